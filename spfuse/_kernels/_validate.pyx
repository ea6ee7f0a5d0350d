"""One-pass O(nnz) checks of compressed levels (the price of safety).

``spfuse.validation.check_compressed`` calls :func:`scan_compressed` to learn,
in one sequential pass, whether a level is valid and canonical; only when it
is not does the slower numpy path run to word the error message.
"""
cimport cython

ctypedef fused index_t:
    int
    long long


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
    cdef Py_ssize_t where = -1
    cdef long long c, prev
    cdef int status = 0
    if n < 0:
        return 2, 0
    cdef Py_ssize_t last = pos[n]
    with nogil:
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
