# Thread-private workspaces of the template kernels (_csr_kernels,
# _csf_kernels, _dense_kernels), written once: a table of ``k`` slots per
# thread for one kernel call, each slot allocated on first use by the thread
# that owns it (first touch) and freed with the table on any exit.
#
# Every workspace is cache-line aligned and a whole number of lines long, so
# two threads' workspaces never share a line.  Side by side malloc'ed blocks
# did: mttkrp_mid's 512-byte row temporaries, one per thread, ran slower on
# two threads than on one whenever the heap placed them 16 bytes into a line.
from spfuse._kernels._openmp_helpers cimport omp_get_thread_num

cdef extern from *:
    """
    #include <stdlib.h>
    #include <string.h>
    #if defined(_WIN32)
    #include <malloc.h>
    #endif
    #define SPFUSE_LINE 64
    static void* spfuse_ws_alloc(size_t nbytes, int zeroed) {
        size_t size = (nbytes + SPFUSE_LINE - 1) & ~(size_t)(SPFUSE_LINE - 1);
        void* p = NULL;
        if (size == 0) size = SPFUSE_LINE;
    #if defined(_WIN32)
        p = _aligned_malloc(size, SPFUSE_LINE);
    #else
        if (posix_memalign(&p, SPFUSE_LINE, size) != 0) p = NULL;
    #endif
        if (p != NULL && zeroed) memset(p, 0, size);
        return p;
    }
    static void spfuse_ws_free(void* p) {
    #if defined(_WIN32)
        _aligned_free(p);
    #else
        free(p);
    #endif
    }
    """
    # ``nbytes`` rounded up to whole cache lines, line-aligned (NULL on failure)
    void* spfuse_ws_alloc(size_t nbytes, int zeroed) noexcept nogil
    void spfuse_ws_free(void* p) noexcept nogil
    # the cache line size the allocations are aligned to, in bytes
    enum: SPFUSE_LINE


cdef class Workspaces:
    # ``k`` slots per thread; thread ``t`` owns ``ptr[t * k : (t + 1) * k]``
    cdef void** ptr
    cdef Py_ssize_t n


cdef inline void** ws_slot(void** ws, int k, int slot) noexcept nogil:
    """Address of the calling thread's workspace ``slot`` (of ``k`` per thread)."""
    return ws + <Py_ssize_t>omp_get_thread_num() * k + slot


cdef inline void* ws_get(void** ws, int k, int slot, size_t nbytes) noexcept nogil:
    """The calling thread's workspace ``slot``, allocated on first use (NULL
    if that fails; the caller counts the failure)."""
    cdef void** mine = ws_slot(ws, k, slot)
    if mine[0] == NULL:
        mine[0] = spfuse_ws_alloc(nbytes, 0)
    return mine[0]


cdef inline void* ws_zeroed(void** ws, int k, int slot, size_t nbytes) noexcept nogil:
    """The calling thread's workspace ``slot``, zeroed when first allocated:
    a caller that leaves it zeroed after each row never clears it whole."""
    cdef void** mine = ws_slot(ws, k, slot)
    if mine[0] == NULL:
        mine[0] = spfuse_ws_alloc(nbytes, 1)
    return mine[0]


cdef inline Py_ssize_t padded_stride(Py_ssize_t count, Py_ssize_t item_bytes) noexcept nogil:
    """Items per thread in one shared array of per-thread regions: ``count``
    rounded up to whole lines plus one line of gap, so that neighbouring
    threads' regions never share a cache line (the array itself need not be
    aligned)."""
    cdef Py_ssize_t per_line = SPFUSE_LINE // item_bytes
    return ((count + per_line - 1) // per_line + 1) * per_line
