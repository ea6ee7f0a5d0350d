"""How many threads the kernels use.

One function, :func:`effective_num_threads`, is evaluated on every call: an
explicit ``num_threads`` wins, then :func:`set_num_threads` / :func:`threads`,
then the OpenMP runtime's current maximum (``OMP_NUM_THREADS``, or a
``threadpoolctl.threadpool_limits(..., user_api="openmp")`` set at any time),
capped by the cores this process may run on unless ``OMP_NUM_THREADS`` is set
(scikit-learn's ``_openmp_effective_n_threads`` rule).

A kernel call then asks :func:`threads_for_call`, which also leaves out the
cores other threads of this process, and other processes, are busy on right
now.  After a
multi-threaded BLAS call, OpenBLAS's worker threads busy-wait (``nop`` loops on
x86-64, no ``sched_yield``) for about 2**28 TSC ticks (~0.1 s).  A full team
would put a worker behind that spinner while the team's first thread, done
with its share, spins at the closing barrier on the other core (libgomp's
default wait policy): the worker gets a core only when the scheduler
preempts a spinner, milliseconds later (SpMV 7-13x slower than on one
thread, see :mod:`spfuse.bench.after_blas`).  So the team runs on the free
cores only.  Another process running on a core stalls a full team the same
way: a worker waits for the core while its teammate spins at every barrier
(the attention model's 60 executor calls per epoch took 30 ms at two threads
against 1.9 ms at one while a test run held a core), so the system's
runnable threads (``/proc/loadavg``, when this process may use every core)
count too.  Results do not depend on the team size.
``SPFUSE_ADAPTIVE_THREADS=0`` turns this off (e.g. to benchmark scaling).
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from spfuse._kernels import _config

__all__ = ["effective_num_threads", "get_num_threads", "set_num_threads", "threads",
           "threads_for_call"]

_local = threading.local()
_global_setting: list[int | None] = [None]


def _affinity_size() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# The core count is resolved once (sched_getaffinity costs microseconds of a
# ~30 us call budget); OpenMP's maximum is read on every call, so limits set
# after import (threadpoolctl, omp_set_num_threads) are honoured.
_cores: list[int] = []


def _cores_available() -> int:
    if not _cores:
        _cores.append(_affinity_size())
    return _cores[0]


def _default_threads() -> int:
    if not _config.openmp_enabled():
        return 1
    n = _config.openmp_max_threads()
    if "OMP_NUM_THREADS" not in os.environ:
        n = min(n, _cores_available())
    return max(1, n)


def _check(n: object, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{what} must be a positive int or None, got {n!r}")
    if n <= 0:
        raise ValueError(f"{what} must be >= 1, got {n}")
    return n


def set_num_threads(n: int | None) -> None:
    """Set the process-wide default thread count (``None`` restores the default).

    >>> import spfuse
    >>> spfuse.set_num_threads(1); spfuse.get_num_threads()
    1
    >>> spfuse.set_num_threads(None)
    """
    _global_setting[0] = None if n is None else _check(n, "num_threads")


def get_num_threads() -> int:
    """The number of threads the next kernel call will use.

    >>> import spfuse
    >>> spfuse.get_num_threads() >= 1
    True
    """
    return effective_num_threads(None)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Use ``n`` threads inside the ``with`` block (this Python thread only).

    >>> import spfuse
    >>> with spfuse.threads(1):
    ...     spfuse.get_num_threads()
    1
    """
    n = _check(n, "threads(n)")
    previous = getattr(_local, "n", None)
    _local.n = n
    try:
        yield
    finally:
        _local.n = previous


def effective_num_threads(num_threads: int | None = None) -> int:
    """Resolve the thread count for one call (see the module docstring)."""
    if num_threads is not None:
        n = _check(num_threads, "num_threads")
    elif getattr(_local, "n", None) is not None:
        n = _local.n
    elif _global_setting[0] is not None:
        n = _global_setting[0]
    else:
        return _default_threads()
    if not _config.openmp_enabled():
        return 1
    return max(1, n)


def _own_team(n: int) -> list[int]:
    """OS ids of the calling thread and of the OpenMP workers its kernels run
    on (libgomp keeps one pool per calling thread; learnt once per size)."""
    teams = getattr(_local, "teams", None)
    if teams is None:
        teams = _local.teams = {}
    key = (os.getpid(), n)  # a forked child has other threads
    ids = teams.get(key)
    if ids is None:
        ids = teams[key] = _config.team_thread_ids(n)
    return ids


def threads_for_call(num_threads: int | None = None, worthwhile: bool = True) -> int:
    """The team size one kernel call runs with: :func:`effective_num_threads`,
    less the cores other threads of this process occupy right now (a BLAS
    pool still spinning after ``X @ W``, a busy Python thread).

    A call with too little work to be worth a team (``worthwhile=False``)
    runs on one thread: ``num_threads`` is still checked, but the machine is
    not looked at (that reads ``/proc``, microseconds of a tiny call).

    >>> import spfuse
    >>> from spfuse.threads import threads_for_call
    >>> 1 <= threads_for_call() <= spfuse.get_num_threads()
    True
    >>> threads_for_call(1), threads_for_call(2, worthwhile=False)
    (1, 1)
    """
    if not worthwhile:
        # (num_threads still checked; None needs no resolving: reading
        # OpenMP's maximum and the environment cost microseconds per call)
        if num_threads is not None:
            effective_num_threads(num_threads)
        return 1
    n = effective_num_threads(num_threads)
    if n == 1 or os.environ.get("SPFUSE_ADAPTIVE_THREADS", "1") == "0":
        return n
    cores = _cores_available()
    if not _sees_whole_machine():
        # counting stops where the answer can no longer change (one thread)
        busy = _config.runnable_threads(_own_team(n), max(1, cores - 1))
        return n if busy <= 0 else max(1, min(n, cores - busy))   # (<= 0: none, or the OS cannot tell)
    busy, elsewhere = _config.running_elsewhere(_own_team(n), max(1, cores - 1))
    taken = max(0, busy) + max(0, elsewhere)
    return n if taken <= 0 else max(1, min(n, cores - taken))


def _sees_whole_machine() -> bool:
    """May this process use every core the system's run queues count
    (``/proc/loadavg`` is host-wide: in a container pinned to a few of many
    cores, other tenants' threads are no reason to run on fewer)?"""
    if not _whole:
        _whole.append(_cores_available() >= (os.cpu_count() or 1))
    return _whole[0]


_whole: list[bool] = []
