"""Build facts of the Cython runtime (queried by ``spfuse.show_config``)."""
from cython.parallel cimport parallel
from spfuse._kernels._openmp_helpers cimport (
    SPFUSE_OPENMP_ENABLED, omp_get_max_threads, omp_get_num_threads)


def openmp_enabled():
    """True when the kernels were compiled with OpenMP."""
    return bool(SPFUSE_OPENMP_ENABLED)


def openmp_max_threads():
    """OpenMP's current maximum team size (1 without OpenMP)."""
    return omp_get_max_threads()


def team_size(int num_threads):
    """Size of the team a ``parallel(num_threads=...)`` block really gets."""
    # A variable assigned in a parallel block is thread-private; write
    # through a pointer so the value survives the block.
    cdef int seen = 1
    cdef int* out = &seen
    with nogil, parallel(num_threads=num_threads):
        out[0] = omp_get_num_threads()
    return seen
