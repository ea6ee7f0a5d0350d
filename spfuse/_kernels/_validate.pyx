"""One-pass O(nnz) checks of compressed levels (the price of safety).

``spfuse.validation.check_compressed`` calls :func:`scan_compressed` to learn,
in one sequential pass, whether a level is valid and canonical; only when it
is not does the slower numpy path run to word the error message.
"""
cimport cython
from cython.parallel cimport prange
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
    /* Outliers among a[lo..hi), and descents a[p] <= a[p-1] for p in        \
       [max(lo, 1), hi): pieces of one array add up to the whole's counts. */ \
    SPFUSE_CLONES static void spfuse_outliers_##T(                            \
            const T *a, Py_ssize_t lo, Py_ssize_t hi, T size, Py_ssize_t *out, \
            Py_ssize_t *desc) {                                               \
        T o = 0, d = 0;                                                       \
        if (lo == 0 && hi > 0) { o = (U)a[0] >= (U)size; lo = 1; }            \
        for (Py_ssize_t p = lo; p < hi; p++) {                                \
            o += (U)a[p] >= (U)size;                                          \
            d += a[p] <= a[p - 1];                                            \
        }                                                                     \
        *out = (Py_ssize_t)o; *desc = (Py_ssize_t)d;                          \
    }                                                                         \
    /* Number of s in [lo, hi) with pos[s+1] < pos[s]. */                     \
    SPFUSE_CLONES static Py_ssize_t spfuse_drops_##T(                         \
            const T *pos, Py_ssize_t lo, Py_ssize_t hi) {                     \
        Py_ssize_t d = 0;                                                     \
        for (Py_ssize_t s = lo; s < hi; s++) d += pos[s + 1] < pos[s];        \
        return d;                                                             \
    }                                                                         \
    /* Descents crd[p] <= crd[p-1] at the starts p = pos[s] of non-empty     \
       segments s in [max(lo, 1), hi) (allowed in a canonical level).        \
       Branch-free: rows of a power-law matrix are often empty, and a branch \
       per row would be mispredicted.  Needs a monotone pos with last >= 2. */ \
    SPFUSE_CLONES static Py_ssize_t spfuse_starts_##T(                        \
            const T *pos, Py_ssize_t lo, Py_ssize_t hi, const T *crd, T last) { \
        Py_ssize_t d = 0;                                                     \
        for (Py_ssize_t s = lo > 1 ? lo : 1; s < hi; s++) {                   \
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
    """
    void spfuse_outliers_int(const int *a, Py_ssize_t lo, Py_ssize_t hi, int size, Py_ssize_t *out,
                             Py_ssize_t *desc) nogil
    void spfuse_outliers_spfuse_ll(const long long *a, Py_ssize_t lo, Py_ssize_t hi, long long size,
                                   Py_ssize_t *out, Py_ssize_t *desc) nogil
    Py_ssize_t spfuse_drops_int(const int *pos, Py_ssize_t lo, Py_ssize_t hi) nogil
    Py_ssize_t spfuse_drops_spfuse_ll(const long long *pos, Py_ssize_t lo, Py_ssize_t hi) nogil
    Py_ssize_t spfuse_starts_int(const int *pos, Py_ssize_t lo, Py_ssize_t hi, const int *crd, int last) nogil
    Py_ssize_t spfuse_starts_spfuse_ll(const long long *pos, Py_ssize_t lo, Py_ssize_t hi,
                                       const long long *crd, long long last) nogil

cdef enum:
    _MAX_PIECES = 64   # pieces of the fast passes at most (one per thread)


cdef inline Py_ssize_t _piece(Py_ssize_t n, Py_ssize_t k, Py_ssize_t pieces) noexcept nogil:
    """Start of piece ``k`` of ``pieces`` equal pieces of ``[0, n)``."""
    return <Py_ssize_t>((<double>n * k) / pieces) if k < pieces else n


cdef enum:
    _CHUNK_ENTRIES = 16384   # entries per chunk of rows (64-128 KiB of coordinates: in L2)


cdef inline Py_ssize_t _row_holding(const index_t* pos, Py_ssize_t n, Py_ssize_t p) noexcept nogil:
    """The first row ``s`` with ``pos[s] >= p`` (``pos`` non-decreasing, ``n`` rows)."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) // 2
        if pos[mid] < p:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline void _scan_rows(const index_t* pos, const index_t* crd, Py_ssize_t s0, Py_ssize_t s1, long long size,
                            Py_ssize_t last, Py_ssize_t* outliers, Py_ssize_t* descents,
                            Py_ssize_t* allowed) noexcept nogil:
    """Rows ``[s0, s1)`` in chunks of about :data:`_CHUNK_ENTRIES` entries:
    their coordinates' outliers and descents, and the descents at their
    segment starts, added to the three counts (``pos`` non-decreasing)."""
    cdef Py_ssize_t s = s0, e, o, d
    while s < s1:
        e = _row_holding(pos, s1, pos[s] + _CHUNK_ENTRIES) if pos[s1] - pos[s] > _CHUNK_ENTRIES else s1
        if e <= s:
            e = s + 1   # (a row longer than a chunk: a chunk alone)
        if index_t is int:
            spfuse_outliers_int(crd, pos[s], pos[e], <int>min(size, 2147483647), &o, &d)
            if last >= 2:
                allowed[0] += spfuse_starts_int(pos, s, e, crd, <int>last)
        else:
            spfuse_outliers_spfuse_ll(crd, pos[s], pos[e], size, &o, &d)
            if last >= 2:
                allowed[0] += spfuse_starts_spfuse_ll(pos, s, e, crd, last)
        outliers[0] += o
        descents[0] += d
        s = e


@cython.boundscheck(False)
@cython.wraparound(False)
def scan_compressed(const index_t[::1] pos, const index_t[::1] crd, long long size, int num_threads=1):
    """Scan ``pos``/``crd`` once; return ``(status, where)``.

    status 0: valid and canonical (coordinates strictly increasing in every
    segment); 1: valid but unsorted or duplicated (canonicalise a copy);
    2: ``pos`` decreases at or after ``where`` (checked here, so no segment
    is read past ``pos[-1]``); 3: ``crd[where]`` is out of ``[0, size)``.
    The fast passes run in ``num_threads`` pieces (their counts add up, so
    the verdict never depends on it).  Preconditions (checked by the
    caller): ``pos[0] == 0`` and ``pos[-1] <= len(crd)``.
    """
    cdef Py_ssize_t n = pos.shape[0] - 1
    cdef Py_ssize_t s, p, start, end, k
    cdef Py_ssize_t drops = 0, allowed = 0
    cdef Py_ssize_t where = -1
    cdef long long c, prev
    cdef Py_ssize_t outliers = 0, descents = 0
    cdef Py_ssize_t[_MAX_PIECES] pd, po, pdesc, pst
    cdef int status = 0
    cdef Py_ssize_t pieces = min(max(num_threads, 1), _MAX_PIECES)
    if n < 0:
        return 2, 0
    cdef Py_ssize_t last = pos[n]
    with nogil:
        # Fast passes for the common (canonical) case, branch-free so the
        # compiler vectorises them and no per-segment overhead is paid:
        # pos never decreases; every coordinate lies in [0, size); the only
        # descents crd[p] <= crd[p-1] are at segment starts.
        for k in prange(pieces, schedule="static", num_threads=pieces):
            if index_t is int:
                pd[k] = spfuse_drops_int(&pos[0], _piece(n, k, pieces), _piece(n, k + 1, pieces))
            else:
                pd[k] = spfuse_drops_spfuse_ll(&pos[0], _piece(n, k, pieces), _piece(n, k + 1, pieces))
        for k in range(pieces):
            drops = drops + pd[k]
        if drops == 0 and last > 0:
            # pieces of whole rows holding about equal numbers of entries,
            # each walked in chunks of rows: a chunk's coordinates are
            # checked, then its segment starts read them again while they
            # are in cache (two passes over the whole array read it twice
            # from memory: the second cost as much as the first)
            for k in prange(pieces, schedule="static", num_threads=pieces):
                po[k] = 0
                pdesc[k] = 0
                pst[k] = 0
                _scan_rows(&pos[0], &crd[0], _row_holding(&pos[0], n, _piece(last, k, pieces)),
                           _row_holding(&pos[0], n, _piece(last, k + 1, pieces)) if k + 1 < pieces else n,
                           size, last, &po[k], &pdesc[k], &pst[k])
            for k in range(pieces):
                outliers = outliers + po[k]
                descents = descents + pdesc[k]
                allowed = allowed + pst[k]
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
                drops = spfuse_drops_int(<const int*>cnp.PyArray_DATA(pos), 0, n)
    elif _flat(pos, cnp.NPY_INT64):
        if n > 0:
            with nogil:
                drops = spfuse_drops_spfuse_ll(<const long long*>cnp.PyArray_DATA(pos), 0, n)
    else:
        raise ValueError("pos_drops needs a 1-D contiguous int32 or int64 array")
    return drops


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
