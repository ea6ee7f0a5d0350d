# cython: language_level=3
"""Dense template kernels: BLAS products and element-wise maps.

* ``gemm`` / ``gemv`` call BLAS through ``scipy.linalg.cython_blas`` (LP64
  ``int`` sizes, column-major): a C-contiguous (row-major) product
  ``out = A @ B`` is computed as the column-major ``out^T = B^T @ A^T``,
  i.e. by swapping the operands, with no copies.  BLAS runs in its own
  thread pool (OpenBLAS/MKL, controlled by threadpoolctl or
  ``OPENBLAS_NUM_THREADS``), not in our OpenMP team, so these functions take
  no ``num_threads``-driven prange; the planner calls them outside parallel
  regions.
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
from scipy.linalg.cython_blas cimport dgemm, dgemv, sgemm, sgemv

from spfuse._kernels._kernel_common cimport (
    UNARY_ABS, UNARY_EXP, UNARY_LOG, UNARY_NEG, UNARY_RELU, UNARY_SIGMOID, UNARY_SQRT,
    UNARY_TANH,
)

__all__ = ["UNARY_OPS", "gemm", "gemv", "map_unary", "transpose"]

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
    # summed extent) is thin: run in row blocks on our own team (see gemm)
    THIN_NK = 4096
    # OpenBLAS runs a product of at most this many ``m * n * k`` on the calling
    # thread (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD)
    BLAS_SERIAL_MNK = 262144

# Beyond this many int-sized elements a dimension no longer fits LP64 BLAS.
cdef Py_ssize_t _INT_MAX = 2147483647


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

    A thin product (``n * k <= THIN_NK``: GNN-style ``H @ W`` with a few
    dozen columns) is cut into fixed blocks of rows, each a BLAS call small
    enough (``rows * n * k <= BLAS_SERIAL_MNK``) that OpenBLAS runs it on the
    calling thread, and the blocks are shared among ``num_threads`` threads
    of our own OpenMP team -- as scikit-learn's k-means calls BLAS per chunk
    inside ``prange``.  BLAS's own pool is then never woken: its workers
    busy-wait after each call and stall a team sharing their cores (a
    20000x32 @ 32x32 product took 8 ms on two OpenBLAS threads against
    2.5 ms on one while another process held a core).  The blocks do not
    depend on ``num_threads``, so neither do the results.  Any other
    product is one BLAS call on BLAS's own threads (``num_threads`` unused).
    """
    cdef int m = A.shape[1] if trans_a else A.shape[0]
    cdef int k = A.shape[0] if trans_a else A.shape[1]
    cdef int n = B.shape[0] if trans_b else B.shape[1]
    cdef int lda = A.shape[1], ldb = B.shape[1]
    cdef floating one = 1, zero = 0
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
    cdef Py_ssize_t rows = BLAS_SERIAL_MNK // (<Py_ssize_t>n * k)
    cdef Py_ssize_t nblocks, blk
    cdef int r0, mb
    cdef int team = num_threads if num_threads is not None and num_threads > 0 else 1
    cdef floating* a0 = <floating*>&A[0, 0]
    cdef floating* o0 = &out[0, 0]
    if <Py_ssize_t>n * k > THIN_NK or rows >= m:
        nblocks = 1
        rows = m
    else:
        nblocks = (m + rows - 1) // rows
    with nogil:
        for blk in prange(nblocks, schedule="static", num_threads=team if nblocks > 1 else 1):
            r0 = <int>(blk * rows)
            mb = <int>min(rows, m - r0)
            # rows r0.. of op(A): rows of A, or (transposed) its columns
            if floating is double:
                dgemm(&tb, &ta, &n, &mb, &k, &one, <double*>&B[0, 0], &ldb,
                      a0 + (r0 if trans_a else <Py_ssize_t>r0 * lda), &lda, &zero,
                      o0 + <Py_ssize_t>r0 * n, &n)
            else:
                sgemm(&tb, &ta, &n, &mb, &k, &one, <float*>&B[0, 0], &ldb,
                      a0 + (r0 if trans_a else <Py_ssize_t>r0 * lda), &lda, &zero,
                      o0 + <Py_ssize_t>r0 * n, &n)


def gemv(const floating[:, ::1] A, const floating[::1] x, floating[::1] out,
         num_threads=None):
    """gemv(A, x, out, num_threads=None)

    ``out = A @ x`` for C-contiguous A (m, n), x (n,), out (m,).

    Column-major view: A is A^T (n x m, ld n), so ``gemv('T', n, m, 1, A, n,
    x, 1, 0, out, 1)``.  ``out`` must not alias; fully overwritten.
    ``num_threads`` ignored (BLAS pool).  O(m * n).
    """
    cdef int m = A.shape[0], n = A.shape[1], inc = 1
    cdef floating one = 1, zero = 0
    cdef char trans = b'T'
    if A.shape[0] > _INT_MAX or A.shape[1] > _INT_MAX:
        raise OverflowError("gemv: dimensions exceed the LP64 BLAS range")
    if m == 0:
        return
    if n == 0:
        with nogil:
            memset(&out[0], 0, <size_t>m * sizeof(floating))
        return
    with nogil:
        if floating is double:
            dgemv(&trans, &n, &m, &one, <double*>&A[0, 0], &n, <double*>&x[0], &inc,
                  &zero, &out[0], &inc)
        else:
            sgemv(&trans, &n, &m, &one, <float*>&A[0, 0], &n, <float*>&x[0], &inc,
                  &zero, &out[0], &inc)


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
