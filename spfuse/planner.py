"""The planning pipeline: checked program → fused, memory-optimised index tree.

Every stage is a pure function from ``spfuse.passes``; this module only
strings them together for one fusion strategy:

* ``"auto"``  -- redundancy-aware (ReACT): propagate iteration spaces, trie-fuse
  common prefixes, reduce and sparsify temporaries;
* ``"max"``   -- TACO-style: every statement one loop nest (a reduction that
  does not distribute nested as a ``where`` workspace);
* ``"none"``  -- the library approach: one loop nest per unit operation
  (a sum split into binary adds), every temporary materialised whole.
"""
from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import Program
from spfuse.ir.masks import TRUE
from spfuse.ir.ops import TensorInfo
from spfuse.ir.tree import Loop, Root, iter_nodes
from spfuse.passes.build_trees import build_trees, op_extents
from spfuse.passes.common_subexpressions import eliminate_common_subexpressions
from spfuse.passes.decompose import decompose
from spfuse.passes.formats import FormatDecision, infer_formats
from spfuse.passes.fusion import trie_fuse
from spfuse.passes.iteration_space import IterationSpaces, propagate_iteration_spaces, statement_masks
from spfuse.passes.loop_order import OrderChoice, choose_order
from spfuse.passes.mask_drivers import MaskDrivers, atom_bindings
from spfuse.passes.max_fusion import maximal_statement_ops, where_fused
from spfuse.passes.memory import Temporary, full_temporaries, reduce_dimensions
from spfuse.passes.reassociate import CONCORDANT_MARGIN, TEMPLATE_MARGIN, Association, reassociate
from spfuse.passes.redundancy import RedundancyReport, analyse
from spfuse.passes.separate import separate_small_temporaries
from spfuse.passes.tiling import choose_tiles

__all__ = ["FUSION_STRATEGIES", "Plan", "plan_program", "bind_aliases"]

FUSION_STRATEGIES = ("auto", "max", "none")


@dataclass(frozen=True)
class Plan:
    """Everything planning decided for one program and one fusion strategy."""

    program: Program
    fusion: str
    inputs: Mapping[str, TensorInfo]
    ops: tuple
    spaces: IterationSpaces | None
    masks: Mapping[int, Mapping[str, object]]
    orders: Mapping[int, tuple[str, ...]]
    unfused: Root
    tree: Root
    temporaries: Mapping[str, Temporary]
    shapes: Mapping[str, tuple]
    results: tuple[str, ...]
    report: RedundancyReport
    planning_seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    atoms: Mapping[str, tuple] = field(default_factory=dict)  # mask atom → (statement, tensor, indices, mode)
    formats: Mapping[str, FormatDecision] = field(default_factory=dict)
    tiles: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    # True when the masks were propagated across operations (auto fusion):
    # the planner checked that each has an exact driver (passes.mask_drivers),
    # and lowering iterates each one exactly.
    propagated: bool = False
    # Cost decisions shown by explain() with their numbers (``notes`` says
    # why a plan is not the usual one).
    associations: tuple[Association, ...] = ()
    separated: tuple[int, ...] = ()   # ops split out of their fused group (passes.separate)
    decisions: tuple[str, ...] = ()
    order_choices: Mapping[int, OrderChoice] = field(default_factory=dict)  # costs behind ``orders``
    # (op id, mask atom) -> the op's indices of the atom's modes (passes.mask_drivers)
    atom_bindings: Mapping[tuple[int, str], tuple[str, ...] | None] = field(default_factory=dict)
    # operands read under a second name in another storage order (alias -> operand):
    # ``program`` reads the alias, the caller binds it to the operand's tensor
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def transpositions(self) -> dict[int, tuple]:
        """Per op, the operands its loop order visits out of storage order
        (``(name, storage mode order, visiting mode order)``): what the lowering converts."""
        return {i: c.transposed for i, c in self.order_choices.items() if c.transposed}

    @property
    def extents(self) -> dict[str, int | None]:
        return {n.index.upper(): n.extent for n in iter_nodes(self.tree) if isinstance(n, Loop)}


def _shapes(ops, inputs: Mapping[str, TensorInfo]) -> dict[str, tuple]:
    shapes = {n: tuple(i.shape) for n, i in inputs.items()}
    for op in ops:
        ext = op_extents(op, shapes)
        shapes[op.out] = tuple(ext[ix] for ix in op.out_indices)
    return shapes


def plan_program(program: Program, inputs: Mapping[str, TensorInfo], fusion: str = "auto",
                 propagate: bool = True) -> Plan:
    """Plan ``program`` (reductions explicit, names checked) over ``inputs``.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> B = TensorInfo("B", 2, ("dense", "compressed"), (0, 1), (8, 9))
    >>> infos = {"B": B, "C": TensorInfo.dense("C", (8, 4)), "D": TensorInfo.dense("D", (4, 9))}
    >>> p = plan_program(parse_program("A[i,j] = B[i,j] * (C[i,k] * D[k,j])"), infos)
    >>> p.report.cost_text
    'O(K·nnz(B))'
    """
    if fusion not in FUSION_STRATEGIES:
        raise KeyError(f"unknown fusion strategy {fusion!r}; valid: {', '.join(FUSION_STRATEGIES)}")
    if fusion == "auto" and propagate:
        tiny = _tiny_reductions(program, inputs)
        if tiny:
            try:
                plan = plan_program(program, inputs, "max")
            except UnsupportedError:
                plan = None
            # (only when every statement distributes: a ``where`` workspace
            # would be the temporary this path exists to avoid)
            if plan is not None and len(plan.ops) == len(program.statements):
                note = ("input-sensitive fusion (ReACT 4.3.3): every reduction is tiny ("
                        + ", ".join(f"{ix}: {n}" for ix, n in tiny.items())
                        + f" ≤ {TINY_REDUCTION}), so maximal fusion beats temporaries")
                return replace(plan, fusion="auto", notes=plan.notes + (note,))
    start = time.perf_counter()
    results = program.results
    associations: tuple[Association, ...] = ()
    if fusion == "max":
        ops = maximal_statement_ops(program)
        spaces = None
        masks, atoms = statement_masks(ops, inputs)
    else:
        # The library approach adds two operands per call, as scipy does;
        # auto keeps an n-term sum as one n-way union.
        ops = decompose(program, nary=fusion != "none")
        if fusion == "auto":
            # (the library approach computes what is written, repeats included)
            ops = eliminate_common_subexpressions(ops, {st.target.name for st in program.statements},
                                                  {n for n, info in inputs.items() if not info.is_sparse})
            # The library approach ("none") runs the text as written; auto
            # picks the cheapest association of every contraction chain.
            def margin() -> float:
                return TEMPLATE_MARGIN if _fused_template(program, inputs) else CONCORDANT_MARGIN
            ops, associations = reassociate(ops, inputs, results, _shapes(ops, inputs), margin)
        spaces = propagate_iteration_spaces(ops, inputs, results)
        # Without propagation every mask comes from the op's own operands and
        # is exact; the plan falls back to it when a propagated mask cannot be
        # iterated (no access of the masking tensor is concordant there).
        masks = spaces.final if fusion == "auto" and propagate else spaces.forward
        atoms = spaces.atoms
    shapes = _shapes(ops, inputs)
    forward = spaces.forward if spaces is not None else masks
    choices = {op.id: choose_order(op, inputs, masks[op.id], atoms, shapes, forward=forward[op.id]) for op in ops}
    masks, forward, choices = _dense_unless_innermost(ops, masks, forward, choices, inputs, atoms, shapes)
    orders = {i: c.order for i, c in choices.items()}
    unfused = build_trees(ops, orders, masks, shapes)
    temps = {op.out for op in ops} - set(results)
    separations: tuple[str, ...] = ()
    separated: tuple[int, ...] = ()
    if fusion == "auto":
        fused, separations, separated = separate_small_temporaries(trie_fuse(unfused), unfused, ops, masks,
                                                                   shapes, inputs)
        tree, temporaries = reduce_dimensions(fused, ops, temps, shapes)
    elif fusion == "max":
        # each statement one loop nest: its ``where`` workspaces fused into it
        # and shrunk to what the inner loops need, the statements apart
        tree = where_fused(unfused, ops)
        declared = {st.target.name for st in program.statements}
        workspaces = {op.out for op in ops if op.out in temps and op.out not in declared}
        tree, temporaries = reduce_dimensions(tree, ops, workspaces, shapes)
        temporaries.update(full_temporaries(ops, temps - workspaces, shapes))
    else:
        tree, temporaries = unfused, full_temporaries(ops, temps, shapes)
    extents = {n.index.upper(): n.extent for n in iter_nodes(tree) if isinstance(n, Loop)}
    final = spaces.final if spaces is not None else masks
    report = analyse(tree, ops, inputs, final, temporaries, extents, atoms)
    total_nnz = sum(i.nnz or 0 for i in inputs.values() if i.is_sparse)
    formats, tiles = infer_formats(tree, ops, results, shapes, total_nnz), choose_tiles(tree, ops)
    notes = () if propagate or fusion != "auto" else (
        "iteration-space propagation disabled: a propagated mask could not be iterated "
        "concordantly, so every operation iterates its own operands' patterns",)
    decisions = tuple(a.note for a in associations) + separations
    plan = Plan(program, fusion, dict(inputs), ops, spaces, masks, orders, unfused, tree,
                temporaries, shapes, results, report, time.perf_counter() - start, notes, atoms=atoms,
                formats=formats, tiles=tiles, associations=associations, decisions=decisions,
                separated=separated, order_choices=choices, propagated=fusion == "auto" and propagate,
                atom_bindings=atom_bindings(ops, masks, atoms))
    if fusion == "auto" and propagate and not _restoring.get():
        token = _restoring.set(True)
        try:
            plan = with_storage_orders(plan, lambda prog, infos: plan_program(prog, infos, fusion, propagate))
        finally:
            _restoring.reset(token)
    if plan.propagated:
        undriven = MaskDrivers.of(plan).undriven(plan.temporaries)
        if undriven:
            # Iterating a superset there would read a producer's elements that
            # propagation told it to skip (left 0, not their true value).
            fallback = plan_program(program, inputs, fusion, propagate=False)
            return replace(fallback, notes=(
                f"iteration-space propagation disabled: no access iterates the propagated mask "
                f"{undriven[0]} exactly, so every operation iterates its own operands' patterns",))
    return plan


#: set while planning the alternatives of :func:`with_storage_orders` (no recursion)
_restoring: contextvars.ContextVar = contextvars.ContextVar("spfuse_restoring", default=False)


def _dense_unless_innermost(ops, masks, forward, choices, inputs, atoms, shapes):
    """A max/min that iterates only its body's stored positions
    (:func:`~spfuse.passes.iteration_space.sparse_reduction`) needs its
    reduced loop innermost, where the lowering counts the visits and lets
    one implicit zero take part after the loop; with another loop inside,
    the reduced index is iterated densely instead (every zero visited)."""
    from spfuse.passes.iteration_space import sparse_reduction
    redo = [op for op in ops if sparse_reduction(op) and not masks[op.id][op.reduced[0]].is_true
            and choices[op.id].order[-1] != op.reduced[0]]
    if not redo:
        return masks, forward, choices
    masks, forward, choices = dict(masks), dict(forward), dict(choices)
    for op in redo:
        masks[op.id] = {**masks[op.id], op.reduced[0]: TRUE}
        forward[op.id] = {**forward[op.id], op.reduced[0]: TRUE}
        choices[op.id] = choose_order(op, inputs, masks[op.id], atoms, shapes, forward=forward[op.id])
    return masks, forward, choices


#: Plans estimated cheaper than this (ns) are kept without trying other
#: storage orders: re-planning would cost more than it can save.
RESTORE_MIN_NS = 20e6
#: A plan with an operand in the other storage order must win by this factor.
RESTORE_MARGIN = 2.0


def _estimated_ns(plan: Plan) -> float:
    return sum(c.best.total for c in plan.order_choices.values())


def with_storage_orders(plan: Plan, planner) -> Plan:
    """``plan``, or the plan with one 2-D sparse operand read in the other
    storage order (CSR as CSC, or back) when that is estimated cheaper by
    :data:`RESTORE_MARGIN`, the conversion included (the lowering converts
    the operand to the order its loops visit).

    An operand read more than once may also be converted for one of its
    reads only: that read gets a fresh name (an alias, bound by the caller to
    the same tensor) in the other order, so ``Aᵀ·A`` runs as Gustavson over
    columns of ``A`` and rows of ``A`` instead of scattering every product.

    Scorch transposes an operand only to break a cycle in the mode-order
    graph; an acyclic graph can still force an asymptotically worse order
    (``A[i,j]·B[k,j]``: a merge per (i, k) pair instead of Gustavson over
    Bᵀ, or ``Aᵀ·A`` scattered whole).  A program that a template kernel
    runs on its operands as stored (:func:`_fused_template`, or a
    whole-program kernel such as the row maxima of a CSC matrix, read as
    the column maxima of its arrays) is kept: the estimates price the
    generic executor, and converting would only add a pass (masked SpGEMM
    ran converted to a merge per stored mask entry).
    ``planner(program, infos)`` plans a program over operand infos."""
    from spfuse.lowering.groups import split_groups
    from spfuse.lowering.templates import whole_program_kernel
    from spfuse.passes.cost_model import active_constants, fmt_ns
    from spfuse.passes.rename import alias_access, operand_reads
    groups = split_groups(plan)
    for rule in (_gathered_rows, _masked_product_order):
        found = rule(plan, groups, planner)
        if found is not None:
            return found
    if _fused_template(plan.program, plan.inputs) or whole_program_kernel(plan) is not None \
            or _one_template_as_stored(plan, groups):
        return plan   # (the estimates price the generic executor; a template runs the operands as stored)
    reordered = _template_mode_order(plan, planner)
    if reordered is not None:
        return reordered
    base = _estimated_ns(plan)
    # operands some loop order already visits out of storage order (the lowering converts them)
    moved = {t[0] for ts in plan.transpositions.values() for t in ts}
    # a cheap plan tries only its converted operands, whole (one re-plan each:
    # a differentiated program re-planned per read of every operand took minutes)
    cheap = base < RESTORE_MIN_NS
    if cheap and not moved:
        return plan
    best, best_cost, why = plan, base, ""
    taken = set(plan.program.inputs) | set(plan.program.assigned)
    for name, info in plan.inputs.items():
        if not (info.is_sparse and info.ndim == 2 and info.levels == ("dense", "compressed")):
            continue
        if cheap and name not in moved:
            continue
        swapped = replace(info, mode_order=info.mode_order[::-1])
        tries = [(plan.program, {**plan.inputs, name: swapped}, {},
                  f"{name} is read as {swapped.format_name}")]
        reads = operand_reads(plan.program, name)
        if reads > 1 and not cheap:
            alias = next(f"{name}_{k}" for k in range(reads, 10 ** 6) if f"{name}_{k}" not in taken)
            for occurrence in range(reads):
                tries.append((alias_access(plan.program, name, occurrence, alias),
                              {**plan.inputs, alias: replace(swapped, name=alias)}, {alias: name},
                              f"read {occurrence + 1} of {name} is read as {swapped.format_name} "
                              f"(a copy named {alias})"))
        for program, infos, aliases, what in tries:
            try:
                alt = planner(program, infos)
            except UnsupportedError:
                continue
            cost = _estimated_ns(alt) + (info.nnz or 0) * active_constants().transpose_sparse
            # An operand converted anyway is planned for in its new order unless that
            # is notably dearer: the iteration masks then see the layout iterated
            # (A[i,j]·B[i,j] with B CSC: a merge over converted columns, not a search per entry).
            margin = 1 / RESTORE_MARGIN if name in moved and not aliases else RESTORE_MARGIN
            if cost * margin < best_cost:
                best, best_cost = replace(alt, aliases=aliases), cost
                why = (f"{what} (converted per call): estimated {fmt_ns(best_cost)} "
                       f"against {fmt_ns(base)} in its own storage order")
    if not why:
        return plan
    # best.inputs holds the order planned for: the call converts the operand to it
    return replace(best, decisions=best.decisions + (why,))


#: Template kernels that accumulate whole rows of a dense result at a sparse
#: operand's coordinates: each row read, added to and written back.
ROW_SCATTERING_KERNELS = frozenset({"spmm_t", "spmm_t_sum"})
#: Result rows shorter than this are scattered as stored: the write-back of
#: a short row costs about the conversion's gather per entry (100k rows,
#: 1M entries: K=8 lost 1.3x converted, K=32 won 1.4x).
GATHER_MIN_ROW = 32


def _gathered_rows(plan: Plan, groups: tuple, planner) -> Plan | None:
    """The plan with its 2-D sparse operands read in the other storage order,
    when as stored a template kernel would scatter rows of at least
    :data:`GATHER_MIN_ROW` elements into a dense result larger than the cache
    (:data:`~spfuse.passes.cost_model.CACHE_BYTES`) and read that way a
    kernel gathers rows instead; else None.

    A scattered row is read, added to and written back at a random place: at
    100k rows, 1M entries, K=64 (a 51 MB result) ``Aᵀ·X`` scattered took
    101 ms where SpMM over the converted operand took 56 ms, and the
    conversion costs one gather of the values per call once the pattern's
    transpose is remembered (:func:`~spfuse.lowering.transposes.stored_as`).
    Below the cache the scatter hits and saves the conversion (5000 rows,
    K=16: see :func:`_one_template_as_stored`), so the estimates, which
    price the generic executor, are not consulted either way."""
    import math

    from spfuse.lowering.groups import split_groups
    from spfuse.passes.cost_model import CACHE_BYTES
    if len(groups) != 1 or groups[0].kernel not in ROW_SCATTERING_KERNELS:
        return None
    shapes = [plan.shapes.get(name) for name in groups[0].outputs]
    if any(s is None or None in s or len(s) != 2 or s[1] < GATHER_MIN_ROW for s in shapes):
        return None
    swapped = {name: replace(info, mode_order=info.mode_order[::-1]) for name, info in plan.inputs.items()
               if info.is_sparse and info.ndim == 2 and info.levels == ("dense", "compressed")}
    # each further operand is one more conversion, and spmm_t_sum walks a
    # shared pattern once where the gathers walk it per operand (20k rows, K=64,
    # two operands: converting lost 15%; 40k rows gained 1.2-1.5x)
    if sum(8 * math.prod(s) for s in shapes) <= CACHE_BYTES * 4 ** (len(swapped) - 1):
        return None
    try:
        alt = planner(plan.program, {**plan.inputs, **swapped})
    except UnsupportedError:
        return None
    alt_groups = split_groups(alt)
    if len(alt_groups) != 1 or alt_groups[0].kernel in ROW_SCATTERING_KERNELS | {"generic"}:
        return None
    why = (f"{', '.join(sorted(swapped))} read as {', '.join(i.format_name for _, i in sorted(swapped.items()))} "
           f"(converted per call, the transposed pattern remembered): '{alt_groups[0].kernel}' gathers rows "
           f"where '{groups[0].kernel}' would scatter into a result larger than the cache")
    return replace(alt, decisions=alt.decisions + (why,))


#: Per stored entry reached, the dot-product masked SpGEMM (a gather over a
#: row of Bᵀ per stored mask entry) costs about this many times masked
#: Gustavson (a scan of a row of B per stored entry of A): 100k rows, 10 per
#: row in A, B and the mask -- the same count of entries either way -- ran
#: 74 ms by dot products against 36 ms by Gustavson on one thread (33 and
#: 21 ms on two).
DOT_ENTRY_COST = 2.0
#: ... and the other order must be estimated cheaper by this factor, its
#: conversion included (the estimates count entries, not their cache misses)
MASKED_ORDER_MARGIN = 1.25


def _masked_product_order(plan: Plan, groups: tuple, planner) -> Plan | None:
    """The plan of a masked SpGEMM ``M ∘ (A·B)`` with ``B`` read in the other
    storage order (converted per call, its reordering remembered), when the
    kernel that order selects is estimated cheaper by :data:`MASKED_ORDER_MARGIN`,
    the conversion's gather of B's values included; else None.

    Masked Gustavson (B as CSR) marks each mask row, then scans a row of B
    per stored entry of A in that row: ``nnz(M) + a·nnz(B)/rows(B)``
    entries, ``a`` the entries of A in rows whose mask row stores any (at
    most ``nnz(A)·nnz(M)/rows(M)``).  The dot-product kernel (B as CSC)
    scatters those rows of A, then gathers over a column of B per stored
    mask entry: ``a + nnz(M)·nnz(B)/cols(B)`` entries at
    :data:`DOT_ENTRY_COST` each.  A mask as dense as A favours Gustavson (B
    given as CSC ran 2x slower by dot products); a mask with long rows in
    few rows favours the dots."""
    if len(groups) != 1 or groups[0].kernel not in ("masked_spgemm", "masked_spgemm_dot") or groups[0].route is None:
        return None
    from spfuse.lowering.groups import split_groups, transposed_name
    route = groups[0].route
    dot = groups[0].kernel == "masked_spgemm_dot"
    m, a, b = route.names
    b = next((n for n in route.transposed if transposed_name(n) == b), b)   # (B.T: B read as the CSR of Bᵀ)
    if set(route.transposed) - {b} or route.merged:
        return None   # (M or A read transposed, or merged factors: kept as planned)
    infos = plan.inputs
    if len({m, a, b}) != 3 or any(n not in infos or infos[n].nnz is None or None in infos[n].shape
                                  for n in (m, a, b)):
        return None
    nm, na, nb = (int(infos[n].nnz or 0) for n in (m, a, b))
    rows_b, cols_b = (max(1, int(e or 0)) for e in infos[b].shape)
    # (both kernels skip the rows of A whose mask row is empty: at most nnz(M) rows have entries)
    reached = na * min(1.0, nm / max(1, int(infos[m].shape[0] or 0)))
    gustavson = nm + reached * nb / rows_b
    dots = DOT_ENTRY_COST * (reached + nm * nb / cols_b)
    now, other = (dots, gustavson) if dot else (gustavson, dots)
    if now <= (other + nb) * MASKED_ORDER_MARGIN:
        return None
    info = infos[b]
    try:
        alt = planner(plan.program, {**infos, b: replace(info, mode_order=info.mode_order[::-1])})
    except UnsupportedError:
        return None
    alt_groups = split_groups(alt)
    want = "masked_spgemm" if dot else "masked_spgemm_dot"
    if len(alt_groups) != 1 or alt_groups[0].kernel != want:
        return None
    why = (f"masked SpGEMM reads {b} as {'CSR' if dot else 'CSC'} (converted per call, its reordering "
           f"remembered): '{want}' ≈ {other:.3g} entries against '{groups[0].kernel}' ≈ {now:.3g}")
    return replace(alt, decisions=alt.decisions + (why,))


def _one_template_as_stored(plan: Plan, groups: tuple) -> bool:
    """Does one template group run the whole plan, reading every sparse
    operand as stored or through a free transpose (a CSC matrix's arrays
    are the CSR of its transpose)?  ``A·X`` of a CSC ``A`` is then
    ``spmm_t`` on A's own arrays, where converting A to CSR first cost a
    gather per call and SpMM after it (5000 rows, K=16: 0.68 ms against
    scipy's 0.34)."""
    from spfuse.lowering.groups import _free_transpose
    if len(groups) != 1 or groups[0].route is None or groups[0].kernel in ("generic", "copy", "gemm"):
        return False
    route = groups[0].route
    return not route.merged and bool(route.transposed) and all(
        n in plan.inputs and _free_transpose(plan.inputs[n]) for n in route.transposed)


def _template_mode_order(plan: Plan, planner) -> Plan | None:
    """The plan with one 3-d CSF operand read in another mode order, when
    that makes the program a template kernel's einsum; else None.

    ``grad_D[k,r] = sum(i, j, G[i,r] * C[j,r] * X[i,j,k])`` (MTTKRP's
    adjoint) contracts X onto its last stored mode, which no kernel does;
    with X read in mode order (k, i, j) it is an MTTKRP.  The template runs
    several times faster than the generic executor, and the conversion per
    call is one gather of the values once the pattern's reordering is
    remembered (:func:`~spfuse.lowering.transposes.stored_as`), so the
    estimates (which price the generic executor) are not consulted."""
    import itertools
    for name, info in plan.inputs.items():
        if not (info.is_sparse and info.ndim == 3 and info.levels == ("compressed",) * 3):
            continue
        for order in itertools.permutations(range(3)):
            if order == tuple(info.mode_order):
                continue
            infos = {**plan.inputs, name: replace(info, mode_order=order)}
            if not _fused_template(plan.program, infos):
                continue
            try:
                alt = planner(plan.program, infos)
            except UnsupportedError:
                continue
            from spfuse.lowering.templates import match_template
            if match_template(alt) is None:
                continue
            why = (f"{name} is read in mode order {order} (converted per call, its reordering "
                   f"remembered per pattern): a template kernel runs it")
            return replace(alt, decisions=alt.decisions + (why,))
    return None


def bind_aliases(plan: Plan, operands: Mapping[str, Any]) -> Mapping[str, Any]:
    """``operands`` plus each of ``plan``'s aliases bound to its operand.

    >>> from dataclasses import replace
    >>> from spfuse.frontend.parser import parse
    >>> from spfuse.ir.ops import TensorInfo
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (4, 4), nnz=6)
    >>> plan = plan_program(parse("C[j,k] = A[i,j] * A[i,k]"), {"A": A})
    >>> bind_aliases(replace(plan, aliases={"A_2": "A"}), {"A": "the tensor"})
    {'A': 'the tensor', 'A_2': 'the tensor'}
    """
    if not plan.aliases:
        return operands
    return {**operands, **{alias: operands[name] for alias, name in plan.aliases.items()}}


def _fused_template(program: Program, inputs: Mapping[str, TensorInfo]) -> bool:
    """Is the program one einsum that a fused template kernel implements?

    Those kernels (mttkrp, spttm_spttm, spmm_gemm, ...) run the concordant
    tree -- inner sparse levels contracted first -- an order of magnitude
    faster than the generic executor runs any tree, so reassociation keeps
    that tree over a cheaper-looking projected one (:data:`TEMPLATE_MARGIN`).
    """
    from spfuse.lowering.templates import SIGNATURES, _einsum, _unify
    ein = _einsum(program)
    if ein is None or not all(n in inputs for n, _ in ein[3]):
        return False
    return any(_unify(sig, ein[1], ein[2], ein[3], inputs) is not None for sig in SIGNATURES.values())


#: Reductions this short are cheaper fused into one loop nest than materialised.
TINY_REDUCTION = 2


def _tiny_reductions(program: Program, inputs: Mapping[str, TensorInfo]) -> dict[str, int]:
    """Extents of the reduced indices when all are known and ≤ TINY_REDUCTION, else {}."""
    ops = decompose(program)
    shapes = _shapes(ops, inputs)
    out = {}
    for op in ops:
        ext = op_extents(op, shapes)
        for ix in op.reduced:
            if ext[ix] is None or ext[ix] > TINY_REDUCTION:
                return {}
            out[ix] = ext[ix]
    return out


def try_plan(program: Program, inputs, fusion: str):
    """``plan_program`` or the :class:`UnsupportedError` it raised."""
    try:
        return plan_program(program, inputs, fusion)
    except UnsupportedError as e:
        return e
