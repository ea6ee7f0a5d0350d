# Leaf bodies shared by the template kernels (_csr_kernels) and the loop-tree
# executor (_looptree): whole-fiber computations written once.
from cython cimport floating


cdef inline double _dot(const floating* a, const floating* b, Py_ssize_t n) noexcept nogil:
    """Dot of two contiguous vectors in double with 8 independent chains.

    The summation order is fixed by ``n`` only (deterministic, so results do
    not depend on the thread count or the path that calls it), it is not the
    sequential order (8 chains give the adds room to pipeline without
    -ffast-math).
    """
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef double s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0
    cdef Py_ssize_t k = 0
    while k + 8 <= n:
        s0 += <double>a[k] * <double>b[k]
        s1 += <double>a[k + 1] * <double>b[k + 1]
        s2 += <double>a[k + 2] * <double>b[k + 2]
        s3 += <double>a[k + 3] * <double>b[k + 3]
        s4 += <double>a[k + 4] * <double>b[k + 4]
        s5 += <double>a[k + 5] * <double>b[k + 5]
        s6 += <double>a[k + 6] * <double>b[k + 6]
        s7 += <double>a[k + 7] * <double>b[k + 7]
        k += 8
    while k < n:
        s0 += <double>a[k] * <double>b[k]
        k += 1
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SPFUSE_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 3)
    #else
    #define SPFUSE_PREFETCH(p) ((void)(p))
    #endif
    """
    # a hint to bring the cache line at p in (no effect on results)
    void SPFUSE_PREFETCH(const void* p) noexcept nogil


cdef inline void _prefetch_row(const double* p, Py_ssize_t n) noexcept nogil:
    """Ask for the cache lines of ``p[0:n]`` (at most 16 lines): a gathered
    row is then in cache when a leaf reaches it a few rows later."""
    cdef Py_ssize_t k = 0
    if n > 128:
        n = 128
    while k < n:
        SPFUSE_PREFETCH(p + k)
        k += 8
