# cython: language_level=3
"""The thread-workspace table shared by the template kernels (see ``_workspace.pxd``)."""
from libc.stdlib cimport calloc, free

from spfuse._kernels._openmp_helpers cimport omp_get_max_threads


cdef class Workspaces:
    """Thread-private workspace pointers of one kernel call, freed on any exit.

    ``k`` slots per thread; thread ``t`` owns ``ptr[t * k : (t + 1) * k]``.
    Threads allocate their slots lazily inside the parallel region (first
    touch by the owner, ``ws_get``/``ws_zeroed``) and keep them across
    chunks; ``__dealloc__`` (the kernel's reference dropping, on return or on
    an exception such as KeyboardInterrupt) frees them.
    """

    def __cinit__(self, int num_threads, int k=1):
        # (num_threads <= 0 lets OpenMP choose the team: up to its max)
        self.n = <Py_ssize_t>(num_threads if num_threads > 0 else max(1, omp_get_max_threads())) * k
        self.ptr = <void**>calloc(self.n + 1, sizeof(void*))
        if self.ptr == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t t
        if self.ptr != NULL:
            for t in range(self.n):
                spfuse_ws_free(self.ptr[t])
            free(self.ptr)


def _line_offsets(sizes):
    """_line_offsets(sizes) -> list of (offset within its cache line, usable bytes)

    Testing hook: allocate a workspace of each size in turn, report where it
    starts within a cache line (0: aligned) and the bytes it spans (whole
    lines), and free them all.
    """
    cdef list ptrs = []
    cdef void* p
    out = []
    try:
        for nbytes in sizes:
            p = spfuse_ws_alloc(<size_t>nbytes, 1)
            if p == NULL:
                raise MemoryError()
            ptrs.append(<size_t>p)
            out.append((<size_t>p % SPFUSE_LINE, (nbytes + SPFUSE_LINE - 1) // SPFUSE_LINE * SPFUSE_LINE or SPFUSE_LINE))
    finally:
        for q in ptrs:
            spfuse_ws_free(<void*><size_t>q)
    return out


def _padded_stride(Py_ssize_t count, Py_ssize_t item_bytes):
    """_padded_stride(count, item_bytes) -> items per thread (testing hook for ``padded_stride``)."""
    return padded_stride(count, item_bytes)
