"""Reusable buffers for a kernel call's own copies of its dense operands.

A kernel that reads a dense factor in another mode order (SDDMM's ``D[k,j]``
passed C-ordered, SpMM's ``B`` passed Fortran-ordered) reads a copy made for
the call.  A fresh ``np.empty`` of that size comes from the operating system
as untouched pages, and the copy then pays a page fault per 4 KiB: measured
here, a 100000x64 float64 transpose took 13-18 ms into fresh memory and 7-10
ms into memory written before (2 threads), and the whole SDDMM 74 ms against
39.  The copy is read by the kernel and dropped when the call returns, so
the next call on the same thread can write its copy into the same pages.

One buffer is kept per thread and *slot* (the factor's position in the
kernel call, so that two copies in one call never share one), reused while
the request fits it without wasting more than half of it.  Small copies
(under :data:`MIN_BYTES`) are not kept: their pages are the allocator's
already.  :func:`release` drops every thread's buffers (``spfuse.clear_cache``
calls it).

>>> a = buffer(0, (512, 300), np.dtype(np.float64))
>>> b = buffer(0, (512, 300), np.dtype(np.float64))
>>> a.shape, np.shares_memory(a, b)
((512, 300), True)
"""
from __future__ import annotations

import threading

import numpy as np

__all__ = ["MIN_BYTES", "buffer", "release"]

#: copies of this many bytes or more reuse a kept buffer
MIN_BYTES = 1 << 20

_local = threading.local()
#: bumped by :func:`release`: a thread's buffers from before are dropped at its next request
_generation = [0]


def buffer(slot: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-ordered array of ``shape`` for slot ``slot`` of a
    kernel call on this thread: the memory of the previous call's request in
    that slot when it fits.  The caller writes it whole, lends it to one
    kernel call, and never returns it to the user (the next call in the slot
    overwrites it)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    kept = getattr(_local, "buffers", None)
    if kept is None or getattr(_local, "generation", None) != _generation[0]:
        kept = _local.buffers = {}
        _local.generation = _generation[0]
    raw = kept.get(slot)
    if raw is None or not nbytes <= raw.nbytes <= 2 * nbytes:
        raw = kept[slot] = np.empty(nbytes, np.uint8)
    return raw[:nbytes].view(dtype).reshape(shape)


def release() -> None:
    """Drop the kept buffers: this thread's now, every other thread's at its
    next request.

    >>> release()
    """
    _generation[0] += 1
    _local.buffers = {}
