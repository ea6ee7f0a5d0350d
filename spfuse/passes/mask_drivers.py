"""Which access iterates each sparse loop: decided once, by the planner.

A loop whose mask is not ``true`` visits the stored coordinates of the
tensors its mask names (its atoms).  A *driver* of atom ``a`` at a loop is an
access of ``a``'s tensor by an operation bound at that loop such that

- the loop's index sits at a compressed level of the tensor,
- the enclosing loops already bind the indices of the levels above it, and
- under propagated masks (``strict``) the operation's loops visit the
  tensor's modes in its storage order: a transposed copy walks that level
  under other parents, a projection of the atom, not the atom itself.

An atom may name a tensor the operation never reads (SDDMM's ``C·D`` is
restricted to B's pattern by propagation); its indices are then found
through the producers and consumers that carried the mask.

The planner asks :meth:`MaskDrivers.undriven` of a propagated plan: a mask
with no driver cannot be iterated exactly, so it plans without propagation
instead.  The lowering asks :meth:`MaskDrivers.iteration` of every loop it
emits and gets the same answers, so it never meets a mask it cannot iterate.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spfuse.ir.ops import Ref
from spfuse.ir.tree import Compute, Loop, Reset

__all__ = ["Driver", "MaskDrivers", "atom_bindings", "storage_of"]


@dataclass(frozen=True)
class Driver:
    """Operation ``op_id`` reads the atom's tensor as ``ref``, its modes
    visited in ``order`` (the storage order, unless a copy is made)."""

    op_id: int
    ref: Ref
    order: tuple[int, ...]


class MaskDrivers:
    """The drivers of a loop tree's masks.

    ``storage[name]`` is ``(levels, mode_order)`` of each operand that may
    drive (tensors absent from it never do).

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> B = TensorInfo("B", 2, ("dense", "compressed"), (0, 1), (8, 9))
    >>> infos = {"B": B, "C": TensorInfo.dense("C", (8, 4)), "D": TensorInfo.dense("D", (4, 9))}
    >>> p = plan_program(parse_program("A[i,j] = B[i,j] * (C[i,k] * D[k,j])"), infos)
    >>> drivers = MaskDrivers.of(p)
    >>> drivers.strict, drivers.undriven(p.temporaries)
    (True, [])
    >>> for line in drivers.describe():
    ...     print(line)
    i › k › j ∈ B_j: B[i,j] (S0)
    i › j ∈ B_j: B[i,j] (S1)
    """

    def __init__(self, tree, bindings: Mapping[tuple[int, str], tuple[str, ...] | None], atoms: Mapping[str, tuple],
                 storage: Mapping[str, tuple], strict: bool):
        self.tree = tree
        self.bindings = bindings
        self.atoms = atoms
        self.storage = storage
        self.strict = strict
        self.paths: dict[int, list[Loop]] = {}
        self.loops: dict[int, dict[str, Loop]] = {}   # op id -> index -> the loop binding it
        self._walk_paths(tree.children, [])

    @classmethod
    def of(cls, plan) -> MaskDrivers:
        """The drivers of ``plan``'s tree over its planned storage, exact
        (strict) when its masks were propagated."""
        return cls(plan.tree, plan.atom_bindings, plan.atoms, storage_of(plan.inputs), plan.propagated)

    def _walk_paths(self, nodes, path: list) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                for op_id, ix in node.binds:
                    self.loops.setdefault(op_id, {})[ix] = node
                self._walk_paths(node.children, path + [node])
            elif isinstance(node, Compute):
                self.paths[node.op.id] = path

    # -- one loop ---------------------------------------------------------------
    def iteration(self, loop: Loop, bound: frozenset | set) -> tuple[str, tuple[Driver, ...]] | None:
        """How ``loop`` is iterated with the loops ``bound`` (their ``id``\\ s) around it:
        ``("dense", ())``, ``("intersect", drivers)`` or ``("union", drivers)``;
        None when ``strict`` and its mask has no exact driver."""
        mask = loop.mask
        if mask.is_true or mask.is_false:
            return "dense", ()
        if mask.single_conjunction:
            found = tuple(d for a in sorted(mask.atoms) if (d := self.driver(loop, a, bound)) is not None)
            if len(found) < len(mask.atoms) and self.strict:
                return None
            # (not strict: a superset of the mask is iterated, which is safe)
            return ("intersect", found) if found else ("dense", ())
        found = []
        for term in sorted(mask.terms, key=sorted):
            d = next((d for a in sorted(term) if (d := self.driver(loop, a, bound)) is not None), None)
            if d is None:
                # some term cannot be iterated sparsely: visit every coordinate
                return None if self.strict else ("dense", ())
            found.append(d)
        return "union", tuple(found)

    def driver(self, loop: Loop, atom: str, bound: frozenset | set) -> Driver | None:
        """An access of mask atom ``atom`` that can drive ``loop`` (or None)."""
        name = self.atoms[atom][1]
        if name not in self.storage:
            return None
        levels, stored = self.storage[name]
        for op_id, ix in sorted(loop.binds):
            binding = self.bindings.get((op_id, atom))
            if binding is None or ix not in binding:
                continue
            order = self.visiting_order(op_id, binding)
            if self.strict and order != tuple(stored):
                continue
            level_indices = [binding[m] for m in order]
            level = level_indices.index(ix)
            if not all(id(self.loops[op_id][v]) in bound for v in level_indices[:level]):
                continue
            if levels[level] != "compressed":
                continue
            return Driver(op_id, Ref(name, tuple(binding)), order)
        return None

    def visiting_order(self, op_id: int, indices) -> tuple[int, ...]:
        """The modes of a read of ``indices`` by op ``op_id``, outermost loop first."""
        depth = {id(lp): n for n, lp in enumerate(self.paths[op_id])}
        loops = self.loops[op_id]
        return tuple(sorted(range(len(indices)), key=lambda m: depth.get(id(loops.get(indices[m])), 0)))

    # -- the whole tree ---------------------------------------------------------
    def clearing_loops(self, temporary) -> list[tuple[Loop, bool]]:
        """The loops that clear a sparsified ``temporary`` (a
        :class:`~spfuse.passes.memory.Temporary`) at its Reset, outermost
        first: its writer's loops over its kept dimensions, each with
        whether it is cleared whole (a kept dimension whose mask is true is
        stored whole, so a reader visits all of it)."""
        stored = dict(zip(temporary.kept, temporary.masks, strict=True))
        op_id = temporary.op_id
        return [(lp, stored[lp.bound(op_id)].is_true) for lp in self.paths[op_id] if lp.bound(op_id) in stored]

    def undriven(self, temporaries: Mapping) -> list[str]:
        """The masks the lowering would visit with no exact driver, in the
        order it emits them: every loop, and the loops clearing a sparsified
        temporary at its :class:`~spfuse.ir.tree.Reset`."""
        missing: list[str] = []

        def check(loop: Loop, bound: frozenset) -> None:
            if self.iteration(loop, bound) is None:
                missing.append(str(loop.mask))

        def visit(nodes, bound: frozenset) -> None:
            for node in nodes:
                if isinstance(node, Reset):
                    t = temporaries[node.tensor]
                    if all(m.is_true for m in t.masks):
                        continue
                    inner = bound
                    for loop, whole in self.clearing_loops(t):
                        if not whole:
                            check(loop, inner)
                        inner = inner | {id(loop)}
                elif isinstance(node, Loop):
                    check(node, bound)
                    visit(node.children, bound | {id(node)})

        visit(self.tree.children, frozenset())
        return missing

    def describe(self) -> list[str]:
        """One line per sparse loop of the tree, in tree order: the loops
        around it, its mask, and the accesses that iterate it (or how it is
        visited when none can); see the class example.
        """
        lines: list[str] = []

        def visit(nodes, bound: frozenset, path: tuple) -> None:
            for node in nodes:
                if not isinstance(node, Loop):
                    continue
                here = path + (node.index,)
                if not node.mask.is_true:
                    way = self.iteration(node, bound)
                    if way is None:
                        how = "no exact driver"
                    elif way[0] == "dense":
                        how = "every coordinate (a superset: no access can iterate it)"
                    else:
                        join = " ∩ " if way[0] == "intersect" else " ∪ "
                        how = join.join(f"{d.ref.name}[{','.join(d.ref.indices)}] (S{d.op_id})" for d in way[1])
                    lines.append(f"{' › '.join(here)} ∈ {node.mask}: {how}")
                visit(node.children, bound | {id(node)}, here)

        visit(self.tree.children, frozenset(), ())
        return lines


def storage_of(inputs: Mapping) -> dict[str, tuple]:
    """``MaskDrivers``'s ``storage`` from operand infos or Tensors (anything
    with ``levels``/``mode_order``, or a ``format`` holding them)."""
    out = {}
    for name, info in inputs.items():
        fmt = getattr(info, "format", info)
        out[name] = (tuple(fmt.levels), tuple(fmt.mode_order))
    return out


def atom_bindings(ops, masks: Mapping[int, Mapping[str, Any]], atoms: Mapping[str, tuple]) -> dict:
    """For each op and each atom of its masks, the op's indices that the
    atom's modes correspond to (None when no chain of producers and
    consumers links the op to the statement reading the atom's tensor).

    SDDMM with its dense product written as a temporary ``T[p,q]``: ``B``'s
    modes are ``T``'s ``(p, q)``, through the statement reading both.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> infos = {"B": TensorInfo("B", 2, ("dense", "compressed"), (0, 1), (8, 9)),
    ...          "C": TensorInfo.dense("C", (8, 4)), "D": TensorInfo.dense("D", (4, 9))}
    >>> p = plan_program(parse_program("T[p,q] = C[p,k] * D[k,q]; A[i,j] = B[i,j] * T[i,j]"), infos)
    >>> atom_bindings(p.ops, p.masks, p.atoms)
    {(0, 'B_j'): ('p', 'q'), (1, 'B_j'): ('i', 'j')}
    """
    producers = {op.out: op for op in ops}
    consumers: dict[str, list] = {}
    for op in ops:
        for r in op.refs:
            consumers.setdefault(r.name, []).append((op, r))

    def search(op, atom: str, visited: set) -> tuple[str, ...] | None:
        # Depth-first through producers and consumers for the statement
        # reading the atom's tensor; each op is entered once per search (a
        # path-scoped search is exponential in long chains of temporaries,
        # as a differentiated program's adjoint has).
        statement, tensor, indices, _ = atoms[atom]
        if op.statement == statement and any(r.name == tensor and r.indices == indices for r in op.refs):
            return indices
        if op.out in visited:
            return None
        visited.add(op.out)
        for ref in op.refs:  # the pattern may come from an operand's producer
            producer = producers.get(ref.name)
            if producer is None or ref.name in visited:
                continue
            inner = search(producer, atom, visited)
            if inner is not None and all(ix in producer.out_indices for ix in inner):
                return tuple(ref.indices[producer.out_indices.index(ix)] for ix in inner)
        for consumer, ref in consumers.get(op.out, []):
            inner = search(consumer, atom, visited)
            if inner is None:
                continue
            mapped = []
            for ix in inner:
                if ix not in ref.indices:
                    break
                mapped.append(op.out_indices[ref.indices.index(ix)])
            else:
                return tuple(mapped)
        return None

    wanted = {(op.id, a) for op in ops for m in masks.get(op.id, {}).values() for a in m.atoms}
    by_id = {op.id: op for op in ops}
    return {(op_id, a): search(by_id[op_id], a, set()) for op_id, a in sorted(wanted)}
