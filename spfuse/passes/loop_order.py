"""Loop order of each unit operation: Scorch's Algorithm 1 (seed 001) with a
calibrated cost model (:mod:`spfuse.passes.cost_model`).

1. **Mode-order graph** (Algorithm 1, lines 11–18): every input operand --
   sparse or dense, as Scorch's ``for all T`` -- asks for its storage order
   (an edge between consecutive stored modes), and so does every tensor of a
   mask (which cannot be transposed).  While the graph has a cycle, the
   operand on a cycle that is cheapest to transpose (``nnz ×`` the
   calibrated per-entry cost, or ``size ×`` the per-element cost of a dense
   copy) loses its edges: it will be transposed, and that cost counts.
2. **Order search**: among the orders that respect the remaining edges, pick
   the cheapest ``computation + workspace + transposition``.  A
   branch-and-bound over order prefixes keeps this cheap: the prefix cost is
   a lower bound of every completion, and a prefix that breaks a kept
   operand's storage order (sparse filters' constraints first) is cut at
   once.  The runner-up, for ``explain()``, is searched for on demand: the
   next admissible order, else the best one outside the graph.

Ties go to the order of first appearance in the operands, which reproduces
ReACT's trees (``i,k,j`` for ``T[i,j] = C[i,k]·D[k,j]``).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from spfuse.ir.masks import Mask
from spfuse.ir.ops import TensorInfo, UnitOp
from spfuse.passes.cost_model import CACHE_BYTES, CostConstants, OpModel, OrderCost, fmt_ns

__all__ = ["OrderChoice", "choose_order", "order_loops", "appearance_order", "break_cycles"]


def appearance_order(op: UnitOp) -> tuple[str, ...]:
    """Indices in order of first appearance: operands left to right, then output.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> appearance_order(UnitOp(0, "C", ("i", "k"), "*", (Ref("A", ("i", "j")), Ref("B", ("j", "k")))))
    ('i', 'j', 'k')
    """
    seen: dict[str, None] = {}
    for a in op.refs:
        seen.update(dict.fromkeys(a.indices))
    seen.update(dict.fromkeys(op.out_indices))
    return tuple(seen)


class OrderChoice:
    """The order chosen for one operation, with the numbers behind it.

    Planning only needs the order: when the mode-order graph leaves a single
    admissible order, the costs are computed on first access of ``best``;
    ``runner_up`` (for ``explain()``) always is."""

    __slots__ = ("_best", "_order", "cycle", "_model", "_keep", "_runner", "_make")

    def __init__(self, best: OrderCost | None, cycle: tuple[str, ...] = (), model: OpModel | None = None,
                 keep: tuple = (), order: tuple | None = None, make=None):
        self._best, self._order = best, order if best is None else best.order
        self.cycle = cycle  # why operands are copied in another order (cycles broken), one line each
        self._model, self._keep, self._runner, self._make = model, keep, None, make

    @property
    def best(self) -> OrderCost:
        if self._best is None:
            self._model = self._make()
            self._keep = tuple(o.label for o in self._model.sparse + self._model.dense)
            self._best = self._model.cost(self._order)
        return self._best

    @property
    def order(self) -> tuple[str, ...]:
        return self._order

    @property
    def transposed(self) -> tuple:
        """``(operand, storage mode order, visiting mode order)`` the lowering converts."""
        # an order forced by the graph visits every input as stored
        return () if self._best is None else self._best.transposed

    def _runner_up(self) -> tuple:
        if self._runner is None:
            best = self.best.order
            m = self._model
            found = _search(m, self._keep, hard=True, top=1, exclude=(best,)) if m is not None else []
            if found:
                self._runner = (m.cost(found[0][1]), True)
            else:  # a single admissible order: show what the best forbidden one would cost
                alt = _search(m, (), hard=False, top=1, exclude=(best,)) if m is not None else []
                self._runner = (m.cost(alt[0][1]) if alt else None, False)
        return self._runner

    @property
    def runner_up(self) -> OrderCost | None:
        """The cheapest other order (None when the op has one index)."""
        return self._runner_up()[0]

    @property
    def runner_up_admissible(self) -> bool:
        """False when the runner-up breaks a storage order that cycle breaking kept."""
        return self._runner_up()[1]

    def __repr__(self) -> str:
        return f"OrderChoice({self.order!r}, cycle={self.cycle!r})"


def _reaches(edges: Mapping[str, set], src: str, dst: str) -> bool:
    stack, seen = [src], {src}
    while stack:
        u = stack.pop()
        if u == dst:
            return True
        for v in edges.get(u, ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return False


def _forced_order(op: UnitOp, infos: Mapping[str, TensorInfo], masks: Mapping[str, Mask],
                  atoms: Mapping[str, tuple]) -> tuple[str, ...] | None:
    """The order, when the inputs' storage orders and the masks' prefixes
    admit exactly one (SpMM, SpGEMM, SpAdd): no cost to compare.

    A cheap pre-pass over the same edges as :func:`break_cycles`, so planning
    pays for the cost model only where there is a choice."""
    refs = op.refs
    order: list[str] = []
    for idx in [r.indices for r in refs] + [op.out_indices, op.indices]:
        order.extend(ix for ix in idx if ix not in order)
    preds: dict[str, set] = {ix: set() for ix in order}
    own = set()
    for r in refs:
        info = infos.get(r.name)
        if info is None or info.ndim != len(r.indices) or (info.ndim < 2 and not info.is_sparse):
            continue
        storage = [r.indices[m] for m in info.mode_order]
        for a, b in itertools.pairwise(storage):
            preds[b].add(a)
        own.add((r.name, tuple(r.indices)))
    for ix, mask in masks.items():
        if ix not in preds:
            continue
        for a in mask.atoms:
            ref = atoms.get(a)
            if ref is None:
                continue
            statement, tensor, indices, mode = ref
            info = infos.get(tensor)
            if (tensor, tuple(indices)) in own and statement == op.statement:
                continue
            if info is None or statement != op.statement or indices[mode] != ix:
                continue
            names = [indices[m] for m in info.mode_order[:info.level_of_mode(mode)]]
            if all(n in preds for n in names):
                preds[ix].update(names)
    out: list[str] = []
    while len(out) < len(order):
        ready = [ix for ix in order if ix not in out and preds[ix] <= set(out)]
        if len(ready) != 1:
            return None  # a choice to cost, or a cycle to break
        out.append(ready[0])
    return tuple(out)


def _acyclic(model: OpModel, operands) -> bool:
    """The storage orders of ``operands`` and the masks' prefixes admit an order."""
    bit = model.bit
    preds = dict(model.needs)
    for o in operands:
        for a, b in itertools.pairwise(o.storage):
            preds[b] = preds.get(b, 0) | bit[a]
    placed = 0
    while placed != model.full:
        ready = 0
        for ix, b in bit.items():
            if not placed & b and not preds.get(ix, 0) & ~placed:
                ready |= b
        if not ready:
            return False
        placed |= ready
    return True


def break_cycles(model: OpModel) -> tuple[frozenset, tuple[str, ...]]:
    """Sparse operands to transpose so the storage orders admit a loop order,
    cheapest first (Algorithm 1, lines 11–18), and a note per decision.

    >>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
    >>> csr = lambda n, nnz: TensorInfo(n, 2, ("dense", "compressed"), (0, 1), (50, 50), nnz=nnz)
    >>> op = UnitOp(0, "C", ("i", "j"), "*", (Ref("A", ("i", "j")), Ref("B", ("j", "i"))))
    >>> chosen, notes = break_cycles(OpModel(op, {"A": csr("A", 900), "B": csr("B", 40)}, {}))
    >>> sorted(chosen)
    ['B[j,i]']
    """
    kept = {o.label: o for o in model.sparse + model.dense}
    if _acyclic(model, kept.values()):
        return frozenset(), ()  # the common case, decided without building the graph
    pinned = [(p, b) for _, b, p in model.foreign_constraints]
    ix_of = {b: ix for ix, b in model.bit.items()}
    chosen: set[str] = set()
    notes: list[str] = []
    while True:
        edges: dict[str, set] = {}
        owner: dict[tuple, list] = {}
        for o in kept.values():
            for a, b in itertools.pairwise(o.storage):
                edges.setdefault(a, set()).add(b)
                owner.setdefault((a, b), []).append(o.label)
        for prefix, b in pinned:
            for pb, ix in ix_of.items():
                if prefix & pb:
                    edges.setdefault(ix, set()).add(ix_of[b])
        on_cycle = {lab for (a, b), labs in owner.items() if _reaches(edges, b, a) for lab in labs}
        if not on_cycle:
            if any(_reaches(edges, v, u) for u in edges for v in edges[u]):
                notes.append("propagated masks conflict in mode order: one will not be iterable "
                             "(the planner then plans without propagation: passes.mask_drivers)")
            return frozenset(chosen), tuple(notes)
        # Cheapest edge to remove: the transposition after which the best
        # admissible order costs least (transposition included); with more
        # cycles left, by transposition cost alone.
        def score(lab):
            rest = tuple(o for o in kept if o != lab)
            found = _search(model, rest, hard=True, top=1)
            return (found[0][0] if found else math.inf, model.transposition_cost(kept[lab]), lab)
        costs = sorted(score(lab) for lab in on_cycle)
        _, cost, lab = costs[0]
        others = ", ".join(f"{other} {fmt_ns(c)}" + (f" (best order then {fmt_ns(t)})" if t < math.inf else "")
                           for t, c, other in costs[1:])
        if costs[0][0] < math.inf:
            others_total = f"best order {fmt_ns(costs[0][0])}"
        else:
            others_total = ""
        o = kept[lab]
        size = f"nnz {o.nnz:.0f}" if o.sparse else f"{o.size:.0f} elements"
        notes.append(f"storage orders of {', '.join(sorted(on_cycle))} form a cycle: transpose {lab} "
                     f"({size}, {fmt_ns(cost)}" + (f"; {others_total}" if others_total else "") + ")"
                     + (f"; rather than {others}" if others else ""))
        chosen.add(lab)
        del kept[lab]


def _search(model: OpModel, keep, hard: bool, top: int = 2, exclude=()) -> list:
    """The ``top`` cheapest complete orders as ``(total, order)``, by branch and bound.

    With ``hard``, the sparse operands labelled in ``keep`` must be visited
    in storage order and propagated masks must stay iterable."""
    indices, bit, full = model.indices, model.bit, model.full
    forbid = sum(1 << k for k, o in enumerate(model.tracked) if hard and o.label in keep)
    best: list[tuple[float, tuple]] = []

    def rec(order, bound, n, comp, trans, flags, inner):
        if len(best) == top and comp + trans >= best[-1][0]:
            return  # every completion costs at least the prefix
        if bound == full:
            if order in exclude:
                return
            total = comp + trans + model.workspace(order, inner)
            if len(best) < top or total < best[-1][0] * (1 - 1e-12):
                k = len(best)
                while k and total < best[k - 1][0] * (1 - 1e-12):
                    k -= 1  # ties keep the earlier (appearance-first) order
                best.insert(k, (total, order))
                del best[top:]
            return
        for ix in indices:
            if bound & bit[ix] or (hard and not model.feasible_step(bound, ix)):
                continue
            ext = model.extend(bound, n, flags, ix, forbid)
            if ext is None:
                continue
            dc, dt, n2, f2, steps = ext
            rec(order + (ix,), bound | bit[ix], n2, comp + dc, trans + dt, f2, steps)

    rec((), 0, 1.0, 0.0, 0.0, 0, 1.0)
    return best


def choose_order(op: UnitOp, infos: Mapping[str, TensorInfo], masks: Mapping[str, Mask],
                 atoms: Mapping[str, tuple] = {}, shapes: Mapping[str, tuple] | None = None,
                 constants: CostConstants | None = None,
                 forward: Mapping[str, Mask] | None = None) -> OrderChoice:
    """The cheapest loop order of ``op`` and the runner-up (see module docstring).

    ``forward`` are the op's masks before consumers' demand was propagated
    (default ``masks``): only their patterns make an output dimension
    compressed (a workspace under a reduction).

    >>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
    >>> from spfuse.ir.masks import TRUE, atom
    >>> csr = lambda n: TensorInfo(n, 2, ("dense", "compressed"), (0, 1), (100, 100), nnz=500)
    >>> spgemm = UnitOp(0, "C", ("i", "k"), "*", (Ref("A", ("i", "j")), Ref("B", ("j", "k"))), "sum", ("j",))
    >>> atoms = {"A_j": (0, "A", ("i", "j"), 1), "B_k": (0, "B", ("j", "k"), 1)}
    >>> c = choose_order(spgemm, {"A": csr("A"), "B": csr("B")}, {"i": TRUE, "j": atom("A_j"), "k": atom("B_k")}, atoms)
    >>> c.order, c.best.total < c.runner_up.total
    (('i', 'j', 'k'), True)
    """
    def make() -> OpModel:
        return OpModel(op, infos, masks, atoms, shapes, constants, forward)

    forced = _forced_order(op, infos, masks, atoms)
    if forced is not None and not _large_dense(op, infos):
        return OrderChoice(None, order=forced, make=make)
    model = make()
    transpose, notes = break_cycles(model)
    keep = tuple(o.label for o in model.sparse + model.dense if o.label not in transpose)
    found = _search(model, keep, hard=True, top=1)
    if not found:  # propagated masks admit no order: relax (then no exact driver: planned unpropagated)
        found = _search(model, keep, hard=False, top=1)
    elif _large_dense(op, infos) and any(o.label in keep for o in model.dense):
        # A dense operand copied in the other mode order, when the order it
        # permits is much cheaper than every order its storage admits (SDDMM
        # over D[k,j]: i, j, k over a copy Dᵀ streams rows instead of
        # gathering one element of a 51 MB array per stored entry).
        loose = tuple(lab for lab in keep if lab not in {o.label for o in model.dense})
        alt = _search(model, loose, hard=True, top=1)
        if alt and alt[0][0] * DENSE_COPY_MARGIN < found[0][0]:
            chosen = model.cost(alt[0][1])
            copies = ", ".join(f"{name}{list(frm)}→{list(to)}" for name, frm, to in chosen.transposed)
            notes = notes + (f"dense operand copied in another mode order ({copies}): {fmt_ns(alt[0][0])} "
                             f"against {fmt_ns(found[0][0])} for {', '.join(found[0][1])} in storage order",)
            return OrderChoice(chosen, notes, model, loose)
    return OrderChoice(model.cost(found[0][1]), notes, model, keep)


#: A dense operand is copied in another mode order only when that wins by this factor.
DENSE_COPY_MARGIN = 1.5


def _large_dense(op: UnitOp, infos: Mapping[str, TensorInfo]) -> bool:
    """Whether ``op`` reads a dense matrix (or higher) too large for the cache,
    whose storage order may then be worth a copy (the forced order is costed)."""
    for r in op.refs:
        info = infos.get(r.name)
        if (info is not None and not info.is_sparse and info.ndim >= 2 and info.ndim == len(r.indices)
                and info.shape is not None and all(s is not None for s in info.shape)
                and 8 * math.prod(info.shape) > CACHE_BYTES):
            return True
    return False


def order_loops(op: UnitOp, infos: Mapping[str, TensorInfo], masks: Mapping[str, Mask],
                atoms: Mapping[str, tuple] = {}, shapes: Mapping[str, tuple] | None = None) -> tuple[str, ...]:
    """Cheapest loop order for ``op`` (:func:`choose_order` without the numbers).

    >>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
    >>> from spfuse.ir.masks import TRUE, atom
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (5, 6))
    >>> spmm = UnitOp(0, "C", ("i", "k"), "*", (Ref("A", ("i", "j")), Ref("B", ("j", "k"))), "sum", ("j",))
    >>> order_loops(spmm, {"A": A}, {"i": TRUE, "j": atom("A_j"), "k": TRUE}, {"A_j": (0, "A", ("i", "j"), 1)})
    ('i', 'j', 'k')
    """
    return choose_order(op, infos, masks, atoms, shapes).order
