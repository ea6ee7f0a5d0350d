"""A STREAM-style copy: the memory bandwidth memory-bound kernels are judged against.

``copy_bandwidth(nbytes, threads)`` copies a float64 array of ``nbytes``
into another (best of ``trials``) and reports bytes read + written per
second, the STREAM "Copy" convention (write-allocate traffic not counted).
With ``threads > 1`` the array is split into contiguous chunks copied by a
thread pool (numpy releases the GIL while copying).

>>> bw = copy_bandwidth(1 << 20, threads=1, trials=2)
>>> bw > 0
True
"""
from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["copy_bandwidth"]


def copy_bandwidth(nbytes: int = 1 << 28, threads: int = 1, trials: int = 5) -> float:
    """Best-of-``trials`` copy bandwidth in GB/s (1e9 bytes) over ``threads`` threads."""
    n = max(nbytes // 8, threads)
    src = np.ones(n)
    dst = np.empty_like(src)
    bounds = np.linspace(0, n, threads + 1).astype(np.int64)
    chunks = [(src[a:b], dst[a:b]) for a, b in itertools.pairwise(bounds)]
    best = float("inf")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for trial in range(trials + 1):  # trial 0 faults the pages in
            t0 = time.perf_counter()
            if threads == 1:
                np.copyto(dst, src)
            else:
                list(pool.map(lambda c: np.copyto(c[1], c[0]), chunks))
            if trial:
                best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9
