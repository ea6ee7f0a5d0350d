# Every OpenMP call in spfuse is cimported from here, so one generated .c
# builds with and without OpenMP: the C block below keys on _OPENMP and
# provides serial fallbacks.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define SPFUSE_OPENMP_ENABLED 1
    #else
    #define SPFUSE_OPENMP_ENABLED 0
    static inline int omp_get_thread_num(void) { return 0; }
    static inline int omp_get_max_threads(void) { return 1; }
    static inline int omp_get_num_threads(void) { return 1; }
    #endif
    """
    bint SPFUSE_OPENMP_ENABLED
    int omp_get_thread_num() noexcept nogil
    int omp_get_max_threads() noexcept nogil
    int omp_get_num_threads() noexcept nogil
