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

from collections.abc import Mapping
from dataclasses import dataclass

from spfuse.ir.masks import FALSE, TRUE, Mask, atom
from spfuse.ir.ops import Const, Ref, TensorInfo, UnitOp

__all__ = ["IterationSpaces", "propagate_iteration_spaces", "ZERO_PRESERVING", "AtomLabels", "atom_tensor"]

#: unary functions with f(0) == 0: they keep a sparse operand's pattern.
ZERO_PRESERVING = frozenset({"relu", "tanh", "abs", "sqrt", "neg"})


class AtomLabels:
    """Names of mask atoms: one per (access pattern, mode) of a sparse input.

    An atom is the set of coordinates one level of one access stores, written
    like ReACT's ``B_j``: B's level holding the mode that ``B[i,j]`` indexes
    with ``j``.  Two accesses of one tensor with different indices
    (``A[l,i,m] + A[j,l,m]``) store different sets, so the second is primed
    (``A'``); a statement's accesses with equal indices share atoms.
    ``refs[atom] = (statement, tensor, indices, mode)``.

    >>> labels = AtomLabels()
    >>> labels.atom(0, "A", ("i", "j"), 1), labels.atom(0, "A", ("j", "i"), 0), labels.atom(0, "A", ("i", "j"), 0)
    ('A_j', "A'_j", 'A_i')
    """

    def __init__(self) -> None:
        self.refs: dict[str, tuple] = {}
        self._labels: dict[tuple, str] = {}

    def atom(self, statement: int, name: str, indices, mode: int) -> str:
        key = (statement, name, tuple(indices))
        if key not in self._labels:
            self._labels[key] = name + "'" * sum(1 for k in self._labels if k[1] == name)
        atom_name = f"{self._labels[key]}_{indices[mode]}"
        self.refs[atom_name] = key + (mode,)
        return atom_name


def atom_tensor(atom_name: str, atoms: Mapping[str, tuple]) -> str:
    """The tensor an atom belongs to."""
    return atoms[atom_name][1]


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
    atoms: Mapping[str, tuple] | None = None  # AtomLabels.refs

    def dead_values(self, op_id: int) -> tuple[str, ...]:
        """Indices where demand prunes the op's forward space (dead values without propagation)."""
        return tuple(i for i, m in self.forward[op_id].items() if m != self.final[op_id][i])


class _Values:
    """Where each tensor can be non-zero, per dimension; input masks are per access."""

    def __init__(self, inputs: Mapping[str, TensorInfo], labels: AtomLabels):
        self.inputs, self.labels = inputs, labels
        self.temps: dict[str, tuple[Mask, ...]] = {}

    def dims(self, statement: int, ref: Ref) -> tuple[Mask, ...]:
        info = self.inputs.get(ref.name)
        if info is None:
            return self.temps[ref.name]
        return tuple(atom(self.labels.atom(statement, ref.name, ref.indices, m))
                     if info.mode_is_compressed(m) else TRUE for m in range(info.ndim))


def _leaf_mask(leaf, index: str, value: _Values, statement: int) -> Mask:
    if isinstance(leaf, Const):
        return FALSE if leaf.value == 0 else TRUE
    dims = value.dims(statement, leaf)
    masks = [dims[d] for d, ix in enumerate(leaf.indices) if ix == index]
    out = TRUE
    for m in masks:
        out = out & m
    return out


def _projected(op, index: str, mask: Mask, inputs: Mapping[str, TensorInfo], labels: AtomLabels) -> Mask:
    """The pattern of ``op``'s result along ``index``.

    A level's atom only describes the result when the levels above it are
    indexed by output coordinates: after ``T[k] = sum(i, A[i,k])`` the set of
    k with a non-zero is a projection of A's pattern, which no single level
    stores -- so it is summarised as ``true`` (dense), which is always safe.
    """
    if not op.reduced or mask.is_true:
        return mask
    for lab in mask.atoms:
        _, tensor, indices, mode = labels.refs[lab]
        info = inputs.get(tensor)
        if info is None:
            return TRUE
        level = info.mode_order.index(mode)
        if any(indices[m] in op.reduced for m in info.mode_order[:level]):
            return TRUE
    return mask


def _operator_mask(op: UnitOp, index: str, value) -> Mask:
    masks = [_leaf_mask(a, index, value, op.statement) for a in op.args]
    o = op.operator
    if o is None or o in ZERO_PRESERVING:
        return masks[0]
    if o == "*":
        return masks[0] & masks[1]
    if o == "/":
        return masks[0]
    if o in ("+", "-"):
        # n-way union: a coordinate is visited when any term stores it (a
        # zero coefficient still visits: the result keeps the union pattern)
        out = masks[0]
        for m in masks[1:]:
            out = out | m
        return out
    if o == "where":
        cond, then, other = masks
        if isinstance(op.args[2], Const) and op.args[2].value == 0:
            return cond & then
        return then | other
    return TRUE  # sigmoid, exp, log: f(0) != 0


def sparse_reduction(op: UnitOp) -> bool:
    """Does ``op``'s max/min iterate only where its body is stored?

    A max/min over one index sees the implicit zeros too; instead of
    visiting every coordinate, the loop visits the body's stored positions
    (its operator mask) and the lowering counts them: when fewer than the
    extent were visited, one zero takes part (``y[i] = max(j, A[i,j])`` is
    O(nnz), not O(rows × columns)).  The output indices stay dense: an
    unvisited output element would keep its ±inf initial value."""
    return op.reduction in ("max", "min") and len(op.reduced) == 1


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
    true -> B_j
    """
    labels = AtomLabels()
    value = _Values(inputs, labels)
    forward: dict[int, dict[str, Mask]] = {}
    for op in ops:
        masks = {}
        for ix in op.indices:
            m = _operator_mask(op, ix, value)
            if op.reduction in ("max", "min") and not (sparse_reduction(op) and ix in op.reduced):
                # implicit zeros take part in max/min: iterate every index densely
                m = TRUE
            masks[ix] = m
        forward[op.id] = masks
        value.temps[op.out] = tuple(_projected(op, ix, masks[ix], inputs, labels) for ix in op.out_indices)

    # Backward: demand on each produced tensor's dimensions, from its readers.
    demand: dict[str, list[Mask]] = {}
    final: dict[int, dict[str, Mask]] = {}
    for op in reversed(ops):
        if op.out in results:
            wanted = [TRUE] * len(op.out_indices)
        else:
            wanted = demand.get(op.out, [FALSE] * len(op.out_indices))
        masks = dict(forward[op.id])
        if op.reduction not in ("max", "min"):
            # (max/min stay dense: an unvisited element would keep its ±inf
            # initial value, which no consumer may ever see.)
            for d, ix in enumerate(op.out_indices):
                masks[ix] = masks[ix] & wanted[d]
        final[op.id] = masks
        for ref in op.refs:
            if ref.name in inputs:
                continue
            cur = demand.setdefault(ref.name, [FALSE] * len(ref.indices))
            carried = set(ref.indices)
            for d, ix in enumerate(ref.indices):
                m = masks[ix]
                if any(not set(labels.refs[a][2]) <= carried for a in m.atoms):
                    # the mask depends on an index the producer does not have
                    # (T4[j] read as T4[j]*P[n,j]): within the producer it
                    # means "for some n", which no atom of its own expresses
                    m = TRUE
                cur[d] = cur[d] | m
    values = {op.out: tuple(_projected(op, ix, final[op.id][ix], inputs, labels) for ix in op.out_indices)
              for op in ops}
    return IterationSpaces(forward, final, values, dict(labels.refs))


def expression_mask(expr, index: str, value: _Values, statement: int = 0) -> Mask:
    """Mask of a whole AST expression at ``index`` (used by maximal fusion)."""
    from spfuse.frontend.ast import Access, Binary, Literal, Reduce, Unary, Where

    if isinstance(expr, Access):
        return _leaf_mask(Ref(expr.name, expr.indices), index, value, statement)
    if isinstance(expr, Literal):
        return FALSE if expr.value == 0 else TRUE
    if isinstance(expr, Binary):
        a, b = expression_mask(expr.left, index, value, statement), expression_mask(expr.right, index, value, statement)
        return a & b if expr.op == "*" else a if expr.op == "/" else a | b
    if isinstance(expr, Unary):
        return expression_mask(expr.arg, index, value, statement) if expr.fn in ZERO_PRESERVING else TRUE
    if isinstance(expr, Where):
        then = expression_mask(expr.then, index, value, statement)
        if isinstance(expr.other, Literal) and expr.other.value == 0:
            return expression_mask(expr.cond, index, value, statement) & then
        return then | expression_mask(expr.other, index, value, statement)
    if isinstance(expr, Reduce):
        return TRUE if expr.op != "sum" else expression_mask(expr.body, index, value, statement)
    return TRUE


def statement_masks(stmt_ops, inputs: Mapping[str, TensorInfo]):
    """Forward masks of maximally fused statements (no propagation, as in TACO),
    and the atom labels they use."""
    labels = AtomLabels()
    value = _Values(inputs, labels)
    out: dict[int, dict[str, Mask]] = {}
    for op in stmt_ops:
        masks = {ix: expression_mask(op.expr, ix, value, op.statement) for ix in op.indices}
        if op.reduction in ("max", "min"):
            masks = {ix: TRUE for ix in masks}
        out[op.id] = masks
        value.temps[op.out] = tuple(masks[ix] for ix in op.out_indices)
    # A ``where`` workspace (an op whose output its statement's later op
    # reads) is needed only where that reader iterates: its loops take the
    # reader's masks (SDDMM-div's ``w = sum(k, C*D)`` only on B's pattern).
    for n, op in enumerate(stmt_ops):
        reader = next((c for c in stmt_ops[n + 1:] if c.statement == op.statement
                       and any(r.name == op.out for r in c.refs)), None)
        if reader is None or op.reduction in ("max", "min"):
            continue
        reads = {r.indices for r in reader.refs if r.name == op.out}
        if len(reads) != 1:
            continue
        (at,) = reads
        out[op.id] = {**out[op.id], **{ix: out[reader.id][rx] for ix, rx in zip(op.out_indices, at, strict=True)
                                       if out[op.id][ix].is_true}}
    return out, dict(labels.refs)
