# Leaf bodies shared by the template kernels (_csr_kernels, _csf_kernels) and the loop-tree
# executor (_looptree): whole-fiber computations written once.
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset

from spfuse._kernels._kernel_common cimport index_t

# the index type of a leaf's coordinates (the executor is built for both)
ctypedef fused leaf_index_t:
    int32_t
    int64_t


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


cdef inline void _axpy(double* acc, double v, const floating* x, Py_ssize_t n) noexcept nogil:
    """acc[0:n] += v * x[0:n] (vectorisable)."""
    cdef Py_ssize_t k
    for k in range(n):
        acc[k] += v * <double>x[k]


cdef inline void _vecmat(const double* t, Py_ssize_t K, const floating* D, Py_ssize_t L,
                         double* acc) noexcept nogil:
    """``acc[0:L] = t[0:K] @ D`` for C-contiguous ``D`` (K x L), in double.

    Axpy of D's rows, four at a time (``acc += t0*D0 + t1*D1 + t2*D2 +
    t3*D3``), so the order of the sum depends on K only.  O(K * L); D is
    re-read per row, so it should fit in L2 for speed (it does for the
    K, L <= ~256 of the fused kernels).
    """
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


# first elements of a kernel's array arguments, NULL when empty (a
# zero-length memoryview has no element 0 to take the address of)
cdef inline const index_t* _iptr(const index_t[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline const floating* _fptr(const floating[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline const floating* _mptr(const floating[:, ::1] a) noexcept nogil:
    return &a[0, 0] if a.shape[0] > 0 and a.shape[1] > 0 else NULL


cdef inline double _sum4(const double* a, Py_ssize_t n) noexcept nogil:
    """Sum of ``a[0:n]`` in 4 independent chains (in sequence below 8
    entries): the order is fixed by ``n`` only, so results do not depend
    on the thread count; 4 chains hide the adds' latency."""
    cdef double s0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef Py_ssize_t k = 0
    if n < 8:
        s0 = 0.0
        while k < n:
            s0 += a[k]
            k += 1
        return s0
    s0 = a[0]
    s1 = a[1]
    s2 = a[2]
    s3 = a[3]
    k = 4
    while k + 4 <= n:
        s0 += a[k]
        s1 += a[k + 1]
        s2 += a[k + 2]
        s3 += a[k + 3]
        k += 4
    while k < n:
        s0 += a[k]
        k += 1
    return (s0 + s1) + (s2 + s3)


cdef inline double _gather_dot4(const double* a, const double* b, const leaf_index_t* ix,
                                Py_ssize_t n) noexcept nogil:
    """``sum_e a[e] * b[ix[e]]`` in 4 independent chains (in sequence below
    8 entries), the order fixed by ``n`` only: SpMV's leaf without the
    latency of one long chain of adds."""
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef Py_ssize_t k = 0
    if n >= 8:
        while k + 4 <= n:
            s0 += a[k] * b[ix[k]]
            s1 += a[k + 1] * b[ix[k + 1]]
            s2 += a[k + 2] * b[ix[k + 2]]
            s3 += a[k + 3] * b[ix[k + 3]]
            k += 4
    while k < n:
        s0 += a[k] * b[ix[k]]
        k += 1
    return (s0 + s1) + (s2 + s3)


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


cdef inline void _zero_rows(floating* out, Py_ssize_t rows, Py_ssize_t width, int num_threads) noexcept nogil:
    """``out[0:rows, 0:width] = 0`` (C-ordered), rows shared among threads:
    each thread first touches the rows it is likely to write."""
    cdef Py_ssize_t row
    for row in prange(rows, schedule="static", num_threads=num_threads):
        memset(out + row * width, 0, width * sizeof(floating))


cdef inline void _add_partials(double** parts, Py_ssize_t nparts, floating* out, Py_ssize_t n,
                               int num_threads) noexcept nogil:
    """``out[x] = parts[0][x] + parts[1][x] + ...`` for ``x < n``, added in
    part order in double and rounded once: the fixed blocks' partial results
    of a scatter combined the same way on any thread count (``out`` may be
    ``parts[0]`` itself).  Elements are shared among ``num_threads`` threads."""
    cdef Py_ssize_t x, b
    cdef double s
    for x in prange(n, schedule="static", num_threads=num_threads):
        s = parts[0][x]
        for b in range(1, nparts):
            s = s + parts[b][x]
        out[x] = <floating>s


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* exp(x) within 1 ulp of libm's (fdlibm's reduction x = k ln2 + r and
       its rational approximation on |r| <= ln2/2), written branch-free --
       selects, a rounding by adding 1.5 * 2^52, 2^k built from its bits in
       two factors (so subnormal results round once) -- so gcc vectorises a
       loop of it (libm's exp is a call per element: 7.3 against 2.5 ns here
       with AVX2).  Only IEEE +, -, *, / in a fixed order: the same bits
       scalar or vectorised, with or without AVX2 (-ffp-contract=off). */
    static inline double spfuse_bits_double(int64_t i) { double d; memcpy(&d, &i, 8); return d; }
    static inline int64_t spfuse_double_bits(double d) { int64_t i; memcpy(&i, &d, 8); return i; }
    static inline double spfuse_exp(double x) {
        const double shift = 6755399441055744.0;
        const double invln2 = 1.44269504088896338700e+00, ln2hi = 6.93147180369123816490e-01,
                     ln2lo = 1.90821492927058770002e-10;
        const double p1 = 1.66666666666666019037e-01, p2 = -2.77777777770155933842e-03,
                     p3 = 6.61375632143793436117e-05, p4 = -1.65339022054652515390e-06,
                     p5 = 4.13813679705723846039e-08;
        double xc = x > 710.0 ? 710.0 : x;
        double k, hi, lo, r, t, c, y, k1, k2, s1, s2;
        xc = xc < -746.0 ? -746.0 : xc;
        xc = (x != x) ? 0.0 : xc;
        k = (xc * invln2 + shift) - shift;
        hi = xc - k * ln2hi;
        lo = k * ln2lo;
        r = hi - lo;
        t = r * r;
        c = r - t * (p1 + t * (p2 + t * (p3 + t * (p4 + t * p5))));
        y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
        k1 = (k * 0.5 + shift) - shift;
        k2 = k - k1;
        s1 = spfuse_bits_double((spfuse_double_bits(k1 + 1023.0 + shift) - spfuse_double_bits(shift)) << 52);
        s2 = spfuse_bits_double((spfuse_double_bits(k2 + 1023.0 + shift) - spfuse_double_bits(shift)) << 52);
        y = (y * s1) * s2;
        return (x != x) ? x : y;
    }
    """
    # exp within 1 ulp of libm's, vectorisable (see above); the same bits on every build
    double spfuse_exp(double x) noexcept nogil


cdef inline double spfuse_sigmoid(double x) noexcept nogil:
    """``1 / (1 + e^-x)`` in the form that never overflows (``e^x / (1 +
    e^x)`` below 0), with :func:`spfuse_exp`: the one sigmoid of the
    templates and the generic executor, so both give the same bits."""
    cdef double y
    if x >= 0.0:
        return 1.0 / (1.0 + spfuse_exp(-x))
    y = spfuse_exp(x)
    return y / (1.0 + y)
