"""One-pass O(nnz) checks of compressed levels (the price of safety).

``spfuse.validation.check_compressed`` calls :func:`scan_compressed` to learn,
in one sequential pass, whether a level is valid and canonical; only when it
is not does the slower numpy path run to word the error message.
"""
cimport cython
cimport numpy as cnp
import numpy as np

cnp.import_array()

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
    }                                                                         \
    /* Number of p in pos[0..n] with pos[p+1] < pos[p]. */                    \
    SPFUSE_CLONES static Py_ssize_t spfuse_drops_##T(const T *pos, Py_ssize_t n) { \
        Py_ssize_t d = 0;                                                     \
        for (Py_ssize_t s = 0; s < n; s++) d += pos[s + 1] < pos[s];          \
        return d;                                                             \
    }                                                                         \
    /* Descents crd[p] <= crd[p-1] at the starts p = pos[s] of non-empty     \
       segments 1..n-1 (allowed in a canonical level).  Branch-free: rows    \
       of a power-law matrix are often empty, and a branch per row would be  \
       mispredicted.  Needs a monotone pos with pos[n] == last >= 2. */     \
    SPFUSE_CLONES static Py_ssize_t spfuse_starts_##T(                        \
            const T *pos, Py_ssize_t n, const T *crd, T last) {               \
        Py_ssize_t d = 0;                                                     \
        for (Py_ssize_t s = 1; s < n; s++) {                                  \
            T p = pos[s];                                                     \
            int ok = (p > 0) & (p < last) & (p != pos[s - 1]);                \
            T q = ok ? p : 1;                                                 \
            d += ok & (crd[q] <= crd[q - 1]);                                 \
        }                                                                     \
        return d;                                                             \
    }
    typedef long long spfuse_ll;
    typedef unsigned long long spfuse_ull;
    SPFUSE_SCAN_LOOP(int, unsigned int)
    SPFUSE_SCAN_LOOP(spfuse_ll, spfuse_ull)
    /* The int32 passes above, each also writing the int64 copy of what it
       reads: the executor's copy costs no second pass over the array. */
    SPFUSE_CLONES static void spfuse_outliers_widen_int(
            const int *a, Py_ssize_t n, int size, long long *w, Py_ssize_t *out, Py_ssize_t *desc) {
        int o = (unsigned int)a[0] >= (unsigned int)size, d = 0;
        w[0] = a[0];
        for (Py_ssize_t p = 1; p < n; p++) {
            w[p] = a[p];
            o += (unsigned int)a[p] >= (unsigned int)size;
            d += a[p] <= a[p - 1];
        }
        *out = (Py_ssize_t)o; *desc = (Py_ssize_t)d;
    }
    SPFUSE_CLONES static Py_ssize_t spfuse_drops_widen_int(const int *pos, Py_ssize_t n, long long *w) {
        Py_ssize_t d = 0;
        w[0] = pos[0];
        for (Py_ssize_t s = 0; s < n; s++) {
            w[s + 1] = pos[s + 1];
            d += pos[s + 1] < pos[s];
        }
        return d;
    }
    """
    void spfuse_outliers_int(const int *a, Py_ssize_t n, int size, Py_ssize_t *out,
                             Py_ssize_t *desc) nogil
    void spfuse_outliers_spfuse_ll(const long long *a, Py_ssize_t n, long long size, Py_ssize_t *out,
                                   Py_ssize_t *desc) nogil
    Py_ssize_t spfuse_drops_int(const int *pos, Py_ssize_t n) nogil
    Py_ssize_t spfuse_drops_spfuse_ll(const long long *pos, Py_ssize_t n) nogil
    Py_ssize_t spfuse_starts_int(const int *pos, Py_ssize_t n, const int *crd, int last) nogil
    Py_ssize_t spfuse_starts_spfuse_ll(const long long *pos, Py_ssize_t n, const long long *crd,
                                       long long last) nogil
    void spfuse_outliers_widen_int(const int *a, Py_ssize_t n, int size, long long *w, Py_ssize_t *out,
                                   Py_ssize_t *desc) nogil
    Py_ssize_t spfuse_drops_widen_int(const int *pos, Py_ssize_t n, long long *w) nogil


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
        if index_t is int:
            drops = spfuse_drops_int(&pos[0], n)
        else:
            drops = spfuse_drops_spfuse_ll(&pos[0], n)
        if drops == 0 and last > 0:
            if index_t is int:
                spfuse_outliers_int(&crd[0], last, <int>min(size, 2147483647), &outliers, &descents)
                if last >= 2:  # pos is monotone here: 0 <= pos[s] <= last
                    allowed = spfuse_starts_int(&pos[0], n, &crd[0], <int>last)
            else:
                spfuse_outliers_spfuse_ll(&crd[0], last, size, &outliers, &descents)
                if last >= 2:
                    allowed = spfuse_starts_spfuse_ll(&pos[0], n, &crd[0], last)
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


cdef inline bint _flat(cnp.ndarray a, int typenum):
    """``a`` is a 1-D C-contiguous native array of ``typenum``."""
    return (cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_TYPE(a) == typenum
            and cnp.PyArray_ISNOTSWAPPED(a) and cnp.PyArray_IS_C_CONTIGUOUS(a))


def pos_drops(cnp.ndarray pos):
    """Number of places where ``pos`` (1-D contiguous int32 or int64)
    decreases (0: non-decreasing).

    The check a compressed level needs before any kernel may index with it,
    when its coordinates are checked by the kernel itself (SpMV, SpMM): one
    vectorised pass over ``len(pos)`` entries instead of ``len(crd)``.
    (Typed by hand, not with a fused memoryview: it runs on every call,
    where a fused signature's dispatch costs more than the pass.)
    """
    cdef Py_ssize_t n = cnp.PyArray_DIM(pos, 0) - 1 if cnp.PyArray_NDIM(pos) == 1 else 0
    cdef Py_ssize_t drops = 0
    if _flat(pos, cnp.NPY_INT32):
        if n > 0:
            with nogil:
                drops = spfuse_drops_int(<const int*>cnp.PyArray_DATA(pos), n)
    elif _flat(pos, cnp.NPY_INT64):
        if n > 0:
            with nogil:
                drops = spfuse_drops_spfuse_ll(<const long long*>cnp.PyArray_DATA(pos), n)
    else:
        raise ValueError("pos_drops needs a 1-D contiguous int32 or int64 array")
    return drops


def scan_widen(cnp.ndarray pos, cnp.ndarray crd, long long size):
    """:func:`scan_compressed` of an int32 level that also returns its int64
    copy, written in the same pass: ``(status, pos64, crd64)``.

    The generic executor reads int64 index arrays; widening them after the
    scan would read both arrays a second time.  ``pos64``/``crd64`` are
    meaningful only when ``status`` is 0 (when it is not, the caller
    takes the validating path and drops them).  ``pos`` and ``crd`` must be
    1-D contiguous int32 arrays (ValueError otherwise) with ``pos[0] == 0``
    (checked by the caller); ``pos[-1] != len(crd)`` is status 2.
    Typed by hand (no memoryviews): it runs on every call.
    """
    if not (_flat(pos, cnp.NPY_INT32) and _flat(crd, cnp.NPY_INT32)):
        raise ValueError("scan_widen needs 1-D contiguous int32 arrays")
    cdef cnp.npy_intp npos = cnp.PyArray_DIM(pos, 0)
    cdef cnp.npy_intp ncrd = cnp.PyArray_DIM(crd, 0)
    cdef Py_ssize_t n = npos - 1
    cdef const int* p = <const int*>cnp.PyArray_DATA(pos)
    cdef const int* c = <const int*>cnp.PyArray_DATA(crd)
    cdef Py_ssize_t drops = 0, allowed = 0, outliers = 0, descents = 0
    if n < 0 or p[n] != ncrd:
        return 2, None, None
    cdef cnp.ndarray pos64 = cnp.PyArray_EMPTY(1, &npos, cnp.NPY_INT64, 0)
    cdef cnp.ndarray crd64 = cnp.PyArray_EMPTY(1, &ncrd, cnp.NPY_INT64, 0)
    cdef long long* wp = <long long*>cnp.PyArray_DATA(pos64)
    cdef long long* wc = <long long*>cnp.PyArray_DATA(crd64)
    with nogil:
        drops = spfuse_drops_widen_int(p, n, wp)
        if drops == 0 and ncrd > 0:
            spfuse_outliers_widen_int(c, ncrd, <int>min(size, 2147483647), wc, &outliers, &descents)
            if ncrd >= 2:  # pos is monotone here: 0 <= pos[s] <= ncrd
                allowed = spfuse_starts_int(p, n, c, <int>ncrd)
    if drops == 0 and outliers == 0 and descents == allowed:
        return 0, pos64, crd64
    # not canonical or invalid: the sequential scan says which
    return scan_compressed(pos, crd, size)[0], None, None


def readonly_flat(cnp.ndarray a):
    """A read-only 1-D view of the C-contiguous array ``a``: what a Tensor
    keeps of a caller's array (it never writes into it).  ``a.reshape(-1)``
    plus ``flags.writeable = False`` does the same for a microsecond more,
    paid for every operand of every call."""
    cdef cnp.ndarray v
    if not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise ValueError("readonly_flat needs a C-contiguous array")
    if cnp.PyArray_NDIM(a) == 1:
        v = a.view()
    else:
        v = cnp.PyArray_Ravel(a, cnp.NPY_CORDER)  # a view: a is contiguous
    cnp.PyArray_CLEARFLAGS(v, cnp.NPY_ARRAY_WRITEABLE)
    return v


def compressed_ready(object indptr, object indices, object data, Py_ssize_t nouter, Py_ssize_t ninner,
                     bint scan):
    """Whether scipy CSR/CSC arrays can be wrapped as they are, zero-copy:
    three exact ndarrays, 1-D, C-contiguous, native byte order; ``indptr``
    and ``indices`` both int32 or both int64 (int32 only when ``nouter``,
    ``ninner`` and nnz fit it); ``data`` float32 or float64; ``indptr`` of
    ``nouter + 1`` entries from 0 to ``len(indices) == len(data)``, never
    decreasing; with ``scan`` also every index in ``[0, ninner)`` and
    strictly increasing within its segment (:func:`scan_compressed` status 0).

    False means "take the general path" (which words any error), never
    "invalid".  One call instead of a dozen attribute checks in Python: it
    runs for every sparse operand of every call.
    """
    cdef cnp.ndarray p, c, d
    cdef int itype, vtype
    cdef Py_ssize_t nnz
    if not (type(indptr) is np.ndarray and type(indices) is np.ndarray and type(data) is np.ndarray):
        return False
    p, c, d = indptr, indices, data
    itype = cnp.PyArray_TYPE(p)
    vtype = cnp.PyArray_TYPE(d)
    if not ((itype == cnp.NPY_INT32 or itype == cnp.NPY_INT64) and _flat(p, itype) and _flat(c, itype)
            and (vtype == cnp.NPY_FLOAT64 or vtype == cnp.NPY_FLOAT32) and _flat(d, vtype)):
        return False
    nnz = cnp.PyArray_DIM(c, 0)
    if cnp.PyArray_DIM(p, 0) != nouter + 1 or cnp.PyArray_DIM(d, 0) != nnz or nouter < 0 or ninner < 0:
        return False
    if itype == cnp.NPY_INT32:
        if nouter > 2147483647 or ninner > 2147483647 or nnz > 2147483647:
            return False  # needs int64 indices: the general path widens them
        if (<int*>cnp.PyArray_DATA(p))[0] != 0 or (<int*>cnp.PyArray_DATA(p))[nouter] != nnz:
            return False
    elif (<long long*>cnp.PyArray_DATA(p))[0] != 0 or (<long long*>cnp.PyArray_DATA(p))[nouter] != nnz:
        return False
    if scan:
        return scan_compressed(p, c, ninner)[0] == 0
    return pos_drops(p) == 0
