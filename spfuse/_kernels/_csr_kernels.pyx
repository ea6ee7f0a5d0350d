# cython: language_level=3
"""Template kernels over CSR operands (the fast path the planner lowers to).

Conventions shared by every routine of this module
--------------------------------------------------
* A CSR matrix is ``(indptr, indices, data)``; ``indptr`` has ``m + 1``
  entries, ``indptr[0]`` need not be 0 (slices of a bigger matrix work), row
  ``i`` owns positions ``indptr[i] <= p < indptr[i + 1]``.
* Values are ``cython.floating`` (float32 or float64, the same for every value
  array of a call); every reduction accumulates in C ``double`` and rounds once
  when the result is stored.
* All index arrays of one call (indptr, indices, and index outputs) share ONE
  index type, int32 or int64.  With int32, ``m``, ``n`` and every nnz must be
  below 2**31 (the Python wrappers upcast before calling otherwise).
* Inputs are ``const T[::1]`` (1-D, C-contiguous; read-only arrays welcome),
  dense matrices are ``T[:, ::1]`` (C-contiguous, rows contiguous).  Operands
  called ``Dt`` are given transposed so that the rows used by a dot product
  are contiguous.
* NOTHING is validated here (the Python layer did it): out-of-range indices,
  non-monotone indptr, wrong shapes or wrong lengths are undefined behaviour.
  The one exception: ``spmv`` and ``spmm`` read each column index once
  anyway, so they check it before using it (one predictable compare) and
  return the position of an out-of-range one.  The Python layer then skips
  its own O(nnz) scan of ``indices`` for them and checks only ``indptr``.
* ``num_threads`` (>= 1) is explicit.  Rows are split into blocks balanced by
  work (binary search on a prefix array, e.g. ``indptr[r] + r``) and the
  blocks are handed out by ``prange(schedule="dynamic", chunksize=1)``.  The
  arithmetic of one row never depends on the thread count, so results are
  bit-identical for any ``num_threads``.  That skeleton is written once
  (``for_rows``, ``_parallel.pxd``): a routine here is a body over a block
  of rows (``_<name>_rows``) and a struct of its arguments.
* Interruptible: a kernel whose estimated work exceeds one chunk (see
  ``_interrupt.pxd``) runs its rows as consecutive chunks (balanced like the
  blocks), one parallel region each, and calls ``PyErr_CheckSignals()``
  between chunks: Ctrl-C raises ``KeyboardInterrupt`` within ~one chunk
  (tens of ms).  Chunks group whole rows, so chunking never changes results.
* Thread-private workspaces are allocated once per call per thread (lazily,
  by the thread, on its first chunk; slot ``omp_get_thread_num()`` of a
  ``Workspaces`` table, ``_workspace.pxd``: whole cache lines, never shared
  with another thread) and freed when the table is -- also when a signal
  interrupts the call; an allocation failure raises ``MemoryError``
  after the parallel region.
* Sparse outputs are built in two phases: a symbolic pass that counts the
  entries of each row, a prefix sum (numpy ``cumsum``, in Python), and a
  numeric pass in which each row fills its own disjoint slice -- except
  SpAdd-n, whose rows have a cheap upper bound (the sum of the operands' row
  lengths): one pass writes each row at its upper-bound offset, and a
  parallel gather closes the gaps only when threads left some.  Output rows
  are sorted by column; structural entries are kept even when their value
  cancels to 0 (like scipy's symbolic pattern).
"""
cimport cython
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.math cimport INFINITY, fabs, sqrt
from libc.string cimport memcpy, memmove, memset

import numpy as np

from spfuse._kernels._result_pool import empty as pooled_empty

cimport numpy as cnp

cnp.import_array()

from spfuse._kernels._bitmap cimport _bitmap_add, _bitmap_readback, out_index_t
from spfuse._kernels._epilogue cimport (
    EPI_ABS, EPI_ADD, EPI_COL, EPI_CONST, EPI_COPY, EPI_DIV, EPI_MATRIX, EPI_MUL, EPI_NEG, EPI_REG, EPI_RELU, EPI_ROUND,
    EPI_ROW, EPI_SQRT, EPI_SUB, EPI_WHERE, _Epilogue, _epilogue_from, _run_epilogue,
)
from spfuse._kernels._leaves cimport _add_partials, _axpy, _dot, _fptr, _iptr, _mptr, _vecmat
from spfuse._kernels._parallel cimport (
    DYNAMIC_BLOCKS, FIXED_BLOCKS, FIXED_BLOCKS_STATIC, TEAM, block_body, for_rows, split,
)
from spfuse._kernels._interrupt cimport spfuse_set_chunk_work
from spfuse._kernels._kernel_common cimport (
    SDDMM_DIV, SDDMM_DOT, SDDMM_MUL, index_t,
)
from spfuse._kernels._workspace cimport Workspaces, spfuse_ws_alloc, ws_get, ws_slot, ws_zeroed

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SPFUSE_PREFETCH_W(p) __builtin_prefetch((const void*)(p), 1, 3)
    #define SPFUSE_PREFETCH_R(p) __builtin_prefetch((const void*)(p), 0, 3)
    #else
    #define SPFUSE_PREFETCH_W(p) ((void)0)
    #define SPFUSE_PREFETCH_R(p) ((void)0)
    #endif
    """
    # Software prefetch hints (no-ops on other compilers); they never change
    # results, only hide the latency of the next random row / slot accesses.
    void SPFUSE_PREFETCH_W(const void* p) noexcept nogil
    void SPFUSE_PREFETCH_R(const void* p) noexcept nogil

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* c ? a : b on doubles without a branch (bit masks): compilers turn a
       ternary on doubles into a jump, which mispredicts on random data. */
    static inline double spfuse_select(int c, double a, double b) {
        uint64_t ua, ub, m = (uint64_t)0 - (uint64_t)(c != 0);
        memcpy(&ua, &a, 8); memcpy(&ub, &b, 8);
        ua = (ua & m) | (ub & ~m);
        memcpy(&a, &ua, 8);
        return a;
    }
    """
    double spfuse_select(int c, double a, double b) noexcept nogil


__all__ = [
    "SDDMM_OPS", "SPMM_K_TILE",
    "spmv", "spmv_t", "bilinear", "row_extremum", "col_extremum", "spmm", "spmm_t", "SUM_TERMS", "sddmm",
    "scale",
    "spgemm_symbolic", "spgemm_numeric", "spgemm", "masked_spgemm",
    "SPADD_VARIANTS", "SPADD_COSTS", "spadd_row_bounds", "spadd",
    "sddmm_spmm", "spmm_gemm", "sddmm_spmm_gemm",
]

#: op codes of :func:`sddmm`, :func:`sddmm_spmm`, :func:`sddmm_spmm_gemm`
SDDMM_OPS = {"mul": SDDMM_MUL, "div": SDDMM_DIV, "dot": SDDMM_DOT}

# The largest int32 (a constant: np.iinfo costs microseconds per call).
INT32_MAX = 2147483647

# Column tile of the SpMM accumulator: 256 doubles = 2 KiB.  The thread's
# accumulator tile stays in L1 (32-48 KiB) next to the B-row segments being
# streamed (a row of ~10-20 nnz touches 20-40 KiB of B per tile, which stays
# in L1/L2), and 2 KiB contiguous runs per B row are long enough for the
# hardware prefetcher.  K <= 256 (the common case) needs one pass.
cdef enum:
    K_TILE = 256
SPMM_K_TILE = K_TILE

# Blocks handed out per thread by the dynamic schedule (load balance vs. the
# cost of one atomic per block).
cdef enum:
    BLOCKS_PER_THREAD = 16

# spmm_t's output size (bytes) from which a team shares it (a variable: the
# tests lower it to run the team on small inputs)
cdef Py_ssize_t _spmm_t_team_min_bytes = 1 << 22


def _set_spmm_t_team_min_bytes(Py_ssize_t nbytes):
    """_set_spmm_t_team_min_bytes(nbytes) -> previous value

    Testing hook: the output size in bytes over which ``spmm_t`` runs on a
    team (default 4 MiB; negative values only query).
    """
    global _spmm_t_team_min_bytes
    cdef Py_ssize_t old = _spmm_t_team_min_bytes
    if nbytes >= 0:
        _spmm_t_team_min_bytes = nbytes
    return old


# --------------------------------------------------------------------------
# small nogil helpers
# --------------------------------------------------------------------------
cdef enum:
    CHECKED_ROWS = 256   # rows whose indices a kernel checks in one pass before it reads through them


cdef inline Py_ssize_t _first_out_of_range(const index_t* ind, Py_ssize_t start, Py_ssize_t end,
                                           Py_ssize_t n) noexcept nogil:
    """The first position in ``[start, end)`` whose index is outside ``[0, n)``,
    or -1 (one branch-free pass over the run, so it vectorises)."""
    cdef Py_ssize_t p
    cdef int viol = 0
    cdef uint32_t n32
    if index_t is int32_t and n <= 0x7fffffff:   # (compared in 32 bits: 8 indices per AVX2 compare)
        n32 = <uint32_t>n
        for p in range(start, end):
            viol = viol | (<uint32_t>ind[p] >= n32)
    else:
        for p in range(start, end):
            viol = viol | (<size_t>ind[p] >= <size_t>n)
    if not viol:
        return -1
    for p in range(start, end):
        if <size_t>ind[p] >= <size_t>n:
            return p
    return -1


cdef inline Py_ssize_t _checked_run(const index_t* ind, const index_t* ip, Py_ssize_t s0, Py_ssize_t r1,
                                    Py_ssize_t rows, Py_ssize_t n, Py_ssize_t* bad) noexcept nogil:
    """The end of the run of up to ``rows`` rows from ``s0`` (not past
    ``r1``) once its indices are checked in one pass; -1, with the position
    of a bad index in ``bad[0]``, when one is outside ``[0, n)``."""
    cdef Py_ssize_t s1 = min(s0 + rows, r1)
    cdef Py_ssize_t q = _first_out_of_range(ind, ip[s0], ip[s1], n)
    if q >= 0:
        bad[0] = q
        return -1
    return s1


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SPFUSE_OPAQUE_INDEX(v) __asm__("" : "+r"(v))
    #else
    #define SPFUSE_OPAQUE_INDEX(v) ((void)(v))
    #endif
    """
    # an index the optimiser cannot see through (no code emitted): a loop
    # reading through it is not vectorised into gather instructions
    void SPFUSE_OPAQUE_INDEX(int64_t v) noexcept nogil


cdef inline double _gather_dot(const index_t* ind, const floating* val, const floating* x,
                               Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """sum(val[p] * x[ind[p]] for p in [start, end)) in double, in position order
    (``x`` NULL: all ones, the sum of the values).  The indices must have
    been checked (:func:`_first_out_of_range` over a run of rows).
    One chain (rows are short: splitting into chains measured slower at
    ~10 nnz/row); the order is the sequential one, as scipy's csr_matvec.
    With int64 indices gcc vectorises the loop's loads into AVX2 gathers,
    the adds still in order: 13% slower than the scalar loop (20k rows, 320k
    entries: 478 against 418 us with the index check), so the index is
    made opaque to it there.
    """
    cdef double s0 = 0.0
    cdef Py_ssize_t p
    cdef int64_t c
    if x == NULL:   # x all ones: the row's sum
        for p in range(start, end):
            s0 += <double>val[p]
        return s0
    if index_t is int64_t:
        for p in range(start, end):
            c = ind[p]
            SPFUSE_OPAQUE_INDEX(c)
            s0 += <double>val[p] * <double>x[c]
        return s0
    for p in range(start, end):
        s0 += <double>val[p] * <double>x[ind[p]]
    return s0


cdef inline void _prefetch_row(const void* p, Py_ssize_t nbytes) noexcept nogil:
    """Prefetch ``nbytes`` from ``p`` (one hint per 64-byte line, at most 16)."""
    cdef Py_ssize_t off = 0
    if nbytes > 1024:
        nbytes = 1024
    while off < nbytes:
        SPFUSE_PREFETCH_R(<const char*>p + off)
        off += 64


#: widest dense row :func:`spmm` sums in registers (a GNN's classes, a few heads)
cdef enum:
    SMALL_K = 8


cdef inline Py_ssize_t _row_in_registers(const index_t* ind, const floating* val, Py_ssize_t p0,
                                         Py_ssize_t p1, const floating* bp, floating* orow,
                                         Py_ssize_t K, size_t n, bint add) noexcept nogil:
    """``orow[0:K] = sum(p in p0:p1, val[p] * B[ind[p], 0:K])`` for ``K <= SMALL_K``
    (with ``add``: ``orow[0:K] += `` that sum, rounded to the value type first),
    the sums in registers (a workspace row for a few columns costs a
    store-reload per entry: about 2x slower at K <= 4 on cached operands).  Each output is the same
    sequential sum in double as the workspace path gives.  Returns -1, or
    the position of an index outside ``[0, n)``."""
    cdef double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0, a4 = 0.0, a5 = 0.0, a6 = 0.0, a7 = 0.0, v
    cdef const floating* x
    cdef Py_ssize_t p
    cdef index_t c
    for p in range(p0, p1):
        c = ind[p]
        if <size_t>c >= n:
            return p
        if p + 2 < p1:
            SPFUSE_PREFETCH_R(bp + <Py_ssize_t>ind[p + 2] * K)
        v = <double>val[p]
        x = bp + <Py_ssize_t>c * K
        a0 += v * <double>x[0]
        if K > 1:
            a1 += v * <double>x[1]
            if K > 2:
                a2 += v * <double>x[2]
                if K > 3:
                    a3 += v * <double>x[3]
                    if K > 4:
                        a4 += v * <double>x[4]
                        if K > 5:
                            a5 += v * <double>x[5]
                            if K > 6:
                                a6 += v * <double>x[6]
                                if K > 7:
                                    a7 += v * <double>x[7]
    cdef double sums[SMALL_K]
    sums[0] = a0; sums[1] = a1; sums[2] = a2; sums[3] = a3
    sums[4] = a4; sums[5] = a5; sums[6] = a6; sums[7] = a7
    _store_row(orow, sums, K, add)
    return -1


cdef inline void _store_row(floating* orow, const double* acc, Py_ssize_t K, bint add) noexcept nogil:
    """``orow[0:K] = acc`` in the value type, or with ``add`` ``orow[0:K] +=`` it
    (each sum rounded to the value type before the add, as adding a
    separately made result would)."""
    cdef Py_ssize_t k
    if add:
        for k in range(K):
            orow[k] = orow[k] + <floating>acc[k]
    else:
        for k in range(K):
            orow[k] = <floating>acc[k]


cdef inline double _sddmm_value(int op, double b, double s) noexcept nogil:
    """``b op s`` of the SDDMM family (see SDDMM_OPS)."""
    if op == SDDMM_MUL:
        return b * s
    elif op == SDDMM_DIV:
        return b / s if b != 0.0 else 0.0
    return s


cdef inline Py_ssize_t _bit_length(Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b = 0
    while n > 0:
        b += 1
        n >>= 1
    return b


def _set_chunk_work(double units):
    """_set_chunk_work(units) -> previous value

    Testing hook: work units per thread per chunk of this module's kernels
    (default 2**24, see ``_interrupt.pxd``; values < 1 only query).  Small
    values run small inputs as many chunks, each preceded by a signal check.
    """
    return spfuse_set_chunk_work(units)


# --------------------------------------------------------------------------
# SpMV, SpMM, SDDMM
# --------------------------------------------------------------------------
cdef struct _GatherArgs:
    # spmv and spmm: the dense operand (x, or B with K columns), the output,
    # n = the operand's rows (the indices' bound), the bad index found
    const void* B
    void* out
    Py_ssize_t K, tile, annz
    size_t n
    bint accumulate
    Py_ssize_t* bad
    const _Epilogue* epi
    _Epilogue epi_store
    void** wsp


cdef int _spmv_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                    const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`spmv`'s rows ``[r0, r1)``: runs of rows whose indices are checked
    in one pass, then read; with an epilogue, segments of rows through it in cache."""
    cdef const _GatherArgs* a = <const _GatherArgs*>ctx
    cdef const floating* xp = <const floating*>a.B
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t s0 = r0, s1, i, k
    cdef Py_ssize_t rows = CHECKED_ROWS if a.epi == NULL else EPILOGUE_ROWS
    cdef double* regs = NULL
    if a.epi != NULL:
        regs = <double*>ws_get(a.wsp, 1, 0, a.epi.n_regs * EPILOGUE_ROWS * sizeof(double))
        if regs == NULL:
            return -1
    while s0 < r1:
        s1 = _checked_run(ind, ip, s0, r1, rows, a.n, a.bad)
        if s1 < 0:
            break
        if a.epi == NULL:
            for i in range(s0, s1):
                op[i] = <floating>_gather_dot(ind, val, xp, ip[i], ip[i + 1])
        else:
            for i in range(s0, s1):
                regs[i - s0] = <double><floating>_gather_dot(ind, val, xp, ip[i], ip[i + 1])
            _run_epilogue(a.epi, regs, s1 - s0, 0, s0, 0)
            for k in range(s1 - s0):
                op[s0 + k] = <floating>regs[a.epi.out_reg * (s1 - s0) + k]
        s0 = s1
    return 0


def spmv(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
         const floating[::1] x, floating[::1] out, int num_threads, Py_ssize_t n_cols=-1,
         object epilogue=None):
    """spmv(indptr, indices, data, x, out, num_threads, n_cols=-1, epilogue=None) -> bad

    ``out[i] = sum_p data[p] * x[indices[p]]`` for each row (gather-dot).
    ``x`` None: all ones, so ``out`` holds the row sums of the ``m x n_cols``
    matrix (its indices checked against ``n_cols``).
    ``epilogue``: element-wise operations on the results as they are
    stored, as :func:`spmm`'s, over segments of consecutive rows (an
    argument along the rows is an ``EPI_COL`` one here: ``v[i]``): ``A·x + b``
    in one pass.

    Preconditions: A is ``m x n`` CSR (``len(indptr) == m + 1``, ``indptr``
    non-decreasing, ``indptr[m] <= len(indices)``), ``len(x) == n``,
    ``len(out) == m``; ``out`` must not alias ``x``.  Indices need not be
    sorted (duplicates are summed) and are checked here: the return value is
    -1, or the position of an index outside ``[0, n)`` (``out`` is then
    garbage).  ``out`` is fully overwritten.  Sum of a row: sequential in
    double (as scipy).  Complexity O(nnz + m) work, O(1) extra memory;
    memory bound.
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef const index_t* ip = &indptr[0]
    cdef _GatherArgs a
    if x is None and n_cols < 0:
        raise ValueError("spmv: row sums (x None) need n_cols >= 0")
    a.n = <size_t>(n_cols if x is None else x.shape[0])
    a.B = NULL if x is None else _fptr(x)
    a.out = &out[0] if m > 0 else NULL
    cdef Py_ssize_t bad = -1
    a.bad = &bad   # written by any thread that finds one (any position will do)
    cdef Workspaces ws
    a.epi = NULL
    if epilogue is not None:
        keep = _epilogue_from(epilogue, &a.epi_store)
        a.epi = &a.epi_store
        ws = Workspaces(num_threads, 1)
        a.wsp = ws.ptr
    # work: a random gather per entry (~2 units)
    for_rows("spmv", <block_body>_spmv_rows[floating, index_t], &a, _fptr(data), ip, _iptr(indices), ip, NULL,
             m, 2.0 * <double>(ip[m] - ip[0] + m), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, &bad)
    return bad


def spmv_t(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
           const floating[::1] x, floating[::1] out, int nblocks, int num_threads):
    """spmv_t(indptr, indices, data, x, out, nblocks, num_threads) -> bad

    ``out = Aᵀ @ x`` for CSR ``A`` (m x n): ``out[indices[p]] += data[p] * x[i]``
    for each row ``i`` (scatter-axpy).  It is also ``A @ x`` of a CSC ``A``,
    whose arrays are the CSR of ``Aᵀ``.  ``x`` None: all ones, so ``out``
    holds the column sums.

    The rows are cut into ``nblocks`` fixed blocks balanced by work; block
    ``b`` scatters into its own partial of ``n`` doubles, and the partials
    are added in block order.  The blocks, never ``num_threads``, decide
    the arithmetic, so results are bit-identical on any thread count (the
    caller picks ``nblocks`` from the machine and the work, not the call).
    Preconditions: ``len(indptr) == m + 1``, ``indptr`` non-decreasing with
    ``indptr[m] <= len(indices)``, ``len(x) == m``, ``len(out) == n``,
    ``nblocks >= 1``.  Indices may come in any order (duplicates summed) and
    are checked here: the return value is -1, or the position of an index
    outside ``[0, n)`` (``out`` is then garbage).  ``out`` is fully
    overwritten.  Complexity O(nnz + m + nblocks * n); workspace
    ``8 * n * nblocks`` bytes (``nblocks - 1`` for float64).
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t b, p, nb = nblocks
    cdef const index_t* ip = &indptr[0]
    cdef const index_t* ind = _iptr(indices)
    cdef const floating* val = _fptr(data)
    cdef const floating* xp = NULL if x is None else _fptr(x)
    cdef Py_ssize_t bad = -1   # written by any thread that finds one (any position will do)
    cdef _ScatterArgs a
    if nb < 1:
        raise ValueError(f"spmv_t: nblocks must be >= 1, got {nblocks}")
    if m <= 0 or n == 0:
        for p in range(ip[0] if m >= 0 else 0, ip[m] if m > 0 else 0):
            if <size_t>ind[p] >= <size_t>n:
                return p
        out[:] = 0
        return -1
    if nb > m:
        nb = m
    # block 0 of a float64 call scatters straight into ``out``
    cdef Py_ssize_t own = 1 if floating is double else 0
    # (pooled: recycled pages, each partial zeroed by the thread that scatters
    # into it, where np.zeros' fresh pages faulted in during the scatter)
    cdef double[:, ::1] parts = pooled_empty((nb - own, n), np.dtype(np.float64)) if nb > own else None
    cdef double** accs = <double**>malloc(nb * sizeof(double*))
    if accs == NULL:
        raise MemoryError()
    try:
        if floating is double:
            accs[0] = &out[0]
        for b in range(own, nb):
            accs[b] = &parts[b - own, 0]
        with nogil:
            for b in prange(nb, schedule="static", chunksize=1, num_threads=num_threads):
                memset(accs[b], 0, n * sizeof(double))
        a.accs, a.x, a.n, a.bad = accs, xp, n, &bad
        # work: a random scatter per entry (~2 units)
        for_rows("spmv_t", <block_body>_spmv_t_rows[floating, index_t], &a, val, ip, ind, ip, NULL, m,
                 2.0 * <double>(ip[m] - ip[0] + m), num_threads, FIXED_BLOCKS_STATIC, nb, &bad)
        if bad >= 0:
            return bad
        if nb == own:
            return -1  # float64 on one block: ``out`` holds the sums already
        with nogil:
            _add_partials(accs, nb, &out[0], n, num_threads)
    finally:
        free(accs)
    return -1


cdef struct _ScatterArgs:
    double** accs   # block b's partial (spmv_t) or sum (bilinear)
    const void* x
    const void* w
    Py_ssize_t n
    Py_ssize_t* bad


cdef int _spmv_t_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                      const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`spmv_t`'s rows ``[r0, r1)`` of block ``b``, scattered into its partial."""
    cdef const _ScatterArgs* a = <const _ScatterArgs*>ctx
    cdef const floating* xp = <const floating*>a.x
    cdef double* acc = a.accs[b]
    cdef double xi = 1.0
    cdef Py_ssize_t i, p
    cdef size_t n = <size_t>a.n
    cdef index_t c
    for i in range(r0, r1):
        if xp != NULL:
            xi = <double>xp[i]
        for p in range(ip[i], ip[i + 1]):
            c = ind[p]
            if <size_t>c >= n:
                a.bad[0] = p
                break
            acc[c] += <double>val[p] * xi
    return 0


cdef int _bilinear_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                        const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`bilinear`'s rows ``[r0, r1)`` of block ``b``, summed into its sum:
    runs of rows whose indices are checked in one pass, then read."""
    cdef const _ScatterArgs* a = <const _ScatterArgs*>ctx
    cdef const floating* wp = <const floating*>a.w
    cdef const floating* xp = <const floating*>a.x
    cdef Py_ssize_t i, s0 = r0, s1
    cdef double acc = 0.0   # summed in a private variable, stored once: the blocks' sums share a cache line
    while s0 < r1:
        s1 = _checked_run(ind, ip, s0, r1, CHECKED_ROWS, a.n, a.bad)
        if s1 < 0:
            break
        for i in range(s0, s1):
            acc = acc + <double>wp[i] * _gather_dot(ind, val, xp, ip[i], ip[i + 1])
        s0 = s1
    a.accs[0][b] += acc
    return 0


def bilinear(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
             const floating[::1] w, const floating[::1] x, int nblocks, int num_threads):
    """bilinear(indptr, indices, data, w, x, nblocks, num_threads) -> (value, bad)

    ``wᵀ·A·x = sum_i w[i] * sum_p data[p] * x[indices[p]]`` for CSR ``A``
    (m x n): SpMV whose rows are summed as they are made, never stored.  The
    rows are cut into ``nblocks`` fixed blocks balanced by work; each sums its
    rows in order (a row's dot in double, as :func:`spmv`), and the block
    sums are added in block order: the value depends on ``nblocks``, never on
    ``num_threads``.  Indices are checked as they are read: ``bad`` is -1 or
    the position of an index outside ``[0, n)`` (the value is then garbage).
    Preconditions: ``len(w) == m``, ``len(x) == n``, ``nblocks >= 1``.
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t b, nb = nblocks
    cdef const index_t* ip = &indptr[0]
    cdef Py_ssize_t bad = -1
    cdef double total = 0.0
    cdef _ScatterArgs a
    if nb < 1:
        raise ValueError(f"bilinear: nblocks must be >= 1, got {nblocks}")
    if m <= 0:
        return 0.0, -1
    if nb > m:
        nb = m
    cdef double[::1] sums = np.zeros(nb)
    cdef double* sp = &sums[0]
    a.accs, a.w, a.x, a.n, a.bad = &sp, _fptr(w), _fptr(x), x.shape[0], &bad
    # (dynamic: a thread whose core another process takes over leaves the
    # remaining blocks to its teammate)
    for_rows("bilinear", <block_body>_bilinear_rows[floating, index_t], &a, _fptr(data), ip, _iptr(indices), ip,
             NULL, m, 2.0 * <double>(ip[m] - ip[0] + m), num_threads, FIXED_BLOCKS, nb, &bad)
    if bad >= 0:
        return 0.0, bad
    for b in range(nb):
        total += sp[b]
    return total, -1


cdef inline double _extremum(double acc, double v, bint is_min) noexcept nogil:
    """``acc`` after ``max=`` (``min=``) ``v`` as the executor applies it: a
    NaN, once met, stays; among equal values the first met stays.  A branch:
    cheapest on a chain through ``acc`` (a row), where it is well predicted."""
    if (v < acc if is_min else v > acc) or v != v:
        return v
    return acc


cdef inline double _extremum_ordered(double acc, double v, bint is_min) noexcept nogil:
    """:func:`_extremum` for a ``v`` that is not NaN, as one ``maxsd``/``minsd``
    (``v > acc ? v : acc`` keeps ``acc`` on ties and when ``acc`` is NaN): no
    branch on the values, so neither a row's chain (3.3 -> 1.2 ms on 1M
    entries) nor a scatter's overlapped misses (5.6 -> 1.8 ms) wait on a
    mispredicted compare.  A NaN ``v`` is lost here: the callers note any NaN
    they meet (``v != v``, off the chain) and redo that row or block with
    :func:`_extremum`."""
    if is_min:
        return v if v < acc else acc
    return v if v > acc else acc


cdef inline double _row_extremum(const floating* val, Py_ssize_t start, Py_ssize_t end,
                                 bint is_min) noexcept nogil:
    """The extremum of ``val[start:end]`` in order, NaN and ties as :func:`_extremum`."""
    cdef double v, acc = INFINITY if is_min else -INFINITY
    cdef bint nan = False
    cdef Py_ssize_t p
    for p in range(start, end):
        v = <double>val[p]
        acc = _extremum_ordered(acc, v, is_min)
        nan = nan | (v != v)
    if nan:   # the exact walk: which NaN stays (rare; the row is in cache)
        acc = INFINITY if is_min else -INFINITY
        for p in range(start, end):
            acc = _extremum(acc, <double>val[p], is_min)
    return acc


def row_extremum(const index_t[::1] indptr, const floating[::1] data, floating[::1] out,
                 Py_ssize_t n_cols, bint is_min, int num_threads):
    """row_extremum(indptr, data, out, n_cols, is_min, num_threads)

    ``out[i] = max(j, A[i, j])`` (``min`` with ``is_min``) over all ``n_cols``
    columns of CSR ``A``: the stored values of row ``i``, and the implicit
    zeros when the row stores fewer than ``n_cols`` entries (an empty row
    gives 0).  NaN and ties as the executor's ``max=`` (:func:`_extremum`).
    Preconditions: canonical A (no duplicates: the count of a row decides
    its implicit zeros), ``n_cols >= 1``.  Indices are not read.
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef const index_t* ip = &indptr[0]
    cdef _ExtremumArgs a
    a.out = &out[0] if m > 0 else NULL
    a.n_cols = n_cols
    a.is_min = is_min
    for_rows("row_extremum", <block_body>_row_extremum_rows[floating, index_t], &a, _fptr(data), ip, NULL, ip,
             NULL, m, <double>(ip[m] - ip[0] + m), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


cdef struct _ExtremumArgs:
    void* out
    Py_ssize_t n_cols
    bint is_min


cdef int _row_extremum_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                            const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`row_extremum`'s rows ``[r0, r1)``."""
    cdef const _ExtremumArgs* a = <const _ExtremumArgs*>ctx
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t i
    cdef double acc
    for i in range(r0, r1):
        acc = _row_extremum(val, ip[i], ip[i + 1], a.is_min)
        if ip[i + 1] - ip[i] < a.n_cols:
            acc = _extremum(acc, 0.0, a.is_min)
        op[i] = <floating>acc
    return 0


cdef inline void _start_extrema(double* e, Py_ssize_t n, Py_ssize_t width, double start) noexcept nogil:
    """``n`` extrema (with ``width`` 2: (extremum, count) pairs) set to ``start`` (and 0)."""
    cdef Py_ssize_t j
    for j in range(n):
        e[width * j] = start
        if width == 2:
            e[width * j + 1] = 0.0


cdef inline bint _scatter_extrema(const index_t* ip, const index_t* ind, const floating* val, double* e,
                                  Py_ssize_t width, Py_ssize_t r0, Py_ssize_t r1, bint is_min,
                                  bint exact) noexcept nogil:
    """Rows ``[r0, r1)`` into the extrema ``e`` (with ``width`` 2 interleaved
    with their counts); True when a NaN was met and ``exact`` is False (the
    extrema are then not the executor's: the caller redoes them with ``exact``)."""
    cdef Py_ssize_t i, p, j
    cdef double v
    cdef bint nan = False
    for i in range(r0, r1):
        for p in range(ip[i], ip[i + 1]):
            j = width * <Py_ssize_t>ind[p]
            v = <double>val[p]
            if exact:
                e[j] = _extremum(e[j], v, is_min)
            else:
                e[j] = _extremum_ordered(e[j], v, is_min)
                nan = nan | (v != v)
            if width == 2:
                e[j + 1] += 1.0
    return nan


cdef inline bint _has_empty_row(const index_t* ip, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(m):
        if ip[i + 1] == ip[i]:
            return True
    return False


cdef struct _ColExtremaArgs:
    double* extrema   # block b's at ``extrema + b * stride``
    Py_ssize_t stride, width
    unsigned char* nan_met
    bint is_min


cdef int _col_extremum_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                            const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`col_extremum`'s rows ``[r0, r1)`` of block ``b`` into its extrema."""
    cdef const _ColExtremaArgs* a = <const _ColExtremaArgs*>ctx
    if _scatter_extrema(ip, ind, val, a.extrema + b * a.stride, a.width, r0, r1, a.is_min, False):
        a.nan_met[b] = 1
    return 0


def col_extremum(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
                 floating[::1] out, bint is_min, int nblocks, int num_threads):
    """col_extremum(indptr, indices, data, out, is_min, nblocks, num_threads)

    ``out[j] = max(i, A[i, j])`` (``min`` with ``is_min``) over all ``m`` rows
    of CSR ``A`` (m x n, ``len(out) == n``): the stored values of column
    ``j``, and the implicit zeros when it stores fewer than ``m``.  The rows
    are cut into ``nblocks`` fixed blocks (as :func:`spmv_t`); each keeps its
    own extremum and count per column, combined in block order, so NaN and
    ties come out as the executor's row-order walk gives them, on any thread
    count and any number of blocks (at most ``num_threads`` are used; a block
    that meets a NaN is redone with the exact select).  Counts are kept only
    when every row stores something: else no column is full, and every one
    sees an implicit zero.
    Preconditions: canonical A with valid indices, ``m >= 1``,
    ``nblocks >= 1``.  Workspace ``16 * n * nblocks`` bytes (counts kept
    as doubles: exact below 2**53 rows; 8 without counts).
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t b, j, nb = nblocks
    cdef const index_t* ip = &indptr[0]
    cdef const index_t* ind = _iptr(indices)
    cdef const floating* val = _fptr(data)
    cdef double acc, cnt, start = INFINITY if is_min else -INFINITY
    if nb < 1:
        raise ValueError(f"col_extremum: nblocks must be >= 1, got {nblocks}")
    if n == 0:
        return
    # an extremum combined in block order is the row-order walk's whatever the
    # blocks (the first of equals stays, the last NaN wins, counts are exact):
    # no more blocks, and partials, than threads
    if nb > num_threads:
        nb = num_threads if num_threads > 0 else 1
    if nb > m:
        nb = m if m > 0 else 1
    # a column is full only when every row stores something (and then it needs
    # its count, kept beside its extremum: one cache line per scattered entry)
    cdef Py_ssize_t width = 1 if m == 0 or ip[m] - ip[0] < m or _has_empty_row(ip, m) else 2
    cdef double[:, ::1] ws = np.empty((nb, width * n))
    cdef unsigned char[::1] nan_met = np.zeros(nb, np.uint8)
    with nogil:   # each block's extrema set up by the thread that scatters into them
        for b in prange(nb, schedule="static", chunksize=1, num_threads=num_threads):
            _start_extrema(&ws[b, 0], n, width, start)
    cdef _ColExtremaArgs a
    a.extrema, a.stride, a.width, a.nan_met, a.is_min = &ws[0, 0], width * n, width, &nan_met[0], is_min
    for_rows("col_extremum", <block_body>_col_extremum_rows[floating, index_t], &a, val, ip, ind, ip, NULL, m,
             2.0 * <double>(ip[m] - ip[0] + m), num_threads, FIXED_BLOCKS_STATIC, nb, NULL)
    for b in range(nb):
        if nan_met[b]:   # redo the block's rows with the exact select (a NaN is rare)
            with nogil:
                _start_extrema(&ws[b, 0], n, width, start)
                _scatter_extrema(ip, ind, val, &ws[b, 0], width, split(ip, NULL, m, b, nb), split(ip, NULL, m, b + 1, nb),
                                 is_min, True)
    with nogil:
        for j in prange(n, schedule="static", num_threads=num_threads):
            acc = ws[0, width * j]
            cnt = ws[0, width * j + 1] if width == 2 else 0.0
            for b in range(1, nb):
                acc = _extremum(acc, ws[b, width * j], is_min)
                if width == 2:
                    cnt = cnt + ws[b, width * j + 1]
            if cnt < <double>m:
                acc = _extremum(acc, 0.0, is_min)
            out[j] = <floating>acc


# Row epilogues (see :func:`spmm`'s ``epilogue``; the interpreter is
# ``_epilogue.pxd``, shared with gemm's row blocks).
#: the epilogue opcodes by operator name (``None``: a copy; ``round``: to float32)
EPILOGUE_OPS = {None: EPI_COPY, "+": EPI_ADD, "-": EPI_SUB, "*": EPI_MUL, "/": EPI_DIV, "relu": EPI_RELU,
                "neg": EPI_NEG, "abs": EPI_ABS, "sqrt": EPI_SQRT, "round": EPI_ROUND, "where": EPI_WHERE}
#: the epilogue argument kinds: a register, a constant, ``v[i]`` (the row's),
#: ``v[k]`` (the column's), ``M[i, k]`` (a C-ordered matrix of the output's shape)
EPILOGUE_ARGS = {"register": EPI_REG, "constant": EPI_CONST, "row": EPI_ROW, "column": EPI_COL,
                 "matrix": EPI_MATRIX}


cdef enum:
    EPILOGUE_ROWS = 256   # rows an SpMV epilogue works on at a time (in cache, interpretation amortised)


def spmm(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
         const floating[:, ::1] B, floating[:, ::1] out, int num_threads, Py_ssize_t tile=K_TILE,
         bint accumulate=False, object epilogue=None):
    """spmm(indptr, indices, data, B, out, num_threads, tile=SPMM_K_TILE, accumulate=False, epilogue=None) -> bad

    ``out = A @ B`` for CSR ``A`` (m x n) and dense C-contiguous ``B`` (n x K);
    with ``accumulate``, ``out += A @ B`` (each row's sum rounded to the
    value type, then added: what adding a separate product gives) -- a sum
    of SpMMs accumulates term after term into one result, with no
    temporary per term and no pass adding them.

    ``epilogue``: element-wise operations applied to each output row as it
    is stored (``relu(A @ B + b)``, ``c * (A @ B)``), a small register
    program ``(code, kinds, refs, consts, n_regs, out_reg)``: the row
    segment (rounded to the value type) is register 0, each instruction
    ``(opcode, destination, first argument, argument count)`` of
    ``EPI_COPY``..``EPI_WHERE`` works on the segment in float64 over
    arguments ``EPI_REG``..``EPI_MATRIX`` (float64 arrays by address: the
    caller keeps them alive and of the right lengths), and register
    ``out_reg`` is stored.  Not with ``accumulate``.

    Row-axpy: for each row ``i`` and each ``p`` in it,
    ``acc += data[p] * B[indices[p], :]`` into a thread-private double
    accumulator of ``tile`` columns; ``K`` larger than that is processed tile
    by tile (the row's nnz are re-read per tile, from L1).  ``tile`` is the
    tile the planner's tiling pass chose (``Plan.tiles``); ``0`` (or any
    ``tile >= K``) means untiled: the accumulator spans the whole row.
    Tiling never changes results: each output entry is the same sequential
    sum in double whatever the tile.  A row of ``K <= 8`` columns is summed
    in registers instead (:func:`_row_in_registers`; the same sums).
    Preconditions: ``out`` is C-contiguous ``(m, K)``, does not alias ``B``;
    ``indptr`` non-decreasing with ``indptr[m] <= len(indices)``; ``tile >= 0``.
    Indices may come in any order and are checked here: the return value is
    -1, or the position of an index outside ``[0, n)`` (``out`` is then
    garbage).  ``out`` is fully
    overwritten (empty rows become 0; with ``accumulate`` they keep their values).  Complexity O(nnz * K + m * K);
    workspace ``8 * min(tile or K, K)`` bytes/thread.
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t K = out.shape[1]
    cdef Py_ssize_t p
    cdef const index_t* ip = &indptr[0]
    cdef const index_t* ind = _iptr(indices)
    cdef Py_ssize_t bad = -1
    cdef _GatherArgs a
    a.B = &B[0, 0] if B.shape[0] > 0 and K > 0 else NULL
    a.out = &out[0, 0] if m > 0 and K > 0 else NULL
    a.K = K
    a.n = <size_t>B.shape[0]
    a.annz = ip[m]
    a.accumulate = accumulate
    a.bad = &bad   # written by any thread that finds one
    a.epi = NULL
    if tile < 0:
        raise ValueError(f"spmm: tile must be >= 0 (0 = untiled), got {tile}")
    if epilogue is not None:
        if accumulate:
            raise ValueError("spmm: an epilogue does not accumulate")
        keep = _epilogue_from(epilogue, &a.epi_store)
        a.epi = &a.epi_store
    if m == 0:
        return -1
    if K == 0:  # nothing is gathered, but an index is still wrong when it is
        for p in range(ip[0], a.annz):
            if <size_t>ind[p] >= a.n:
                return p
        return -1
    a.tile = K if tile == 0 or tile > K else tile
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # work: K multiply-adds + a row fetch per entry
    for_rows("spmm", <block_body>_spmm_rows[floating, index_t], &a, _fptr(data), ip, ind, ip, NULL, m,
             <double>(a.annz - ip[0] + m) * <double>(K + 8), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD,
             &bad)
    return bad


cdef int _spmm_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                    const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`spmm`'s rows ``[r0, r1)``: each row tile by tile into the
    thread's accumulator (or in registers for ``K <= SMALL_K``), through
    the epilogue if any, then stored."""
    cdef const _GatherArgs* a = <const _GatherArgs*>ctx
    cdef const floating* bp = <const floating*>a.B
    cdef floating* op = <floating*>a.out
    cdef Py_ssize_t K = a.K, tile = a.tile, annz = a.annz, i, p, k, k0, kw, q
    cdef size_t n = a.n
    cdef Py_ssize_t n_regs = 0 if a.epi == NULL else a.epi.n_regs
    cdef double* acc = <double*>ws_get(a.wsp, 1, 0, (1 + n_regs) * tile * sizeof(double))
    cdef double* regs
    cdef floating* orow
    cdef index_t c
    if acc == NULL:
        return -1
    if K <= SMALL_K and a.epi == NULL:
        for i in range(r0, r1):
            q = _row_in_registers(ind, val, ip[i], ip[i + 1], bp, op + i * K, K, n, a.accumulate)
            if q >= 0:
                a.bad[0] = q
        return 0
    for i in range(r0, r1):
        orow = op + i * K
        k0 = 0
        while k0 < K:
            kw = K - k0
            if kw > tile:
                kw = tile
            memset(acc, 0, kw * sizeof(double))
            for p in range(ip[i], ip[i + 1]):
                c = ind[p]
                if <size_t>c >= n:
                    a.bad[0] = p
                    break
                if p + 2 < annz:  # a prefetch of a wild address is harmless
                    _prefetch_row(bp + <Py_ssize_t>ind[p + 2] * K + k0, kw * sizeof(floating))
                _axpy(acc, <double>val[p], bp + <Py_ssize_t>c * K + k0, kw)
            if a.epi != NULL:
                regs = acc + tile
                for k in range(kw):
                    regs[k] = <double><floating>acc[k]
                _run_epilogue(a.epi, regs, kw, i, k0, K)
                _store_row(orow + k0, regs + a.epi.out_reg * kw, kw, False)
            else:
                _store_row(orow + k0, acc, kw, a.accumulate)
            k0 = k0 + kw
    return 0


cdef Py_ssize_t[::1] _owned_ranges(const index_t* ind, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t n,
                                   Py_ssize_t nb):
    """Bounds of ``nb`` ranges of ``[0, n)`` holding about equal shares of the
    entries ``ind[p0:p1]`` fall in, estimated from every ``stride``-th
    entry (about 2**16 of them: a power-law matrix's heavy rows would leave
    one thread most of the work in ranges of equal length).  Only the
    ownership depends on it, never the arithmetic."""
    cdef Py_ssize_t[::1] bounds = np.empty(nb + 1, np.intp)
    cdef Py_ssize_t b, j, p, seen = 0, total = 0
    cdef Py_ssize_t stride = max(1, (p1 - p0) >> 16)
    cdef Py_ssize_t[::1] counts
    cdef index_t c
    bounds[0] = 0
    bounds[nb] = n
    if nb == 1:
        return bounds
    counts = np.zeros(n, np.intp)
    with nogil:
        p = p0
        while p < p1:
            c = ind[p]
            if <size_t>c < <size_t>n:   # (a bad index is found by the scatter)
                counts[c] += 1
                total += 1
            p += stride
        b = 1
        for j in range(n):
            while b < nb and seen * nb >= total * b:
                bounds[b] = j
                b += 1
            seen += counts[j]
        while b < nb:
            bounds[b] = n
            b += 1
    return bounds


#: the most terms one ``spmm_t`` walk sums (the first plus ``terms``)
cdef enum:
    MAX_SUM_TERMS = 4
SUM_TERMS = MAX_SUM_TERMS


cdef int _sum_terms(str kernel, tuple terms, const floating[::1] data, const floating[:, ::1] B,
                    const floating** vals, const floating** bps) except -1:
    """Fill ``vals``/``bps`` with the values and dense rows of the first term
    (``data``, ``B``) and of each ``(data_t, B_t)`` in ``terms``; returns
    their number (``terms`` None: one).  Raises ``ValueError`` for a term
    not of the call's value dtype and layout or shape, or too many terms.
    (None, not ``()``, is the default: a fused def function mis-bound a
    ``()`` default that followed a C-constant one.)"""
    if terms is None:
        terms = ()
    cdef int t, nterms = 1 + len(terms)
    cdef const floating[::1] tdata
    cdef const floating[:, ::1] tB
    if nterms > MAX_SUM_TERMS:
        raise ValueError(f"{kernel}: at most {MAX_SUM_TERMS} terms, got {nterms}")
    vals[0] = _fptr(data)
    bps[0] = &B[0, 0] if B.shape[0] > 0 and B.shape[1] > 0 else NULL
    for t in range(1, nterms):
        term = terms[t - 1]
        if not isinstance(term, tuple) or len(term) != 2:
            raise ValueError(f"{kernel}: a term is (data, B)")
        try:
            tdata, tB = term
        except (TypeError, ValueError) as e:
            raise ValueError(f"{kernel}: term {t} is not of the call's value dtype or layout: {e}") from None
        if tdata.shape[0] < data.shape[0] or tB.shape[0] != B.shape[0] or tB.shape[1] != B.shape[1]:
            raise ValueError(f"{kernel}: term {t} has the wrong shape")
        vals[t] = _fptr(tdata)
        bps[t] = &tB[0, 0] if tB.shape[0] > 0 and tB.shape[1] > 0 else NULL
    return nterms


cdef struct _SpmmTArgs:
    const void** vals   # the terms' values (the first is the rows' own) and dense factors
    const void** bps
    int nterms
    double* acc
    const Py_ssize_t* owned   # teammate b owns output rows [owned[b], owned[b + 1])
    Py_ssize_t n, K
    Py_ssize_t* bad


cdef int _spmm_t_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                      const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`spmm_t`'s rows ``[r0, r1)`` scattered by teammate ``b`` into the output rows it owns."""
    cdef const _SpmmTArgs* a = <const _SpmmTArgs*>ctx
    cdef const floating** vals = <const floating**>a.vals
    cdef const floating** bps = <const floating**>a.bps
    cdef const floating* bp = bps[0]
    cdef Py_ssize_t j0 = a.owned[b], j1 = a.owned[b + 1], K = a.K, i, p, t
    cdef size_t n = <size_t>a.n
    cdef int nterms = a.nterms
    cdef double* acc = a.acc
    cdef index_t c
    for i in range(r0, r1):
        for p in range(ip[i], ip[i + 1]):
            c = ind[p]
            if <size_t>c >= n:
                a.bad[0] = p
                break
            if <size_t>(c - j0) < <size_t>(j1 - j0):
                _axpy(acc + <Py_ssize_t>c * K, <double>val[p], bp + i * K, K)
                for t in range(1, nterms):
                    _axpy(acc + <Py_ssize_t>c * K, <double>vals[t][p], bps[t] + i * K, K)
    return 0


def spmm_t(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
           const floating[:, ::1] B, floating[:, ::1] out, int num_threads=1, tuple terms=None):
    """spmm_t(indptr, indices, data, B, out, num_threads=1, terms=None) -> bad

    ``out = Aᵀ @ B`` for CSR ``A`` (m x n) and dense C-contiguous ``B``
    (m x K), without transposing ``A``: each entry ``p`` of row ``i``
    scatters ``data[p] * B[i, :]`` into ``out[indices[p], :]``
    (scatter-axpy), rows in order, so every element is the sequential sum
    over rows -- on any number of threads: a team splits the *output rows*
    into one range per thread, each thread walking every row of ``A`` and
    scattering only the entries whose column falls in its range (the
    indices are read once per thread; the K-wide multiply-adds, the work,
    once in all; the ranges hold about equal numbers of entries, see
    :func:`_owned_ranges`).  No partial results, and bit-identical to one thread.
    (A team splitting the output's *columns* ran slower on 2 threads than
    on one: each thread did every row fetch for half a row of work.)
    It is also ``A @ B`` of a CSC ``A``.  Sums are accumulated in double:
    in ``out`` itself for float64, in an (n x K) double buffer for float32.

    ``terms``: up to ``SUM_TERMS - 1`` more ``(data_t, B_t)`` summed in the
    same walk, ``out = Σ A_tᵀ @ B_t`` where ``A_t`` stores ``data_t`` on
    ``A``'s pattern (a gradient reaching one operand along several paths):
    per entry, the output row is read and written once for all terms,
    which add in term order.

    Preconditions: ``len(indptr) == m + 1``, ``indptr`` non-decreasing with
    ``indptr[m] <= len(indices)``, ``B`` is ``(m, K)``, ``out`` is
    C-contiguous ``(n, K)`` and aliases no ``B``; each ``data_t`` is as
    long as ``data`` and each ``B_t`` is shaped as ``B`` (else
    ``ValueError``).  Indices may come in
    any order (duplicates summed) and are checked here: the return value is
    -1, or the position of an index outside ``[0, n)`` (``out`` is then
    garbage).  ``out`` is fully overwritten.  Complexity O(terms * (nnz * K) + n * K)
    work, O(nnz * num_threads) index reads; a team only when ``out`` is
    over 4 MiB (see ``_set_spmm_t_team_min_bytes``).
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t n = out.shape[0], K = out.shape[1]
    cdef Py_ssize_t i, p, nb
    cdef const index_t* ip = &indptr[0]
    cdef const index_t* ind = _iptr(indices)
    cdef const floating* vals[MAX_SUM_TERMS]
    cdef const floating* bps[MAX_SUM_TERMS]
    cdef int nterms = _sum_terms("spmm_t", terms, data, B, vals, bps)
    cdef const floating* val = vals[0]
    cdef floating* op
    cdef double* acc
    cdef double[::1] work
    cdef Py_ssize_t bad = -1   # written by any thread that finds one (any position will do)
    if m <= 0 or n == 0 or K == 0:   # nothing is scattered, but an index is still wrong when it is
        for p in range(ip[0] if m > 0 else 0, ip[m] if m > 0 else 0):
            if <size_t>ind[p] >= <size_t>n:
                return p
        if n > 0 and K > 0:
            memset(&out[0, 0], 0, n * K * sizeof(floating))
        return -1
    op = &out[0, 0]
    if floating is double:
        acc = <double*>op
        memset(acc, 0, n * K * sizeof(double))
    else:
        work = np.zeros(n * K)
        acc = &work[0]
    # a team only for an output past a core's cache: below it, one thread's
    # scatter stays in cache and a second thread's walk of the indices costs
    # more than it takes over (20000 x 16: 2.0 ms on one thread, 2.1 on two;
    # 20000 x 32, 5 MiB: 8.6 against 4.6; 100k x 16: 29 against 11)
    nb = num_threads if num_threads > 1 and n * K * <Py_ssize_t>sizeof(double) > _spmm_t_team_min_bytes else 1
    if nb > n:
        nb = n
    cdef Py_ssize_t[::1] owned = _owned_ranges(ind, ip[0], ip[m], n, nb)
    cdef _SpmmTArgs a
    a.vals, a.bps, a.nterms = <const void**>vals, <const void**>bps, nterms
    a.acc, a.owned, a.n, a.K, a.bad = acc, &owned[0], n, K, &bad
    # work: K multiply-adds per term + a row fetch per entry, as spmm's (chunks between interrupt checks);
    # one teammate, the whole output, on one thread: the plain scatter
    for_rows("spmm_t", <block_body>_spmm_t_rows[floating, index_t], &a, val, ip, ind, ip, NULL, m,
             <double>(ip[m] - ip[0] + m) * <double>(nterms * K + 8), nb, TEAM, nb, &bad)
    if bad >= 0:
        return bad
    if floating is not double:
        for i in range(n * K):
            op[i] = <floating>acc[i]
    return -1


def sddmm(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] bdata,
          const floating[:, ::1] C, const floating[:, ::1] Dt, floating[::1] out_data,
          int op, int num_threads):
    """sddmm(indptr, indices, bdata, C, Dt, out_data, op, num_threads)

    Sampled dense-dense product on B's pattern.

    For each stored ``p`` of row ``i`` of CSR ``B`` (m x n), ``j = indices[p]``,
    ``s = dot(C[i, :], Dt[j, :])`` (double, 8 chains) and
    ``op == 0`` (mul): ``out_data[p] = bdata[p] * s``;
    ``op == 1`` (div): ``out_data[p] = bdata[p] / s`` if ``bdata[p] != 0`` else 0
    (sparse convention 0/x = 0; b/0 gives inf/nan as in numpy);
    ``op == 2`` (dot): ``out_data[p] = s`` (masked GEMM, ``bdata`` unused).
    The result has B's pattern (reuse ``indptr``/``indices``).
    Preconditions: ``C`` is (m, K), ``Dt`` is (n, K), both C-contiguous;
    ``len(out_data) == len(bdata) == nnz``; ``out_data`` may alias ``bdata``.
    Complexity O(nnz * K); no workspace.
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef Py_ssize_t K = C.shape[1]
    cdef const index_t* ip = &indptr[0]
    cdef _SddmmArgs a
    a.C = &C[0, 0] if C.shape[0] > 0 and K > 0 else NULL
    a.Dt = &Dt[0, 0] if Dt.shape[0] > 0 and K > 0 else NULL
    a.out = &out_data[0] if out_data.shape[0] > 0 else NULL
    a.K = K
    a.annz = ip[m]
    a.op = op
    # work: a K-dot + a row fetch per entry
    for_rows("sddmm", <block_body>_sddmm_rows[floating, index_t], &a, _fptr(bdata), ip, _iptr(indices), ip,
             NULL, m, <double>(a.annz - ip[0] + m) * <double>(K + 8), num_threads, DYNAMIC_BLOCKS,
             BLOCKS_PER_THREAD, NULL)


cdef struct _SddmmArgs:
    const void* C
    const void* Dt
    void* out
    Py_ssize_t K, annz
    int op


cdef int _sddmm_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* bv,
                     const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`sddmm`'s rows ``[r0, r1)``."""
    cdef const _SddmmArgs* a = <const _SddmmArgs*>ctx
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.Dt
    cdef floating* ov = <floating*>a.out
    cdef Py_ssize_t K = a.K, annz = a.annz, i, p
    cdef int op = a.op
    for i in range(r0, r1):
        for p in range(ip[i], ip[i + 1]):
            if p + 2 < annz:
                _prefetch_row(dp + <Py_ssize_t>ind[p + 2] * K, K * sizeof(floating))
            ov[p] = <floating>_sddmm_value(op, <double>bv[p], _dot(cp + i * K, dp + <Py_ssize_t>ind[p] * K, K))
    return 0


def scale(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
          const floating[::1] r, const floating[::1] c, floating[::1] out_data, int num_threads):
    """scale(indptr, indices, data, r, c, out_data, num_threads)

    ``D_r · A · D_c`` on A's pattern: ``out_data[p] = r[i] * data[p] * c[j]``
    for each stored ``p`` of row ``i``, ``j = indices[p]`` (in that order of
    multiplication, rounded once); ``r`` or ``c`` None: ones on that side.
    Preconditions: CSR ``A`` (m x n) with valid indices, ``len(r) == m``,
    ``len(c) == n``, ``len(out_data) == len(data)``; ``out_data`` may alias
    ``data``.  One pass, memory bound: O(nnz + m).
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef const index_t* ip = &indptr[0]
    cdef _ScaleArgs a
    a.r = NULL if r is None else _fptr(r)
    a.c = NULL if c is None else _fptr(c)
    a.out = &out_data[0] if out_data.shape[0] > 0 else NULL
    for_rows("scale", <block_body>_scale_rows[floating, index_t], &a, _fptr(data), ip, _iptr(indices), ip,
             NULL, m, 2.0 * <double>(ip[m] - ip[0] + m), num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)


cdef struct _ScaleArgs:
    const void* r
    const void* c
    void* out


cdef int _scale_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                     const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`scale`'s rows ``[r0, r1)``."""
    cdef const _ScaleArgs* a = <const _ScaleArgs*>ctx
    cdef const floating* rp = <const floating*>a.r
    cdef const floating* cp = <const floating*>a.c
    cdef floating* ov = <floating*>a.out
    cdef Py_ssize_t i, p
    cdef double ri
    for i in range(r0, r1):
        ri = 1.0 if rp == NULL else <double>rp[i]
        if cp == NULL:
            for p in range(ip[i], ip[i + 1]):
                ov[p] = <floating>(ri * <double>val[p])
        else:
            for p in range(ip[i], ip[i + 1]):
                ov[p] = <floating>(ri * <double>val[p] * <double>cp[ind[p]])
    return 0


# --------------------------------------------------------------------------
# SpGEMM (Gustavson, two phases)
# --------------------------------------------------------------------------
cdef inline double _spgemm_work(const index_t* aip, Py_ssize_t m, const index_t* bip,
                                Py_ssize_t nbr, double per_flop) noexcept nogil:
    """Estimated work of a SpGEMM phase: ``per_flop`` units per expected flop
    (nnz(A) * mean row length of B, O(1): the exact count would cost a pass
    over A) plus the row and entry overheads."""
    cdef double annz = <double>(aip[m] - aip[0])
    cdef double avg = <double>(bip[nbr] - bip[0]) / <double>nbr if nbr > 0 else 0.0
    return per_flop * annz * avg + 4.0 * (annz + <double>m)


def spgemm_symbolic(const index_t[::1] a_indptr, const index_t[::1] a_indices,
                    const index_t[::1] b_indptr, const index_t[::1] b_indices,
                    Py_ssize_t n_cols, int64_t[::1] row_nnz, int num_threads):
    """spgemm_symbolic(a_indptr, a_indices, b_indptr, b_indices, n_cols, row_nnz, num_threads)

    Phase 1 of ``C = A @ B``: ``row_nnz[i]`` = number of distinct columns of row i.

    Preconditions: A is ``m x n`` CSR, B is ``n x n_cols`` CSR, indices in
    range (any order, duplicates allowed — they count once), ``len(row_nnz)
    == m``.  Each thread owns a marker array of ``n_cols`` index_t (stamp =
    row number).  Complexity O(flops + m) with flops = sum over A's entries
    of the length of the B row they select; workspace n_cols * itemsize per
    thread.
    """
    cdef Py_ssize_t m = a_indptr.shape[0] - 1
    cdef const index_t* aip = &a_indptr[0]
    cdef _SpgemmArgs a
    if m == 0:
        return
    a.aip, a.aind, a.bip, a.bind = aip, _iptr(a_indices), &b_indptr[0], _iptr(b_indices)
    a.annz = aip[m]
    a.n_cols = n_cols
    a.out = &row_nnz[0]
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    for_rows("spgemm_symbolic", <block_body>_spgemm_symbolic_rows[index_t], &a, NULL, aip, a.aind, aip, NULL, m,
             _spgemm_work(aip, m, &b_indptr[0], b_indptr.shape[0] - 1, 8.0), num_threads, DYNAMIC_BLOCKS,
             4 * BLOCKS_PER_THREAD, NULL)


cdef struct _SpgemmArgs:
    # the CSR operands beside the rows' own (A, the mask M, the result C) and B
    const void* aip
    const void* aind
    const void* aval
    const void* mip
    const void* mind
    const void* mval
    const void* bip
    const void* bind
    const void* bval
    const void* cip
    void* cind
    void* out
    unsigned char* hit
    Py_ssize_t annz, mnnz, n_cols
    bint b_transposed
    void** wsp


cdef int _spgemm_symbolic_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const void* unused,
                               const index_t* aip, const index_t* aind) noexcept nogil:
    """:func:`spgemm_symbolic`'s rows ``[r0, r1)``: distinct columns counted
    against the thread's marker array (stamp = row number)."""
    cdef const _SpgemmArgs* a = <const _SpgemmArgs*>ctx
    cdef const index_t* bip = <const index_t*>a.bip
    cdef const index_t* bind = <const index_t*>a.bind
    cdef int64_t* rn = <int64_t*>a.out
    cdef Py_ssize_t annz = a.annz, i, p, q, z, cnt
    cdef index_t j, k
    cdef void** slot = ws_slot(a.wsp, 1, 0)
    cdef index_t* mark
    if slot[0] == NULL:   # the thread's first block: its marker array
        mark = <index_t*>spfuse_ws_alloc((a.n_cols + 1) * sizeof(index_t), 0)
        if mark == NULL:
            return -1
        for z in range(a.n_cols):
            mark[z] = -1
        slot[0] = mark
    mark = <index_t*>slot[0]
    for i in range(r0, r1):
        cnt = 0
        for p in range(aip[i], aip[i + 1]):
            j = aind[p]
            # software pipeline (see spgemm_numeric)
            if p + 3 < annz:
                SPFUSE_PREFETCH_R(&bip[aind[p + 3]])
            if p + 2 < annz:
                SPFUSE_PREFETCH_R(&bind[bip[aind[p + 2]]])
            if p + 1 < annz:
                for q in range(bip[aind[p + 1]], bip[aind[p + 1] + 1]):
                    SPFUSE_PREFETCH_W(&mark[bind[q]])
            for q in range(bip[j], bip[j + 1]):
                k = bind[q]
                if mark[k] != <index_t>i:
                    mark[k] = <index_t>i
                    cnt = cnt + 1
        rn[i] = cnt
    return 0


cdef bint _bitmap_ws(void** wsp, int k, int first, Py_ssize_t n_cols) noexcept nogil:
    """The calling thread's scatter workspace in slots ``first`` to
    ``first + 2`` of its ``k``: a double accumulator per column, a zeroed bit
    per column and a zeroed summary bit per 64 columns, made on first use;
    False if an allocation fails."""
    cdef Py_ssize_t nw = (n_cols + 63) >> 6
    cdef void** sv = ws_slot(wsp, k, first)
    cdef void** sb = ws_slot(wsp, k, first + 1)
    cdef void** sw = ws_slot(wsp, k, first + 2)
    if sv[0] == NULL:
        sv[0] = spfuse_ws_alloc((n_cols + 1) * sizeof(double), 0)
    if sb[0] == NULL:
        sb[0] = spfuse_ws_alloc((nw + 1) * sizeof(uint64_t), 1)
    if sw[0] == NULL:
        sw[0] = spfuse_ws_alloc((((nw + 63) >> 6) + 1) * sizeof(uint64_t), 1)
    return sv[0] != NULL and sb[0] != NULL and sw[0] != NULL


cdef inline void _masked_row_saxpy(Py_ssize_t i, const index_t* mip, const index_t* mind, const floating* mval,
                                   const index_t* aip, const index_t* aind, const floating* aval,
                                   const index_t* bip, const index_t* bind, const floating* bval,
                                   Py_ssize_t annz, double* acc, unsigned char* flag,
                                   floating* ov, unsigned char* hp) noexcept nogil:
    """Row ``i`` of :func:`masked_spgemm` with B as CSR: M's row marks its
    columns, A's row scatters B's rows only there (the flags left zeroed)."""
    cdef Py_ssize_t p, q
    cdef index_t j, k
    cdef double v
    for p in range(mip[i], mip[i + 1]):
        flag[mind[p]] = 1
        acc[mind[p]] = 0.0
    for q in range(aip[i], aip[i + 1]):
        j = aind[q]
        v = aval[q]
        # software pipeline over A's entries (contiguous across rows), as
        # spgemm_numeric: B's row pointer of q+3, B's row of q+2
        if q + 3 < annz:
            SPFUSE_PREFETCH_R(&bip[aind[q + 3]])
        if q + 2 < annz:
            SPFUSE_PREFETCH_R(&bind[bip[aind[q + 2]]])
        for p in range(bip[j], bip[j + 1]):
            k = bind[p]
            if flag[k]:
                acc[k] += v * <double>bval[p]
                flag[k] = 2
    for p in range(mip[i], mip[i + 1]):
        k = mind[p]
        hp[p] = flag[k] == 2
        ov[p] = <floating>(<double>mval[p] * acc[k]) if flag[k] == 2 else 0
        flag[k] = 0


cdef inline void _masked_row_dot(Py_ssize_t i, const index_t* mip, const index_t* mind, const floating* mval,
                                 const index_t* aip, const index_t* aind, const floating* aval,
                                 const index_t* bip, const index_t* bind, const floating* bval,
                                 Py_ssize_t mnnz, double* row, uint64_t* bits,
                                 floating* ov, unsigned char* hp) noexcept nogil:
    """Row ``i`` of :func:`masked_spgemm` with B given as the CSR of Bᵀ: A's
    row scattered dense and marked in a bitmap; per stored mask entry, Bᵀ's
    row tests the bitmap (one bit per column: it stays in L1) and reads the
    dense row only where A stores an entry -- a sparse-times-sparse dot
    mostly misses, and the dense row of a wide A would miss the cache on
    every read (the dense row and bitmap left zeroed)."""
    cdef Py_ssize_t p, q
    cdef index_t j, k
    cdef double sacc
    cdef unsigned char any_hit
    for q in range(aip[i], aip[i + 1]):
        j = aind[q]
        row[j] = aval[q]
        bits[j >> 6] |= (<uint64_t>1) << (j & 63)
    for p in range(mip[i], mip[i + 1]):
        k = mind[p]
        if p + 2 < mnnz:   # the Bᵀ row two entries ahead (rows are random)
            SPFUSE_PREFETCH_R(&bind[bip[mind[p + 2]]])
            SPFUSE_PREFETCH_R(&bval[bip[mind[p + 2]]])
        sacc = 0.0
        any_hit = 0
        for q in range(bip[k], bip[k + 1]):
            j = bind[q]
            if (bits[j >> 6] >> (j & 63)) & 1:
                sacc = sacc + row[j] * <double>bval[q]
                any_hit = 1
        hp[p] = any_hit
        ov[p] = <floating>(<double>mval[p] * sacc) if any_hit else 0
    for q in range(aip[i], aip[i + 1]):
        j = aind[q]
        row[j] = 0.0
        bits[j >> 6] = 0


def masked_spgemm(const index_t[::1] m_indptr, const index_t[::1] m_indices, const floating[::1] m_data,
                  const index_t[::1] a_indptr, const index_t[::1] a_indices, const floating[::1] a_data,
                  const index_t[::1] b_indptr, const index_t[::1] b_indices, const floating[::1] b_data,
                  Py_ssize_t width, floating[::1] out_data, unsigned char[::1] hit, int num_threads,
                  bint b_transposed=False):
    """masked_spgemm(m_indptr, m_indices, m_data, a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, width, out_data, hit, num_threads, b_transposed=False)

    ``C = M ∘ (A @ B)`` on M's pattern: for each stored ``p`` of row ``i`` of
    CSR ``M``, ``k = m_indices[p]``, ``out_data[p] = m_data[p] * sum_j A[i, j]
    * B[j, k]`` over the ``j`` where A and B both store an entry, and
    ``hit[p] = 1`` when there is one (else ``out_data[p] = 0``, ``hit[p] = 0``:
    the caller drops those entries, as the product stores none there).

    * ``b_transposed`` False: B is CSR and ``width`` its column count.
      Masked Gustavson: M's row marks its columns in a thread-private flag
      per column, A's row scatters B's rows into a double accumulator where
      the flag is set: O(flops) tests, ``A @ B`` never assembled.  Sums in the
      order of A's row then B's row.
    * ``b_transposed`` True: ``b_*`` is the CSR of ``Bᵀ`` (a CSC ``B``) and
      ``width`` A's column count.  A's row is scattered into a thread-private
      dense row and marked in a bitmap; each mask entry walks Bᵀ's row,
      testing the bitmap and reading the dense row on a hit (no merge).
      Sums in the order of Bᵀ's row.

    Independent of threads.  Preconditions: canonical CSR operands with
    ``len(out_data) == len(hit) == nnz(M)``.  Workspace per thread: 9 bytes
    per column of the dense row.
    """
    cdef Py_ssize_t m = m_indptr.shape[0] - 1
    cdef const index_t* mip = &m_indptr[0]
    cdef const index_t* aip = &a_indptr[0]
    cdef _SpgemmArgs a
    if m <= 0 or mip[m] == mip[0]:
        return
    a.mip, a.mind, a.mval = mip, _iptr(m_indices), _fptr(m_data)
    a.aip, a.aind, a.aval = aip, _iptr(a_indices), _fptr(a_data)
    a.bip, a.bind, a.bval = &b_indptr[0], _iptr(b_indices), _fptr(b_data)
    a.out = &out_data[0] if out_data.shape[0] > 0 else NULL
    a.hit = &hit[0] if hit.shape[0] > 0 else NULL
    a.annz, a.mnnz, a.n_cols, a.b_transposed = aip[m], mip[m], width, b_transposed
    cdef Workspaces ws = Workspaces(num_threads, 2)
    a.wsp = ws.ptr
    # blocks balanced by the rows' scatter (A) or their mask entries (M)
    for_rows("masked_spgemm", <block_body>_masked_spgemm_rows[floating, index_t], &a, a.mval, mip, a.mind,
               mip if b_transposed else aip, NULL, m,
               _spgemm_work(aip, m, &b_indptr[0], b_indptr.shape[0] - 1, 4.0) + 4.0 * <double>(a.mnnz - mip[0]),
               num_threads, DYNAMIC_BLOCKS, 4 * BLOCKS_PER_THREAD, NULL)


cdef int _masked_spgemm_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* mval,
                             const index_t* mip, const index_t* mind) noexcept nogil:
    """:func:`masked_spgemm`'s rows ``[r0, r1)`` (the mask's rows)."""
    cdef const _SpgemmArgs* a = <const _SpgemmArgs*>ctx
    cdef const index_t* aip = <const index_t*>a.aip
    cdef const index_t* aind = <const index_t*>a.aind
    cdef const floating* aval = <const floating*>a.aval
    cdef const index_t* bip = <const index_t*>a.bip
    cdef const index_t* bind = <const index_t*>a.bind
    cdef const floating* bval = <const floating*>a.bval
    cdef floating* ov = <floating*>a.out
    cdef Py_ssize_t i
    # zeroed on first use; every row leaves them zeroed
    cdef double* dense = <double*>ws_zeroed(a.wsp, 2, 0, (a.n_cols + 1) * sizeof(double))
    # bytes per column (Gustavson's marks) or bits (the dot's bitmap)
    cdef unsigned char* flag = <unsigned char*>ws_zeroed(a.wsp, 2, 1, a.n_cols + 9)
    if dense == NULL or flag == NULL:
        return -1
    for i in range(r0, r1):
        if mip[i] == mip[i + 1]:
            continue
        if a.b_transposed:
            _masked_row_dot(i, mip, mind, mval, aip, aind, aval, bip, bind, bval, a.mnnz,
                            dense, <uint64_t*>flag, ov, a.hit)
        else:
            _masked_row_saxpy(i, mip, mind, mval, aip, aind, aval, bip, bind, bval, a.annz,
                              dense, flag, ov, a.hit)
    return 0


def spgemm_numeric(const index_t[::1] a_indptr, const index_t[::1] a_indices,
                   const floating[::1] a_data,
                   const index_t[::1] b_indptr, const index_t[::1] b_indices,
                   const floating[::1] b_data, Py_ssize_t n_cols,
                   const index_t[::1] c_indptr, index_t[::1] c_indices,
                   floating[::1] c_data, int num_threads):
    """spgemm_numeric(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, n_cols, c_indptr, c_indices, c_data, num_threads)

    Phase 2 of ``C = A @ B``: fill ``c_indices``/``c_data`` row by row.

    Preconditions: as :func:`spgemm_symbolic`; ``c_indptr`` is the prefix sum
    of its ``row_nnz`` (``c_indptr[0]`` is an arbitrary offset, usually 0);
    ``c_indices``/``c_data`` have ``c_indptr[m] - c_indptr[0]`` entries, row
    i at ``[c_indptr[i] - c_indptr[0], c_indptr[i + 1] - c_indptr[0])``.
    Gustavson: the products of row i are scattered into a thread-private
    double accumulator per column, the touched columns marked in a bitmap
    with a summary level; reading the bitmap back yields the row sorted
    (``_bitmap_readback``) -- no sort, which cost as much as the products
    themselves when rows were sorted after the fact.  ``C[i, k]`` sums in
    the order of A's row then B's row (sequential, as scipy), independent of
    threads.  Explicit zeros from cancellation are kept.
    Complexity O(flops + nnz(C) + m * n_cols / 4096); workspace per thread
    about 8.2 bytes per column.
    """
    cdef Py_ssize_t m = a_indptr.shape[0] - 1
    cdef const index_t* aip = &a_indptr[0]
    cdef const index_t* cip = &c_indptr[0]
    cdef _SpgemmArgs a
    if m == 0:
        return
    a.aip, a.bip, a.bind, a.bval, a.cip = aip, &b_indptr[0], _iptr(b_indices), _fptr(b_data), cip
    a.cind = &c_indices[0] if c_indices.shape[0] > 0 else NULL
    a.out = &c_data[0] if c_data.shape[0] > 0 else NULL
    a.annz, a.n_cols = aip[m], n_cols
    cdef Workspaces ws = Workspaces(num_threads, 3)
    a.wsp = ws.ptr
    # chunks and blocks balanced by output nnz (known now) + rows
    for_rows("spgemm_numeric", <block_body>_spgemm_numeric_rows[floating, index_t], &a, _fptr(a_data), aip,
               _iptr(a_indices), cip, NULL, m,
               _spgemm_work(aip, m, &b_indptr[0], b_indptr.shape[0] - 1, 16.0) + 4.0 * <double>(cip[m] - cip[0]),
               num_threads, DYNAMIC_BLOCKS, 4 * BLOCKS_PER_THREAD, NULL)


cdef int _spgemm_numeric_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* aval,
                              const index_t* aip, const index_t* aind) noexcept nogil:
    """:func:`spgemm_numeric`'s rows ``[r0, r1)`` of A: scattered into the
    thread's accumulator and bitmap, read back sorted into C's rows."""
    cdef const _SpgemmArgs* a = <const _SpgemmArgs*>ctx
    cdef const index_t* cip = <const index_t*>a.cip
    cdef const index_t* bip = <const index_t*>a.bip
    cdef const index_t* bind = <const index_t*>a.bind
    cdef const floating* bval = <const floating*>a.bval
    cdef index_t* cind = <index_t*>a.cind
    cdef floating* cval = <floating*>a.out
    cdef Py_ssize_t annz = a.annz, i, p, q, cs
    cdef Py_ssize_t span[2]
    cdef index_t j
    cdef double v
    if not _bitmap_ws(a.wsp, 3, 0, a.n_cols):
        return -1
    cdef double* acc = <double*>ws_slot(a.wsp, 3, 0)[0]
    cdef uint64_t* bits = <uint64_t*>ws_slot(a.wsp, 3, 1)[0]
    cdef uint64_t* words = <uint64_t*>ws_slot(a.wsp, 3, 2)[0]
    for i in range(r0, r1):
        cs = cip[i] - cip[0]
        span[0] = span[1] = -1
        for p in range(aip[i], aip[i + 1]):
            j = aind[p]
            v = aval[p]
            # software pipeline over A's entries (contiguous across rows): B
            # row pointer of p+3, B row of p+2, accumulators of p+1
            if p + 3 < annz:
                SPFUSE_PREFETCH_R(&bip[aind[p + 3]])
            if p + 2 < annz:
                q = bip[aind[p + 2]]
                SPFUSE_PREFETCH_R(&bind[q])
                SPFUSE_PREFETCH_R(&bval[q])
            if p + 1 < annz:
                for q in range(bip[aind[p + 1]], bip[aind[p + 1] + 1]):
                    SPFUSE_PREFETCH_W(&acc[bind[q]])
            for q in range(bip[j], bip[j + 1]):
                _bitmap_add(acc, bits, words, bind[q], v * <double>bval[q], span)
        if span[0] >= 0:
            _bitmap_readback(acc, bits, words, span[0], span[1], cind + cs, cval + cs)
    return 0


def _prefix_sum(row_nnz, idx_dtype):
    """indptr (m + 1) from per-row counts; int64 if the total needs it."""
    indptr = np.empty(row_nnz.shape[0] + 1, dtype=np.int64)
    indptr[0] = 0
    np.cumsum(row_nnz, out=indptr[1:])
    if idx_dtype == np.int32 and indptr[len(indptr) - 1] <= INT32_MAX:
        return indptr.astype(np.int32)
    return indptr


def spgemm(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data,
           Py_ssize_t n_cols, int num_threads):
    """``C = A @ B`` for CSR A (m x n) and CSR B (n x n_cols) -> ``(indptr, indices, data)``.

    Two phases (:func:`spgemm_symbolic`, cumsum, :func:`spgemm_numeric`).
    Preconditions: all four index arrays the same dtype (int32/int64), both
    data arrays the same float dtype, 1-D contiguous, indices in range.
    Output: int32 index arrays when the inputs are int32 and nnz(C) fits,
    int64 otherwise (then the inputs are upcast on a copy); data has the
    input float dtype; rows sorted, structural zeros kept.
    """
    idx_dtype = np.asarray(a_indptr).dtype
    m = len(a_indptr) - 1
    row_nnz = np.empty(m, dtype=np.int64)
    spgemm_symbolic(a_indptr, a_indices, b_indptr, b_indices, n_cols, row_nnz, num_threads)
    indptr = _prefix_sum(row_nnz, idx_dtype)
    if indptr.dtype != idx_dtype:
        a_indptr, a_indices, b_indptr, b_indices = (
            np.asarray(a, dtype=np.int64) for a in (a_indptr, a_indices, b_indptr, b_indices))
    nnz = int(indptr[len(indptr) - 1])
    # (the result's two large arrays from the pool: no page faults per call)
    indices = pooled_empty(nnz, indptr.dtype)
    data = pooled_empty(nnz, np.asarray(a_data).dtype)
    spgemm_numeric(a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, n_cols,
                   indptr, indices, data, num_threads)
    return indptr, indices, data


# --------------------------------------------------------------------------
# SpAdd-n: one pass, each row a k-way merge or a scatter into a workspace
# --------------------------------------------------------------------------
# Row strategies of :func:`spadd` (``variant``).
cdef enum:
    SPADD_AUTO = 0       # per row, by the cost model below
    SPADD_MERGE = 1      # k-way tournament over the sorted operand rows (chain beyond its limits)
    SPADD_SCATTER = 2    # dense accumulator + two-level bitmap, read back in column order
    SPADD_CHAIN = 3      # merge by the chain only (the tournament's fallback, kept testable)
SPADD_VARIANTS = {"auto": SPADD_AUTO, "merge": SPADD_MERGE, "scatter": SPADD_SCATTER,
                  "chain": SPADD_CHAIN}

# Per-row cost model of ``variant="auto"``, in merge steps (~3.9 ns each
# here).  Fitted on this machine (2 cores, 1 MiB L2, 32 MiB L3) with both
# variants forced on 20 000-row uniform operands: 2, 3 and 7 operands of 2
# to 30 entries a row, 500 to 2 000 000 columns.  Merge of 2-3 runs (and
# over 64): one step per element of the chain's running lengths
# (branch-free, latency-bound) plus a row overhead.  Merge of 4-64 runs
# (the tournament): a row overhead (copying the runs into keys, building
# two trees) plus a cost per entry and tree level -- refitted with the
# tournament on 20k and 200k columns, 7 operands of 10 and 40 entries a
# row (within ~5% of the measured kernel there).  Scatter: a row overhead and a cost per entry (L1 bitmap,
# accumulator access, ordered read-back) that both grow once the
# accumulator row (8 bytes a column) outgrows half the L2, plus a summary
# word scanned per 4096 columns of the row's span.
cdef double SPADD_MERGE_ROW = 14.0
cdef double SPADD_TOURNEY_ROW = 40.0
cdef double SPADD_TOURNEY_ENTRY = 0.65
cdef double SPADD_SCATTER_ROW = 6.5
cdef double SPADD_SCATTER_ROW_MISS = 100.0
cdef double SPADD_SCATTER_ENTRY = 1.7
cdef double SPADD_SCATTER_ENTRY_MISS = 2.3
cdef Py_ssize_t SPADD_ACC_FITS = 65536
cdef double SPADD_SCAN_WORD = 1.0
SPADD_COSTS = {"merge_row": SPADD_MERGE_ROW, "tourney_row": SPADD_TOURNEY_ROW,
               "tourney_entry_level": SPADD_TOURNEY_ENTRY, "tourney_min_runs": SPADD_TOURNEY_MIN_RUNS,
               "tourney_max_runs": SPADD_MAX_RUNS,
               "scatter_row": SPADD_SCATTER_ROW,
               "scatter_row_miss": SPADD_SCATTER_ROW_MISS, "scatter_entry": SPADD_SCATTER_ENTRY,
               "scatter_entry_miss": SPADD_SCATTER_ENTRY_MISS, "acc_fits_columns": SPADD_ACC_FITS,
               "scan_word": SPADD_SCAN_WORD}


cdef struct _Operands:
    # ``n`` CSR operands of the same shape, by pointer (int index type and
    # float value type fixed by the specialisation that reads them).
    Py_ssize_t n
    void** indptr
    void** indices
    void** data


cdef inline size_t _address(object a) except? 0:
    """An ndarray's data pointer: ``a.ctypes.data`` without the ctypes
    object numpy builds per access (a microsecond or more each: SpAdd-7
    read 27 per call)."""
    return <size_t>cnp.PyArray_DATA(<cnp.ndarray?>a)


cdef int _collect(list arrays, void** out) except -1:
    cdef Py_ssize_t t
    for t in range(len(arrays)):
        a = arrays[t]
        out[t] = <void*>_address(a) if a.size else NULL
    return 0


cdef inline Py_ssize_t _merge_runs(const index_t* ac, const double* av, Py_ssize_t na,
                                   const index_t* bc, const floating* bv, Py_ssize_t nb,
                                   double c, index_t* oc, double* ov) noexcept nogil:
    """Merge the sorted duplicate-free runs ``a`` (double values) and ``c * b``
    into ``o``; equal columns give ``a + c * b`` (a first: operand order).

    Branch-free selection (the comparisons of random columns are
    unpredictable): both heads are read, the smaller column is written, each
    side advances when its column was taken.  Returns the output length.
    """
    cdef Py_ssize_t i = 0, j = 0, o = 0
    cdef index_t x, y
    cdef double va, vb
    cdef int ta, tb
    while i < na and j < nb:
        x = ac[i]
        y = bc[j]
        va = av[i]
        vb = c * <double>bv[j]
        ta = x <= y
        tb = y <= x
        oc[o] = x if ta else y
        # -0.0 is the exact additive identity (x + -0.0 == x, signed zeros too)
        ov[o] = spfuse_select(ta, va, -0.0) + spfuse_select(tb, vb, -0.0)
        i += ta
        j += tb
        o += 1
    while i < na:
        oc[o] = ac[i]
        ov[o] = av[i]
        i += 1
        o += 1
    while j < nb:
        oc[o] = bc[j]
        ov[o] = c * <double>bv[j]
        j += 1
        o += 1
    return o


cdef inline Py_ssize_t _row_merge(const _Operands* ops, const double* coef, Py_ssize_t i,
                                  index_t* c0, double* v0, index_t* c1, double* v1,
                                  out_index_t* outc, floating* outv) noexcept nogil:
    """Row ``i`` of the sum by a left-deep chain of two-way merges
    (((B1 + B2) + B3) + ...) in thread-private double buffers ``c0/v0``,
    ``c1/v1`` (room for the row's upper bound each), then rounded once into
    ``outc/outv``.  Needs sorted duplicate-free operand rows; sums in operand
    order, exactly as the scatter variant.  Returns the row's length."""
    cdef Py_ssize_t t, q, p0, ln, cnt = 0, runs = 0
    cdef const index_t* ip
    cdef const index_t* ind
    cdef const floating* val
    cdef const index_t* ind1 = NULL
    cdef const floating* val1 = NULL
    cdef double c, c1st = 0.0
    cdef index_t* tc
    cdef double* tv
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        p0 = ip[i]
        ln = ip[i + 1] - p0
        if ln == 0:
            continue
        ind = <const index_t*>ops.indices[t] + p0
        val = <const floating*>ops.data[t] + p0
        c = coef[t]
        runs += 1
        if runs == 1:
            # keep the first run in place: a row with one run is a scaled copy
            ind1 = ind
            val1 = val
            c1st = c
            cnt = ln
            continue
        if runs == 2:
            for q in range(cnt):
                c0[q] = ind1[q]
                v0[q] = c1st * <double>val1[q]
        cnt = _merge_runs(c0, v0, cnt, ind, val, ln, c, c1, v1)
        tc = c0; c0 = c1; c1 = tc
        tv = v0; v0 = v1; v1 = tv
    if runs == 1:
        for q in range(cnt):
            outc[q] = <out_index_t>ind1[q]
            outv[q] = <floating>(c1st * <double>val1[q])
    elif runs > 1:
        for q in range(cnt):
            outc[q] = <out_index_t>c0[q]
            outv[q] = <floating>v0[q]
    return cnt


# A tournament over at most this many non-empty operand rows (stack state,
# the run number in the key's low SPADD_RUN_BITS bits, the position in the
# row buffer in the next SPADD_POS_BITS, the column above: fixed shifts);
# rows with more runs, calls with columns >= 2**31 or row bounds of 2**26
# entries take the merge chain.
cdef enum:
    SPADD_TOURNEY_MIN_RUNS = 4
    SPADD_MAX_RUNS = 64
    SPADD_RUN_BITS = 6
    SPADD_POS_BITS = 26
    SPADD_COL_SHIFT = 32   # SPADD_RUN_BITS + SPADD_POS_BITS: columns < 2**31
cdef uint64_t SPADD_HIGH = 0xFFFFFFFFFFFFFFFF
cdef uint64_t SPADD_LOW = 0


cdef inline Py_ssize_t _tourney_load(const index_t* ind, Py_ssize_t ln, Py_ssize_t p, int s,
                                     Py_ssize_t run, uint64_t* kb) noexcept nogil:
    """Append one run's keys at ``p`` between a low and a high sentinel;
    returns the next free position."""
    cdef Py_ssize_t q
    kb[p] = SPADD_LOW
    p += 1
    for q in range(ln):
        kb[p + q] = ((<uint64_t>ind[q]) << s) | ((<uint64_t>(p + q)) << SPADD_RUN_BITS) | <uint64_t>run
    kb[p + ln] = SPADD_HIGH
    return p + ln + 1


cdef inline void _tourney_build(const uint64_t* leaves, Py_ssize_t runs, Py_ssize_t kk, bint smallest,
                                uint64_t* win, uint64_t* lose) noexcept nogil:
    """Loser tree over ``leaves`` (padded to ``kk`` with the losing sentinel):
    each match's winner moves up, its loser stays in the node; ``win[1]``
    is the overall winner (smallest key, or largest)."""
    cdef Py_ssize_t r, node
    cdef uint64_t a, b, lo, hi
    for r in range(kk):
        win[kk + r] = leaves[r] if r < runs else (SPADD_HIGH if smallest else SPADD_LOW)
    # (branch-free min/max: the matches' outcomes are unpredictable)
    for node in range(kk - 1, 0, -1):
        a = win[2 * node]
        b = win[2 * node + 1]
        lo = a if a < b else b
        hi = b if a < b else a
        win[node] = lo if smallest else hi
        lose[node] = hi if smallest else lo


cdef inline Py_ssize_t _row_tourney(const _Operands* ops, const double* coef, Py_ssize_t i,
                                    uint64_t* kb, uint64_t* sk, index_t itype,
                                    out_index_t* outc, floating* outv) noexcept nogil:
    """Row ``i`` of the sum by a k-way tournament (loser trees) over its
    ``k`` non-empty operand rows; returns the row's length, or -1 when
    ``k`` is under ``SPADD_TOURNEY_MIN_RUNS`` (a chain of two or three runs
    is cheaper: see ``SPADD_COSTS``) or over ``SPADD_MAX_RUNS``; the caller
    then chains.

    The runs' columns are first copied, in operand order, into the thread's
    key buffer: ``kb[p] = column << 32 | p << 6 | run`` (``p`` < 2**26 the
    position in the buffer; values are read from the operand, through the
    run, only when their entry is emitted), each run between a
    low (0) and a high (all-ones) sentinel key.  One unsigned comparison of
    two keys orders by column and breaks ties by position, i.e. by operand.
    A key carries its own position, so advancing its run is one load
    (``kb[p + 1]``), and each output entry costs one replay of its run's
    leaf-to-root path: ceil(log2 k) branch-free min/max steps, instead of
    the chain's repeated re-merging of the running sum.

    The replay is a chain of dependent loads and compares, so two
    independent tournaments run interleaved: one pops the smallest keys
    from the front, one the largest from the back (reverse tree over the
    runs' ends), ceil(n/2) and floor(n/2) of the row's n entries -- exactly
    a partition of the row.  The front collapses equal columns on the fly
    (operand order), the back only records its keys, which a final
    sequential pass replays in increasing order, continuing the front's
    running sum: every column is summed in operand order in double and
    rounded once, exactly as the merge chain and the scatter do.  Needs
    sorted duplicate-free operand rows; ``kb`` holds the row's upper bound
    plus two sentinels per operand, ``sk`` half the row bound."""
    cdef Py_ssize_t t, p0, p1, runs = 0, lv, levels = 0, kk, node, o = -1, p = 0, r
    cdef Py_ssize_t total, half, it, e
    cdef Py_ssize_t first[SPADD_MAX_RUNS]
    cdef const floating* vp[SPADD_MAX_RUNS]
    cdef Py_ssize_t vo[SPADD_MAX_RUNS]
    cdef double cf[SPADD_MAX_RUNS]
    cdef uint64_t heads[SPADD_MAX_RUNS]
    cdef uint64_t tails[SPADD_MAX_RUNS]
    cdef uint64_t win[2 * SPADD_MAX_RUNS]
    cdef uint64_t lf[SPADD_MAX_RUNS]
    cdef uint64_t lb[SPADD_MAX_RUNS]
    cdef int s = SPADD_COL_SHIFT
    cdef uint64_t kf, kr, x, col, last = SPADD_HIGH
    cdef uint64_t pmask = ((<uint64_t>1) << SPADD_POS_BITS) - 1, rmask = (<uint64_t>1 << SPADD_RUN_BITS) - 1
    cdef const index_t* ip
    cdef double acc = 0.0
    cdef bint same
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        runs += ip[i + 1] > ip[i]
    if runs < SPADD_TOURNEY_MIN_RUNS or runs > SPADD_MAX_RUNS:
        return -1
    runs = 0
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        p0 = ip[i]
        p1 = ip[i + 1]
        if p1 == p0:
            continue
        first[runs] = p
        vp[runs] = <const floating*>ops.data[t] + p0
        vo[runs] = p + 1
        cf[runs] = coef[t]
        p = _tourney_load(<const index_t*>ops.indices[t] + p0, p1 - p0, p, s, runs, kb)
        heads[runs] = kb[first[runs] + 1]
        tails[runs] = kb[p - 2]
        runs += 1
    while ((<Py_ssize_t>1) << levels) < runs:
        levels += 1
    kk = (<Py_ssize_t>1) << levels
    _tourney_build(tails, runs, kk, False, win, lb)
    kr = win[1]
    _tourney_build(heads, runs, kk, True, win, lf)
    kf = win[1]
    total = p - 2 * runs
    half = total >> 1
    e = half
    if kk == 8:
        for it in range(half):
            # front: emit the smallest key (running sum over equal columns)
            p = <Py_ssize_t>((kf >> SPADD_RUN_BITS) & pmask)
            r = <Py_ssize_t>(kf & rmask)
            col = kf >> s
            same = col == last
            acc = spfuse_select(same, acc, -0.0) + cf[r] * <double>vp[r][p - vo[r]]
            o += 1 - same
            outc[o] = <out_index_t>col
            outv[o] = <floating>acc
            last = col
            kf = kb[p + 1]
            # (3 levels unrolled: nodes 4 + r/2, 2 + r/4, 1)
            node = 4 + (r >> 1)
            x = lf[node]
            lf[node] = kf if x < kf else x
            kf = x if x < kf else kf
            node = 2 + (r >> 2)
            x = lf[node]
            lf[node] = kf if x < kf else x
            kf = x if x < kf else kf
            x = lf[1]
            lf[1] = kf if x < kf else x
            kf = x if x < kf else kf
            # back: record the largest key
            p = <Py_ssize_t>((kr >> SPADD_RUN_BITS) & pmask)
            r = <Py_ssize_t>(kr & rmask)
            e -= 1
            sk[e] = kr
            kr = kb[p - 1]
            node = 4 + (r >> 1)
            x = lb[node]
            lb[node] = kr if x > kr else x
            kr = x if x > kr else kr
            node = 2 + (r >> 2)
            x = lb[node]
            lb[node] = kr if x > kr else x
            kr = x if x > kr else kr
            x = lb[1]
            lb[1] = kr if x > kr else x
            kr = x if x > kr else kr
    else:
        for it in range(half):
            # front: emit the smallest key (running sum over equal columns)
            p = <Py_ssize_t>((kf >> SPADD_RUN_BITS) & pmask)
            r = <Py_ssize_t>(kf & rmask)
            col = kf >> s
            same = col == last
            acc = spfuse_select(same, acc, -0.0) + cf[r] * <double>vp[r][p - vo[r]]
            o += 1 - same
            outc[o] = <out_index_t>col
            outv[o] = <floating>acc
            last = col
            kf = kb[p + 1]
            node = (kk + r) >> 1
            for lv in range(levels):
                x = lf[node]
                lf[node] = kf if x < kf else x
                kf = x if x < kf else kf
                node >>= 1
            # back: record the largest key
            p = <Py_ssize_t>((kr >> SPADD_RUN_BITS) & pmask)
            r = <Py_ssize_t>(kr & rmask)
            e -= 1
            sk[e] = kr
            kr = kb[p - 1]
            node = (kk + r) >> 1
            for lv in range(levels):
                x = lb[node]
                lb[node] = kr if x > kr else x
                kr = x if x > kr else kr
                node >>= 1
    # an odd row's middle key (the front's next), then the back's keys in
    # increasing order
    for it in range(-(total & 1), half):
        if it >= 0:
            kf = sk[it]
        p = <Py_ssize_t>((kf >> SPADD_RUN_BITS) & pmask)
        r = <Py_ssize_t>(kf & rmask)
        col = kf >> s
        same = col == last
        acc = spfuse_select(same, acc, -0.0) + cf[r] * <double>vp[r][p - vo[r]]
        o += 1 - same
        outc[o] = <out_index_t>col
        outv[o] = <floating>acc
        last = col
    return o + 1


cdef inline Py_ssize_t _row_scatter(const _Operands* ops, const double* coef, Py_ssize_t i,
                                    double* acc, uint64_t* bits, uint64_t* words, index_t itype,
                                    out_index_t* outc, floating* outv) noexcept nogil:
    """Row ``i`` of the sum by scattering into the thread's workspace: a
    double accumulator per column (``acc``), a bit per column (``bits``, set
    = touched in this row) and a summary bit per 64-column word (``words``);
    both bitmaps are all-zero between rows (the read-back clears what it
    visits) and take 1/8 byte a column, so a 200k-column row's bits stay in
    L1.  Entries accumulate in operand order (then position order), then the
    marked columns are read back in increasing order (summary words over the
    row's span, set bits by count-trailing-zeros): sorted without a sort,
    O(entries + span / 4096).  Any column order and duplicates are fine."""
    cdef Py_ssize_t t, p
    cdef Py_ssize_t span[2]
    cdef const index_t* ip
    cdef const index_t* ind
    cdef const floating* val
    cdef double c
    span[0] = span[1] = -1
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        ind = <const index_t*>ops.indices[t]
        val = <const floating*>ops.data[t]
        c = coef[t]
        for p in range(ip[i], ip[i + 1]):
            _bitmap_add(acc, bits, words, ind[p], c * <double>val[p], span)
    if span[0] < 0:
        return 0
    return _bitmap_readback(acc, bits, words, span[0], span[1], outc, outv)


cdef inline bint _prefer_scatter(const _Operands* ops, Py_ssize_t i, double fixed, double entry,
                                 index_t itype) noexcept nogil:
    """Cost model of ``variant="auto"`` for row ``i`` (O(operands)): the merge
    chain costs the sum of its running lengths, the tournament (4 to 64
    runs) a row cost plus one per entry and tree level, the scatter ``fixed`` plus
    ``entry`` per entry plus the summary words over the row's column span
    (from each operand row's first and last column)."""
    cdef Py_ssize_t t, p0, p1, ub = 0, steps = 0, runs = 0
    cdef Py_ssize_t lo = 0, hi = -1
    cdef const index_t* ip
    cdef const index_t* ind
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        p0 = ip[i]
        p1 = ip[i + 1]
        if p1 == p0:
            continue
        ind = <const index_t*>ops.indices[t]
        if runs == 0 or ind[p0] < lo:
            lo = ind[p0]
        if runs == 0 or ind[p1 - 1] > hi:
            hi = ind[p1 - 1]
        runs += 1
        ub += p1 - p0
        if runs > 1:
            steps += ub
    if runs <= 1:
        return False
    cdef double merge = SPADD_MERGE_ROW + <double>steps
    if SPADD_TOURNEY_MIN_RUNS <= runs <= SPADD_MAX_RUNS:
        merge = SPADD_TOURNEY_ROW + SPADD_TOURNEY_ENTRY * <double>ub * <double>_bit_length(runs - 1)
    return (fixed + entry * <double>ub + SPADD_SCAN_WORD * <double>((hi >> 12) - (lo >> 12) + 1)
            < merge)


cdef inline void _prefetch_span(const char* a, const char* b) noexcept nogil:
    """Prefetch every cache line of ``[a, b)`` (at most 8: the rest of a long
    row streams in on its own)."""
    cdef const char* e = a + 512
    if b < e:
        e = b
    a = <const char*>(<size_t>a & ~(<size_t>63))
    while a < e:
        SPFUSE_PREFETCH_R(a)
        a += 64


cdef inline void _spadd_prefetch(const _Operands* ops, Py_ssize_t i, Py_ssize_t r1,
                                 const double* acc, index_t itype, floating ftype) noexcept nogil:
    """Software pipeline over rows (the operand rows of one output row lie
    anywhere in memory): fetch the operand rows of row ``i + 2`` and, when
    row ``i`` scatters, the accumulators row ``i + 1`` will touch."""
    cdef Py_ssize_t t, p, p0, p1
    cdef const index_t* ip
    cdef const index_t* ind
    for t in range(ops.n):
        ip = <const index_t*>ops.indptr[t]
        if i + 2 < r1:
            p0 = ip[i + 2]
            p1 = ip[i + 3]
            if p1 > p0:
                _prefetch_span(<const char*>(<const index_t*>ops.indices[t] + p0),
                               <const char*>(<const index_t*>ops.indices[t] + p1))
                _prefetch_span(<const char*>(<const floating*>ops.data[t] + p0),
                               <const char*>(<const floating*>ops.data[t] + p1))
        if acc != NULL and i + 1 < r1:
            ind = <const index_t*>ops.indices[t]
            for p in range(ip[i + 1], ip[i + 2]):
                SPFUSE_PREFETCH_W(&acc[ind[p]])


cdef struct _SpaddArgs:
    const _Operands* ops
    const double* coef
    Py_ssize_t n_cols, max_ub, klen
    const int64_t* ub
    int variant
    bint tourney
    size_t nb0, nb1
    double fixed, entry
    void** wsp
    int64_t* row_cnt
    int64_t* row_src
    int64_t* seq   # one thread in row order: the next row's offset (rows then written compact); else NULL


cdef int _spadd_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, floating* oval,
                     const index_t* first_indptr, out_index_t* oind) noexcept nogil:
    """Rows ``[r0, r1)`` of the sum (blocks balanced by ``ub[r] + r``).

    The block writes its rows one after the other from ``ub[r0]`` (its first
    row's upper-bound offset; ``seq[0]`` instead when one thread runs the
    whole call in row order, which leaves the output compact); row ``i``'s
    length goes to ``row_cnt[i]`` and its offset to ``row_src[i]``.
    Workspaces (5 slots per thread in ``wsp``): two merge buffers, each
    room for ``max_ub`` (column, double) pairs of the chain, slot 0 also
    for the tournament's keys and back keys; and --
    only once a row of this thread takes the scatter path -- its
    accumulators and bitmaps (``_row_scatter``).  ``first_indptr`` only
    selects the index type.
    """
    cdef const _SpaddArgs* a = <const _SpaddArgs*>ctx
    cdef const _Operands* ops = a.ops
    cdef index_t itype = 0
    cdef floating ftype = 0
    cdef Py_ssize_t i, cnt, max_ub = a.max_ub, w
    cdef void** wsp = a.wsp
    cdef double* bv0 = <double*>ws_get(wsp, 5, 0, a.nb0)
    cdef double* bv1 = <double*>ws_get(wsp, 5, 1, a.nb1)
    cdef index_t* bc0
    cdef index_t* bc1
    cdef double* acc
    cdef bint scat
    if bv0 == NULL or bv1 == NULL:
        return -1
    bc0 = <index_t*>(bv0 + max_ub + 1)
    bc1 = <index_t*>(bv1 + max_ub + 1)
    w = a.seq[0] if a.seq != NULL else a.ub[r0]
    for i in range(r0, r1):
        if a.variant == SPADD_SCATTER:
            scat = True
        elif a.variant == SPADD_MERGE or a.variant == SPADD_CHAIN:
            scat = False
        else:
            scat = _prefer_scatter(ops, i, a.fixed, a.entry, itype)
        _spadd_prefetch(ops, i, r1, <const double*>(ws_slot(wsp, 5, 2)[0] if scat else NULL), itype, ftype)
        if scat:
            # (this thread's bitmap workspace is made on its first scatter row)
            if not _bitmap_ws(wsp, 5, 2, a.n_cols):
                return -1
            acc = <double*>ws_slot(wsp, 5, 2)[0]
            cnt = _row_scatter(ops, a.coef, i, acc, <uint64_t*>ws_slot(wsp, 5, 3)[0],
                               <uint64_t*>ws_slot(wsp, 5, 4)[0], itype, oind + w, oval + w)
        else:
            cnt = (_row_tourney(ops, a.coef, i, <uint64_t*>bv0, <uint64_t*>bv0 + a.klen, itype,
                                oind + w, oval + w) if a.tourney else -1)
            if cnt < 0:
                cnt = _row_merge(ops, a.coef, i, bc0, bv0, bc1, bv1, oind + w, oval + w)
        a.row_cnt[i] = cnt
        a.row_src[i] = w
        w = w + cnt
    if a.seq != NULL:
        a.seq[0] = w
    return 0


cdef object _spadd_run(list indptrs, list indices, list datas, size_t coef_addr,
                       Py_ssize_t n_rows, Py_ssize_t n_cols, int num_threads, int variant,
                       size_t ub_addr, Py_ssize_t max_ub, index_t itype, floating ftype,
                       out_index_t otype, size_t oind_addr, size_t oval_addr, size_t rc_addr,
                       size_t rs_addr):
    """Run every row (chunked for Ctrl-C); returns True when the output is
    already compact (one thread in row order, or no duplicate column)."""
    cdef Py_ssize_t n = len(indptrs)
    cdef _Operands ops
    cdef _SpaddArgs a
    cdef int64_t seq = 0
    cdef Workspaces ws
    cdef const int64_t* ubp = <const int64_t*>ub_addr
    cdef int64_t* rc = <int64_t*>rc_addr
    cdef Py_ssize_t t, total = 0
    cdef size_t pair = sizeof(index_t) + sizeof(double)
    ops.n = n
    ops.indptr = <void**>malloc(3 * n * sizeof(void*))
    if ops.indptr == NULL:
        raise MemoryError()
    ops.indices = ops.indptr + n
    ops.data = ops.indptr + 2 * n
    a.ops, a.coef, a.n_cols, a.max_ub, a.ub, a.variant = &ops, <const double*>coef_addr, n_cols, max_ub, ubp, variant
    a.row_cnt, a.row_src, a.seq = rc, <int64_t*>rs_addr, &seq if num_threads == 1 else NULL
    a.entry = SPADD_SCATTER_ENTRY if n_cols <= SPADD_ACC_FITS else SPADD_SCATTER_ENTRY_MISS
    a.fixed = SPADD_SCATTER_ROW if n_cols <= SPADD_ACC_FITS else SPADD_SCATTER_ROW_MISS
    # the tournament's key: column << 32 | position << 6 | run, below the
    # all-ones sentinel (columns too wide to share 64 bits with the run
    # number: chain); keys + back keys in slot 0
    a.tourney = (variant != SPADD_CHAIN and n_cols <= (<Py_ssize_t>1 << 31)
                 and max_ub + 2 * n < (<Py_ssize_t>1 << SPADD_POS_BITS))
    a.klen = max_ub + 2 * n + 1
    a.nb0 = a.nb1 = (max_ub + 1) * pair
    if a.nb0 < (a.klen + max_ub // 2 + 2) * sizeof(uint64_t):
        a.nb0 = (a.klen + max_ub // 2 + 2) * sizeof(uint64_t)
    try:
        _collect(indptrs, ops.indptr)
        _collect(indices, ops.indices)
        _collect(datas, ops.data)
        ws = Workspaces(num_threads, 5)
        a.wsp = ws.ptr
        # work: ~ a merge step per entry and chain level, plus the rows
        for_rows("spadd", <block_body>_spadd_rows[floating, index_t, out_index_t], &a, <void*>oval_addr,
                 ops.indptr[0], <void*>oind_addr, ubp, NULL, n_rows,
                 <double>(ubp[n_rows] - ubp[0]) * (2.0 + <double>_bit_length(n)) + 4.0 * <double>n_rows * n,
                 num_threads, DYNAMIC_BLOCKS, 4 * BLOCKS_PER_THREAD, NULL)
    finally:
        free(ops.indptr)
    if num_threads == 1:
        return True
    with nogil:
        for t in range(n_rows):
            total += rc[t]
    return total == ubp[n_rows] - ubp[0]


def _spadd_typed(const index_t[::1] first_indptr, floating[::1] buf_val, out_index_t[::1] buf_ind,
                 list indptrs, list indices, list datas, size_t coef_addr, Py_ssize_t n_rows,
                 Py_ssize_t n_cols, int num_threads, int variant, size_t ub_addr, Py_ssize_t max_ub,
                 size_t oind_addr, size_t oval_addr, size_t rc_addr, size_t rs_addr):
    """:func:`_spadd_run` specialised by the dtypes of the first ``indptr``, the
    value buffer and the index buffer (Cython picks one of the 8 index x value
    x output-index combinations from the three arrays)."""
    cdef index_t itype = 0
    cdef floating ftype = 0
    cdef out_index_t otype = 0
    return _spadd_run(indptrs, indices, datas, coef_addr, n_rows, n_cols, num_threads, variant,
                      ub_addr, max_ub, itype, ftype, otype, oind_addr, oval_addr, rc_addr, rs_addr)


def _check_operand_dtypes(indptrs, indices, datas, index_dtype, value_dtype):
    """Fail loudly (not UB) if the operand lists mix dtypes or are not contiguous."""
    for group, dt in ((indptrs, index_dtype), (indices, index_dtype), (datas, value_dtype)):
        for a in group:
            if not isinstance(a, np.ndarray) or a.dtype != dt or not a.flags.c_contiguous:
                raise TypeError("spadd operands must be C-contiguous numpy arrays of one "
                                f"index dtype and one value dtype; got {type(a).__name__} "
                                f"{getattr(a, 'dtype', None)}")


cdef void _add_row_lengths(const index_t* ip, Py_ssize_t m, int64_t* ub) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(m):
        ub[i + 1] += ip[i + 1] - ip[i]


def spadd_row_bounds(list indptrs, Py_ssize_t n_rows):
    """Upper-bound offsets of SpAdd's rows: ``ub[i + 1] - ub[i]`` = sum over
    operands of row i's stored entries (int64, ``n_rows + 1`` entries).

    The row statistics the variant choice reads (max, mean) come from it and
    :func:`spadd` reuses it (``row_bounds=``).  O(n_rows * n_operands), one
    C loop per operand (int32/int64 indptrs; others through numpy).

    >>> import numpy as np
    >>> spadd_row_bounds([np.array([0, 2, 3]), np.array([0, 0, 4])], 2).tolist()
    [0, 2, 7]
    """
    cdef int64_t[::1] u
    cdef const int32_t[::1] p32
    cdef const int64_t[::1] p64
    ub = np.zeros(n_rows + 1, dtype=np.int64)
    u = ub
    for ip in indptrs:
        ip = np.asarray(ip)
        if ip.shape != (n_rows + 1,):
            raise ValueError(f"spadd: an indptr has shape {ip.shape}, expected ({n_rows + 1},)")
        if n_rows == 0:
            continue
        if ip.dtype == np.int32 and ip.flags.c_contiguous:
            p32 = ip
            with nogil:
                _add_row_lengths(&p32[0], n_rows, &u[0])
        elif ip.dtype == np.int64 and ip.flags.c_contiguous:
            p64 = ip
            with nogil:
                _add_row_lengths(&p64[0], n_rows, &u[0])
        else:
            ub[1:] += np.diff(ip)
    np.cumsum(ub, out=ub)
    return ub


def spadd(list indptrs, list indices, list datas, coefficients, Py_ssize_t n_rows,
          Py_ssize_t n_cols, int num_threads, variant="auto", row_bounds=None, index_dtype=None):
    """``C = sum_t coefficients[t] * B_t`` (n-way union) -> ``(indptr, indices, data)``.

    ``coefficients``: float64 array (e.g. +1/-1 for subtraction), one per
    operand.  Operands are passed as three Python lists of numpy arrays
    (``indptrs[t]``, ``indices[t]``, ``datas[t]`` of operand ``t``), all
    ``n_rows x n_cols`` CSR, every index array the same dtype (int32/int64),
    every data array the same float dtype, all C-contiguous (checked:
    O(n_operands)); the kernel reads them through an array of raw pointers
    (no stacking copy, no dtype conversion).

    One pass: row i is written at its upper-bound offset (sum of the
    operands' row lengths, :func:`spadd_row_bounds`, or ``row_bounds``), by

    * ``"merge"``: rows with 4 to 64 non-empty operand rows by a k-way
      tournament (two interleaved loser trees, ceil(log2 k) branch-free
      steps per entry), others by a left-deep chain of branch-free two-way
      merges -- needs CANONICAL operands (rows sorted, no duplicate
      columns; anything else gives an unsorted result, never a memory error);
    * ``"chain"``: every row by the chain (the tournament's fallback, kept
      callable so that it stays tested);
    * ``"scatter"``: Gustavson's dense accumulator of ``n_cols`` doubles per
      thread with a bit per column and a summary bit per 64 columns, read
      back in column order (``_bitmap_readback``) -- any column order,
      duplicates summed;
    * ``"auto"``: per row, the cheaper by a cost model of both (counts of
      merge steps vs. scattered entries and scanned slots); canonical
      operands.

    Both sum ``C[i, k]`` in operand order in double and round once, so every
    variant, chunking and thread count gives the same bits.  With one thread
    the rows land compacted; otherwise, if duplicates shrank some rows, they
    slide down in place (one sequential memmove per stretch of back-to-back
    rows; no second buffer whose pages would have to be faulted in and
    zeroed; the gaps' few pages stay with the arrays).  Output
    index dtype is ``index_dtype`` (default: the operands'; int32 from int64
    operands is written directly, no narrowing copy; int64 if int32 cannot
    hold nnz(C)), value
    dtype the operands'; rows sorted, structural zeros from cancellation
    kept.  With no operands: an all-zero float64 matrix.  Complexity
    O(nnz * log2(operands)) merging (O(nnz * chain length) chaining),
    O(nnz + nnz(C)) typical scattering; workspace per thread about
    2 * (8 + itemsize) * (max row bound + 2 * operands) bytes, plus
    16 * n_cols when a row scatters.

    >>> import numpy as np
    >>> ip, ix, v = spadd([np.array([0, 2]), np.array([0, 1])], [np.array([0, 2]), np.array([2])],
    ...                   [np.array([1.0, 2.0]), np.array([5.0])], [1.0, -1.0], 1, 3, 1)
    >>> ip.tolist(), ix.tolist(), v.tolist()
    ([0, 2], [0, 2], [1.0, -3.0])
    """
    coefficients = np.ascontiguousarray(coefficients, dtype=np.float64)
    if variant not in SPADD_VARIANTS:
        raise ValueError(f"spadd: variant must be one of {sorted(SPADD_VARIANTS)}, got {variant!r}")
    if not indptrs:
        return (np.zeros(n_rows + 1, dtype=np.int32), np.empty(0, dtype=np.int32),
                np.empty(0, dtype=np.float64))
    n = len(indptrs)
    if len(indices) != n or len(datas) != n or coefficients.shape != (n,):
        raise ValueError(f"spadd: {n} indptrs, {len(indices)} indices, {len(datas)} data arrays "
                         f"and {coefficients.shape} coefficients do not match")
    idt = indptrs[0].dtype
    vdt = datas[0].dtype
    _check_operand_dtypes(indptrs, indices, datas, idt, vdt)
    if idt not in (np.int32, np.int64) or vdt not in (np.float32, np.float64):
        raise TypeError(f"spadd: unsupported dtypes index={idt} value={vdt}")
    ub = spadd_row_bounds(indptrs, n_rows) if row_bounds is None else np.asarray(row_bounds)
    if ub.dtype != np.int64 or ub.shape != (n_rows + 1,) or not ub.flags.c_contiguous:
        raise ValueError("spadd: row_bounds must be spadd_row_bounds(indptrs, n_rows)")
    total = int(ub[n_rows])
    odt = idt if index_dtype is None else np.dtype(index_dtype)
    if odt not in (np.int32, np.int64):
        raise TypeError(f"spadd: index_dtype must be int32 or int64, got {odt}")
    if odt == np.int32 and n_cols > INT32_MAX:
        raise ValueError(f"spadd: {n_cols} columns do not fit index_dtype int32")
    if n_rows == 0 or total == 0:
        return (np.zeros(n_rows + 1, dtype=odt), np.empty(0, dtype=odt), np.empty(0, dtype=vdt))
    cdef Py_ssize_t max_ub = int(np.diff(ub).max())
    buf_ind = np.empty(total, dtype=odt)
    buf_val = np.empty(total, dtype=vdt)
    row_cnt = np.empty(n_rows, dtype=np.int64)
    row_src = np.empty(n_rows, dtype=np.int64)
    cdef int code = SPADD_VARIANTS[variant]
    cdef size_t a_coef = _address(coefficients), a_ub = _address(ub)
    cdef size_t a_ind = _address(buf_ind), a_val = _address(buf_val)
    cdef size_t a_rc = _address(row_cnt), a_rs = _address(row_src)
    compact = _spadd_typed(indptrs[0], buf_val, buf_ind, indptrs, indices, datas, a_coef, n_rows, n_cols,
                           num_threads, code, a_ub, max_ub, a_ind, a_val, a_rc, a_rs)
    indptr = np.empty(n_rows + 1, dtype=np.int64)
    indptr[0] = 0
    np.cumsum(row_cnt, out=indptr[1:])
    nnz = int(indptr[n_rows])
    if not compact:
        # rows shrank by duplicates and blocks wrote at their upper-bound
        # offsets: slide them down in place (no second buffer to fault in)
        _compact_dispatch(indptr, row_cnt, row_src, n_rows, buf_ind, buf_val)
    # (with one thread, pages past nnz were never touched: the slice costs no memory)
    out_ind, out_val = buf_ind[:nnz], buf_val[:nnz]
    if odt == np.int32 and nnz > INT32_MAX:
        return indptr, out_ind.astype(np.int64), out_val
    return indptr.astype(odt, copy=False), out_ind, out_val


cdef void _spadd_compact(const int64_t* indptr, const int64_t* row_cnt, const int64_t* row_src,
                         Py_ssize_t m, char* ind, char* val, size_t isz, size_t vsz) noexcept nogil:
    """Move each row from ``row_src[i]`` down to ``indptr[i]`` in place, in
    row order, one memmove per stretch of rows that lie back to back.

    Safe in place: blocks write their rows back to back from their first
    row's upper-bound offset, in row order, so ``row_src`` is increasing
    with ``row_src[i] + row_cnt[i] <= row_src[i + 1]``, and ``indptr[i] <=
    row_src[i]``: a row's destination ends before any later row's source."""
    cdef Py_ssize_t i = 0, j
    cdef int64_t src, dst, n
    while i < m:
        src = row_src[i]
        dst = indptr[i]
        n = row_cnt[i]
        j = i + 1
        while j < m and row_src[j] == src + n:
            n += row_cnt[j]
            j += 1
        if src != dst and n > 0:
            memmove(ind + dst * isz, ind + src * isz, n * isz)
            memmove(val + dst * vsz, val + src * vsz, n * vsz)
        i = j


cdef _compact_dispatch(const int64_t[::1] indptr, const int64_t[::1] row_cnt,
                       const int64_t[::1] row_src, Py_ssize_t m, ind, val):
    cdef size_t ia = _address(ind), va = _address(val)
    cdef size_t isz = ind.dtype.itemsize, vsz = val.dtype.itemsize
    with nogil:
        _spadd_compact(&indptr[0], &row_cnt[0], &row_src[0], m, <char*>ia, <char*>va, isz, vsz)


# --------------------------------------------------------------------------
# Fused kernels (SparseLNR branches with scalar / row temporaries)
# --------------------------------------------------------------------------
def sddmm_spmm(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] bdata,
               const floating[:, ::1] C, const floating[:, ::1] Dt, const floating[:, ::1] E,
               floating[:, ::1] out, int op, int num_threads):
    """sddmm_spmm(indptr, indices, bdata, C, Dt, E, out, op, num_threads)

    Fused <SDDMM, SpMM> with a SCALAR temporary (SparseLNR).

    ``out[i, :] = sum_{p in row i} w_p * E[j, :]`` with ``j = indices[p]``,
    ``s = dot(C[i, :], Dt[j, :])`` and ``w_p = bdata[p] op s`` as in
    :func:`sddmm` (0 mul, 1 div with 0/x = 0, 2 dot).  Covers
    ``A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]`` (``Dt = D``) and GNN-2
    ``Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]`` (C = X, Dt = Y.T,
    E = Y.T: all C-contiguous).  The SDDMM value never materialises.
    Preconditions: B (m x n) CSR; C (m, K), Dt (n, K), E (n, L), out (m, L)
    C-contiguous; out does not alias the inputs.  ``out`` fully overwritten.
    Complexity O(nnz * (K + L)); workspace L doubles per thread.
    """
    cdef _RowTemporaryArgs a
    a.C, a.Dt, a.W = _mptr(C), _mptr(Dt), NULL
    a.K, a.op, a.sampled, a.gemm = C.shape[1], op, True, False
    _row_temporary("sddmm_spmm", &a, indptr, indices, bdata, E, out, num_threads)


def spmm_gemm(const index_t[::1] indptr, const index_t[::1] indices, const floating[::1] data,
              const floating[:, ::1] C, const floating[:, ::1] D, floating[:, ::1] out,
              int num_threads):
    """spmm_gemm(indptr, indices, data, C, D, out, num_threads)

    Fused <SpMM, GEMM> with a ROW temporary: ``out = (A @ C) @ D``.

    Per row i: ``t = sum_p data[p] * C[indices[p], :]`` (thread-private, K
    doubles), then ``out[i, :] = t @ D`` by :func:`_vecmat` (own loop: no
    BLAS call inside the OpenMP region, so no nested BLAS threading and a
    summation order fixed by K).  Covers GNN-1 ``Z = A @ X @ W`` and
    ``A[i,l] = B[i,j] * C[j,k] * D[k,l]``.
    Preconditions: A (m x n) CSR; C (n, K), D (K, L), out (m, L)
    C-contiguous; out aliases nothing.  ``out`` fully overwritten.
    Complexity O(nnz * K + m * K * L); workspace K + L doubles per thread.
    """
    cdef _RowTemporaryArgs a
    a.C, a.Dt, a.W = NULL, NULL, _mptr(D)
    a.K, a.op, a.sampled, a.gemm = 0, SDDMM_MUL, False, True
    _row_temporary("spmm_gemm", &a, indptr, indices, data, C, out, num_threads)


def sddmm_spmm_gemm(const index_t[::1] indptr, const index_t[::1] indices,
                    const floating[::1] bdata, const floating[:, ::1] C,
                    const floating[:, ::1] Dt, const floating[:, ::1] F,
                    const floating[:, ::1] W, floating[:, ::1] out, int num_threads,
                    int op=0):
    """sddmm_spmm_gemm(indptr, indices, bdata, C, Dt, F, W, out, num_threads, op=0)

    Fused <SDDMM, SpMM, GEMM>: scalar temporary, then row temporary.

    ``t[l] = sum_{p in row i} (bdata[p] op dot(C[i], Dt[j])) * F[j, l]``,
    ``out[i, :] = t @ W``; ``op`` as in :func:`sddmm` (default 0: multiply).
    Covers ``A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]``.
    Preconditions: B (m x n) CSR; C (m, K), Dt (n, K), F (n, Lf), W (Lf, M),
    out (m, M) C-contiguous; out aliases nothing.  ``out`` fully overwritten.
    Complexity O(nnz * (K + Lf) + m * Lf * M); workspace Lf + M doubles per
    thread.
    """
    cdef _RowTemporaryArgs a
    a.C, a.Dt, a.W = _mptr(C), _mptr(Dt), _mptr(W)
    a.K, a.op, a.sampled, a.gemm = C.shape[1], op, True, True
    _row_temporary("sddmm_spmm_gemm", &a, indptr, indices, bdata, F, out, num_threads)


cdef struct _RowTemporaryArgs:
    const void* C
    const void* Dt
    const void* F
    const void* W
    void* out
    Py_ssize_t K, L, M, annz
    int op
    bint sampled, gemm
    void** wsp


cdef int _row_temporary(str name, _RowTemporaryArgs* a, const index_t[::1] indptr, const index_t[::1] indices,
                        const floating[::1] data, const floating[:, ::1] F, floating[:, ::1] out,
                        int num_threads) except -1:
    """The row-temporary kernels' one driver: per row ``i``, ``t = sum_p w_p *
    F[j, :]`` (``w_p = data[p]``; ``a.sampled``: ``data[p] op dot(C[i], Dt[j])``
    as in :func:`sddmm`) in the thread's workspace, then ``out[i, :] = t``
    or (``a.gemm``) ``t @ W`` by :func:`_vecmat`.  ``a`` holds C, Dt, W, K,
    op and the two flags; this fills the rest."""
    cdef Py_ssize_t m = indptr.shape[0] - 1
    cdef const index_t* ip = &indptr[0]
    a.L = F.shape[1]
    a.M = out.shape[1] if a.gemm else 0
    a.F = _mptr(F)
    a.annz = ip[m]
    if m == 0 or out.shape[1] == 0:
        return 0
    a.out = &out[0, 0]
    cdef Workspaces ws = Workspaces(num_threads, 1)
    a.wsp = ws.ptr
    # work: a K-dot (sampled), an L-axpy and a row fetch per entry; an L x M vecmat per row (gemm)
    for_rows(name, <block_body>_row_temporary_rows[floating, index_t], a, _fptr(data), ip, _iptr(indices), ip,
               NULL, m, <double>(a.annz - ip[0] + m) * <double>(a.K + a.L + 8)
               + <double>m * <double>a.L * <double>a.M, num_threads, DYNAMIC_BLOCKS, BLOCKS_PER_THREAD, NULL)
    return 0


cdef int _row_temporary_rows(const void* ctx, Py_ssize_t b, Py_ssize_t r0, Py_ssize_t r1, const floating* val,
                             const index_t* ip, const index_t* ind) noexcept nogil:
    """:func:`_row_temporary`'s rows ``[r0, r1)``."""
    cdef const _RowTemporaryArgs* a = <const _RowTemporaryArgs*>ctx
    cdef const floating* cp = <const floating*>a.C
    cdef const floating* dp = <const floating*>a.Dt
    cdef const floating* fp = <const floating*>a.F
    cdef const floating* wp = <const floating*>a.W
    cdef floating* op_ = <floating*>a.out
    # (the struct's fields in locals: the stores through ``t`` and ``op_`` could alias them)
    cdef Py_ssize_t K = a.K, L = a.L, M = a.M, annz = a.annz, width = a.M if a.gemm else a.L, i, p, l
    cdef bint sampled = a.sampled, gemm = a.gemm
    cdef int op = a.op
    cdef double* t = <double*>ws_get(a.wsp, 1, 0, (L + M + 1) * sizeof(double))
    cdef double* acc
    cdef double w
    if t == NULL:
        return -1
    acc = t + L if gemm else t
    for i in range(r0, r1):
        memset(t, 0, L * sizeof(double))
        if sampled:
            for p in range(ip[i], ip[i + 1]):
                if p + 2 < annz:
                    _prefetch_row(dp + <Py_ssize_t>ind[p + 2] * K, K * sizeof(floating))
                    _prefetch_row(fp + <Py_ssize_t>ind[p + 2] * L, L * sizeof(floating))
                w = _sddmm_value(op, <double>val[p], _dot(cp + i * K, dp + <Py_ssize_t>ind[p] * K, K))
                _axpy(t, w, fp + <Py_ssize_t>ind[p] * L, L)
        else:   # (apart: no test per entry in the plain SpMM's loop)
            for p in range(ip[i], ip[i + 1]):
                if p + 2 < annz:
                    _prefetch_row(fp + <Py_ssize_t>ind[p + 2] * L, L * sizeof(floating))
                _axpy(t, <double>val[p], fp + <Py_ssize_t>ind[p] * L, L)
        if gemm:
            _vecmat(t, L, wp, M, acc)
        for l in range(width):
            op_[i * width + l] = <floating>acc[l]
    return 0
