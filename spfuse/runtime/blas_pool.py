"""Keep the BLAS pool behind ``scipy.linalg.cython_blas`` asleep.

spfuse's dense products call BLAS through ``scipy.linalg.cython_blas``.
Left to itself, OpenBLAS (pthreads build, as in scipy's wheels) runs a large
product on its own pool, whose workers then busy-wait about 0.1 s for the
next call.  Every kernel, torch op or numpy call that follows in that window
shares its cores with them: a 2-layer GCN training step took 12.3 ms on two
threads with the pool woken by its gradient products against 5.1 ms with it
asleep (and torch.sparse's steps interleaved with it slowed by half too).

So spfuse holds that library to one thread for the length of each of its
products and runs the product's blocks on its own OpenMP team
(:func:`spfuse._kernels._dense_kernels.gemm`), restoring the user's setting
afterwards.  The library is found once, with threadpoolctl (the registry
scikit-learn uses): the pthreads OpenBLAS whose symbols take LP64 ints (the
one cython_blas calls; numpy's ILP64 copy has ``64_``-suffixed symbols).
With anything else (MKL, an OpenMP-threaded OpenBLAS, whose setter would set
OpenMP's own count, or an ambiguous match) nothing is bound and BLAS runs as
it always has.
"""
from __future__ import annotations

import ctypes
import os

from spfuse._kernels import _dense_kernels

__all__ = ["hold_blas_once"]

_held: list[str | None] = []


def hold_blas_once() -> str | None:
    """Bind the BLAS library spfuse's products call (on the first call only);
    return its path, or None when it is left to its own threads.

    >>> from spfuse.runtime.blas_pool import hold_blas_once
    >>> hold_blas_once() == hold_blas_once()   # found once, then remembered
    True
    """
    if not _held:
        _held.append(_bind())
    return _held[0]


def _bind() -> str | None:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:   # (a declared dependency; kept optional for vendored builds)
        return None
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library it calls)
    found = []
    for info in threadpool_info():
        if info.get("internal_api") != "openblas" or info.get("threading_layer") != "pthreads":
            continue
        symbols = _lp64_thread_symbols(info["filepath"])
        if symbols is not None:
            found.append((info["filepath"], symbols))
    if len(found) > 1:   # several LP64 OpenBLAS: the one shipped with scipy, if it is one of them
        scipy_dir = os.path.dirname(os.path.dirname(scipy.linalg.__file__))
        found = [f for f in found if os.path.dirname(f[0]).startswith(scipy_dir.rstrip(os.sep) + ".libs")
                 or f[0].startswith(scipy_dir)]
    if len(found) != 1:
        return None
    path, (set_threads, get_threads) = found[0]
    _dense_kernels.hold_blas_to_one_thread(set_threads, get_threads)
    return path


def _lp64_thread_symbols(path: str) -> tuple[int, int] | None:
    """Addresses of ``[scipy_]openblas_{set,get}_num_threads`` (unsuffixed:
    the LP64 build) in the already-loaded library at ``path``, or None."""
    try:
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
    except OSError:
        return None
    for prefix in ("scipy_", ""):
        setter = getattr(lib, f"{prefix}openblas_set_num_threads", None)
        getter = getattr(lib, f"{prefix}openblas_get_num_threads", None)
        if setter is not None and getter is not None:
            return (ctypes.cast(setter, ctypes.c_void_p).value or 0,
                    ctypes.cast(getter, ctypes.c_void_p).value or 0)
    return None
