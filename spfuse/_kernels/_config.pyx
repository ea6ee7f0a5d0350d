"""Build facts of the Cython runtime (queried by ``spfuse.show_config``) and
what the thread-count logic of ``spfuse.threads`` needs to ask the OS."""
from cython.parallel cimport parallel
from libc.stdlib cimport free, malloc
from spfuse._kernels._openmp_helpers cimport (
    SPFUSE_OPENMP_ENABLED, omp_get_max_threads, omp_get_num_threads, omp_get_thread_num)

cdef extern from *:
    """
    #if defined(__linux__)
    #include <dirent.h>
    #include <fcntl.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    static long spfuse_thread_id(void) { return (long)syscall(SYS_gettid); }
    /* How many threads of this process, other than the `n_skip` ids in `skip`,
       are running or waiting for a core right now (state 'R' in
       /proc/self/task/<tid>/stat); -1 when /proc cannot tell.  A thread that
       busy-waits (OpenBLAS's pool for ~0.1 s after each call, any OpenMP
       team for its spin count) shows up here. */
    static int spfuse_runnable_threads(const long* skip, int n_skip) {
        DIR* dir = opendir("/proc/self/task");
        struct dirent* entry;
        char path[64], stat[192];
        int count = 0;
        if (dir == NULL) return -1;
        while ((entry = readdir(dir)) != NULL) {
            long tid;
            int k, fd, mine = 0;
            ssize_t len;
            const char* state;
            if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
            tid = strtol(entry->d_name, NULL, 10);
            for (k = 0; k < n_skip; k++) if (skip[k] == tid) { mine = 1; break; }
            if (mine) continue;
            snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
            fd = open(path, O_RDONLY);
            if (fd < 0) continue;            /* the thread just exited */
            len = read(fd, stat, sizeof stat - 1);
            close(fd);
            if (len <= 0) continue;
            stat[len] = 0;
            /* "tid (comm) S ...": comm may hold ')' itself, so take the last */
            state = strrchr(stat, ')');
            if (state != NULL && state[1] == ' ' && state[2] == 'R') count++;
        }
        closedir(dir);
        return count;
    }
    #else
    static long spfuse_thread_id(void) { return 0; }
    static int spfuse_runnable_threads(const long* skip, int n_skip) { return -1; }
    #endif
    """
    long spfuse_thread_id() noexcept nogil
    int spfuse_runnable_threads(const long* skip, int n_skip) noexcept nogil


def openmp_enabled():
    """True when the kernels were compiled with OpenMP."""
    return bool(SPFUSE_OPENMP_ENABLED)


def openmp_max_threads():
    """OpenMP's current maximum team size for the calling thread (1 without OpenMP).

    Read on every call: ``omp_set_num_threads`` (what threadpoolctl's
    ``threadpool_limits(user_api="openmp")`` calls) changes it at run time.
    """
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


def team_thread_ids(int num_threads):
    """OS thread ids of the team a ``parallel(num_threads=...)`` block started
    from the calling thread runs on (the caller first; ``[0]`` without Linux).

    libgomp keeps one pool of worker threads per calling thread and reuses it,
    so these are the threads every kernel called from here runs on.
    """
    cdef int n = max(1, num_threads)
    cdef long* ids = <long*>malloc(n * sizeof(long))
    cdef int got = 1
    cdef int* gotp = &got
    if ids == NULL:
        raise MemoryError()
    try:
        with nogil, parallel(num_threads=n):
            ids[omp_get_thread_num()] = spfuse_thread_id()
            if omp_get_thread_num() == 0:
                gotp[0] = omp_get_num_threads()
        return [ids[k] for k in range(got)]
    finally:
        free(ids)


def runnable_threads(skip):
    """How many threads of this process, other than the ids in ``skip``, are
    running or runnable now (-1 when the OS cannot tell, e.g. not Linux)."""
    cdef Py_ssize_t n = len(skip), k
    cdef long* ids = <long*>malloc(max(1, n) * sizeof(long))
    if ids == NULL:
        raise MemoryError()
    try:
        for k in range(n):
            ids[k] = skip[k]
        return spfuse_runnable_threads(ids, <int>n)
    finally:
        free(ids)
