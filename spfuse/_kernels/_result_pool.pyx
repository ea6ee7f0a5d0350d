"""Large result arrays whose memory returns to a pool when they die.

A kernel's result of many megabytes (SpMM's ``n x K`` output, SDDMM's values)
is written into fresh memory on every call, and on Linux fresh memory is
untouched pages: the kernel then takes a page fault per 4 KiB it writes, and
on two threads the faults serialise in the kernel.  Measured here, SpMM of a
100k-row matrix with K=64 (a 51 MB output): 27 ms on 2 threads into memory
written before, 40-45 ms into fresh memory.  A training loop or any repeated
call frees the previous result before (or soon after) it asks for the next,
so the pages can be handed over instead of returned to the system.

:func:`empty` returns an ordinary writable ndarray whose memory is owned by a
small :class:`_Block`; when the last array or view reading that memory dies,
the block's memory goes back to the pool (at most :data:`MAX_BLOCKS` blocks
and :data:`MAX_BYTES` bytes are kept, the oldest freed first) and the next
request of the same size takes it.  Results under :data:`MIN_BYTES`
(128 KiB) come from ``np.empty``: the allocator reuses small blocks itself.
:func:`release` frees what the pool keeps (``spfuse.clear_cache`` calls it).
Like ``np.empty``, the memory holds garbage: the kernels write every element.

>>> a = empty((1024, 1024), np.dtype(np.float64)); p = a.ctypes.data
>>> del a
>>> b = empty((1024, 1024), np.dtype(np.float64)); b.ctypes.data == p
True
"""
import threading

import numpy as np

cimport numpy as cnp

cnp.import_array()

#: results of this many bytes or more come from the pool.  Below 4 MiB the
#: allocator does not keep freed memory either: glibc returns a freed block
#: over its mmap threshold, or the top of its heap past the trim threshold,
#: to the system, and the next call faults its pages in again.  Measured: a
#: softmax on the stored entries of a 400k-entry matrix (3.3 MB of values,
#: rows' maxima and sums of 0.8 MB) took 12.2 ms with 4 MiB here, 8.7 ms
#: with 128 KiB; page faults were a quarter of its profile.
MIN_BYTES = 1 << 17
#: blocks and bytes the pool keeps at most while no result uses them
MAX_BLOCKS = 32
MAX_BYTES = 1 << 30

_lock = threading.Lock()
_free: list = []        # raw uint8 arrays nothing reads, oldest first
_kept = [0, 0]          # blocks, bytes


cdef class _Block:
    """Owner of one pooled allocation: exposes it as a writable byte buffer
    (the arrays made on it keep it alive) and hands it back when it dies."""

    cdef object raw
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, raw):
        self.raw = raw
        self.shape[0] = raw.nbytes
        self.strides[0] = 1

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        buffer.buf = cnp.PyArray_DATA(self.raw)
        buffer.format = "B"
        buffer.internal = NULL
        buffer.itemsize = 1
        buffer.len = self.shape[0]
        buffer.ndim = 1
        buffer.obj = self
        buffer.readonly = 0
        buffer.shape = self.shape
        buffer.strides = self.strides
        buffer.suboffsets = NULL

    def __releasebuffer__(self, Py_buffer* buffer):
        pass

    def __del__(self):
        try:
            _give_back(self.raw)
        except Exception:   # (interpreter shutdown: the module may be gone; the memory is freed)
            pass


def _give_back(raw) -> None:
    """Keep ``raw`` for the next request of its size; the oldest kept blocks
    go when the limits would be passed (sizes no longer asked for age out)."""
    nbytes = raw.nbytes
    if nbytes > MAX_BYTES:
        return
    with _lock:
        _free.append(raw)
        _kept[0] += 1
        _kept[1] += nbytes
        while _kept[0] > MAX_BLOCKS or _kept[1] > MAX_BYTES:
            old = _free.pop(0)
            _kept[0] -= 1
            _kept[1] -= old.nbytes


def _take(Py_ssize_t nbytes):
    """The most recently kept block of ``nbytes``, or None."""
    with _lock:
        for k in range(len(_free) - 1, -1, -1):
            if _free[k].nbytes == nbytes:
                _kept[0] -= 1
                _kept[1] -= nbytes
                return _free.pop(k)
    return None


def empty(shape, dtype) -> np.ndarray:
    """empty(shape, dtype) -> ndarray

    ``np.empty(shape, dtype)`` (C-ordered, writable, uninitialised), its
    memory taken from the pool when one of the same size is free."""
    dtype = np.dtype(dtype)
    if not isinstance(shape, tuple):
        shape = tuple(shape) if hasattr(shape, "__len__") else (shape,)
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    raw = _take(nbytes)
    if raw is None:
        raw = np.empty(nbytes, np.uint8)
    return np.frombuffer(_Block(raw), dtype=dtype, count=count).reshape(shape)


def release() -> None:
    """release()

    Free every block the pool keeps (results in use are not touched)."""
    with _lock:
        _free.clear()
        _kept[0] = _kept[1] = 0


def kept() -> tuple:
    """kept() -> (blocks, bytes) the pool holds now."""
    with _lock:
        return _kept[0], _kept[1]
