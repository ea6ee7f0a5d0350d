"""One-pass O(nnz) checks of compressed levels (the price of safety).

``spfuse.validation.check_compressed`` calls :func:`scan_compressed` to learn,
in one sequential pass, whether a level is valid and canonical; only when it
is not does the slower numpy path run to word the error message.
"""
cimport cython

ctypedef fused index_t:
    int
    long long

cdef extern from *:
    """
    /* The canonical-case check of a whole coordinate array in one pass:
       coordinates outside [0, size) (one unsigned compare catches both
       ends) and descents a[p] <= a[p-1].  Plain C so gcc vectorises it
       (Cython's conditionals become branches); on x86-64 glibc an AVX2
       clone is picked at load time, the SSE2 default runs elsewhere. */
    #if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__)
    #define SPFUSE_CLONES __attribute__((target_clones("avx2", "default")))
    #else
    #define SPFUSE_CLONES
    #endif
    #define SPFUSE_SCAN_LOOP(T, U)                                            \
    SPFUSE_CLONES static void spfuse_outliers_##T(                            \
            const T *a, Py_ssize_t n, T size, Py_ssize_t *out, Py_ssize_t *desc) { \
        T o = (U)a[0] >= (U)size, d = 0;                                      \
        for (Py_ssize_t p = 1; p < n; p++) {                                  \
            o += (U)a[p] >= (U)size;                                          \
            d += a[p] <= a[p - 1];                                            \
        }                                                                     \
        *out = (Py_ssize_t)o; *desc = (Py_ssize_t)d;                          \
    }
    typedef long long spfuse_ll;
    typedef unsigned long long spfuse_ull;
    SPFUSE_SCAN_LOOP(int, unsigned int)
    SPFUSE_SCAN_LOOP(spfuse_ll, spfuse_ull)
    """
    void spfuse_outliers_int(const int *a, Py_ssize_t n, int size, Py_ssize_t *out,
                             Py_ssize_t *desc) nogil
    void spfuse_outliers_spfuse_ll(const long long *a, Py_ssize_t n, long long size, Py_ssize_t *out,
                                   Py_ssize_t *desc) nogil


@cython.boundscheck(False)
@cython.wraparound(False)
def scan_compressed(const index_t[::1] pos, const index_t[::1] crd, long long size):
    """Scan ``pos``/``crd`` once; return ``(status, where)``.

    status 0: valid and canonical (coordinates strictly increasing in every
    segment); 1: valid but unsorted or duplicated (canonicalise a copy);
    2: ``pos`` decreases at or after ``where`` (checked here, so no segment
    is read past ``pos[-1]``); 3: ``crd[where]`` is out of ``[0, size)``.
    Preconditions (checked by the caller): ``pos[0] == 0`` and
    ``pos[-1] <= len(crd)``.
    """
    cdef Py_ssize_t n = pos.shape[0] - 1
    cdef Py_ssize_t s, p, start, end
    cdef Py_ssize_t drops = 0, allowed = 0
    cdef Py_ssize_t where = -1
    cdef long long c, prev
    cdef Py_ssize_t outliers, descents
    cdef int status = 0
    if n < 0:
        return 2, 0
    cdef Py_ssize_t last = pos[n]
    with nogil:
        # Fast passes for the common (canonical) case, branch-free so the
        # compiler vectorises them and no per-segment overhead is paid:
        # pos never decreases; every coordinate lies in [0, size); the only
        # descents crd[p] <= crd[p-1] are at segment starts.
        for s in range(n):
            drops += pos[s + 1] < pos[s]
        if drops == 0 and last > 0:
            if index_t is int:
                spfuse_outliers_int(&crd[0], last, <int>min(size, 2147483647), &outliers, &descents)
            else:
                spfuse_outliers_spfuse_ll(&crd[0], last, size, &outliers, &descents)
            for s in range(1, n):  # pos is monotone here: 0 <= pos[s] <= last
                p = pos[s]
                if 0 < p < last and p != pos[s - 1]:
                    allowed += crd[p] <= crd[p - 1]
            if outliers or descents != allowed:
                drops = -1  # not canonical or invalid: find which, and where
        if drops != 0:
            for s in range(n):
                start = pos[s]
                end = pos[s + 1]
                if end < start or end > last:  # a later drop: never read past pos[-1]
                    status, where = 2, s
                    break
                prev = -1
                for p in range(start, end):
                    c = crd[p]
                    if c < 0 or c >= size:
                        status, where = 3, p
                        break
                    if c <= prev:
                        status = 1
                    prev = c
                if status >= 2:
                    break
    return status, where
