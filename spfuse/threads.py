"""How many threads the kernels use.

One function, :func:`effective_num_threads`, is evaluated on every call: an
explicit ``num_threads`` wins, then :func:`set_num_threads` / :func:`threads`,
then ``OMP_NUM_THREADS`` (read by the OpenMP runtime itself), then the number
of cores this process may run on -- the last two resolved once per process,
at the first call, like the OpenMP runtime does.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from spfuse._kernels import _config

__all__ = ["effective_num_threads", "get_num_threads", "set_num_threads", "threads"]

_local = threading.local()
_global_setting: list[int | None] = [None]


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# The default (no explicit setting) is resolved once: the OpenMP runtime
# reads OMP_NUM_THREADS once at start-up too, and sched_getaffinity costs
# microseconds of a ~50 us call budget.
_default: list[int] = []


def _default_threads() -> int:
    if not _default:
        n = _config.openmp_max_threads()
        if "OMP_NUM_THREADS" not in os.environ:
            n = min(n, _available_cores())
        _default.append(max(1, n) if _config.openmp_enabled() else 1)
    return _default[0]


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
