# cython: language_level=3
"""Dense template kernels: BLAS products and element-wise maps.

* ``gemm`` calls BLAS through ``scipy.linalg.cython_blas`` (LP64 ``int``
  sizes, column-major): a C-contiguous (row-major) product ``out = A @ B``
  is computed as the column-major ``out^T = B^T @ A^T``, i.e. by swapping
  the operands, with no copies.  The product is cut into fixed blocks that
  our own OpenMP team shares, each a single-threaded BLAS call: BLAS's own
  pool is kept asleep (see :func:`hold_blas_to_one_thread`).
* ``map_unary`` applies one unary op to a 1-D value array (e.g. the data of
  a sparse operand with an unchanged pattern), computed in double.
* ``pattern_program`` runs element-wise work and row reductions on one CSR
  pattern (``spfuse.lowering.pattern_values``): a table of instructions,
  interpreted per row and instruction, each a tight loop over the row's
  entries.
* ``transpose`` copies a C-ordered matrix into its transpose, C-ordered,
  tile by tile: a dense operand read in the other mode order (``D.T``, a
  Fortran array, a result wanted the other way round) becomes C-ordered at
  about the speed of a copy, where numpy's element-strided copy of a tall
  matrix's ``a.T`` runs 2-3x slower.
"""
cimport cython
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.math cimport fabs, log, sqrt, tanh
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset
from scipy.linalg.cython_blas cimport dgemm, sgemm

from spfuse._kernels._kernel_common cimport (
    UNARY_ABS, UNARY_EXP, UNARY_LOG, UNARY_NEG, UNARY_RELU, UNARY_SIGMOID, UNARY_SQRT,
    UNARY_TANH, index_t,
)
from spfuse._kernels._epilogue cimport _Epilogue, _epilogue_from, _run_epilogue
from spfuse._kernels._leaves cimport _dot, _prefetch_row, spfuse_exp, spfuse_sigmoid
from spfuse._kernels._openmp_helpers cimport omp_get_thread_num
from spfuse._kernels._workspace cimport padded_stride

__all__ = ["PATTERN_ARGS", "PATTERN_OPS", "UNARY_OPS", "gather", "gemm", "hold_blas_to_one_thread", "map_unary",
           "pattern_program", "transpose"]

#: op codes of :func:`map_unary` (name -> code)
UNARY_OPS = {
    "relu": UNARY_RELU, "sigmoid": UNARY_SIGMOID, "tanh": UNARY_TANH, "exp": UNARY_EXP,
    "log": UNARY_LOG, "abs": UNARY_ABS, "sqrt": UNARY_SQRT, "neg": UNARY_NEG,
}

#: edge of the square tiles :func:`transpose` copies (two 32×32 tiles of
#: doubles are 16 KiB: both stay in L1 while one is read by rows and the
#: other written by columns)
cdef enum:
    _TILE = 32

cdef enum:
    # a product with at most this many ``n * k`` (columns of out times the
    # summed extent) is thin: cut into row blocks by BLAS_SERIAL_MNK
    THIN_NK = 4096
    # OpenBLAS runs a product of at most this many ``m * n * k`` on the calling
    # thread (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD)
    BLAS_SERIAL_MNK = 262144
    # a wider product is cut along its longer side of out into at most
    # GEMM_MAX_BLOCKS blocks of at least GEMM_MIN_SIDE rows (or columns): each
    # block repacks the other operand, a cost of about 1/GEMM_MIN_SIDE
    GEMM_MIN_SIDE = 32
    GEMM_MAX_BLOCKS = 16
    # a product whose out is too small to cut (one block along its longer
    # side: a weight gradient Xᵀ·G of two tall factors) is cut along the
    # summed extent instead, into at most GEMM_MAX_DEPTH_BLOCKS blocks of at
    # least GEMM_MIN_DEPTH, each into its own partial of out (added in
    # block order)
    GEMM_MIN_DEPTH = 2048
    GEMM_MAX_DEPTH_BLOCKS = 8

# Beyond this many int-sized elements a dimension no longer fits LP64 BLAS.
cdef Py_ssize_t _INT_MAX = 2147483647

ctypedef void (*_set_threads_fn)(int) noexcept nogil
ctypedef int (*_get_threads_fn)() noexcept nogil
cdef _set_threads_fn _blas_set_threads = NULL
cdef _get_threads_fn _blas_get_threads = NULL


def hold_blas_to_one_thread(size_t set_address, size_t get_address):
    """hold_blas_to_one_thread(set_address, get_address)

    Bind the thread-count setter and getter (C addresses of OpenBLAS's
    ``openblas_set_num_threads`` / ``openblas_get_num_threads``, as exported
    by the library ``scipy.linalg.cython_blas`` calls; 0, 0 unbinds).
    While bound, :func:`gemm` holds that library to one thread for the
    length of each call and runs its blocks on our own OpenMP team, then
    restores the user's setting.  Its pool is then never woken by spfuse:
    OpenBLAS's workers busy-wait ~0.1 s after each threaded call, and a
    kernel or torch op that follows on the same cores waits for them (a
    2-layer GCN training step, 2 threads: 12.3 ms with the pool woken by
    its gradient products, 5.1 ms with it asleep).
    """
    global _blas_set_threads, _blas_get_threads
    if (set_address == 0) != (get_address == 0):
        raise ValueError("hold_blas_to_one_thread: bind both addresses or neither")
    _blas_set_threads = <_set_threads_fn>set_address
    _blas_get_threads = <_get_threads_fn>get_address


cdef inline void _gemm_block(char* ta, char* tb, int m0, int mb, int n0, int nb, int k,
                             const floating* a0, int lda, const floating* b0, int ldb,
                             floating* o0, int ldo, bint trans_a, bint trans_b, int k0=0) noexcept nogil:
    """``out[m0:m0+mb, n0:n0+nb] = op(A)[m0:m0+mb, k0:k0+k] @ op(B)[k0:k0+k, n0:n0+nb]``
    as one BLAS call."""
    cdef floating one = 1, zero = 0
    # rows m0.. of op(A): rows of A, or (transposed) its columns; columns
    # n0.. of op(B): columns of B, or (transposed) its rows; the summed
    # extent from k0: columns of A (rows, transposed), rows of B (columns)
    cdef const floating* a = a0 + (m0 + <Py_ssize_t>k0 * lda if trans_a else <Py_ssize_t>m0 * lda + k0)
    cdef const floating* b = b0 + (<Py_ssize_t>n0 * ldb + k0 if trans_b else n0 + <Py_ssize_t>k0 * ldb)
    cdef floating* o = o0 + <Py_ssize_t>m0 * ldo + n0
    if floating is double:
        dgemm(tb, ta, &nb, &mb, &k, &one, <double*>b, &ldb, <double*>a, &lda, &zero, o, &ldo)
    else:
        sgemm(tb, ta, &nb, &mb, &k, &one, <float*>b, &ldb, <float*>a, &lda, &zero, o, &ldo)


cdef void _epilogue_rows(const _Epilogue* e, floating* out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n,
                         double* regs) noexcept nogil:
    """Rows ``[lo, hi)`` of the C-ordered ``out`` (``n`` columns) through
    the epilogue, in place (``regs``: ``e.n_regs * n`` doubles)."""
    cdef Py_ssize_t r, c
    for r in range(lo, hi):
        for c in range(n):
            regs[c] = <double>out[r * n + c]
        _run_epilogue(e, regs, n, r, 0, n)
        for c in range(n):
            out[r * n + c] = <floating>regs[e.out_reg * n + c]


def gemm(const floating[:, ::1] A, const floating[:, ::1] B, floating[:, ::1] out,
         num_threads=None, bint trans_a=False, bint trans_b=False, object epilogue=None):
    """gemm(A, B, out, num_threads=None, trans_a=False, trans_b=False, epilogue=None)

    ``out = op(A) @ op(B)`` for C-contiguous A, B, out (m, n), where
    ``op(X)`` is ``X.T`` when its ``trans_`` flag is set, else ``X``: op(A)
    is (m, k), op(B) is (k, n).  A transposed operand is read as stored
    (BLAS's 'T'), not copied.

    BLAS (dgemm/sgemm by dtype) on swapped operands:
    ``gemm(tb, ta, n, m, k, 1, B, ldb, A, lda, 0, out, n)``.  ``out`` must not
    alias A or B; it is fully overwritten (zeros when k == 0).
    Dimensions must be < 2**31 (LP64 BLAS).  Complexity O(m * n * k).

    The product is cut into fixed blocks of out shared by ``num_threads``
    threads of our own OpenMP team, as scikit-learn's k-means calls BLAS per
    chunk inside ``prange``; each block is a single-threaded BLAS call:
    * a thin product (``n * k <= THIN_NK``: GNN-style ``H @ W`` with a few
      dozen columns) in row blocks small enough (``rows * n * k <=
      BLAS_SERIAL_MNK``) that OpenBLAS runs each on the calling thread;
    * with BLAS held to one thread (:func:`hold_blas_to_one_thread`), any
      other product of more than ``BLAS_SERIAL_MNK`` multiply-adds along the
      longer side of out, in up to ``GEMM_MAX_BLOCKS`` blocks;
    * otherwise one BLAS call on BLAS's own threads.
    * with BLAS held, a product whose out is one block that way but whose
      summed extent is deep (``k >= 2 * GEMM_MIN_DEPTH``: ``Xᵀ·G`` of two
      tall factors, a weight gradient) in up to ``GEMM_MAX_DEPTH_BLOCKS``
      blocks of ``k``, each into its own partial of out, the partials added
      in block order (in double).
    The blocks depend on the shapes only, never on ``num_threads``: each
    element of out is one BLAS dot over the whole ``k``, or over the same
    fixed pieces of it, so results do not depend on the team size.

    ``epilogue``: element-wise operations applied to each row of out right
    after its block's BLAS call, while the block is in cache (``relu(H @ W +
    b)``): a register program as :func:`spfuse._kernels._csr_kernels.spmm`
    takes (``_epilogue.pxd``), register 0 the row as stored.  The blocks are
    then always row blocks (never pieces of ``k``).
    """
    cdef int m = A.shape[1] if trans_a else A.shape[0]
    cdef int k = A.shape[0] if trans_a else A.shape[1]
    cdef int n = B.shape[0] if trans_b else B.shape[1]
    cdef int lda = A.shape[1], ldb = B.shape[1]
    cdef char ta = b'T' if trans_a else b'N'
    cdef char tb = b'T' if trans_b else b'N'
    if A.shape[0] > _INT_MAX or A.shape[1] > _INT_MAX or B.shape[0] > _INT_MAX or B.shape[1] > _INT_MAX:
        raise OverflowError("gemm: dimensions exceed the LP64 BLAS range")
    if (B.shape[1] if trans_b else B.shape[0]) != k or out.shape[0] != m or out.shape[1] != n:
        raise ValueError("gemm: shapes do not match")
    if m == 0 or n == 0:
        return
    cdef Py_ssize_t work = <Py_ssize_t>m * n * k
    cdef Py_ssize_t nblocks = 1, blk, side = m, i, size = <Py_ssize_t>m * n
    cdef bint by_rows = True
    cdef int lo, hi
    cdef floating* p0
    cdef double total
    cdef int team = num_threads if num_threads is not None and num_threads > 0 else 1
    cdef bint hold = _blas_set_threads != NULL and work > BLAS_SERIAL_MNK
    cdef int before = 1
    cdef _Epilogue epi
    cdef bint has_epi = epilogue is not None
    cdef double* regs
    cdef int failed = 0
    if has_epi:
        keep = _epilogue_from(epilogue, &epi)
    if k == 0:
        with nogil:
            memset(&out[0, 0], 0, <size_t>m * n * sizeof(floating))
        if has_epi:   # (no BLAS call: the zero rows go through the epilogue)
            regs = <double*>malloc(epi.n_regs * n * sizeof(double))
            if regs == NULL:
                raise MemoryError("gemm: cannot allocate the epilogue's registers")
            with nogil:
                _epilogue_rows(&epi, &out[0, 0], 0, m, n, regs)
            free(regs)
        return
    if <Py_ssize_t>n * k <= THIN_NK:
        nblocks = (m + BLAS_SERIAL_MNK // (<Py_ssize_t>n * k) - 1) // (BLAS_SERIAL_MNK // (<Py_ssize_t>n * k))
    elif hold:
        by_rows = m >= n or has_epi
        side = m if by_rows else n
        nblocks = max(1, min(<Py_ssize_t>GEMM_MAX_BLOCKS, side // GEMM_MIN_SIDE))
    cdef Py_ssize_t depth_blocks = 1
    if hold and nblocks == 1 and <Py_ssize_t>n * k > THIN_NK and not has_epi:
        depth_blocks = max(1, min(<Py_ssize_t>GEMM_MAX_DEPTH_BLOCKS, k // GEMM_MIN_DEPTH))
    cdef Py_ssize_t blocks = depth_blocks if depth_blocks > 1 else nblocks
    cdef const floating* a0 = &A[0, 0]
    cdef const floating* b0 = &B[0, 0]
    cdef floating* o0 = &out[0, 0]
    if depth_blocks > 1:
        p0 = <floating*>malloc(depth_blocks * size * sizeof(floating))
        if p0 == NULL:
            raise MemoryError("gemm: cannot allocate the partial products")
    with nogil:
        if hold:
            before = _blas_get_threads()
            if before != 1:
                _blas_set_threads(1)
        for blk in prange(blocks, schedule="dynamic", chunksize=1, num_threads=team if blocks > 1 else 1):
            if depth_blocks > 1:   # (a block of k into its own partial)
                lo = <int>(blk * k // blocks)
                hi = <int>((blk + 1) * k // blocks)
                _gemm_block(&ta, &tb, 0, m, 0, n, hi - lo, a0, lda, b0, ldb, p0 + blk * size, n,
                            trans_a, trans_b, lo)
            else:
                lo = <int>(blk * side // blocks)
                hi = <int>((blk + 1) * side // blocks)
                if by_rows:
                    _gemm_block(&ta, &tb, lo, hi - lo, 0, n, k, a0, lda, b0, ldb, o0, n, trans_a, trans_b)
                    if has_epi:   # the block's rows through the epilogue, still in cache
                        regs = <double*>malloc(epi.n_regs * n * sizeof(double))
                        if regs == NULL:
                            failed += 1
                            continue
                        _epilogue_rows(&epi, o0, lo, hi, n, regs)
                        free(regs)
                else:
                    _gemm_block(&ta, &tb, 0, m, lo, hi - lo, k, a0, lda, b0, ldb, o0, n, trans_a, trans_b)
        if hold and before != 1:
            _blas_set_threads(before)
        if depth_blocks > 1:   # the partials added in block order
            for i in range(size):
                total = 0.0
                for blk in range(depth_blocks):
                    total = total + <double>p0[blk * size + i]
                o0[i] = <floating>total
    if depth_blocks > 1:
        free(p0)
    if failed:
        raise MemoryError("gemm: cannot allocate the epilogue's registers")


cdef inline double _unary(int op, double x) noexcept nogil:
    if op == UNARY_RELU:
        return x if x > 0.0 else (x if x != x else 0.0)   # NaN propagates like np.maximum
    elif op == UNARY_SIGMOID:
        return spfuse_sigmoid(x)
    elif op == UNARY_TANH:
        return tanh(x)
    elif op == UNARY_EXP:
        return spfuse_exp(x)
    elif op == UNARY_LOG:
        return log(x)
    elif op == UNARY_ABS:
        return fabs(x)
    elif op == UNARY_SQRT:
        return sqrt(x)
    return -x


cdef enum:
    ROW_SEGMENT = 256   # columns of a row a standalone epilogue works on at a time


def rows_program(object epilogue, floating[:, ::1] out, int num_threads=1):
    """rows_program(epilogue, out, num_threads=1)

    ``out`` (m x K, C-ordered) computed by a register program alone, as
    :func:`gemm`'s epilogue but with no product (register 0 holds zeros and
    nothing reads it): element-wise work over dense arrays
    (``T / r[i]``, ``relu(T + b[k]) * M``) in one pass over the result,
    segment by segment of each row while in cache, on ``num_threads``
    threads (numpy's element-wise loops run one operation per pass, on one
    thread).  A vector result is one row (its vectors are ``EPI_COL``
    arguments).  Static segments: the same arithmetic on any team.
    """
    cdef _Epilogue epi
    keep = _epilogue_from(epilogue, &epi)
    cdef Py_ssize_t m = out.shape[0], K = out.shape[1]
    if m == 0 or K == 0:
        return
    cdef Py_ssize_t nseg = (K + ROW_SEGMENT - 1) // ROW_SEGMENT
    cdef Py_ssize_t tasks = m * nseg, t, i, k0, kw, c
    cdef floating* o0 = &out[0, 0]
    cdef double* regs
    cdef int failed = 0
    with nogil, parallel(num_threads=num_threads if tasks > 1 else 1):
        regs = <double*>malloc(epi.n_regs * ROW_SEGMENT * sizeof(double))
        for t in prange(tasks, schedule="static"):
            if regs == NULL:
                failed += 1
            else:
                i = t // nseg
                k0 = (t % nseg) * ROW_SEGMENT
                kw = min(<Py_ssize_t>ROW_SEGMENT, K - k0)
                memset(regs, 0, kw * sizeof(double))
                _run_epilogue(&epi, regs, kw, i, k0, K)
                for c in range(kw):
                    o0[i * K + k0 + c] = <floating>regs[epi.out_reg * kw + c]
        free(regs)
    if failed:
        raise MemoryError("rows_program: cannot allocate the registers")


def map_unary(const floating[::1] values, int op_code, floating[::1] out, int num_threads=1):
    """map_unary(values, op_code, out, num_threads=1)

    ``out[p] = f(values[p])`` for ``f = UNARY_OPS`` code ``op_code``.

    Codes: relu 0 (``max(x, 0)``, NaN kept), sigmoid 1 (overflow-safe
    form), tanh 2, exp 3, log 4, abs 5, sqrt 6, neg 7; evaluated in double
    with libm (exp, also in sigmoid: ``spfuse_exp``, within 1 ulp of libm's
    and vectorised), then rounded to the value type (log/sqrt of negatives give
    NaN, log(0) gives -inf, as numpy, without warnings).  ``out`` may be
    ``values`` (in place); same length.  Static prange over elements;
    elementwise, so identical for any thread count.  O(n).  An unknown code
    behaves as ``neg`` -- the Python layer only passes UNARY_OPS values.
    """
    cdef Py_ssize_t n = values.shape[0], p
    if n == 0:
        return
    with nogil:
        if op_code == UNARY_EXP:   # (a loop of its own: vectorised)
            for p in prange(n, schedule="static", num_threads=num_threads):
                out[p] = <floating>spfuse_exp(<double>values[p])
        else:
            for p in prange(n, schedule="static", num_threads=num_threads):
                out[p] = <floating>_unary(op_code, <double>values[p])


def gather(const floating[::1] values, const int64_t[::1] order, floating[::1] out, int num_threads=1):
    """gather(values, order, out, num_threads=1)

    ``out[p] = values[order[p]]``: a sparse tensor's values in another
    storage order (CSR as CSC, a transpose), ``order`` the permutation
    remembered for its pattern.  numpy's ``take`` runs it on one thread at
    about 7 ns per random read (1M values: 7 ms); here the team shares
    static ranges of ``out``.  Preconditions (the caller's: ``order`` is a
    permutation it built): every ``order[p]`` in ``[0, len(values))``.
    Raises ValueError when ``out`` and ``order`` differ in length.
    Elementwise, so identical for any thread count.  O(n).

    >>> import numpy as np
    >>> out = np.empty(3); gather(np.array([1.0, 2.0, 3.0]), np.array([2, 0, 1]), out); out.tolist()
    [3.0, 1.0, 2.0]
    """
    cdef Py_ssize_t n = order.shape[0], p
    if out.shape[0] != n:
        raise ValueError(f"gather: out has {out.shape[0]} entries, order {n}")
    if n == 0:
        return
    cdef const floating* v = &values[0]
    cdef const int64_t* o = &order[0]
    cdef floating* dst = &out[0]
    with nogil:
        for p in prange(n, schedule="static", num_threads=num_threads):
            dst[p] = v[o[p]]


def transpose(const floating[:, ::1] a, floating[:, ::1] out, int num_threads=1):
    """transpose(a, out, num_threads=1)

    ``out[j, i] = a[i, j]``: ``out`` (C-ordered, shape ``a.shape[::-1]``)
    becomes ``a``'s transpose.  Copied in 32×32 tiles, so that each tile of
    ``a`` is read by rows and each of ``out`` written by rows of the other
    tile while both sit in cache.  The tiles are shared among
    ``num_threads`` threads in bands of ``out``'s rows, or -- when ``a`` has
    too few columns to give each thread a band (a 20000×32 factor) -- in
    bands of ``out``'s columns (static schedule: each element is copied
    once, by one thread, so any thread count gives the same bits).  O(size).
    ``out`` must not overlap ``a``.
    """
    cdef Py_ssize_t m = a.shape[0], n = a.shape[1]
    if out.shape[0] != n or out.shape[1] != m:
        raise ValueError(f"transpose: out has shape ({out.shape[0]}, {out.shape[1]}), "
                         f"the transpose of ({m}, {n}) needs ({n}, {m})")
    cdef Py_ssize_t t, i0, i1, j0, j1, i, j
    cdef Py_ssize_t row_tiles = (n + _TILE - 1) // _TILE, col_tiles = (m + _TILE - 1) // _TILE
    cdef bint by_rows = row_tiles >= 4 * num_threads or row_tiles >= col_tiles
    # (the tiles' loop order, see _transpose_tiles; a wide ``a`` has as many
    # row tiles of ``out`` as column tiles or more: always cut by rows)
    cdef bint wide = m < n
    cdef Py_ssize_t bands = row_tiles if by_rows else col_tiles
    cdef const floating* src
    cdef floating* dst
    if m == 0 or n == 0:
        return
    src = &a[0, 0]
    dst = &out[0, 0]
    with nogil:
        if wide:   # (a loop of its own: sharing one with the other order slowed that one 2x)
            for t in prange(bands, schedule="static", num_threads=num_threads):
                j0 = t * _TILE
                _transpose_tiles(src, dst, m, n, 0, m, j0, min(j0 + _TILE, n), True)
        else:
            for t in prange(bands, schedule="static", num_threads=num_threads):
                if by_rows:   # a band of _TILE rows of ``out``, all its columns
                    j0 = t * _TILE
                    j1 = min(j0 + _TILE, n)
                    i0 = 0
                    i1 = m
                else:         # a band of _TILE columns of ``out``, all its rows
                    j0 = 0
                    j1 = n
                    i0 = t * _TILE
                    i1 = min(i0 + _TILE, m)
                _transpose_tiles(src, dst, m, n, i0, i1, j0, j1, False)


cdef inline void _transpose_tiles(const floating* src, floating* dst, Py_ssize_t m, Py_ssize_t n,
                                  Py_ssize_t i0, Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1,
                                  bint by_out_rows) noexcept nogil:
    """``dst[j, i] = src[i, j]`` over ``[i0, i1) × [j0, j1)``, tile by tile.
    Each tile is read a ``src`` row at a time, or with ``by_out_rows``
    written a ``dst`` row at a time, gathering down ``src``'s columns: for a
    wide ``src`` (a K × n factor, 64 × 100k, one thread: 6.2-7.9 against
    10.3-12.3 ms by ``src`` rows; two threads 2.6-3.1 against 4.2-4.7).
    (Callers pass a constant: each inlined copy keeps one loop order.)"""
    cdef Py_ssize_t ti, tj, i, j, ie, je
    cdef const floating* irow
    cdef floating* jrow
    tj = j0
    while tj < j1:
        je = min(tj + _TILE, j1)
        ti = i0
        while ti < i1:
            ie = min(ti + _TILE, i1)
            if by_out_rows:
                for j in range(tj, je):
                    jrow = dst + j * m
                    for i in range(ti, ie):
                        jrow[i] = src[i * n + j]
            else:
                for i in range(ti, ie):
                    irow = src + i * n
                    for j in range(tj, je):
                        dst[j * m + i] = irow[j]
            ti = ti + _TILE
        tj = tj + _TILE


# --------------------------------------------------------------------------
# Pattern programs: element-wise work and row reductions on one CSR pattern
# --------------------------------------------------------------------------
# A program (made by ``spfuse.lowering.pattern_values``) is a table of
# instructions, one row each:
#   [opcode, sub, dst_kind, dst, nargs, coef_base, flags, (arg kind, arg index) * nargs]
# run over blocks of whole rows (up to PAT_BLOCK_ENTRIES entries and
# PAT_BLOCK_ROWS rows; a longer row is a block alone): entry registers hold
# the block's entries, row registers one value per row.  Interpretation is
# paid per instruction and block, never per entry: each argument is first
# laid out over the block's entries by a loop of its own kind, then an
# element-wise operation runs one tight loop over them (row by row, a row of
# ten entries paid the dispatch of every instruction per ten entries: the
# SDDMM-div adjoint's program ran at 2x its dot and axpy leaves).
cdef enum:
    PAT_COPY = 0
    PAT_ADD = 1        # sum of coefficient * argument, left to right
    PAT_SUB = 2        # the first term minus the others (each times its coefficient)
    PAT_MUL = 3
    PAT_DIV = 4        # a / b, and 0 where a is 0
    PAT_WHERE = 5      # b where a != 0 (NaN too), else c
    PAT_UNARY = 6      # sub: a UNARY_* code
    PAT_REDUCE = 7     # sub: 0 sum, 1 max, 2 min over the row's entries (max/min see implicit zeros)
    PAT_ROW_DOT = 8    # a row's sum over e of the product of dense operands; sub: the array whose stride is e's extent
    PAT_ENTRY_DOT = 9  # per entry, the dot of the row's dense row and the column's (SDDMM's leaf): args dense_row, col_row
    PAT_ROW_AXPY = 10  # a dense matrix row: sum over the entries of a value times the column's dense row
                       # (SpMM's leaf): args (a value laid out over the entries, col_row); dst: the output array
    PAT_STORED_EXTREMUM = 11  # sub 1 max / 2 min: a row's ``max(P*(e - c)) + c``, ``c = min(P*e)`` (min: the
                              # other way round), args (P, e): a reduction over a pattern's stored entries as
                              # the front end writes it (spfuse.frontend.patterns): the arithmetic, and bits,
                              # of its five instructions in one pass over each row's entries

cdef enum:
    ARG_CONST = 0      # consts[index]
    ARG_ENTRY = 1      # entry register
    ARG_ROW = 2        # row register (the row's value at every entry)
    ARG_PATTERN = 3    # arrays[index][p]: values stored on the pattern
    ARG_ROWVEC = 4     # arrays[index][i]
    ARG_COLVEC = 5     # arrays[index][column of p]
    ARG_MATRIX = 6     # arrays[index][i * strides[index] + column of p]
    ARG_SCALAR = 7     # arrays[index][0]
    ARG_DENSE_ROW = 8  # arrays[index][i * strides[index] + e] (a row dot's matrix operand)
    ARG_DENSE_E = 9    # arrays[index][e] (a row dot's vector operand)
    ARG_COL_ROW = 10   # arrays[index][column of p * strides[index] + e] (an entry dot's or axpy's gathered row)

cdef enum:
    PAT_BLOCK_ENTRIES = 256
    PAT_BLOCK_ROWS = 64

cdef enum:
    PAT_HEADER = 7
    PAT_ROW_RESTRICTED = 1   # flag: a row-wise result is 0 on rows storing nothing

PATTERN_OPS = {"copy": PAT_COPY, "+": PAT_ADD, "-": PAT_SUB, "*": PAT_MUL, "/": PAT_DIV, "where": PAT_WHERE,
               "unary": PAT_UNARY, "reduce": PAT_REDUCE, "row_dot": PAT_ROW_DOT, "entry_dot": PAT_ENTRY_DOT,
               "row_axpy": PAT_ROW_AXPY, "stored_extremum": PAT_STORED_EXTREMUM}
PATTERN_ARGS = {"const": ARG_CONST, "entry": ARG_ENTRY, "row": ARG_ROW, "pattern": ARG_PATTERN,
                "rowvec": ARG_ROWVEC, "colvec": ARG_COLVEC, "matrix": ARG_MATRIX, "scalar": ARG_SCALAR,
                "dense_row": ARG_DENSE_ROW, "dense_e": ARG_DENSE_E, "col_row": ARG_COL_ROW}


cdef inline double _row_arg(int kind, Py_ssize_t index, Py_ssize_t i, const double* consts, double* rows,
                            double** arrays) noexcept nogil:
    """A row-level argument's value at row ``i``."""
    if kind == ARG_CONST:
        return consts[index]
    if kind == ARG_ROW:
        return rows[index]
    if kind == ARG_ROWVEC:
        return arrays[index][i]
    return arrays[index][0]   # ARG_SCALAR


cdef inline const double* _block_arg(int kind, Py_ssize_t index, Py_ssize_t i0, Py_ssize_t nr,
                                     const index_t* ip, const index_t* cols, const double* consts, double* rows,
                                     Py_ssize_t nrs, double** arrays, const int64_t* strides, double* entries,
                                     Py_ssize_t bw, double* scratch) noexcept nogil:
    """An argument laid out over the entries of rows ``[i0, i0 + nr)`` (the
    block's positions ``[ip[i0], ip[i0 + nr])``, contiguous): a register or
    stored values as they are, anything else written into ``scratch``.
    Row ``r`` of the block keeps its row registers at ``rows + r * nrs``."""
    cdef Py_ssize_t P0 = ip[i0], N = ip[i0 + nr] - P0, e, r
    cdef double v
    cdef const double* a
    if kind == ARG_ENTRY:
        return entries + index * bw
    if kind == ARG_PATTERN:
        return arrays[index] + P0
    if kind == ARG_COLVEC:
        a = arrays[index]
        for e in range(N):
            scratch[e] = a[cols[P0 + e]]
        return scratch
    if kind == ARG_CONST or kind == ARG_SCALAR:
        v = consts[index] if kind == ARG_CONST else arrays[index][0]
        for e in range(N):
            scratch[e] = v
        return scratch
    for r in range(nr):   # a value or a matrix row per row
        if kind == ARG_MATRIX:
            a = arrays[index] + (i0 + r) * strides[index]
            for e in range(ip[i0 + r], ip[i0 + r + 1]):
                scratch[e - P0] = a[cols[e]]
        else:
            v = _row_arg(kind, index, i0 + r, consts, rows + r * nrs, arrays)
            for e in range(ip[i0 + r] - P0, ip[i0 + r + 1] - P0):
                scratch[e] = v
    return scratch


cdef inline double _row_op(const int64_t* ins, Py_ssize_t i, const double* consts, double* rows,
                           double** arrays) noexcept nogil:
    """A row-wise instruction's value at row ``i`` (the entry-wise ones, on one value)."""
    cdef int op = <int>ins[0]
    cdef Py_ssize_t nargs = ins[4], k
    cdef double a = _row_arg(<int>ins[PAT_HEADER], ins[PAT_HEADER + 1], i, consts, rows, arrays)
    cdef double b, r
    if op == PAT_COPY:
        return a
    if op == PAT_UNARY:
        return _unary(<int>ins[1], a)
    if op == PAT_ADD or op == PAT_SUB:
        r = a * consts[ins[5]]
        for k in range(1, nargs):
            b = _row_arg(<int>ins[PAT_HEADER + 2 * k], ins[PAT_HEADER + 2 * k + 1], i, consts, rows, arrays)
            if consts[ins[5] + k] != 1.0:
                b = b * consts[ins[5] + k]
            r = r + b if op == PAT_ADD else r - b
        return r
    b = _row_arg(<int>ins[PAT_HEADER + 2], ins[PAT_HEADER + 3], i, consts, rows, arrays)
    if op == PAT_MUL:
        r = a * b
        for k in range(2, nargs):
            r = r * _row_arg(<int>ins[PAT_HEADER + 2 * k], ins[PAT_HEADER + 2 * k + 1], i, consts, rows, arrays)
        return r
    if op == PAT_DIV:
        return 0.0 if a == 0.0 else a / b
    # PAT_WHERE
    return b if a != 0.0 else _row_arg(<int>ins[PAT_HEADER + 4], ins[PAT_HEADER + 5], i, consts, rows, arrays)


cdef inline double _row_dot(const int64_t* ins, Py_ssize_t i, const double* consts, double* rows,
                            double** arrays, const int64_t* strides) noexcept nogil:
    """``sum(e, x0 * x1 * ...)`` at row ``i``: each term's factors multiplied
    left to right, the terms added in ``e`` order from 0."""
    cdef Py_ssize_t extent = strides[ins[1]], nargs = ins[4], e, k, index
    cdef int kind
    cdef double r = 0.0, t, x
    for e in range(extent):
        t = 1.0
        for k in range(nargs):
            kind = <int>ins[PAT_HEADER + 2 * k]
            index = ins[PAT_HEADER + 2 * k + 1]
            if kind == ARG_DENSE_ROW:
                x = arrays[index][i * strides[index] + e]
            elif kind == ARG_DENSE_E:
                x = arrays[index][e]
            else:
                x = _row_arg(kind, index, i, consts, rows, arrays)
            t = x if k == 0 else t * x
        r = r + t
    return r


cdef inline void _entry_dots(const int64_t* ins, Py_ssize_t i, Py_ssize_t p0, Py_ssize_t n, const index_t* cols,
                             Py_ssize_t nnz, double** arrays, const int64_t* strides, double* dst) noexcept nogil:
    """``dst[e] = dot(L[i, :], R[column of entry e, :])`` over row ``i``'s
    entries (``L``: the first argument, a row-indexed dense matrix; ``R``:
    the second, a column-indexed one; both rows ``strides`` long).  The rows
    of the entries two ahead are prefetched, into the next row's (``nnz``:
    the pattern's entries): rows of ten entries lost a fifth of the hints."""
    cdef Py_ssize_t K = strides[ins[PAT_HEADER + 3]], e
    cdef const double* left = arrays[ins[PAT_HEADER + 1]] + i * strides[ins[PAT_HEADER + 1]]
    cdef const double* right = arrays[ins[PAT_HEADER + 3]]
    for e in range(n):
        if p0 + e + 2 < nnz:
            _prefetch_row(right + cols[p0 + e + 2] * K, K)
        dst[e] = _dot(left, right + cols[p0 + e] * K, K)


cdef inline void _row_axpy(const int64_t* ins, Py_ssize_t i, Py_ssize_t p0, Py_ssize_t n, const index_t* cols,
                           Py_ssize_t nnz, const double* values, double** arrays, const int64_t* strides) noexcept nogil:
    """Row ``i`` of the output array ``arrays[ins[3]]``: ``sum_e values[e] *
    R[column of entry e, :]``, added in the entries' order (``R``: the
    second argument, rows ``strides`` long)."""
    cdef Py_ssize_t L = strides[ins[PAT_HEADER + 3]], e = 0, k, f
    cdef const double* right = arrays[ins[PAT_HEADER + 3]]
    cdef const double* r0
    cdef const double* r1
    cdef const double* r2
    cdef const double* r3
    cdef double* orow = arrays[ins[3]] + i * L
    cdef double v0, v1, v2, v3
    for k in range(L):
        orow[k] = 0.0
    # four entries a pass over the output row: one load and store of it per
    # four gathered rows, the additions still in the entries' order
    while e + 4 <= n:
        for f in range(p0 + e + 4, min(p0 + e + 8, nnz)):   # (into the next row's entries)
            _prefetch_row(right + cols[f] * L, L)
        v0, v1, v2, v3 = values[e], values[e + 1], values[e + 2], values[e + 3]
        r0 = right + cols[p0 + e] * L
        r1 = right + cols[p0 + e + 1] * L
        r2 = right + cols[p0 + e + 2] * L
        r3 = right + cols[p0 + e + 3] * L
        for k in range(L):
            orow[k] = (((orow[k] + v0 * r0[k]) + v1 * r1[k]) + v2 * r2[k]) + v3 * r3[k]
        e = e + 4
    while e < n:
        v0 = values[e]
        r0 = right + cols[p0 + e] * L
        for k in range(L):
            orow[k] = orow[k] + v0 * r0[k]
        e = e + 1


cdef inline double _reduce(int sub, const double* a, Py_ssize_t n, Py_ssize_t ncols) noexcept nogil:
    """A row's sum (``sub`` 0), max (1) or min (2) of its ``n`` entries
    ``a``; max and min see the row's implicit zeros, NaN propagates (as
    numpy's maximum / minimum)."""
    cdef Py_ssize_t e
    cdef double r
    if n == 0:
        return 0.0
    r = a[0]
    if sub == 0:
        for e in range(1, n):
            r = r + a[e]
        return r
    cdef bint nan = r != r
    cdef double v
    # (one select per entry and no branch: the NaN test is an or; the rare
    # row holding a NaN is reduced again the branchy way, for its bits)
    if sub == 1:
        for e in range(1, n):
            v = a[e]
            nan = nan | (v != v)
            r = v if v > r else r
    else:
        for e in range(1, n):
            v = a[e]
            nan = nan | (v != v)
            r = v if v < r else r
    if nan:
        r = a[0]
        for e in range(1, n):
            if r != r or a[e] != a[e]:
                r = r + a[e]
            elif (sub == 1 and a[e] > r) or (sub == 2 and a[e] < r):
                r = a[e]
    if n < ncols and r == r and ((sub == 1 and r < 0.0) or (sub == 2 and r > 0.0)):
        r = 0.0   # the row's implicit zeros take part
    return r


cdef Py_ssize_t _pattern_block(const int64_t* code, Py_ssize_t n_ins, Py_ssize_t stride, Py_ssize_t i0,
                               Py_ssize_t nr, const index_t* ip, Py_ssize_t ncols, const index_t* cols,
                               const double* consts, double* rows, Py_ssize_t nrs, double** arrays,
                               const int64_t* strides, double* entries, Py_ssize_t bw, double* scratch,
                               Py_ssize_t nnz) noexcept nogil:
    """Every instruction on the block of rows ``[i0, i0 + nr)`` (of a pattern
    of ``nnz`` entries): the element-wise ones in one loop over the block's
    entries, the row-wise ones and the leaves row by row.  Each entry's and
    each row's arithmetic is the same whatever the block, so results do not
    depend on how rows are grouped.  Returns how many values the ``row_axpy``
    leaves wrote that are not finite."""
    cdef Py_ssize_t P0 = ip[i0], N = ip[i0 + nr] - P0, t, e, k, r, p, nargs
    cdef const int64_t* ins
    cdef int op, sub
    cdef double* dst
    cdef double* rr
    cdef const double* a
    cdef const double* b
    cdef const double* c
    cdef double coef, v
    cdef Py_ssize_t nonfinite = 0
    for t in range(n_ins):
        ins = code + t * stride
        op = <int>ins[0]
        sub = <int>ins[1]
        nargs = ins[4]
        if op == PAT_ENTRY_DOT:
            dst = entries + ins[3] * bw
            for r in range(nr):
                p = ip[i0 + r]
                _entry_dots(ins, i0 + r, p, ip[i0 + r + 1] - p, cols, nnz, arrays, strides, dst + (p - P0))
            continue
        if op == PAT_ROW_AXPY:
            a = _block_arg(<int>ins[PAT_HEADER], ins[PAT_HEADER + 1], i0, nr, ip, cols, consts, rows, nrs, arrays,
                           strides, entries, bw, scratch)
            for r in range(nr):
                p = ip[i0 + r]
                _row_axpy(ins, i0 + r, p, ip[i0 + r + 1] - p, cols, nnz, a + (p - P0), arrays, strides)
            nonfinite = nonfinite + _nonfinite(arrays[ins[3]] + i0 * strides[ins[PAT_HEADER + 3]],
                                               nr * strides[ins[PAT_HEADER + 3]])
            continue
        if ins[2] == 1 and op != PAT_REDUCE and op != PAT_STORED_EXTREMUM:   # a row-wise result
            for r in range(nr):
                rr = rows + r * nrs
                v = _row_dot(ins, i0 + r, consts, rr, arrays, strides) if op == PAT_ROW_DOT else \
                    _row_op(ins, i0 + r, consts, rr, arrays)
                if (ins[6] & PAT_ROW_RESTRICTED) and ip[i0 + r + 1] == ip[i0 + r]:
                    v = 0.0
                rr[ins[3]] = v
            continue
        a = _block_arg(<int>ins[PAT_HEADER], ins[PAT_HEADER + 1], i0, nr, ip, cols, consts, rows, nrs, arrays,
                       strides, entries, bw, scratch)
        if op == PAT_REDUCE:
            for r in range(nr):
                p = ip[i0 + r]
                rows[r * nrs + ins[3]] = _reduce(sub, a + (p - P0), ip[i0 + r + 1] - p, ncols)
            continue
        if op == PAT_STORED_EXTREMUM:
            b = _block_arg(<int>ins[PAT_HEADER + 2], ins[PAT_HEADER + 3], i0, nr, ip, cols, consts, rows, nrs,
                           arrays, strides, entries, bw, scratch + bw)
            dst = scratch + 2 * bw
            for e in range(N):
                dst[e] = a[e] * b[e]
            for r in range(nr):
                p = ip[i0 + r] - P0
                k = ip[i0 + r + 1] - P0 - p
                v = _reduce(3 - sub, dst + p, k, ncols)   # the bound c, from the other side
                for e in range(p, p + k):
                    dst[e] = a[e] * (b[e] - v)
                rows[r * nrs + ins[3]] = _reduce(sub, dst + p, k, ncols) + v
            continue
        dst = entries + ins[3] * bw
        if op == PAT_COPY:
            for e in range(N):
                dst[e] = a[e]
        elif op == PAT_UNARY and sub == UNARY_EXP:   # (a loop of its own: vectorised)
            for e in range(N):
                dst[e] = spfuse_exp(a[e])
        elif op == PAT_UNARY:
            for e in range(N):
                dst[e] = _unary(sub, a[e])
        elif op == PAT_ADD or op == PAT_SUB:
            coef = consts[ins[5]]
            for e in range(N):
                dst[e] = a[e] * coef
            for k in range(1, nargs):
                b = _block_arg(<int>ins[PAT_HEADER + 2 * k], ins[PAT_HEADER + 2 * k + 1], i0, nr, ip, cols, consts,
                               rows, nrs, arrays, strides, entries, bw, scratch + bw)
                coef = consts[ins[5] + k]
                if op == PAT_ADD:
                    for e in range(N):
                        dst[e] = dst[e] + (b[e] if coef == 1.0 else b[e] * coef)
                else:
                    for e in range(N):
                        dst[e] = dst[e] - (b[e] if coef == 1.0 else b[e] * coef)
        elif op == PAT_MUL:
            if nargs == 1:
                for e in range(N):
                    dst[e] = a[e]
            else:
                # (the first argument's scratch is read before the second's is written: two slots)
                b = _block_arg(<int>ins[PAT_HEADER + 2], ins[PAT_HEADER + 3], i0, nr, ip, cols, consts, rows, nrs,
                               arrays, strides, entries, bw, scratch + bw)
                for e in range(N):
                    dst[e] = a[e] * b[e]
                for k in range(2, nargs):
                    b = _block_arg(<int>ins[PAT_HEADER + 2 * k], ins[PAT_HEADER + 2 * k + 1], i0, nr, ip, cols,
                                   consts, rows, nrs, arrays, strides, entries, bw, scratch + bw)
                    for e in range(N):
                        dst[e] = dst[e] * b[e]
        elif op == PAT_DIV and ins[PAT_HEADER] == ins[PAT_HEADER + 2] and ins[PAT_HEADER + 1] == ins[PAT_HEADER + 3]:
            for e in range(N):
                # a / a, a pattern's indicator: 1, 0 where a is 0, NaN where a is not finite -- the
                # division's bits by a subtraction (a - a is 0 or NaN), at a fraction of its cost
                v = a[e]
                dst[e] = (v - v) + 1.0 if v != 0.0 else 0.0
        elif op == PAT_DIV:
            b = _block_arg(<int>ins[PAT_HEADER + 2], ins[PAT_HEADER + 3], i0, nr, ip, cols, consts, rows, nrs,
                           arrays, strides, entries, bw, scratch + bw)
            for e in range(N):
                # (0 / 1 where a is 0, + 0.0 making that a +0: one division
                # for every entry, with no branch around it, so gcc vectorises
                # it -- branching, scalar divisions were a fifth of the
                # SDDMM-div adjoint's program)
                v = b[e]   # (loaded whatever a is: a load under a condition is not if-converted)
                v = v if a[e] != 0.0 else 1.0
                dst[e] = a[e] / v + 0.0
        else:   # PAT_WHERE
            b = _block_arg(<int>ins[PAT_HEADER + 2], ins[PAT_HEADER + 3], i0, nr, ip, cols, consts, rows, nrs,
                           arrays, strides, entries, bw, scratch + bw)
            c = _block_arg(<int>ins[PAT_HEADER + 4], ins[PAT_HEADER + 5], i0, nr, ip, cols, consts, rows, nrs,
                           arrays, strides, entries, bw, scratch + 2 * bw)
            for e in range(N):
                dst[e] = b[e] if a[e] != 0.0 else c[e]
    return nonfinite


cdef inline Py_ssize_t _nonfinite(const double* a, Py_ssize_t n) noexcept nogil:
    """How many of ``a[:n]`` are infinite or NaN (``x - x`` is 0 for a finite x only)."""
    cdef Py_ssize_t e, count = 0
    for e in range(n):
        count = count + (a[e] - a[e] != 0.0)
    return count


def pattern_program(const index_t[::1] indptr, const index_t[::1] cols, Py_ssize_t ncols,
                    const int64_t[:, ::1] code, const double[::1] consts, list arrays,
                    const int64_t[::1] strides, Py_ssize_t n_entry, Py_ssize_t n_row,
                    const int64_t[:, ::1] outputs, int num_threads=1):
    """pattern_program(indptr, cols, ncols, code, consts, arrays, strides, n_entry, n_row, outputs, num_threads=1)

    Run a pattern program (see the table above) over every row of the CSR
    pattern ``(indptr, cols)`` (``ncols`` columns; int32 or int64 indices,
    one type for both, read as stored).  ``arrays``: float64
    C-contiguous 1-D arrays the arguments and the outputs index;
    ``strides[k]``: the row length of ``arrays[k]`` read as a matrix.
    ``outputs``: rows ``(register kind, register, array index)`` -- an entry
    register written at each row's positions, a row register at the row
    (a ``row_axpy`` writes its row of a dense output matrix in ``arrays``
    itself).  Each row is computed alone, in the instructions' order, so results do
    not depend on ``num_threads`` (or on the blocks of rows the rows are run in).  Preconditions (the caller's): column
    indices in ``[0, ncols)``, every array long enough for what reads it.
    Returns how many output values are infinite or NaN (counted as they are
    written: the caller needs no pass of its own over them).
    """
    cdef Py_ssize_t m = indptr.shape[0] - 1, i, j, width = 1, n_ins = code.shape[0], nonfinite = 0
    cdef Py_ssize_t stride = code.shape[1], n_out = outputs.shape[0], n_arrays = len(arrays)
    cdef const index_t* ip = &indptr[0]
    cdef const index_t* cp = &cols[0] if cols.shape[0] > 0 else NULL
    cdef const int64_t* cd = &code[0, 0] if n_ins > 0 else NULL
    cdef const int64_t* st = &strides[0] if strides.shape[0] > 0 else NULL
    cdef const int64_t* outs = &outputs[0, 0] if n_out > 0 else NULL
    cdef const double* cs = &consts[0] if consts.shape[0] > 0 else NULL
    cdef const double[::1] view
    cdef double** ptrs
    cdef double* work
    cdef double* rows
    cdef double* entries
    cdef Py_ssize_t* starts
    cdef Py_ssize_t per_thread, P0, N, o, e, r, b, nblocks = 0, i0, nr, nrs = n_row + 1
    if m <= 0 or n_ins == 0:
        return 0
    for i in range(m):
        if ip[i + 1] - ip[i] > width:
            width = ip[i + 1] - ip[i]
    if width < PAT_BLOCK_ENTRIES:
        width = PAT_BLOCK_ENTRIES
    # (whole cache lines and a line of gap: threads' blocks never share a line)
    per_thread = padded_stride((n_entry + 3) * width + PAT_BLOCK_ROWS * nrs, sizeof(double))
    ptrs = <double**>malloc((n_arrays + 1) * sizeof(double*))
    work = <double*>malloc(<size_t>per_thread * num_threads * sizeof(double))
    starts = <Py_ssize_t*>malloc((m + 1) * sizeof(Py_ssize_t))
    if ptrs == NULL or work == NULL or starts == NULL:
        free(ptrs)
        free(work)
        free(starts)
        raise MemoryError()
    try:
        for j in range(n_arrays):
            view = arrays[j]
            ptrs[j] = <double*>&view[0] if view.shape[0] > 0 else NULL   # (outputs are fresh, writable arrays)
        # the blocks: whole rows, from the pattern alone
        i = 0
        while i < m:
            starts[nblocks] = i
            nblocks = nblocks + 1
            j = i + 1
            while j < m and j - i < PAT_BLOCK_ROWS and ip[j + 1] - ip[i] <= width:
                j = j + 1
            i = j
        starts[nblocks] = m
        with nogil:
            for b in prange(nblocks, schedule="dynamic", chunksize=1, num_threads=num_threads):
                rows = work + <Py_ssize_t>omp_get_thread_num() * per_thread
                entries = rows + PAT_BLOCK_ROWS * nrs
                i0 = starts[b]
                nr = starts[b + 1] - i0
                P0 = ip[i0]
                N = ip[i0 + nr] - P0
                nonfinite += _pattern_block(cd, n_ins, stride, i0, nr, ip, ncols, cp, cs, rows, nrs, ptrs, st,
                                            entries, width, entries + n_entry * width, ip[m])
                for o in range(n_out):
                    if outs[3 * o] == 0:
                        for e in range(N):
                            ptrs[outs[3 * o + 2]][P0 + e] = entries[outs[3 * o + 1] * width + e]
                        nonfinite += _nonfinite(ptrs[outs[3 * o + 2]] + P0, N)
                    else:
                        for r in range(nr):
                            ptrs[outs[3 * o + 2]][i0 + r] = rows[r * nrs + outs[3 * o + 1]]
                        nonfinite += _nonfinite(ptrs[outs[3 * o + 2]] + i0, nr)
    finally:
        free(ptrs)
        free(work)
        free(starts)
    return nonfinite
