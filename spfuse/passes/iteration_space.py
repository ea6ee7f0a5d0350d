"""Sparse iteration-space propagation (ReACT 4.2).

Forward: each unit operation's mask per index follows from its operator
(∧ for ``*``, numerator for ``/`` -- the sparse convention ``0/x = 0`` --,
∨ for ``+ -``, unchanged through unary functions with ``f(0) = 0``, dense
through ``sigmoid exp log`` and non-zero constants).  Reductions by max/min
iterate densely (implicit zeros take part in the comparison).

Backward: a temporary only has to be computed where some consumer reads it,
so the demand of every use (the consumer's final mask at the index reading
each dimension) is OR-ed and AND-ed into the producer's masks.  This removes
ReACT's dead-value redundancy: SDDMM's ``C·D`` is only formed where B is
stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from spfuse.ir.masks import FALSE, TRUE, Mask, atom
from spfuse.ir.ops import Const, Ref, TensorInfo, UnitOp

__all__ = ["IterationSpaces", "propagate_iteration_spaces", "ZERO_PRESERVING"]

#: unary functions with f(0) == 0: they keep a sparse operand's pattern.
ZERO_PRESERVING = frozenset({"relu", "tanh", "abs", "sqrt", "neg"})


@dataclass(frozen=True)
class IterationSpaces:
    """Masks per operation and index.

    ``forward[op][index]``: what the operation's own operands imply;
    ``final[op][index]``: after AND-ing consumers' demand (what auto iterates);
    ``value[name][dim]``: the pattern where a tensor can be non-zero.
    """

    forward: Mapping[int, Mapping[str, Mask]]
    final: Mapping[int, Mapping[str, Mask]]
    value: Mapping[str, tuple[Mask, ...]]

    def dead_values(self, op_id: int) -> tuple[str, ...]:
        """Indices where demand prunes the op's forward space (dead values without propagation)."""
        return tuple(i for i, m in self.forward[op_id].items() if m != self.final[op_id][i])


def _leaf_mask(leaf, index: str, value: Mapping[str, tuple[Mask, ...]]) -> Mask:
    if isinstance(leaf, Const):
        return FALSE if leaf.value == 0 else TRUE
    masks = [value[leaf.name][d] for d, ix in enumerate(leaf.indices) if ix == index]
    out = TRUE
    for m in masks:
        out = out & m
    return out


def _operator_mask(op: UnitOp, index: str, value) -> Mask:
    masks = [_leaf_mask(a, index, value) for a in op.args]
    o = op.operator
    if o is None or o in ZERO_PRESERVING:
        return masks[0]
    if o == "*":
        return masks[0] & masks[1]
    if o == "/":
        return masks[0]
    if o in ("+", "-"):
        return masks[0] | masks[1]
    if o == "where":
        cond, then, other = masks
        if isinstance(op.args[2], Const) and op.args[2].value == 0:
            return cond & then
        return then | other
    return TRUE  # sigmoid, exp, log: f(0) != 0


def _input_value_mask(info: TensorInfo) -> tuple[Mask, ...]:
    return tuple(atom(info.name) if info.mode_is_compressed(m) else TRUE for m in range(info.ndim))


def propagate_iteration_spaces(ops: tuple[UnitOp, ...], inputs: Mapping[str, TensorInfo],
                               results: tuple[str, ...]) -> IterationSpaces:
    """Compute forward and propagated masks for every op.

    >>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
    >>> csr = TensorInfo("B", 2, ("dense", "compressed"), (0, 1), (4, 5))
    >>> ops = (UnitOp(0, "T0", ("i", "j"), "*", (Ref("C", ("i", "k")), Ref("D", ("k", "j"))), "sum", ("k",)),
    ...        UnitOp(1, "A", ("i", "j"), "*", (Ref("B", ("i", "j")), Ref("T0", ("i", "j")))))
    >>> inputs = {"B": csr, "C": TensorInfo.dense("C", (4, 3)), "D": TensorInfo.dense("D", (3, 5))}
    >>> s = propagate_iteration_spaces(ops, inputs, ("A",))
    >>> print(s.forward[0]["j"], "->", s.final[0]["j"])
    true -> B
    """
    value: dict[str, tuple[Mask, ...]] = {n: _input_value_mask(i) for n, i in inputs.items()}
    forward: dict[int, dict[str, Mask]] = {}
    for op in ops:
        masks = {}
        for ix in op.indices:
            m = _operator_mask(op, ix, value)
            if op.reduction in ("max", "min"):
                # implicit zeros take part in max/min: iterate every index densely
                m = TRUE
            masks[ix] = m
        forward[op.id] = masks
        value[op.out] = tuple(masks[ix] for ix in op.out_indices)

    # Backward: demand on each produced tensor's dimensions, from its readers.
    demand: dict[str, list[Mask]] = {}
    final: dict[int, dict[str, Mask]] = {}
    for op in reversed(ops):
        if op.out in results:
            wanted = [TRUE] * len(op.out_indices)
        else:
            wanted = demand.get(op.out, [FALSE] * len(op.out_indices))
        masks = dict(forward[op.id])
        for d, ix in enumerate(op.out_indices):
            masks[ix] = masks[ix] & wanted[d]
        final[op.id] = masks
        for ref in op.refs:
            if ref.name in inputs:
                continue
            cur = demand.setdefault(ref.name, [FALSE] * len(ref.indices))
            for d, ix in enumerate(ref.indices):
                cur[d] = cur[d] | masks[ix]
    values = dict(value)
    for op in ops:
        values[op.out] = tuple(final[op.id][ix] for ix in op.out_indices)
    return IterationSpaces(forward, final, values)


def expression_mask(expr, index: str, value: Mapping[str, tuple[Mask, ...]]) -> Mask:
    """Mask of a whole AST expression at ``index`` (used by maximal fusion)."""
    from spfuse.frontend.ast import Access, Binary, Literal, Reduce, Unary, Where

    if isinstance(expr, Access):
        return _leaf_mask(Ref(expr.name, expr.indices), index, value)
    if isinstance(expr, Literal):
        return FALSE if expr.value == 0 else TRUE
    if isinstance(expr, Binary):
        a, b = expression_mask(expr.left, index, value), expression_mask(expr.right, index, value)
        return a & b if expr.op == "*" else a if expr.op == "/" else a | b
    if isinstance(expr, Unary):
        return expression_mask(expr.arg, index, value) if expr.fn in ZERO_PRESERVING else TRUE
    if isinstance(expr, Where):
        then = expression_mask(expr.then, index, value)
        if isinstance(expr.other, Literal) and expr.other.value == 0:
            return expression_mask(expr.cond, index, value) & then
        return then | expression_mask(expr.other, index, value)
    if isinstance(expr, Reduce):
        return TRUE if expr.op != "sum" else expression_mask(expr.body, index, value)
    return TRUE


def statement_masks(stmt_ops, inputs: Mapping[str, TensorInfo]) -> dict[int, dict[str, Mask]]:
    """Forward masks of maximally fused statements (no propagation, as in TACO)."""
    value: dict[str, tuple[Mask, ...]] = {n: _input_value_mask(i) for n, i in inputs.items()}
    out: dict[int, dict[str, Mask]] = {}
    for op in stmt_ops:
        masks = {ix: expression_mask(op.expr, ix, value) for ix in op.indices}
        if op.reduction in ("max", "min"):
            masks = {ix: TRUE for ix in masks}
        out[op.id] = masks
        value[op.out] = tuple(masks[ix] for ix in op.out_indices)
    return out
