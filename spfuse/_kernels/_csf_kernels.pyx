# cython: language_level=3
"""Template kernels over 3-d CSF operands.

CSF layout (every level compressed, mode order (0, 1, 2)):
``pos0, crd0, pos1, crd1, pos2, crd2, vals`` with ``pos0 = [0, n_i]``;
level-0 position ``q`` (``0 <= q < n_i``) has coordinate ``crd0[q]`` and owns
the level-1 positions (fibers) ``pos1[q] <= f < pos1[q + 1]``; fiber ``f``
has coordinate ``crd1[f]`` and owns the entries ``pos2[f] <= p < pos2[f + 1]``
with coordinates ``crd2[p]`` and values ``vals[p]``.

Shared conventions (as in ``_csr_kernels``): values ``cython.floating``,
double accumulation; ONE index type (int32/int64) for every pos/crd array of
a call; ``const T[::1]`` inputs, C-contiguous dense matrices; NO validation
(the Python layer checked the tensor: pos non-decreasing, coordinates in
range, ``crd0`` strictly increasing -- distinct output rows); explicit
``num_threads``; parallel over level-0 positions ``q`` in blocks balanced by
``pos2[pos1[q]] + pos1[q] + q`` (entries + fibers + slices), handed out by
``prange(schedule="dynamic", chunksize=1)`` (the skeleton of
``_parallel.pxd``, shared with ``_csr_kernels``: a routine here is a body
over a block of slices and a struct of its arguments); thread-private workspaces
allocated once per call per thread; the arithmetic of a slice never depends
on the thread count, so results are bit-identical for any ``num_threads``.

Interruptible (see ``_interrupt.pxd``): a call whose estimated work exceeds
one chunk runs its level-0 positions as consecutive chunks (balanced like
the blocks), one parallel region each, with ``PyErr_CheckSignals()`` in
between; workspaces live in a ``Workspaces`` table (``_workspace.pxd``: one
slot per thread, allocated by the thread on first use, never sharing a cache
line with another thread's) freed on any exit, KeyboardInterrupt included.  Chunks group whole slices, so chunking never changes results.
"""
cimport cython
from cython cimport floating
from cython.parallel cimport prange
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from spfuse._kernels._interrupt cimport spfuse_set_chunk_work
from spfuse._kernels._kernel_common cimport index_t
from spfuse._kernels._leaves cimport _add_partials, _axpy, _fptr, _iptr, _mptr, _vecmat, _zero_rows
from spfuse._kernels._parallel cimport DYNAMIC_BLOCKS, FIXED_BLOCKS, TEAM, block_body, for_rows, num_blocks
from spfuse._kernels._workspace cimport Workspaces, ws_get

import numpy as np

__all__ = ["ttv", "ttv_mid", "mttkrp", "mttkrp_mid", "mttkrp_inner", "mttkrp_gemm", "spttm_spttm"]

cdef enum:
    BLOCKS_PER_THREAD = 16
    # mttkrp_mid's blocks of output rows per thread: each walks every slice
    MID_BLOCKS_PER_THREAD = 4


cdef inline void _fiber_times(double* t, const index_t* p2, const index_t* c2, const floating* v,
                              const floating* D, Py_ssize_t f, Py_ssize_t R) noexcept nogil:
    """``t[0:R] = sum_p v[p] * D[c2[p], :]`` over fiber ``f``'s entries (MTTKRP's hoisted row)."""
    cdef Py_ssize_t p
    memset(t, 0, R * sizeof(double))
    for p in range(p2[f], p2[f + 1]):
        _axpy(t, <double>v[p], D + <Py_ssize_t>c2[p] * R, R)


cdef inline double _work(const index_t* pos1, const index_t* pos2, Py_ssize_t n,
                         double per_entry, double per_fiber, double per_slice) noexcept nogil:
    """Estimated work units of a call (see ``_interrupt.pxd``)."""
    cdef double nf = <double>(pos1[n] - pos1[0])
    cdef double ne = <double>(pos2[pos1[n]] - pos2[pos1[0]])
    return per_entry * ne + per_fiber * nf + per_slice * <double>n


cdef struct _CsfArgs:
    # the CSF operand's coordinates (its values, pos1 and pos2 come with each block)
    const void* crd0
    const void* crd1
    const void* crd2
    # the dense factors and the output
    const void* C
    const void* D
    const void* E
    void* out
    double** accs   # mttkrp_inner: block b's partial
    double* wide    # mttkrp_mid, float32: the double copy of out
    Py_ssize_t R, M   # the factors' widths
    Py_ssize_t J, nb  # mttkrp_mid: the output rows and their ranges
    Py_ssize_t base   # pos1[0]: fiber f's output row is f - base
    void** wsp


cdef floating* _zeroed(floating[:, ::1] out, int num_threads) noexcept:
    """``out`` (C-ordered) set to 0, rows shared among the threads: the rows
    of a dense result no slice writes stay 0.  NULL when ``out`` is empty."""
    if out.shape[0] == 0 or out.shape[1] == 0:
        return NULL
    with nogil:
        _zero_rows(&out[0, 0], out.shape[0], out.shape[1], num_threads)
    return &out[0, 0]


def _set_chunk_work(double units):
    """_set_chunk_work(units) -> previous value

    Testing hook: work units per thread per chunk of this module's kernels
    (default 2**24, see ``_interrupt.pxd``; values < 1 only query).  Small
    values run small inputs as many chunks, each preceded by a signal check.
    """
    return spfuse_set_chunk_work(units)


def ttv(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
        const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
        const floating[::1] vals, const floating[::1] c, floating[::1] out_vals,
        int num_threads):
    """ttv(pos0, crd0, pos1, crd1, pos2, crd2, vals, c, out_vals, num_threads)

    Tensor-times-vector over the last mode: ``A[i,j] = sum_k X[i,j,k] * c[k]``.

    ``out_vals[f] = sum_{p in fiber f} vals[p] * c[crd2[p]]`` for every
    level-1 position ``f``, so the result has X's (i, j) pattern: the CSR-like
    matrix ``(pos1, crd1, out_vals)`` with row coordinates ``crd0`` (an empty
    fiber gives 0).  Preconditions: ``len(c) >= max(crd2) + 1``,
    ``len(out_vals) == pos1[n_i] - pos1[0]`` (entry f - pos1[0] for fiber f).
    Complexity O(nnz + n_fibers); no workspace.
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef _CsfArgs a
    if n == 0:
        return
    a.crd2, a.C = _iptr(crd2), _fptr(c)
    a.out = &out_vals[0] if out_vals.shape[0] > 0 else NULL
    a.base = p1[0]
    for_rows("ttv", <block_body>_ttv_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2, n,
             _work(p1, p2, n, 4.0, 4.0, 1.0), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


cdef int _ttv_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                     const index_t* p1, const index_t* p2) noexcept nogil:
    """:func:`ttv`'s slices ``[q0, q1)``."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cv = <const floating*>a.C
    cdef floating* ov = <floating*>a.out
    cdef Py_ssize_t q, f, p
    cdef double s
    for q in range(q0, q1):
        for f in range(p1[q], p1[q + 1]):
            s = 0.0
            for p in range(p2[f], p2[f + 1]):
                s = s + <double>v[p] * <double>cv[c2[p]]
            ov[f - a.base] = <floating>s
    return 0


def ttv_mid(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
            const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
            const floating[::1] vals, const floating[::1] c, floating[:, ::1] out, int num_threads):
    """ttv_mid(pos0, crd0, pos1, crd1, pos2, crd2, vals, c, out, num_threads)

    Tensor-times-vector over the middle stored mode: ``A[i,k] = sum_j
    X[i,j,k] * c[j]`` into the dense ``out`` (I x K).  Per slice i, each
    fiber's entries are scaled by ``c[j]`` and scattered into row i (an
    axpy of a sparse fiber), accumulated in double: in ``out``'s own row for
    float64, in a thread-private row for float32.  Slices own distinct rows,
    so the result does not depend on the thread count.  Preconditions:
    ``len(c) > max(crd1)``, ``out`` C-contiguous with ``I > max(crd0)`` and
    ``K > max(crd2)``, ``crd0`` strictly increasing.  ``out`` fully
    overwritten.  Complexity O(nnz + n_fibers + I * K); workspace K doubles
    per thread (float32 only).
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t K = out.shape[1]
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef floating* op = _zeroed(out, num_threads)
    cdef _CsfArgs a
    if op == NULL or n == 0:
        return
    a.crd0, a.crd1, a.crd2, a.C, a.out, a.R = _iptr(crd0), _iptr(crd1), _iptr(crd2), _fptr(c), op, K
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    for_rows("ttv_mid", <block_body>_ttv_mid_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2, n,
             _work(p1, p2, n, 4.0, 4.0, <double>K), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


cdef int _ttv_mid_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                         const index_t* p1, const index_t* p2) noexcept nogil:
    """:func:`ttv_mid`'s slices ``[q0, q1)``, each into its own row (float32:
    through the thread's double row)."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c0 = <const index_t*>a.crd0
    cdef const index_t* c1 = <const index_t*>a.crd1
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cv = <const floating*>a.C
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t K = a.R, q, f, p, k, row
    cdef double cj
    cdef double* dst
    cdef double* acc = NULL if floating is double else <double*>ws_get(a.wsp, 1, 0, K * sizeof(double))
    if floating is not double and acc == NULL:
        return -1
    for q in range(q0, q1):
        row = <Py_ssize_t>c0[q]
        if floating is double:
            dst = <double*>(op + row * K)   # slices own their rows
        else:
            dst = acc
            memset(dst, 0, K * sizeof(double))
        for f in range(p1[q], p1[q + 1]):
            cj = <double>cv[c1[f]]
            for p in range(p2[f], p2[f + 1]):
                dst[c2[p]] += <double>v[p] * cj
        if floating is not double:
            for k in range(K):
                op[row * K + k] = <floating>dst[k]
    return 0


def mttkrp(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
           const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
           const floating[::1] vals, const floating[:, ::1] C, const floating[:, ::1] D,
           floating[:, ::1] out, int num_threads):
    """mttkrp(pos0, crd0, pos1, crd1, pos2, crd2, vals, C, D, out, num_threads)

    MTTKRP ``A[i,r] = sum_{j,k} X[i,j,k] * C[j,r] * D[k,r]`` with hoisting.

    Per fiber (i, j): ``t[r] = sum_k X[i,j,k] * D[k,r]`` (thread-private),
    then ``acc[r] += t[r] * C[j,r]`` -- the C factor is hoisted out of the
    k loop (loop-invariant redundancy removed).  Preconditions: C (J, R),
    D (Kd, R), out (I, R) C-contiguous with ``I > max(crd0)``; ``crd0``
    strictly increasing.  ``out`` fully overwritten (rows absent from crd0
    become 0).  Complexity O(nnz * R + n_fibers * R + I * R); workspace 2R
    doubles per thread.
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t R = out.shape[1]
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef floating* op = _zeroed(out, num_threads)
    cdef _CsfArgs a
    if op == NULL or n == 0:
        return
    # the fibers' rows of D, scaled by C's row of the middle mode
    a.crd0, a.crd1, a.crd2, a.C, a.D, a.E = _iptr(crd0), _iptr(crd1), _iptr(crd2), _mptr(D), _mptr(C), NULL
    a.out, a.R, a.M = op, R, 0
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    for_rows("mttkrp", <block_body>_mttkrp_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2, n,
             _work(p1, p2, n, <double>(R + 8), <double>(2 * R + 8), <double>(R + 1)), num_threads,
             DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


cdef int _mttkrp_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                        const index_t* p1, const index_t* p2) noexcept nogil:
    """Slices ``[q0, q1)`` of :func:`mttkrp` and :func:`mttkrp_gemm`, each
    into its own row: per fiber, ``u = sum_p v[p] * C[c2[p], :]`` (C: the
    inner mode's factor), ``t += u * D[c1[f], :]`` (D: the middle mode's),
    then the slice's row is ``t``, or with ``E``, ``t @ E``."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c0 = <const index_t*>a.crd0
    cdef const index_t* c1 = <const index_t*>a.crd1
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.D
    cdef const floating* ep = <const floating*>a.E
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t R = a.R, M = a.M, width = a.M if a.E != NULL else a.R, q, f, r, p
    cdef const floating* drow
    cdef const floating* crow
    cdef double vp
    cdef double* u = <double*>ws_get(a.wsp, 1, 0, (2 * R + M + 1) * sizeof(double))
    cdef double* t
    cdef double* row
    if u == NULL:
        return -1
    t = u + R
    row = t + R if ep != NULL else t
    for q in range(q0, q1):
        memset(t, 0, R * sizeof(double))
        for f in range(p1[q], p1[q + 1]):
            drow = dp + <Py_ssize_t>c1[f] * R
            p = p2[f]
            if p2[f + 1] - p == 1:
                # one entry (most fibers of a sparse tensor): its row of u is
                # v * C[c2[p], :] exactly, so it is not stored and read again
                vp = <double>v[p]
                crow = cp + <Py_ssize_t>c2[p] * R
                for r in range(R):
                    t[r] += (vp * <double>crow[r]) * <double>drow[r]
                continue
            _fiber_times(u, p2, c2, v, cp, f, R)
            for r in range(R):
                t[r] += u[r] * <double>drow[r]
        if ep != NULL:
            _vecmat(t, R, ep, M, row)
        for r in range(width):
            op[<Py_ssize_t>c0[q] * width + r] = <floating>row[r]
    return 0


def mttkrp_mid(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
               const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
               const floating[::1] vals, const floating[:, ::1] C, const floating[:, ::1] D,
               floating[:, ::1] out, int num_threads):
    """mttkrp_mid(pos0, crd0, pos1, crd1, pos2, crd2, vals, C, D, out, num_threads)

    MTTKRP on the middle stored mode: ``A[j,r] = sum_{i,k} X[i,j,k] * C[i,r] * D[k,r]``.

    Owner computes: the output rows are cut into a few ranges of ``j`` per
    thread (one on one thread), handed out dynamically; a range's block
    walks the slices, finds each slice's first fiber in the range by binary
    search (a slice's fibers are sorted by ``j``), and for each fiber
    ``(i, j)`` in the range forms ``t[r] = sum_k X[i,j,k] * D[k,r]`` (as
    :func:`mttkrp`) and adds ``t[r] * C[i,r]`` to row ``j``, which no other
    block writes.  The interruptible chunks are ranges of slices that every
    block walks in turn, so row j is summed over the slices in order
    whatever the chunks and ranges: results are bit-identical for any
    thread count, with no partial results to add.  (The chunks used to be
    groups of blocks, ~1.6 per chunk on two threads, so a thread often
    waited for its teammate's block: 2M entries took 41-51 ms on two
    threads, now 33-37.)  Preconditions: C (I, R) with ``I > max(crd0)``,
    D (Kd, R), out (J, R) C-contiguous with ``J > max(crd1)``; each slice's
    fibers strictly increasing in ``j`` (canonical CSF).  ``out`` fully
    overwritten.  Complexity O(nnz * R + n_fibers * R + blocks * n_slices *
    log(fibers per slice)); workspace R doubles per thread (float32: and a
    double copy of out, rounded once at the end).
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t J = out.shape[0]
    cdef Py_ssize_t R = out.shape[1]
    cdef Py_ssize_t nb, row
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef floating* op_ = _zeroed(out, num_threads)
    cdef double work
    cdef _CsfArgs a
    if op_ == NULL or n == 0:
        return
    work = _work(p1, p2, n, <double>(R + 8), <double>(2 * R + 8), 1.0)
    # blocks: a few per thread to balance them, few enough that the per-slice
    # searches and factor-row loads (blocks x slices, ~1 us each) stay a
    # small part of the work
    nb = min(num_blocks(J, num_threads, BLOCKS_PER_THREAD), <Py_ssize_t>num_threads * MID_BLOCKS_PER_THREAD)
    while nb > num_threads and <double>nb * <double>n * 64.0 > work / 16.0:
        nb = nb >> 1
    if nb > J:
        nb = J
    a.crd0, a.crd1, a.crd2, a.C, a.D, a.out = _iptr(crd0), _iptr(crd1), _iptr(crd2), _mptr(C), _mptr(D), op_
    a.R, a.J, a.nb = R, J, nb
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # float32: the rows are summed in a double copy of out, rounded once at the end
    cdef double[:, ::1] wide = None if floating is double else np.zeros((J, R))
    a.wide = NULL if floating is double else &wide[0, 0]
    # interruptible chunks of slices, each run by every block: a row is summed
    # over the slices in order whatever the chunks and blocks
    for_rows("mttkrp_mid", <block_body>_mttkrp_mid_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2,
             n, work, num_threads, TEAM, nb, NULL)
    if floating is not double:
        with nogil:
            for row in prange(J * R, schedule="static", num_threads=num_threads):
                op_[row] = <floating>a.wide[row]


cdef int _mttkrp_mid_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                            const index_t* p1, const index_t* p2) noexcept nogil:
    """:func:`mttkrp_mid`'s slices ``[q0, q1)`` into block ``b``'s range of output rows."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c0 = <const index_t*>a.crd0
    cdef const index_t* c1 = <const index_t*>a.crd1
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.D
    cdef Py_ssize_t R = a.R, j0 = a.J * b // a.nb, j1 = a.J * (b + 1) // a.nb
    cdef Py_ssize_t q, f, f1, lo, hi, mid, row, r
    cdef const floating* crow
    cdef double* acc
    cdef double* t = <double*>ws_get(a.wsp, 1, 0, R * sizeof(double))
    if t == NULL:
        return -1
    if floating is double:
        acc = <double*>(<floating*>a.out + j0 * R)
    else:
        acc = a.wide + j0 * R
    for q in range(q0, q1):
        # the slice's first fiber with j >= j0
        lo = p1[q]
        hi = p1[q + 1]
        while lo < hi:
            mid = (lo + hi) >> 1
            if c1[mid] < j0:
                lo = mid + 1
            else:
                hi = mid
        crow = cp + <Py_ssize_t>c0[q] * R
        f = lo
        f1 = p1[q + 1]
        while f < f1 and c1[f] < j1:
            _fiber_times(t, p2, c2, v, dp, f, R)
            row = (<Py_ssize_t>c1[f] - j0) * R
            for r in range(R):
                acc[row + r] += t[r] * <double>crow[r]
            f = f + 1
    return 0


def mttkrp_inner(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
                 const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
                 const floating[::1] vals, const floating[:, ::1] C, const floating[:, ::1] D,
                 floating[:, ::1] out, int nblocks, int num_threads):
    """mttkrp_inner(pos0, crd0, pos1, crd1, pos2, crd2, vals, C, D, out, nblocks, num_threads)

    MTTKRP on the inner stored mode: ``A[k,r] = sum_{i,j} X[i,j,k] * C[i,r] * D[j,r]``.

    Per ``(i, j)`` fiber ``t[r] = C[i,r] * D[j,r]`` is formed once, then
    ``X[i,j,k] * t`` is added to row ``k`` for each stored ``k`` (a
    scatter-axpy): X is read as stored, where putting k in the middle
    (:func:`mttkrp_mid`) gathered all of X's values again on every call.
    The slices are cut into ``nblocks`` fixed blocks balanced by work; block
    ``b`` adds into its own partial of A (``K x R`` doubles; a float64
    call's block 0 into ``out`` itself) and the partials are added in block
    order, so results depend on ``nblocks``, never on ``num_threads`` (the
    caller picks ``nblocks`` from the machine and the work).
    Preconditions: C (I, R) with ``I > max(crd0)``, D (J, R) with
    ``J > max(crd1)``, out (K, R) with ``K > max(crd2)``, all C-contiguous;
    ``nblocks >= 1``.  ``out`` is fully overwritten.  Complexity
    O(nnz * R + n_fibers * R + nblocks * K * R); workspace ``8 * K * R``
    bytes per block past the first (float32: every block) and R doubles
    per thread.
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t K = out.shape[0]
    cdef Py_ssize_t R = out.shape[1]
    cdef Py_ssize_t nb = nblocks, b, own
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef floating* op_ = &out[0, 0] if K > 0 and R > 0 else NULL
    cdef _CsfArgs a
    if nb < 1:
        raise ValueError(f"mttkrp_inner: nblocks must be >= 1, got {nblocks}")
    if K == 0 or R == 0:
        return
    if n == 0:
        memset(op_, 0, K * R * sizeof(floating))
        return
    if nb > n:
        nb = n
    own = 1 if floating is double else 0
    cdef double[:, ::1] parts = np.zeros((nb - own, K * R)) if nb > own else None
    cdef double** accs = <double**>malloc(nb * sizeof(double*))
    if accs == NULL:
        raise MemoryError()
    a.crd0, a.crd1, a.crd2, a.C, a.D, a.R, a.accs = _iptr(crd0), _iptr(crd1), _iptr(crd2), _mptr(C), _mptr(D), R, accs
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    try:
        if floating is double:
            memset(op_, 0, K * R * sizeof(double))
            accs[0] = <double*>op_
        for b in range(own, nb):
            accs[b] = &parts[b - own, 0]
        # interruptible chunks of each block's slices, run in order: a
        # block's partial sums its entries in the same order whatever the chunks
        for_rows("mttkrp_inner", <block_body>_mttkrp_inner_slices[floating, index_t], &a, _fptr(vals), p1, p2,
                 p1, p2, n, _work(p1, p2, n, <double>(R + 8), <double>(R + 8), 1.0), num_threads, FIXED_BLOCKS,
                 nb, NULL)
        if nb > own:
            with nogil:
                _add_partials(accs, nb, op_, K * R, num_threads)
    finally:
        free(accs)


cdef int _mttkrp_inner_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                              const index_t* p1, const index_t* p2) noexcept nogil:
    """:func:`mttkrp_inner`'s slices ``[q0, q1)`` of block ``b``, scattered into its partial."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c0 = <const index_t*>a.crd0
    cdef const index_t* c1 = <const index_t*>a.crd1
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.D
    cdef Py_ssize_t R = a.R, q, f, p, r
    cdef double* acc = a.accs[b]
    cdef const floating* crow
    cdef const floating* drow
    cdef double* row
    cdef double w
    cdef double* t = <double*>ws_get(a.wsp, 1, 0, R * sizeof(double))
    if t == NULL:
        return -1
    for q in range(q0, q1):
        crow = cp + <Py_ssize_t>c0[q] * R
        for f in range(p1[q], p1[q + 1]):
            drow = dp + <Py_ssize_t>c1[f] * R
            for r in range(R):
                t[r] = <double>crow[r] * <double>drow[r]
            for p in range(p2[f], p2[f + 1]):
                row = acc + <Py_ssize_t>c2[p] * R
                w = <double>v[p]
                for r in range(R):
                    row[r] += w * t[r]
    return 0


def mttkrp_gemm(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
                const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
                const floating[::1] vals, const floating[:, ::1] C, const floating[:, ::1] D,
                const floating[:, ::1] E, floating[:, ::1] out, int num_threads):
    """mttkrp_gemm(pos0, crd0, pos1, crd1, pos2, crd2, vals, C, D, E, out, num_threads)

    Fused <MTTKRP, GEMM>: ``A[i,m] = sum_{k,l,j} B[i,k,l] * C[l,j] * D[k,j] * E[j,m]``.

    B is the CSF tensor with modes (i, k, l).  Per slice i (thread-private
    row temporaries): for each fiber (i, k), ``u[j] = sum_l B[i,k,l] *
    C[l,j]``, ``t[j] += u[j] * D[k,j]`` (MTTKRP hoisting), then
    ``out[i, :] = t @ E``.  Preconditions: C (Ld, J), D (Kd, J), E (J, M),
    out (I, M) C-contiguous, ``I > max(crd0)``, crd0 strictly increasing.
    ``out`` fully overwritten (absent rows 0).  Complexity O(nnz * J +
    n_fibers * J + n_i * J * M); workspace 2J + M doubles per thread.
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t M = out.shape[1]
    cdef Py_ssize_t J = C.shape[1]
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef floating* op = _zeroed(out, num_threads)
    cdef _CsfArgs a
    if op == NULL or n == 0:
        return
    a.crd0, a.crd1, a.crd2, a.C, a.D, a.E = _iptr(crd0), _iptr(crd1), _iptr(crd2), _mptr(C), _mptr(D), _mptr(E)
    a.out, a.R, a.M = op, J, M
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    for_rows("mttkrp_gemm", <block_body>_mttkrp_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2,
             n, _work(p1, p2, n, <double>(J + 8), <double>(2 * J + 8), <double>(J * M + J + 1)), num_threads,
             DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


def spttm_spttm(const index_t[::1] pos0, const index_t[::1] crd0, const index_t[::1] pos1,
                const index_t[::1] crd1, const index_t[::1] pos2, const index_t[::1] crd2,
                const floating[::1] vals, const floating[:, ::1] C, const floating[:, ::1] D,
                floating[:, ::1] out_vals, int num_threads):
    """spttm_spttm(pos0, crd0, pos1, crd1, pos2, crd2, vals, C, D, out_vals, num_threads)

    Fused <SpTTM, SpTTM>: ``A[i,j,m] = sum_{k,l} B[i,j,k] * C[k,l] * D[l,m]``.

    Per fiber f = (i, j): ``t[l] = sum_k B[i,j,k] * C[k,l]`` (thread-private
    row temporary), ``out_vals[f - pos1[0], :] = t @ D``.  The result keeps
    B's (i, j) pattern with a dense last mode: level-1 positions of B,
    values shaped ``(n_fibers, M)``.  Preconditions: C (Kd, L), D (L, M),
    out_vals (pos1[n_i] - pos1[0], M) C-contiguous.  Every row of out_vals is
    overwritten (empty fibers give 0).  Complexity O(nnz * L + n_fibers * L
    * M); workspace L + M doubles per thread.
    """
    cdef Py_ssize_t n = crd0.shape[0]
    cdef Py_ssize_t L = C.shape[1]
    cdef Py_ssize_t M = out_vals.shape[1]
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef _CsfArgs a
    if n == 0 or M == 0:
        return
    a.crd2, a.C, a.D, a.R, a.M, a.base = _iptr(crd2), _mptr(C), _mptr(D), L, M, p1[0]
    a.out = &out_vals[0, 0] if out_vals.shape[0] > 0 else NULL
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    for_rows("spttm_spttm", <block_body>_spttm_spttm_slices[floating, index_t], &a, _fptr(vals), p1, p2, p1, p2,
             n, _work(p1, p2, n, <double>(L + 8), <double>(L * M + L + 8), 1.0), num_threads, DYNAMIC_BLOCKS,
             BLOCKS_PER_THREAD, NULL)


cdef int _spttm_spttm_slices(const void* ctx, Py_ssize_t b, Py_ssize_t q0, Py_ssize_t q1, const floating* v,
                             const index_t* p1, const index_t* p2) noexcept nogil:
    """:func:`spttm_spttm`'s slices ``[q0, q1)``, a row of the result per fiber."""
    cdef const _CsfArgs* a = <const _CsfArgs*>ctx
    cdef const index_t* c2 = <const index_t*>a.crd2
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.D
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t L = a.R, M = a.M, q, f, p, r
    cdef double* t = <double*>ws_get(a.wsp, 1, 0, (L + M + 1) * sizeof(double))
    cdef double* acc
    if t == NULL:
        return -1
    acc = t + L
    for q in range(q0, q1):
        for f in range(p1[q], p1[q + 1]):
            memset(t, 0, L * sizeof(double))
            for p in range(p2[f], p2[f + 1]):
                _axpy(t, <double>v[p], cp + <Py_ssize_t>c2[p] * L, L)
            _vecmat(t, L, dp, M, acc)
            for r in range(M):
                op[(f - a.base) * M + r] = <floating>acc[r]
    return 0
