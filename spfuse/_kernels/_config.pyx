"""Build facts of the Cython runtime (queried by ``spfuse.show_config``) and
what the thread-count logic of ``spfuse.threads`` needs to ask the OS."""
import os
import sys
import threading
import time

from cython.parallel cimport parallel
from libc.stdlib cimport free, malloc
from spfuse._kernels._openmp_helpers cimport (
    SPFUSE_OPENMP_ENABLED, omp_get_max_threads, omp_get_num_threads, omp_get_thread_num)

cdef extern from *:
    """
    #if defined(__linux__)
    #include <sys/syscall.h>
    #include <unistd.h>
    static long spfuse_thread_id(void) { return (long)syscall(SYS_gettid); }
    /* Of the threads tids[0..n) whose /proc/self/task/<tid>/stat files are
       open as fds[0..n), those not among skip[0..n_skip): how many are
       running or waiting for a core right now (state 'R')?  Stops counting
       at `stop_at`.  A thread that exited makes its read fail: *gone is then
       set (the caller lists the threads again). */
    static int spfuse_count_running(const long* tids, const int* fds, int n,
                                    const long* skip, int n_skip, int stop_at, int* gone,
                                    int only_listed) {
        /* only_listed: count the threads in skip[] instead of the others */
        char stat[192];
        int k, j, count = 0;
        for (k = 0; k < n && count < stop_at; k++) {
            const char* state;
            ssize_t len;
            for (j = 0; j < n_skip && skip[j] != tids[k]; j++) {}
            if ((j < n_skip) != (only_listed != 0)) continue;
            len = pread(fds[k], stat, sizeof stat - 1, 0);
            if (len <= 0) { *gone = 1; continue; }
            stat[len] = 0;
            /* "tid (comm) S ...": comm may hold ')' itself, so take the last */
            state = strrchr(stat, ')');
            if (state != NULL && state[1] == ' ' && state[2] == 'R') count++;
        }
        return count;
    }
    /* The system's runnable threads now: the numerator of /proc/loadavg's
       fourth field ("running/total"), read through the open `fd`; -1 if
       it cannot be read. */
    static int spfuse_system_running(int fd) {
        char buf[128];
        int field = 0, running = 0;
        const char* c;
        ssize_t len = pread(fd, buf, sizeof buf - 1, 0);
        if (len <= 0) return -1;
        buf[len] = 0;
        for (c = buf; *c && field < 3; c++) if (*c == ' ') field++;
        if (field < 3 || *c < '0' || *c > '9') return -1;
        for (; *c >= '0' && *c <= '9'; c++) running = running * 10 + (*c - '0');
        return running;
    }
    #else
    static long spfuse_thread_id(void) { return 0; }
    static int spfuse_count_running(const long* tids, const int* fds, int n,
                                    const long* skip, int n_skip, int stop_at, int* gone,
                                    int only_listed) {
        *gone = 1; return 0;
    }
    static int spfuse_system_running(int fd) { return -1; }
    #endif
    """
    long spfuse_thread_id() noexcept nogil
    int spfuse_count_running(const long* tids, const int* fds, int n,
                             const long* skip, int n_skip, int stop_at, int* gone,
                             int only_listed) noexcept nogil
    int spfuse_system_running(int fd) noexcept nogil


_LINUX = sys.platform.startswith("linux")


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


# The threads of this process, as open /proc stat files: listing
# /proc/self/task and opening each file costs ~10x reading an open one, so
# the list is made again only every _RELIST_S seconds or when a thread exits
# (a thread started in between is seen at the next listing).  The C arrays
# are shared by every Python thread: _LOCK guards them (os calls release the
# GIL).
cdef enum:
    MAX_LISTED = 256
cdef long _tids[MAX_LISTED]
cdef int _fds[MAX_LISTED]
cdef int _n_listed = 0
_listed_at = [-1.0]
_listed_pid = [0]  # a forked child holds its parent's files: list again
_RELIST_S = 0.5
_LOCK = threading.Lock()


def _listed_thread_ids():
    """Testing hook: the OS ids of this process's threads as last listed."""
    return [_tids[k] for k in range(_n_listed)]


cdef bint _all_listed(const long* ids, int n) noexcept:
    """Whether every thread in ``ids`` is in the current listing.  A team
    started after the last listing is not: its workers, spinning after a
    kernel, would be taken for another process's threads (the next call on
    half its team) until the listing is made again."""
    cdef int j, k
    for j in range(n):
        for k in range(_n_listed):
            if _tids[k] == ids[j]:
                break
        else:
            return False
    return True


cdef int _relist() except -1:
    global _n_listed
    cdef int k
    for k in range(_n_listed):
        os.close(_fds[k])
    _n_listed = 0
    for tid in os.listdir("/proc/self/task"):
        if _n_listed == MAX_LISTED:
            break
        try:
            _fds[_n_listed] = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
        except OSError:  # it just exited
            continue
        _tids[_n_listed] = int(tid)
        _n_listed += 1
    _listed_at[0] = time.monotonic()
    _listed_pid[0] = os.getpid()
    return 0


def runnable_threads(skip, int stop_at=1 << 30):
    """How many threads of this process, other than the OS ids in ``skip``,
    are running or waiting for a core now (counting stops at ``stop_at``);
    -1 when that cannot be told (not Linux, /proc unreadable, or another
    Python thread is asking right now).  A thread that busy-waits (OpenBLAS's
    pool for ~0.1 s after each call) counts."""
    cdef int gone = 0, count, k, n_skip = min(len(skip), 64)
    cdef long skip_ids[64]
    if not _LINUX or not _LOCK.acquire(blocking=False):
        return -1
    try:
        for k in range(n_skip):
            skip_ids[k] = skip[k]
        if time.monotonic() - _listed_at[0] > _RELIST_S or os.getpid() != _listed_pid[0]:
            _relist()
        count = spfuse_count_running(_tids, _fds, _n_listed, skip_ids, n_skip, stop_at, &gone, 0)
        if gone:
            _listed_at[0] = -1.0
        return count
    except OSError:
        return -1
    finally:
        _LOCK.release()


_loadavg = [-1, 0]   # an open /proc/loadavg and the pid that opened it


def running_elsewhere(team, int stop_at=1 << 30):
    """``(busy, elsewhere)``: how many threads of this process outside
    ``team`` (OS ids, the calling thread first) are running or waiting for a
    core now (as :func:`runnable_threads`), and how many threads of *other*
    processes are: the system's runnable threads (``/proc/loadavg``) less
    the caller, ``busy`` and the team's workers still spinning after a
    kernel.  The workers' states are read only when the system count says
    something else runs (each read costs microseconds).  ``(-1, -1)`` when
    nothing can be told, ``elsewhere`` -1 alone when the system count
    cannot be read."""
    cdef int gone = 0, busy, k, n_team = min(len(team), 64), system, workers = 0
    cdef long ids[64]
    if not _LINUX or not _LOCK.acquire(blocking=False):
        return -1, -1
    try:
        for k in range(n_team):
            ids[k] = team[k]
        if (time.monotonic() - _listed_at[0] > _RELIST_S or os.getpid() != _listed_pid[0]
                or not _all_listed(ids, n_team)):
            _relist()
        if _loadavg[1] != os.getpid():
            if _loadavg[0] >= 0:
                os.close(_loadavg[0])
            _loadavg[0], _loadavg[1] = os.open("/proc/loadavg", os.O_RDONLY), os.getpid()
        busy = spfuse_count_running(_tids, _fds, _n_listed, ids, n_team, stop_at, &gone, 0)
        system = spfuse_system_running(_loadavg[0])
        if system < 0:
            return busy, -1
        system -= 1 + busy   # the caller is running: it is reading this
        if system > 0 and n_team > 1:
            workers = spfuse_count_running(_tids, _fds, _n_listed, ids + 1, n_team - 1, 1 << 30, &gone, 1)
        if gone:
            _listed_at[0] = -1.0
        return busy, max(0, system - workers)
    except OSError:
        return -1, -1
    finally:
        _LOCK.release()
