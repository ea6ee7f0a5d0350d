"""What one task runs: the single-node spfuse kernel on one block of every operand.

A :class:`CellRunner` is made once on the client and placed in the graph as
one key that every block task depends on, so Dask ships it once per worker
(with the spfuse :class:`~spfuse.Kernel` inside), not once per task.  A task
receives its operands' blocks, cuts the ones that are not chunked along a
partitioned axis down to the task's range (:func:`~spfuse.dask.partition.slice_block`),
runs the kernel, and returns each result in the kind the graph promised
(its ``meta``): the single-node engine may return a sparse result for an
all-empty block where other blocks give dense ones.

>>> import numpy as np, scipy.sparse as sp, spfuse
>>> runner = CellRunner(spfuse.compile("y[i] = A[i,j] * x[j]"), ("A", "x"), ("y",), (np.empty(0),))
>>> A = sp.csr_array(np.eye(3))
>>> run_cell(runner, CellSlices((((0, 1, 3),), ())), A, np.arange(3.0))
array([1., 2.])
"""
from __future__ import annotations

import functools
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.dask.partition import slice_block
from spfuse.tensor import Tensor

__all__ = ["CellRunner", "CellSlices", "run_cell", "joined", "like_meta", "empty_like_meta", "block_cpu_seconds"]

#: Thread CPU seconds block tasks have spent in this process (see :func:`block_cpu_seconds`).
_BLOCK_CPU = [0.0]


def block_cpu_seconds() -> float:
    """Thread CPU seconds the block tasks run in this process have used so far.

    What a worker spends on spfuse's own work, without Dask's background
    (heartbeats, memory monitor, profiler, transfers): ``spfuse bench
    --suite dask`` reads it from every worker before and after a call.

    >>> before = block_cpu_seconds()
    >>> import spfuse
    >>> runner = CellRunner(spfuse.compile("y[i] = A[i,j] * x[j]"), ("A", "x"), ("y",), (np.empty(0),))
    >>> _ = run_cell(runner, CellSlices(((), ())), sp.csr_array(np.eye(3)), np.ones(3))
    >>> block_cpu_seconds() > before
    True
    """
    return _BLOCK_CPU[0]


def timed(task):
    """``task`` with the thread CPU it uses added to :func:`block_cpu_seconds`.

    >>> timed(sorted)([2, 1])
    [1, 2]
    """
    @functools.wraps(task)
    def run(*args):
        start = time.thread_time()
        try:
            return task(*args)
        finally:
            _BLOCK_CPU[0] += time.thread_time() - start
    return run


@dataclass(frozen=True)
class CellSlices:
    """Per operand, the ``(axis, lo, hi)`` cuts a task applies to its block.

    A plain object rather than a tuple, so the graph never mistakes the
    integers for a task or a key.
    """

    cuts: tuple


@dataclass(frozen=True)
class CellRunner:
    """The spfuse kernel and how to call it and return its results (see the module docstring)."""

    kernel: Any
    names: tuple
    results: tuple
    metas: tuple

    def __dask_tokenize__(self):
        return ("spfuse.dask.CellRunner", self.kernel.text, self.kernel.fusion, self.kernel.out_format,
                self.kernel.num_threads, self.names, self.results,
                tuple((type(m).__name__, str(m.dtype), m.ndim) for m in self.metas))


def like_meta(value: Any, meta: Any) -> Any:
    """``value`` converted to ``meta``'s kind (numpy, a scipy class, or Tensor).

    >>> import scipy.sparse as sp
    >>> like_meta(np.eye(2), sp.csr_matrix((0, 0))).format, type(like_meta(sp.csr_array(np.eye(2)), np.empty(0)))
    ('csr', <class 'numpy.ndarray'>)
    """
    if isinstance(meta, np.ndarray):
        if isinstance(value, Tensor):
            value = value.todense()
        elif sp.issparse(value):
            value = value.toarray()
        return np.asarray(value, dtype=meta.dtype)
    if sp.issparse(meta):
        if isinstance(value, Tensor):
            value = value.to_scipy("sparray") if not value.format.is_dense else value.todense()
        if type(value) is not type(meta):
            value = type(meta)(value)
        return value.astype(meta.dtype, copy=False)
    if isinstance(meta, Tensor):
        if isinstance(value, np.ndarray):
            value = Tensor.from_numpy(value, meta.format)
        elif sp.issparse(value):
            value = Tensor.from_scipy(value)
        if value.format != meta.format:
            value = value.asformat(meta.format)
        return value.astype(meta.dtype) if value.dtype != meta.dtype else value
    return value


def empty_like_meta(meta: Any, shape: tuple) -> Any:
    """An all-zero result of ``meta``'s kind and ``shape``.

    >>> empty_like_meta(np.empty((0,)), (3,))
    array([0., 0., 0.])
    """
    if isinstance(meta, np.ndarray):
        return np.zeros(shape, dtype=meta.dtype)
    if sp.issparse(meta):
        return type(meta)(shape, dtype=meta.dtype)
    return Tensor.from_coo(np.zeros((len(shape), 0), np.int64), np.zeros(0, meta.dtype), shape,
                           format=meta.format)


#: Chunks joined in this process: (ids of the chunks) -> (weak references to them, the joined array).
_JOINED: OrderedDict = OrderedDict()
_JOINED_KEEP = 4


def joined(block: Any) -> Any:
    """A dense operand given in chunks (a nested list, one level per axis) as one array.

    The block tasks on one worker read the same chunks of a broadcast factor,
    so the join (a copy the size of the factor) is made once per process and
    reused while those very chunk objects live (weak references; at most
    :data:`_JOINED_KEEP` kept).  The joined array is read-only: Dask's data is
    never written to, and neither are spfuse's inputs.

    >>> chunks = [[np.ones((1, 2))], [np.zeros((2, 2))]]
    >>> joined(chunks).shape, joined(chunks) is joined(chunks), joined(np.ones(3)).shape
    ((3, 2), True, (3,))
    """
    if not isinstance(block, list):
        return block
    flat = list(_leaves(block))
    key = tuple(id(c) for c in flat)
    hit = _JOINED.get(key)
    if hit is not None and all(ref() is c for ref, c in zip(hit[0], flat, strict=True)):
        _JOINED.move_to_end(key)
        return hit[1]
    out = np.block(block)
    out.setflags(write=False)
    try:  # a chunk that dies takes its entry with it (ids are reused)
        refs = [weakref.ref(c, lambda _, key=key: _JOINED.pop(key, None)) for c in flat]
    except TypeError:  # not weak-referenceable: no reuse
        return out
    _JOINED[key] = (refs, out)
    while len(_JOINED) > _JOINED_KEEP:
        _JOINED.popitem(last=False)
    return out


def _leaves(nested: list):
    for x in nested:
        if isinstance(x, list):
            yield from _leaves(x)
        else:
            yield x


@timed
def run_cell(runner: CellRunner, slices: CellSlices, *blocks: Any) -> Any:
    """Run ``runner``'s kernel on one block of each operand (cut by ``slices``).

    An operand arriving as a nested list of chunks is joined first (:func:`joined`).
    Returns the one result, or a dict of results for multi-result programs.
    """
    operands = {}
    for name, block, cuts in zip(runner.names, blocks, slices.cuts, strict=True):
        block = joined(block)
        for axis, lo, hi in cuts:
            block = slice_block(block, axis, lo, hi)
        operands[name] = block
    out = runner.kernel(**operands)
    if len(runner.results) == 1:
        return like_meta(out, runner.metas[0])
    return {r: like_meta(out[r], m) for r, m in zip(runner.results, runner.metas, strict=True)}


def pick(cell_output: dict, name: str) -> Any:
    """One result of a multi-result block task.

    >>> pick({"y": 1, "z": 2}, "z")
    2
    """
    return cell_output[name]
