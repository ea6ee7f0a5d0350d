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
``prange(schedule="dynamic", chunksize=1)``; thread-private workspaces
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
from cython.parallel cimport parallel, prange
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from spfuse._kernels._interrupt cimport PyErr_CheckSignals, num_chunks, spfuse_set_chunk_work
from spfuse._kernels._kernel_common cimport index_t
from spfuse._kernels._leaves cimport _add_partials
from spfuse._kernels._workspace cimport Workspaces, ws_get

import numpy as np

__all__ = ["ttv", "ttv_mid", "mttkrp", "mttkrp_mid", "mttkrp_inner", "mttkrp_gemm", "spttm_spttm"]

cdef enum:
    BLOCKS_PER_THREAD = 16
    # mttkrp_mid's blocks of output rows per thread: each walks every slice
    MID_BLOCKS_PER_THREAD = 4


cdef inline Py_ssize_t _num_blocks(Py_ssize_t n, int num_threads) noexcept nogil:
    cdef Py_ssize_t nb
    if n <= 0:
        return 0
    if num_threads <= 1:
        return 1
    nb = <Py_ssize_t>num_threads * BLOCKS_PER_THREAD
    return nb if nb < n else n


cdef inline double _cost(const index_t* pos1, const index_t* pos2, Py_ssize_t q) noexcept nogil:
    return <double>(pos2[pos1[q]] - pos2[pos1[0]]) + <double>(pos1[q] - pos1[0]) + <double>q


cdef inline Py_ssize_t _split(const index_t* pos1, const index_t* pos2, Py_ssize_t n,
                              Py_ssize_t b, Py_ssize_t nb) noexcept nogil:
    """First level-0 position of block ``b`` of ``nb`` (balanced by _cost)."""
    cdef Py_ssize_t lo, hi, mid
    cdef double target
    if b <= 0:
        return 0
    if b >= nb:
        return n
    target = _cost(pos1, pos2, n) * (<double>b / <double>nb)
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cost(pos1, pos2, mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline void _axpy(double* acc, double v, const floating* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n):
        acc[k] += v * <double>x[k]


cdef inline void _fiber_times(double* t, const index_t* p2, const index_t* c2, const floating* v,
                              const floating* D, Py_ssize_t f, Py_ssize_t R) noexcept nogil:
    """``t[0:R] = sum_p v[p] * D[c2[p], :]`` over fiber ``f``'s entries (MTTKRP's hoisted row)."""
    cdef Py_ssize_t p
    memset(t, 0, R * sizeof(double))
    for p in range(p2[f], p2[f + 1]):
        _axpy(t, <double>v[p], D + <Py_ssize_t>c2[p] * R, R)


cdef inline void _vecmat(const double* t, Py_ssize_t K, const floating* D, Py_ssize_t L,
                         double* acc) noexcept nogil:
    """``acc[0:L] = t[0:K] @ D`` (D C-contiguous K x L), four rows of D at a time."""
    cdef Py_ssize_t k = 0, l
    cdef double t0, t1, t2, t3
    cdef const floating* d0
    cdef const floating* d1
    cdef const floating* d2
    cdef const floating* d3
    memset(acc, 0, L * sizeof(double))
    while k + 4 <= K:
        t0 = t[k]; t1 = t[k + 1]; t2 = t[k + 2]; t3 = t[k + 3]
        d0 = D + k * L; d1 = d0 + L; d2 = d1 + L; d3 = d2 + L
        for l in range(L):
            acc[l] += (t0 * <double>d0[l] + t1 * <double>d1[l]) + (t2 * <double>d2[l] + t3 * <double>d3[l])
        k += 4
    while k < K:
        t0 = t[k]
        d0 = D + k * L
        for l in range(L):
            acc[l] += t0 * <double>d0[l]
        k += 1


cdef inline const index_t* _iptr(const index_t[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline const floating* _fptr(const floating[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline Py_ssize_t _sub(const index_t* pos1, const index_t* pos2, Py_ssize_t q0,
                            Py_ssize_t q1, Py_ssize_t b, Py_ssize_t nb) noexcept nogil:
    """First level-0 position of block ``b`` of ``nb`` of the chunk ``[q0, q1)``."""
    return q0 + _split(pos1 + q0, pos2, q1 - q0, b, nb)


cdef inline double _work(const index_t* pos1, const index_t* pos2, Py_ssize_t n,
                         double per_entry, double per_fiber, double per_slice) noexcept nogil:
    """Estimated work units of a call (see ``_interrupt.pxd``)."""
    cdef double nf = <double>(pos1[n] - pos1[0])
    cdef double ne = <double>(pos2[pos1[n]] - pos2[pos1[0]])
    return per_entry * ne + per_fiber * nf + per_slice * <double>n


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
    cdef Py_ssize_t nb, nch, ch, h0, h1, b, q, q0, q1, f, p
    cdef double s
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cv = _fptr(c)
    cdef floating* ov = &out_vals[0] if out_vals.shape[0] > 0 else NULL
    if n == 0:
        return
    nch = num_chunks(_work(p1, p2, n, 4.0, 4.0, 1.0), num_threads, n)
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        h0 = _split(p1, p2, n, ch, nch)
        h1 = _split(p1, p2, n, ch + 1, nch)
        nb = _num_blocks(h1 - h0, num_threads)
        with nogil:
            for b in prange(nb, schedule="dynamic", chunksize=1, num_threads=num_threads):
                q0 = _sub(p1, p2, h0, h1, b, nb)
                q1 = _sub(p1, p2, h0, h1, b + 1, nb)
                for q in range(q0, q1):
                    for f in range(p1[q], p1[q + 1]):
                        s = 0.0
                        for p in range(p2[f], p2[f + 1]):
                            s = s + <double>v[p] * <double>cv[c2[p]]
                        ov[f - p1[0]] = <floating>s


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
    cdef Py_ssize_t I = out.shape[0]
    cdef Py_ssize_t K = out.shape[1]
    cdef Py_ssize_t nb, nch, ch, h0, h1, b, q, q0, q1, f, p, k, row
    cdef double cj
    cdef const index_t* c0 = _iptr(crd0)
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* c1 = _iptr(crd1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cv = _fptr(c)
    cdef floating* op = &out[0, 0] if I > 0 and K > 0 else NULL
    cdef double* acc
    cdef double* dst
    cdef int failed = 0
    if I == 0 or K == 0:
        return
    with nogil:
        for row in prange(I, schedule="static", num_threads=num_threads):
            memset(op + row * K, 0, K * sizeof(floating))
    if n == 0:
        return
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    nch = num_chunks(_work(p1, p2, n, 4.0, 4.0, <double>K), num_threads, n)
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        h0 = _split(p1, p2, n, ch, nch)
        h1 = _split(p1, p2, n, ch + 1, nch)
        nb = _num_blocks(h1 - h0, num_threads)
        with nogil, parallel(num_threads=num_threads):
            acc = NULL if floating is double else <double*>ws_get(wsp, 1, 0, K * sizeof(double))
            for b in prange(nb, schedule="dynamic", chunksize=1):
                if floating is not double and acc == NULL:
                    failed += 1
                    continue
                q0 = _sub(p1, p2, h0, h1, b, nb)
                q1 = _sub(p1, p2, h0, h1, b + 1, nb)
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
        if failed:
            raise MemoryError("ttv_mid: cannot allocate the thread workspace")


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
    cdef Py_ssize_t I = out.shape[0]
    cdef Py_ssize_t R = out.shape[1]
    cdef Py_ssize_t nb, nch, ch, h0, h1
    cdef Py_ssize_t b, q, q0, q1, f, p, r, row
    cdef const index_t* c0 = _iptr(crd0)
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* c1 = _iptr(crd1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cp = &C[0, 0] if C.shape[0] > 0 and R > 0 else NULL
    cdef const floating* dp = &D[0, 0] if D.shape[0] > 0 and R > 0 else NULL
    cdef floating* op = &out[0, 0] if I > 0 and R > 0 else NULL
    cdef double* t
    cdef double* acc
    cdef const floating* crow
    cdef int failed = 0
    if I == 0 or R == 0:
        return
    with nogil:
        for row in prange(I, schedule="static", num_threads=num_threads):
            memset(op + row * R, 0, R * sizeof(floating))
    if n == 0:
        return
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    nch = num_chunks(_work(p1, p2, n, <double>(R + 8), <double>(2 * R + 8), <double>(R + 1)),
                     num_threads, n)
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        h0 = _split(p1, p2, n, ch, nch)
        h1 = _split(p1, p2, n, ch + 1, nch)
        nb = _num_blocks(h1 - h0, num_threads)
        with nogil, parallel(num_threads=num_threads):
            t = <double*>ws_get(wsp, 1, 0, (2 * R + 1) * sizeof(double))
            acc = t + R
            for b in prange(nb, schedule="dynamic", chunksize=1):
                if t == NULL:
                    failed += 1
                    continue
                q0 = _sub(p1, p2, h0, h1, b, nb)
                q1 = _sub(p1, p2, h0, h1, b + 1, nb)
                for q in range(q0, q1):
                    memset(acc, 0, R * sizeof(double))
                    for f in range(p1[q], p1[q + 1]):
                        _fiber_times(t, p2, c2, v, dp, f, R)
                        crow = cp + <Py_ssize_t>c1[f] * R
                        for r in range(R):
                            acc[r] += t[r] * <double>crow[r]
                    for r in range(R):
                        op[<Py_ssize_t>c0[q] * R + r] = <floating>acc[r]
        if failed:
            raise MemoryError("mttkrp: cannot allocate the thread workspace")


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
    cdef Py_ssize_t nb, nch, ch, q0, q1, b, q, f, f1, lo, hi, mid, j0, j1, row, r
    cdef const index_t* c0 = _iptr(crd0)
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* c1 = _iptr(crd1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cp = &C[0, 0] if C.shape[0] > 0 and R > 0 else NULL
    cdef const floating* dp = &D[0, 0] if D.shape[0] > 0 and R > 0 else NULL
    cdef floating* op_ = &out[0, 0] if J > 0 and R > 0 else NULL
    cdef const floating* crow
    cdef double* t
    cdef double* acc
    cdef double work
    cdef int failed = 0
    if J == 0 or R == 0:
        return
    memset(op_, 0, J * R * sizeof(floating))
    if n == 0:
        return
    work = _work(p1, p2, n, <double>(R + 8), <double>(2 * R + 8), 1.0)
    # blocks: a few per thread to balance them, few enough that the per-slice
    # searches and factor-row loads (blocks x slices, ~1 us each) stay a
    # small part of the work
    nb = min(_num_blocks(J, num_threads), <Py_ssize_t>num_threads * MID_BLOCKS_PER_THREAD)
    while nb > num_threads and <double>nb * <double>n * 64.0 > work / 16.0:
        nb = nb >> 1
    if nb > J:
        nb = J
    # interruptible chunks of slices, each run by every block: a row is summed
    # over the slices in order whatever the chunks and blocks
    nch = num_chunks(work, num_threads, n)
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    # float32: the rows are summed in a double copy of out, rounded once at the end
    cdef double[:, ::1] wide = None if floating is double else np.zeros((J, R))
    cdef double* wp = NULL if floating is double else &wide[0, 0]
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        q0 = _split(p1, p2, n, ch, nch)
        q1 = _split(p1, p2, n, ch + 1, nch)
        with nogil, parallel(num_threads=num_threads):
            t = <double*>ws_get(wsp, 1, 0, R * sizeof(double))
            for b in prange(nb, schedule="dynamic", chunksize=1):
                if t == NULL:
                    failed += 1
                    continue
                j0 = J * b // nb
                j1 = J * (b + 1) // nb
                if floating is double:
                    acc = <double*>(op_ + j0 * R)
                else:
                    acc = wp + j0 * R
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
        if failed:
            raise MemoryError("mttkrp_mid: cannot allocate the thread workspace")
    if floating is not double:
        with nogil:
            for row in prange(J * R, schedule="static", num_threads=num_threads):
                op_[row] = <floating>wp[row]


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
    cdef Py_ssize_t nb = nblocks, nch, ch, b, q, q0, q1, s0, s1, f, p, r, own
    cdef const index_t* c0 = _iptr(crd0)
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* c1 = _iptr(crd1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cp = &C[0, 0] if C.shape[0] > 0 and R > 0 else NULL
    cdef const floating* dp = &D[0, 0] if D.shape[0] > 0 and R > 0 else NULL
    cdef floating* op_ = &out[0, 0] if K > 0 and R > 0 else NULL
    cdef const floating* crow
    cdef const floating* drow
    cdef double* t
    cdef double* acc
    cdef double* row
    cdef double w
    cdef int failed = 0
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
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    try:
        if floating is double:
            memset(op_, 0, K * R * sizeof(double))
            accs[0] = <double*>op_
        for b in range(own, nb):
            accs[b] = &parts[b - own, 0]
        # interruptible chunks of each block's slices, run in order: a
        # block's partial sums its entries in the same order whatever the chunks
        nch = num_chunks(_work(p1, p2, n, <double>(R + 8), <double>(R + 8), 1.0), num_threads, n)
        for ch in range(nch):
            if ch > 0:
                PyErr_CheckSignals()
            with nogil, parallel(num_threads=num_threads):
                t = <double*>ws_get(wsp, 1, 0, R * sizeof(double))
                for b in prange(nb, schedule="dynamic", chunksize=1):
                    if t == NULL:
                        failed += 1
                        continue
                    q0 = _split(p1, p2, n, b, nb)
                    q1 = _split(p1, p2, n, b + 1, nb)
                    s0 = _sub(p1, p2, q0, q1, ch, nch)
                    s1 = _sub(p1, p2, q0, q1, ch + 1, nch)
                    acc = accs[b]
                    for q in range(s0, s1):
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
            if failed:
                raise MemoryError("mttkrp_inner: cannot allocate the thread workspace")
        if nb > own:
            with nogil:
                _add_partials(accs, nb, op_, K * R, num_threads)
    finally:
        free(accs)


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
    cdef Py_ssize_t I = out.shape[0]
    cdef Py_ssize_t M = out.shape[1]
    cdef Py_ssize_t J = C.shape[1]
    cdef Py_ssize_t nb, nch, ch, h0, h1
    cdef Py_ssize_t b, q, q0, q1, f, p, r, row
    cdef const index_t* c0 = _iptr(crd0)
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* c1 = _iptr(crd1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cp = &C[0, 0] if C.shape[0] > 0 and J > 0 else NULL
    cdef const floating* dp = &D[0, 0] if D.shape[0] > 0 and J > 0 else NULL
    cdef const floating* ep = &E[0, 0] if J > 0 and M > 0 else NULL
    cdef floating* op = &out[0, 0] if I > 0 and M > 0 else NULL
    cdef double* u
    cdef double* t
    cdef double* acc
    cdef const floating* drow
    cdef int failed = 0
    if I == 0 or M == 0:
        return
    with nogil:
        for row in prange(I, schedule="static", num_threads=num_threads):
            memset(op + row * M, 0, M * sizeof(floating))
    if n == 0:
        return
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    nch = num_chunks(_work(p1, p2, n, <double>(J + 8), <double>(2 * J + 8), <double>(J * M + J + 1)),
                     num_threads, n)
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        h0 = _split(p1, p2, n, ch, nch)
        h1 = _split(p1, p2, n, ch + 1, nch)
        nb = _num_blocks(h1 - h0, num_threads)
        with nogil, parallel(num_threads=num_threads):
            u = <double*>ws_get(wsp, 1, 0, (2 * J + M + 1) * sizeof(double))
            t = u + J
            acc = t + J
            for b in prange(nb, schedule="dynamic", chunksize=1):
                if u == NULL:
                    failed += 1
                    continue
                q0 = _sub(p1, p2, h0, h1, b, nb)
                q1 = _sub(p1, p2, h0, h1, b + 1, nb)
                for q in range(q0, q1):
                    memset(t, 0, J * sizeof(double))
                    for f in range(p1[q], p1[q + 1]):
                        memset(u, 0, J * sizeof(double))
                        for p in range(p2[f], p2[f + 1]):
                            _axpy(u, <double>v[p], cp + <Py_ssize_t>c2[p] * J, J)
                        drow = dp + <Py_ssize_t>c1[f] * J
                        for r in range(J):
                            t[r] += u[r] * <double>drow[r]
                    _vecmat(t, J, ep, M, acc)
                    for r in range(M):
                        op[<Py_ssize_t>c0[q] * M + r] = <floating>acc[r]
        if failed:
            raise MemoryError("mttkrp_gemm: cannot allocate the thread workspace")


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
    cdef Py_ssize_t nb, nch, ch, h0, h1
    cdef Py_ssize_t b, q, q0, q1, f, p, r
    cdef const index_t* p1 = _iptr(pos1)
    cdef const index_t* p2 = _iptr(pos2)
    cdef const index_t* c2 = _iptr(crd2)
    cdef const floating* v = _fptr(vals)
    cdef const floating* cp = &C[0, 0] if C.shape[0] > 0 and L > 0 else NULL
    cdef const floating* dp = &D[0, 0] if L > 0 and M > 0 else NULL
    cdef floating* op = &out_vals[0, 0] if out_vals.shape[0] > 0 and M > 0 else NULL
    cdef double* t
    cdef double* acc
    cdef int failed = 0
    if n == 0 or M == 0:
        return
    cdef Workspaces ws = Workspaces(num_threads, 1)
    cdef void** wsp = ws.ptr
    # work: per entry, per fiber, per slice (see _work)
    nch = num_chunks(_work(p1, p2, n, <double>(L + 8), <double>(L * M + L + 8), 1.0),
                     num_threads, n)
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        h0 = _split(p1, p2, n, ch, nch)
        h1 = _split(p1, p2, n, ch + 1, nch)
        nb = _num_blocks(h1 - h0, num_threads)
        with nogil, parallel(num_threads=num_threads):
            t = <double*>ws_get(wsp, 1, 0, (L + M + 1) * sizeof(double))
            acc = t + L
            for b in prange(nb, schedule="dynamic", chunksize=1):
                if t == NULL:
                    failed += 1
                    continue
                q0 = _sub(p1, p2, h0, h1, b, nb)
                q1 = _sub(p1, p2, h0, h1, b + 1, nb)
                for q in range(q0, q1):
                    for f in range(p1[q], p1[q + 1]):
                        memset(t, 0, L * sizeof(double))
                        for p in range(p2[f], p2[f + 1]):
                            _axpy(t, <double>v[p], cp + <Py_ssize_t>c2[p] * L, L)
                        _vecmat(t, L, dp, M, acc)
                        for r in range(M):
                            op[(f - p1[0]) * M + r] = <floating>acc[r]
        if failed:
            raise MemoryError("spttm_spttm: cannot allocate the thread workspace")
