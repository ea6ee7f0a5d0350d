"""Sparse operands as dask arrays of row blocks, with nnz-balanced boundaries.

A sparse matrix becomes a dask array whose chunks are scipy CSR row blocks
(the layout scverse uses); an N-d sparse tensor becomes one whose chunks are
:class:`spfuse.Tensor` slabs along mode 0.  Row boundaries balance *work*,
not rows: each row costs one unit plus its stored entries, and the
boundaries split the prefix sums of that cost (``indptr + row``) evenly, so
a power-law hub row gets a block to itself instead of overloading one.

Every block's metadata -- its stored-entry count and the sorted distinct
column coordinates it touches -- is recorded on the client under the dask
array's name (:func:`block_info`), so planning and the communication cost
model need not execute anything.

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_array(np.diag(np.arange(1.0, 7.0)))
>>> dA = from_scipy(A, chunks=3)
>>> dA.chunks
((2, 2, 2), (6,))
>>> block_info(dA).nnz
(2, 2, 2)
"""
from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.highlevelgraph import HighLevelGraph

from spfuse.tensor import Tensor, as_tensor

__all__ = ["balanced_boundaries", "from_scipy", "from_tensor", "from_mtx", "from_npz", "block_info",
           "BlockInfo", "slice_block", "with_meta"]

Chunks = None | int | Sequence[int]


def balanced_boundaries(indptr: Any, nblocks: int) -> np.ndarray:
    """Row boundaries ``[0, ..., nrows]`` splitting ``nblocks`` ways by rows + stored entries.

    A row costs ``1 + nnz(row)``; boundary ``b`` is the first row whose
    prefix cost reaches ``b / nblocks`` of the total.  Boundaries never
    repeat: a hub row heavier than one block's share just yields fewer,
    non-empty blocks.

    >>> balanced_boundaries([0, 1, 2, 3, 4], 2).tolist()          # uniform rows: equal halves
    [0, 2, 4]
    >>> balanced_boundaries([0, 100, 101, 102, 103], 3).tolist()  # the hub row alone
    [0, 1, 4]
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    if indptr.ndim != 1 or len(indptr) == 0:
        raise ValueError(f"indptr must be a non-empty 1-D array, got shape {indptr.shape}")
    if not isinstance(nblocks, (int, np.integer)) or nblocks < 1:
        raise ValueError(f"nblocks must be a positive int, got {nblocks!r}")
    nrows = len(indptr) - 1
    cost = indptr + np.arange(nrows + 1)  # prefix cost: rows before + entries before
    targets = cost[-1] * np.arange(1, nblocks) / nblocks
    inner = np.searchsorted(cost, targets, side="left")
    bounds = np.unique(np.concatenate(([0], np.clip(inner, 0, nrows), [nrows])))
    return bounds if nrows else np.array([0, 0])


def _row_bounds(nrows: int, indptr: np.ndarray | None, chunks: Chunks) -> np.ndarray:
    """Row boundaries from ``chunks``: None (one block per 2**20 stored entries), a block count, or row counts."""
    if chunks is None:
        nnz = int(indptr[-1]) if indptr is not None else nrows
        chunks = max(1, -(-nnz // (1 << 20)))
    if isinstance(chunks, (int, np.integer)):
        if indptr is None:
            indptr = np.arange(nrows + 1)
        return balanced_boundaries(indptr, int(chunks))
    counts = np.asarray(chunks, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any() or counts.sum() != nrows:
        raise ValueError(f"chunks must be a block count or non-negative row counts summing to {nrows}, "
                         f"got {tuple(np.asarray(chunks).tolist())}")
    return np.concatenate(([0], np.cumsum(counts)))


@dataclass(frozen=True)
class BlockInfo:
    """Per-block metadata of a row-partitioned sparse dask array.

    ``nnz[b]``: stored entries of block ``b``; ``columns[b]``: for each
    axis after the first, the sorted distinct coordinates block ``b``
    touches (what a block must fetch of a factor indexed by that axis).
    """

    nnz: tuple
    columns: tuple  # columns[b][axis - 1] -> sorted int64 array
    nbytes: tuple = ()  # nbytes[b]: what Dask's sizeof counts for block b (what a transfer moves)
    meta: Any = None  # an empty block of the right kind (Dask replaces a Tensor meta after persist)

    def touched(self, block: int, axis: int, bounds: np.ndarray) -> np.ndarray:
        """Which blocks of ``bounds`` (a partition of ``axis``) block ``block`` touches.

        >>> info = BlockInfo((2,), ((np.array([0, 5]),),))
        >>> info.touched(0, 1, np.array([0, 3, 6, 9])).tolist()
        [True, True, False]
        """
        cols = self.columns[block][axis - 1]
        nb = len(bounds) - 1
        which = np.searchsorted(bounds, cols, side="right") - 1
        return np.bincount(which[(which >= 0) & (which < nb)], minlength=nb)[:nb] > 0


_INFO: dict[str, BlockInfo] = {}
_INFO_LOCK = threading.Lock()
_MAX_INFO = 256


def _remember(name: str, info: BlockInfo) -> None:
    with _INFO_LOCK:
        if len(_INFO) >= _MAX_INFO:
            _INFO.pop(next(iter(_INFO)))
        _INFO[name] = info


def _block_meta(block: Any) -> tuple[int, tuple, int]:
    """(nnz, distinct coordinates per non-leading axis, Dask's sizeof) of one sparse block."""
    from dask.sizeof import sizeof

    from spfuse.dask import registrations  # noqa: F401  (sizeof of sparse arrays and Tensor)
    if isinstance(block, Tensor):
        coords = block.coords
        return (int(block.nnz), tuple(np.unique(coords[a]).astype(np.int64) for a in range(1, block.ndim)),
                int(sizeof(block)))
    csr = block.tocsr()
    return int(csr.nnz), (np.unique(csr.indices).astype(np.int64),), int(sizeof(block))


def block_info(arr: da.Array, compute: bool = True) -> BlockInfo | None:
    """The :class:`BlockInfo` of a row-partitioned sparse dask array.

    Arrays built by :func:`from_scipy`/:func:`from_tensor` have it already;
    for any other (``dask.array.from_array(A, chunks=..., asarray=False)``)
    it is computed once, in one small pass over the blocks (``compute=False``
    returns ``None`` instead).

    >>> import numpy as np, scipy.sparse as sp, dask.array as da
    >>> A = sp.csr_array(np.eye(4))
    >>> block_info(da.from_array(A, chunks=(2, 4), asarray=False), ).nnz
    (2, 2)
    """
    info = _INFO.get(arr.name)
    if info is None and compute:
        per_block = dask.compute(*[dask.delayed(_block_meta)(b) for b in arr.to_delayed().ravel()])
        info = BlockInfo(*(tuple(m[k] for m in per_block) for k in range(3)))
        _remember(arr.name, info)
    return info


def _from_blocks(blocks: list, bounds: np.ndarray, shape: tuple, meta: Any, prefix: str) -> da.Array:
    """A dask array over already-sliced blocks along axis 0 (the data sit in the graph)."""
    name = f"{prefix}-{dask.base.tokenize(*blocks, tuple(bounds))}"
    rest = (0,) * (len(shape) - 1)
    # a task, not a bare literal: the worker that runs it imports spfuse.dask (and with it
    # the sizeof registrations), so Dask's memory and transfer accounting counts the block's
    # buffers (a csr_array would count ~56 bytes) from the moment it is stored
    layer = {(name, b) + rest: (stored_block, blk) for b, blk in enumerate(blocks)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    chunks = (tuple(np.diff(bounds).tolist()),) + tuple((s,) for s in shape[1:])
    arr = with_meta(da.Array(graph, name, chunks, meta=meta), meta)
    per_block = [_block_meta(b) for b in blocks]
    _remember(name, BlockInfo(*(tuple(m[k] for m in per_block) for k in range(3)), meta=meta))
    return arr


def stored_block(block: Any) -> Any:
    """The block itself (the task that puts one of spfuse's row blocks on a worker).

    >>> stored_block(3)
    3
    """
    return block


def with_meta(arr: da.Array, meta: Any) -> da.Array:
    """``arr`` with ``meta`` as its meta as given: Dask turns a meta it cannot
    slice (a :class:`spfuse.Tensor`) into an empty numpy array otherwise.

    >>> import numpy as np, dask.array as da
    >>> t = Tensor.from_numpy(np.zeros((0, 2)), "csr")
    >>> type(with_meta(da.zeros((0, 2)), t)._meta).__name__
    'Tensor'
    """
    if isinstance(meta, Tensor):
        arr._meta = meta
    return arr


def from_scipy(A: Any, chunks: Chunks = None) -> da.Array:
    """A dask array of CSR row blocks from a scipy sparse matrix or array.

    ``chunks``: ``None`` (about 2**20 stored entries per block), a number of
    blocks (boundaries balanced by rows + stored entries), or explicit row
    counts (which may be zero).  Blocks keep ``A``'s flavour (``csr_array``
    or ``csr_matrix``); ``A`` is not modified.

    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.random_array((10, 6), density=0.3, format="csr", rng=0)
    >>> dA = from_scipy(A, chunks=(4, 0, 6))
    >>> dA.chunks, type(dA._meta).__name__
    (((4, 0, 6), (6,)), 'csr_array')
    >>> bool((dA.compute() != A).nnz == 0)
    True
    """
    if not sp.issparse(A) or A.ndim != 2:
        raise TypeError(f"from_scipy expects a 2-D scipy.sparse matrix or array, got {type(A).__name__}")
    csr = A.tocsr()
    if not csr.has_canonical_format:
        csr = csr.copy()
        csr.sum_duplicates()
    bounds = _row_bounds(csr.shape[0], csr.indptr, chunks)
    blocks = [csr[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    return _from_blocks(blocks, bounds, csr.shape, csr[:0], "spfuse-csr")


def slice_block(block: Any, axis: int, lo: int, hi: int) -> Any:
    """``block`` restricted to ``lo <= coordinate < hi`` along ``axis`` (coordinates shifted to start at 0).

    Works on numpy arrays, scipy sparse matrices and :class:`spfuse.Tensor`.

    >>> t = Tensor.from_coo([[0, 1, 2], [0, 1, 2], [0, 1, 2]], [1.0, 2.0, 3.0], (3, 3, 3))
    >>> slice_block(t, 1, 1, 3).coords.tolist()
    [[1, 2], [0, 1], [1, 2]]
    """
    if lo == 0 and hi == block.shape[axis]:
        return block
    if isinstance(block, Tensor):
        coords = block.coords
        keep = (coords[axis] >= lo) & (coords[axis] < hi)
        sel = coords[:, keep].astype(np.int64)
        sel[axis] -= lo
        shape = list(block.shape)
        shape[axis] = hi - lo
        out = Tensor.from_coo(sel, block.values[keep], tuple(shape), format=block.format)
        out.origin = block.origin
        return out
    index = [slice(None)] * block.ndim
    index[axis] = slice(lo, hi)
    return block[tuple(index)]


def from_tensor(X: Any, chunks: Chunks = None) -> da.Array:
    """A dask array of :class:`spfuse.Tensor` slabs along mode 0 (balanced by stored entries).

    >>> import numpy as np
    >>> X = Tensor.from_coo([[0, 1, 3], [0, 1, 2], [1, 0, 0]], [1.0, 2.0, 3.0], (4, 3, 2))
    >>> dX = from_tensor(X, chunks=(1, 3))
    >>> dX.chunks[0], dX.blocks[1].compute()
    ((1, 3), <spfuse.Tensor shape=(3, 3, 2) float64 csf nnz=2 index=int32>)
    """
    t = as_tensor(X, name="X")
    if t.ndim < 1:
        raise ValueError("from_tensor needs a tensor with at least one mode")
    first = np.bincount(t.coords[0], minlength=t.shape[0]) if t.nnz else np.zeros(t.shape[0], np.int64)
    indptr = np.concatenate(([0], np.cumsum(first)))
    bounds = _row_bounds(t.shape[0], indptr, chunks)
    blocks = [slice_block(t, 0, int(lo), int(hi)) if len(bounds) > 2 else t
              for lo, hi in itertools.pairwise(bounds)]
    meta = slice_block(t, 0, 0, 0) if t.shape[0] else t
    return _from_blocks(blocks, bounds, t.shape, meta, "spfuse-tensor")


def from_mtx(path: str | os.PathLike, chunks: Chunks = None) -> da.Array:
    """A Matrix Market file as a dask array of CSR row blocks (read on the client).

    >>> import tempfile, os, numpy as np, spfuse
    >>> p = os.path.join(tempfile.mkdtemp(), "a.mtx")
    >>> spfuse.io.write_mtx(p, np.eye(3))
    >>> from_mtx(p, chunks=(1, 2)).compute().toarray()[2]
    array([0., 0., 1.])
    """
    from spfuse.io import read_mtx
    t = read_mtx(path)
    return from_scipy(t.to_scipy("sparray") if t.ndim == 2 and not t.format.is_dense
                      else sp.csr_array(t.todense()), chunks)


def _load_npz(path: str) -> Any:
    return sp.csr_array(sp.load_npz(path))  # the flavour the array's meta promises


def from_npz(paths: Sequence[str | os.PathLike]) -> da.Array:
    """Row blocks stored one per ``scipy.sparse.save_npz`` file, read lazily by the workers.

    Only each file's ``shape`` entry is read on the client; a block's
    metadata (:func:`block_info`) is computed when a plan first needs it.

    >>> import tempfile, os, numpy as np, scipy.sparse as sp
    >>> d = tempfile.mkdtemp()
    >>> for k in range(2):
    ...     sp.save_npz(os.path.join(d, f"{k}.npz"), sp.csr_array(np.eye(2, 3, k)))
    >>> dA = from_npz(sorted(os.path.join(d, f) for f in os.listdir(d)))
    >>> dA.shape, dA.compute().toarray()[3].tolist()
    ((4, 3), [0.0, 0.0, 1.0])
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("from_npz needs at least one file")
    shapes = []
    for p in paths:
        with np.load(p) as z:
            shapes.append(tuple(int(s) for s in z["shape"]))
            fmt = z["format"].item()
            fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
            dtype = z["data"].dtype
    if any(len(s) != 2 or s[1] != shapes[0][1] for s in shapes):
        raise ValueError(f"row-block files must be 2-D with one column count, got shapes {shapes}")
    name = f"spfuse-npz-{dask.base.tokenize(paths)}"
    layer = {(name, b, 0): (_load_npz, p) for b, p in enumerate(paths)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    chunks = (tuple(s[0] for s in shapes), (shapes[0][1],))
    return da.Array(graph, name, chunks, meta=sp.csr_array((0, shapes[0][1]), dtype=dtype))
