"""Loop order of each unit operation.

A first structural model in the spirit of Scorch's Algorithm 1 (seed 001):
enumerate the orders of an operation's indices (at most a few hundred) and
keep the cheapest under

* **concordance** (weight 100 per violation): the indices of every sparse
  operand -- and of every tensor named in an iteration mask -- must be
  visited in its storage order, otherwise the operand would need a
  transposition;
* **stride** (weight 1 per access): the innermost loop should run along the
  last (contiguous) mode of every dense access it touches, or not touch it.

Ties go to the order of first appearance in the operands, which reproduces
ReACT's trees (``i,k,j`` for ``T[i,j] = C[i,k]·D[k,j]``).
"""
from __future__ import annotations

import itertools
from typing import Mapping

from spfuse.ir.masks import Mask
from spfuse.ir.ops import Ref, TensorInfo, UnitOp

__all__ = ["order_loops", "appearance_order", "order_cost"]

DISCORDANCE_WEIGHT = 100.0
STRIDE_WEIGHT = 1.0
_MAX_ENUMERATED = 7  # 7! = 5040 orders; beyond that keep appearance order


def appearance_order(op: UnitOp) -> tuple[str, ...]:
    """Indices in order of first appearance: operands left to right, then output."""
    seen: dict[str, None] = {}
    for a in op.refs:
        seen.update(dict.fromkeys(a.indices))
    seen.update(dict.fromkeys(op.out_indices))
    return tuple(seen)


def _storage_indices(ref: Ref, info: TensorInfo) -> tuple[str, ...]:
    return tuple(ref.indices[m] for m in info.mode_order)


def order_cost(order: tuple[str, ...], op: UnitOp, infos: Mapping[str, TensorInfo],
               masks: Mapping[str, Mask], atoms: Mapping[str, tuple] = {}) -> float:
    """Structural cost of visiting ``op``'s indices in ``order`` (lower is better)."""
    pos = {ix: n for n, ix in enumerate(order)}
    cost = 0.0
    sparse_orders = []
    for ref in op.refs:
        info = infos.get(ref.name)
        if info is not None and info.is_sparse:
            sparse_orders.append(_storage_indices(ref, info))
    # A mask naming a tensor the op does not read (B in SDDMM's T0, through
    # propagation) filters the op's output loops: keep them in output order.
    own = {atoms.get(lab, (None, None))[1] for m in masks.values() for lab in m.atoms}
    if any(not any(r.name == t for r in op.refs) for t in own if t is not None):
        sparse_orders.append(tuple(op.out_indices))
    for storage in sparse_orders:
        for a, b in zip(storage, storage[1:]):
            if a != b and pos.get(a, -1) > pos.get(b, -1):
                cost += DISCORDANCE_WEIGHT
    inner = order[-1] if order else None
    accesses = [r for r in op.refs if not (infos.get(r.name) and infos[r.name].is_sparse)]
    accesses.append(Ref(op.out, op.out_indices))
    for ref in accesses:
        if len(ref.indices) >= 2 and inner in ref.indices and ref.indices[-1] != inner:
            cost += STRIDE_WEIGHT
    return cost


def order_loops(op: UnitOp, infos: Mapping[str, TensorInfo], masks: Mapping[str, Mask],
                atoms: Mapping[str, tuple] = {}) -> tuple[str, ...]:
    """Cheapest loop order for ``op`` (see module docstring).

    >>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
    >>> from spfuse.ir.masks import TRUE, atom
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (5, 6))
    >>> spmm = UnitOp(0, "C", ("i", "k"), "*", (Ref("A", ("i", "j")), Ref("B", ("j", "k"))), "sum", ("j",))
    >>> order_loops(spmm, {"A": A}, {"i": TRUE, "j": atom("A"), "k": TRUE})
    ('i', 'j', 'k')
    """
    base = appearance_order(op)
    for ix in op.indices:
        if ix not in base:
            base += (ix,)
    if len(base) > _MAX_ENUMERATED:
        return base
    best, best_cost = base, order_cost(base, op, infos, masks, atoms)
    for perm in itertools.permutations(base):
        c = order_cost(perm, op, infos, masks, atoms)
        if c < best_cost:
            best, best_cost = perm, c
    return best
