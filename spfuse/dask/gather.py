"""The *gather* strategy for a contracted partitioned index: fetch only the rows a block touches.

For ``C[i,k] = A[i,j] * B[j,k]`` with ``A`` in row blocks ``A_i`` and a large
``B`` in row blocks ``B_c`` (``j`` contracted and partitioned), the
*reduce* strategy computes one partial ``A_i[:, J_c] @ B_c`` per touching
pair and adds them; the *gather* strategy (row-Gustavson) instead

1. computes ``u_i``, the sorted distinct columns of ``A_i``, where ``A_i`` lives
   (:func:`distinct_columns`);
2. sends ``u_i`` to each touched ``B_c`` and brings back only those rows
   (:func:`take_rows`);
3. runs the fused kernel once per row block on ``A_i`` with its columns
   renumbered ``0..len(u_i)-1`` and the gathered rows stacked in that order
   (:func:`run_gathered`) -- no partial results, no reduction.

It moves ``8 * |u_i ∩ J_c|`` bytes of indices plus the touched rows per
pair, instead of a whole block of ``B`` or a partial result: the cost
model (:mod:`spfuse.dask.cost`) picks the cheaper one.

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_array(np.array([[0.0, 2.0, 0.0, 1.0]]))
>>> u = distinct_columns(A, 1)
>>> u.tolist(), take_rows(np.arange(8.0).reshape(4, 2), u, 0, 0).tolist()
([1, 3], [[2.0, 3.0], [6.0, 7.0]])
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.dask.blocks import CellRunner, CellSlices, joined, like_meta, timed
from spfuse.dask.partition import slice_block
from spfuse.tensor import Tensor

__all__ = ["distinct_columns", "take_rows", "renumber", "stack", "run_gathered"]


def distinct_columns(block: Any, axis: int) -> np.ndarray:
    """The sorted distinct coordinates of a sparse block along ``axis`` (int64).

    >>> distinct_columns(sp.csr_array(np.array([[1.0, 0, 1], [1.0, 0, 0]])), 1).tolist()
    [0, 2]
    """
    if isinstance(block, Tensor):
        return np.unique(block.coords[axis]).astype(np.int64)
    coo = block.tocoo()
    return np.unique(coo.col if axis == 1 else coo.row).astype(np.int64)


def take_rows(block: Any, wanted: np.ndarray, axis: int, lo: int) -> Any:
    """The entries of ``block`` (covering coordinates ``lo..``) at the global
    coordinates ``wanted`` along ``axis`` that fall inside it, in order.

    >>> take_rows(np.arange(6.0).reshape(3, 2), np.array([0, 4, 5, 9]), 0, 3).tolist()
    [[2.0, 3.0], [4.0, 5.0]]
    """
    n = block.shape[axis]
    local = wanted[(wanted >= lo) & (wanted < lo + n)] - lo
    if isinstance(block, Tensor):
        coords = block.coords
        pos = np.searchsorted(local, coords[axis])
        hit = (pos < len(local)) & (local[np.minimum(pos, len(local) - 1)] == coords[axis]) if len(local) else \
            np.zeros(coords.shape[1], bool)
        sel = coords[:, hit].astype(np.int64)
        sel[axis] = pos[hit]
        shape = list(block.shape)
        shape[axis] = len(local)
        return Tensor.from_coo(sel, block.values[hit], tuple(shape), format=block.format)
    index = [slice(None)] * block.ndim
    index[axis] = local
    return block[tuple(index)]


def renumber(block: Any, axis: int, columns: np.ndarray) -> Any:
    """``block`` with its coordinates along ``axis`` replaced by their rank in ``columns``.

    >>> renumber(sp.csr_array(np.array([[0.0, 5.0, 0.0, 7.0]])), 1, np.array([1, 3])).toarray()
    array([[5., 7.]])
    """
    if isinstance(block, Tensor):
        coords = block.coords.astype(np.int64)
        coords[axis] = np.searchsorted(columns, coords[axis])
        shape = list(block.shape)
        shape[axis] = len(columns)
        out = Tensor.from_coo(coords, block.values, tuple(shape), format=block.format)
        out.origin = block.origin
        return out
    csr = block.tocsr() if axis == 1 else block.T.tocsr()
    out = type(block)((csr.data, np.searchsorted(columns, csr.indices).astype(csr.indices.dtype), csr.indptr),
                      shape=(csr.shape[0], len(columns)))
    return out if axis == 1 else type(block)(out.T)


def stack(pieces: list, axis: int) -> Any:
    """Gathered pieces joined along ``axis`` (dense, scipy sparse or Tensor).

    >>> stack([np.ones((1, 2)), np.zeros((2, 2))], 0).shape
    (3, 2)
    """
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    if isinstance(first, Tensor):
        from spfuse.dask.registrations import concatenate_tensors
        return concatenate_tensors(pieces, axis)
    if sp.issparse(first):
        out = (sp.vstack if axis == 0 else sp.hstack)(pieces, format="csr")
        return type(first)(out) if type(out) is not type(first) else out
    return np.concatenate(pieces, axis=axis)


@timed
def run_gathered(runner: CellRunner, slices: CellSlices, gathered: tuple, columns: np.ndarray,
                 *blocks_and_pieces: Any) -> Any:
    """Run ``runner`` on one row block with the contracted index renumbered.

    ``gathered[k]`` is ``None`` for an operand passed as one block, or
    ``(axis, npieces)``: the operand arrives as ``npieces`` gathered pieces to
    stack along ``axis``; for the sparse operand that defines the index it
    is ``(axis, 0)``: its block is renumbered by ``columns`` along ``axis``.

    >>> import spfuse
    >>> runner = CellRunner(spfuse.compile("y[i] = A[i,j] * x[j]"), ("A", "x"), ("y",), (np.empty(0),))
    >>> A = sp.csr_array(np.array([[0.0, 2.0, 0.0, 1.0]]))
    >>> run_gathered(runner, CellSlices(((), ())), ((1, 0), (0, 2)), np.array([1, 3]), A,
    ...              np.array([10.0]), np.array([100.0]))
    array([120.])
    """
    it = iter(blocks_and_pieces)
    operands = {}
    for name, how, cuts in zip(runner.names, gathered, slices.cuts, strict=True):
        if how is None or how[1] == 0:
            block = joined(next(it))
            for axis, lo, hi in cuts:
                block = slice_block(block, axis, lo, hi)
            if how is not None:
                block = renumber(block, how[0], columns)
        else:
            block = stack([next(it) for _ in range(how[1])], how[0])
        operands[name] = block
    out = runner.kernel(**operands)
    if len(runner.results) == 1:
        return like_meta(out, runner.metas[0])
    return {r: like_meta(out[r], m) for r, m in zip(runner.results, runner.metas, strict=True)}


def gather_spec(layout: Any) -> Any:
    """When the gather strategy applies to a planned call, what it gathers; else ``None``.

    It applies to a single result summed over exactly one partitioned index
    ``d`` that exactly one sparse operand carries on an axis it does not
    block (so its blocks can be renumbered), every other operand carrying
    ``d`` being blocked along it (so its touched rows can be taken).
    Returns ``(d, sparse_name, axis, {name: axis of every other operand})``.

    >>> import scipy.sparse as sp, spfuse.dask as sfd
    >>> k = sfd.compile("y[i] = A[i,j] * x[j]")
    >>> gather_spec(k.layout(A=sfd.from_scipy(sp.csr_array(np.eye(2))), x=np.ones(2))) is None
    True
    """
    results = layout.classification.results
    if len(results) != 1:
        return None
    (rl,) = results.values()
    if len(rl.contracted_dims) != 1:
        return None
    (d,) = rl.contracted_dims
    definers, others = [], {}
    for o in layout.operands:
        axes = [a for a, dim in enumerate(o.dims) if dim == d]
        if not axes:
            continue
        if len(axes) != 1:
            return None
        if o.sparse and not o.blocked[axes[0]] and axes[0] > 0:
            definers.append((o.name, axes[0]))
        elif o.blocked[axes[0]] and all(blk or n == 1 for blk, n in zip(o.blocked, o.array.numblocks, strict=True)):
            others[o.name] = axes[0]  # (its rows are taken from one chunk per block, not from joined chunks)
        else:
            return None
    if len(definers) != 1 or not others:
        return None
    return (d, definers[0][0], definers[0][1], others)
