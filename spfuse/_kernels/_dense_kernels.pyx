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
* ``transpose`` copies a C-ordered matrix into its transpose, C-ordered,
  tile by tile: a dense operand read in the other mode order (``D.T``, a
  Fortran array, a result wanted the other way round) becomes C-ordered at
  about the speed of a copy, where numpy's element-strided copy of a tall
  matrix's ``a.T`` runs 2-3x slower.
"""
cimport cython
from cython cimport floating
from cython.parallel cimport prange
from libc.math cimport exp, fabs, log, sqrt, tanh
from libc.string cimport memset
from scipy.linalg.cython_blas cimport dgemm, sgemm

from spfuse._kernels._kernel_common cimport (
    UNARY_ABS, UNARY_EXP, UNARY_LOG, UNARY_NEG, UNARY_RELU, UNARY_SIGMOID, UNARY_SQRT,
    UNARY_TANH,
)

__all__ = ["UNARY_OPS", "gemm", "hold_blas_to_one_thread", "map_unary", "transpose"]

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
                             floating* o0, int ldo, bint trans_a, bint trans_b) noexcept nogil:
    """``out[m0:m0+mb, n0:n0+nb] = op(A)[m0:m0+mb] @ op(B)[:, n0:n0+nb]`` as one BLAS call."""
    cdef floating one = 1, zero = 0
    # rows m0.. of op(A): rows of A, or (transposed) its columns; columns
    # n0.. of op(B): columns of B, or (transposed) its rows
    cdef const floating* a = a0 + (m0 if trans_a else <Py_ssize_t>m0 * lda)
    cdef const floating* b = b0 + (<Py_ssize_t>n0 * ldb if trans_b else n0)
    cdef floating* o = o0 + <Py_ssize_t>m0 * ldo + n0
    if floating is double:
        dgemm(tb, ta, &nb, &mb, &k, &one, <double*>b, &ldb, <double*>a, &lda, &zero, o, &ldo)
    else:
        sgemm(tb, ta, &nb, &mb, &k, &one, <float*>b, &ldb, <float*>a, &lda, &zero, o, &ldo)


def gemm(const floating[:, ::1] A, const floating[:, ::1] B, floating[:, ::1] out,
         num_threads=None, bint trans_a=False, bint trans_b=False):
    """gemm(A, B, out, num_threads=None, trans_a=False, trans_b=False)

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
    The blocks depend on the shapes only, never on ``num_threads``, and each
    element of out is one BLAS dot over the whole ``k``: results do not
    depend on the team size.
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
    if k == 0:
        with nogil:
            memset(&out[0, 0], 0, <size_t>m * n * sizeof(floating))
        return
    cdef Py_ssize_t work = <Py_ssize_t>m * n * k
    cdef Py_ssize_t nblocks = 1, blk, side = m
    cdef bint by_rows = True
    cdef int lo, hi
    cdef int team = num_threads if num_threads is not None and num_threads > 0 else 1
    cdef bint hold = _blas_set_threads != NULL and work > BLAS_SERIAL_MNK
    cdef int before = 1
    if <Py_ssize_t>n * k <= THIN_NK:
        nblocks = (m + BLAS_SERIAL_MNK // (<Py_ssize_t>n * k) - 1) // (BLAS_SERIAL_MNK // (<Py_ssize_t>n * k))
    elif hold:
        by_rows = m >= n
        side = m if by_rows else n
        nblocks = max(1, min(<Py_ssize_t>GEMM_MAX_BLOCKS, side // GEMM_MIN_SIDE))
    cdef const floating* a0 = &A[0, 0]
    cdef const floating* b0 = &B[0, 0]
    cdef floating* o0 = &out[0, 0]
    with nogil:
        if hold:
            before = _blas_get_threads()
            if before != 1:
                _blas_set_threads(1)
        for blk in prange(nblocks, schedule="dynamic", chunksize=1, num_threads=team if nblocks > 1 else 1):
            lo = <int>(blk * side // nblocks)
            hi = <int>((blk + 1) * side // nblocks)
            if by_rows:
                _gemm_block(&ta, &tb, lo, hi - lo, 0, n, k, a0, lda, b0, ldb, o0, n, trans_a, trans_b)
            else:
                _gemm_block(&ta, &tb, 0, m, lo, hi - lo, k, a0, lda, b0, ldb, o0, n, trans_a, trans_b)
        if hold and before != 1:
            _blas_set_threads(before)


cdef inline double _unary(int op, double x) noexcept nogil:
    if op == UNARY_RELU:
        return x if x > 0.0 else (x if x != x else 0.0)   # NaN propagates like np.maximum
    elif op == UNARY_SIGMOID:
        if x >= 0.0:
            return 1.0 / (1.0 + exp(-x))
        return exp(x) / (1.0 + exp(x))
    elif op == UNARY_TANH:
        return tanh(x)
    elif op == UNARY_EXP:
        return exp(x)
    elif op == UNARY_LOG:
        return log(x)
    elif op == UNARY_ABS:
        return fabs(x)
    elif op == UNARY_SQRT:
        return sqrt(x)
    return -x


def map_unary(const floating[::1] values, int op_code, floating[::1] out, int num_threads=1):
    """map_unary(values, op_code, out, num_threads=1)

    ``out[p] = f(values[p])`` for ``f = UNARY_OPS`` code ``op_code``.

    Codes: relu 0 (``max(x, 0)``, NaN kept), sigmoid 1 (overflow-safe
    form), tanh 2, exp 3, log 4, abs 5, sqrt 6, neg 7; evaluated in double
    with libm, then rounded to the value type (log/sqrt of negatives give
    NaN, log(0) gives -inf, as numpy, without warnings).  ``out`` may be
    ``values`` (in place); same length.  Static prange over elements;
    elementwise, so identical for any thread count.  O(n).  An unknown code
    behaves as ``neg`` -- the Python layer only passes UNARY_OPS values.
    """
    cdef Py_ssize_t n = values.shape[0], p
    if n == 0:
        return
    with nogil:
        for p in prange(n, schedule="static", num_threads=num_threads):
            out[p] = <floating>_unary(op_code, <double>values[p])


def transpose(const floating[:, ::1] a, floating[:, ::1] out, int num_threads=1):
    """transpose(a, out, num_threads=1)

    ``out[j, i] = a[i, j]``: ``out`` (C-ordered, shape ``a.shape[::-1]``)
    becomes ``a``'s transpose.  Copied in 32×32 tiles, so that each tile of
    ``a`` is read by rows and each of ``out`` written by rows of the other
    tile while both sit in cache; tile rows of ``out`` are shared among
    ``num_threads`` threads (static schedule: each element is copied once,
    by one thread, so any thread count gives the same bits).  O(size).
    ``out`` must not overlap ``a``.
    """
    cdef Py_ssize_t m = a.shape[0], n = a.shape[1]
    if out.shape[0] != n or out.shape[1] != m:
        raise ValueError(f"transpose: out has shape ({out.shape[0]}, {out.shape[1]}), "
                         f"the transpose of ({m}, {n}) needs ({n}, {m})")
    cdef Py_ssize_t jt, i0, i, j, j0, j1, i1
    cdef Py_ssize_t tiles = (n + _TILE - 1) // _TILE
    if m == 0 or n == 0:
        return
    with nogil:
        for jt in prange(tiles, schedule="static", num_threads=num_threads):
            j0 = jt * _TILE
            j1 = min(j0 + _TILE, n)
            i0 = 0
            while i0 < m:
                i1 = min(i0 + _TILE, m)
                for j in range(j0, j1):
                    for i in range(i0, i1):
                        out[j, i] = a[i, j]
                i0 = i0 + _TILE
