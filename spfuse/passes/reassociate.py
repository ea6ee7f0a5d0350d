"""Cost-based reassociation of contraction chains (the sparse matrix-chain problem).

The three-address form follows the text: ``A[i,k]*X[k,h]*W[h,j]`` becomes
``T0 = A·X; Z = T0·W``.  Which association is cheaper depends on the data:
``(A·X)·W`` costs ``nnz·H + I·H·J`` and ``A·(X·W)`` costs ``K·H·J + nnz·J``.
This pass finds every *chain* -- unit operations of one statement that are
sum-contractions ``out = sum(r, a*b)`` linked through temporaries read once --
and picks the cheapest binary contraction tree over its factors by dynamic
programming over factor subsets (opt_einsum's ``optimal`` path, small ``n``).

Cost of contracting two parts = the product of the extents of every index
they carry, times each part's density (a sparse input's density is
``nnz / size``; a contraction's result is non-zero where any of its terms is,
assuming uniform independent non-zeros).  This gives the formulas above
whenever A has at least as many stored entries as rows (``A·X`` is then
estimated dense).  A pair that sums no index (an outer or Hadamard product)
is formed only with a sparse part: ``B[i,j]·C[i,k]`` is ``C``'s rows
sampled on ``B``'s pattern, ``nnz·K`` products that the next contraction
(``·D[j,k]`` summing ``k``: SDDMM) consumes as they are made.  Products of
dense parts would make temporaries bigger than any operand and are never
formed.  The chain walks through such products too, so ``G[i,l]·B[i,j]·
C[i,k]·D[j,k]`` (a gradient of SDDMM-SpMM) is re-formed as
``((B·C)·D)·G`` -- SDDMM then ``Sᵀ·G`` -- instead of the written order's
dense ``[l,j,k]`` temporary.  A contraction whose result is at once
multiplied by a sparse factor holding all its indices is computed on that
factor's pattern only (the planner's masks), and costed so.

The written order is kept when an ``nnz`` or extent is unknown (``compile()``
before seeing data), or when the best tree is not cheaper by
:data:`REASSOCIATE_MARGIN` -- cost estimates assume uniformly spread
non-zeros, so near-ties are not worth leaving the order the user wrote (and
the fused template that implements it).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from math import prod

from spfuse.ir.ops import Ref, TensorInfo, UnitOp

__all__ = ["Association", "reassociate", "REASSOCIATE_MARGIN", "CONCORDANT_MARGIN", "TEMPLATE_MARGIN",
           "chain_cost", "projected"]

#: Reassociate only when the written order costs this many times the best.
REASSOCIATE_MARGIN = 1.25
#: A tree without projected temporaries (see :func:`projected`) is preferred
#: over a cheaper tree that has them while it costs at most this many times
#: as many multiply-adds.  On the generic executor MTTKRP's concordant tree
#: (k first) ran as fast or faster on the 8 tensors where the estimate put the
#: trees within 1.25x or favoured k-first (1.0-27x faster), but slower beyond
#: (nations, estimate 1.26x: 0.78 vs 0.49 ms; 100x1000x10, 1.96x: 64 vs 7 ms),
#: so alone it only breaks near-ties.  The planner passes
#: :data:`TEMPLATE_MARGIN` instead when a fused template kernel implements the
#: statement (those kernels run the concordant tree).
CONCORDANT_MARGIN = REASSOCIATE_MARGIN
#: The concordant margin when a template kernel runs the concordant tree: the
#: mttkrp template ran 9.4x to 2400x faster than the generic executor's best
#: tree on all 11 tensors measured, including the three where the estimate
#: favoured the projected tree by 1.26-1.99x.
TEMPLATE_MARGIN = 8.0


@dataclass(frozen=True)
class Association:
    """The decision for one chain: both trees as text, their costs, and why."""

    statement: int
    factors: tuple[str, ...]
    written: str
    chosen: str
    written_cost: float | None
    chosen_cost: float | None
    reason: str
    tree: object = field(default=None, compare=False, repr=False)  # nested pairs of factor positions

    @property
    def changed(self) -> bool:
        return self.written != self.chosen

    @property
    def note(self) -> str:
        head = f"association of {'·'.join(self.factors)}: "
        if self.written_cost is None:
            return head + f"written order {self.written} kept ({self.reason})"
        costs = f"{self.written} = {self.written_cost:.4g}"
        if self.changed:
            costs += f" vs {self.chosen} = {self.chosen_cost:.4g}"
            return head + f"{self.chosen} chosen ({costs} multiply-adds; {self.reason})"
        return head + f"written order {self.written} kept ({costs} multiply-adds; {self.reason})"


def _is_contraction(op: UnitOp) -> bool:
    return (op.operator == "*" and op.reduction == "sum" and bool(op.reduced) and len(op.args) == 2
            and all(isinstance(a, Ref) for a in op.args))


def _is_product(op: UnitOp) -> bool:
    """A product of two operands that sums no index (Hadamard or outer)."""
    return (op.operator == "*" and op.reduction is None and not op.reduced and len(op.args) == 2
            and all(isinstance(a, Ref) for a in op.args))


class _Chain:
    """Factors and written tree of the chain rooted at one op."""

    def __init__(self, root: UnitOp, producers, internal):
        self.root = root
        self.factors: list[Ref] = []
        self.internal_ops: list[UnitOp] = []   # in the order they were emitted
        self.written = self._walk(root, producers, internal)
        #: whether the chain reaches through a product that sums nothing
        self.through_products = any(_is_product(p) for p in self.internal_ops)

    def _walk(self, op, producers, internal):
        parts = []
        for a in op.args:
            p = producers.get(a.name)
            if a.name in internal and p is not None and p.statement == self.root.statement \
                    and a.indices == p.out_indices:
                parts.append(self._walk(p, producers, internal))
                self.internal_ops.append(p)
            else:
                self.factors.append(a)
                parts.append(len(self.factors) - 1)
        return tuple(parts)


def _leaves(tree) -> frozenset:
    return frozenset({tree}) if isinstance(tree, int) else _leaves(tree[0]) | _leaves(tree[1])


def _text(tree, names) -> str:
    if isinstance(tree, int):
        return names[tree]
    left, right = (_text(t, names) for t in tree)
    return f"({left}·{right})"


def chain_cost(tree, factors, out_indices, extents, density, storage=None) -> float | None:
    """Multiply-adds of evaluating a binary contraction ``tree`` over ``factors``
    (``None`` when it forms a pair that sums no index).

    >>> from spfuse.ir.ops import Ref
    >>> f = [Ref("A", ("i", "k")), Ref("X", ("k", "h")), Ref("W", ("h", "j"))]
    >>> ext = {"i": 10, "k": 10, "h": 4, "j": 2}
    >>> chain_cost(((0, 1), 2), f, ("i", "j"), ext, [0.3, 1.0, 1.0])  # nnz·H + I·H·J
    200.0
    >>> chain_cost((0, (1, 2)), f, ("i", "j"), ext, [0.3, 1.0, 1.0])  # K·H·J + nnz·J
    140.0
    """
    keep = _keeper(factors, out_indices)
    cost = 0.0

    def walk(t, sample: float = 1.0):
        nonlocal cost
        if isinstance(t, int):
            return frozenset({t}), density[t]
        left, right = t
        # a contraction multiplied at once by a sparse factor holding all its
        # indices is computed on that factor's pattern (SDDMM's C·D under B)
        (sl, dl), (sr, dr) = (walk(left, _sampling(right, left, keep, factors, density)),
                              walk(right, _sampling(left, right, keep, factors, density)))
        step = _step(sl, sr, dl, dr, keep, factors, extents, density, storage)
        if step is None:
            raise _Invalid
        c, d = step
        cost += c * sample
        return sl | sr, d

    try:
        walk(tree)
    except _Invalid:
        return None
    return cost


class _Invalid(Exception):
    pass


def _blows_up(tree, factors, out_indices, extents, density) -> bool:
    """Does ``tree`` form a temporary with more (estimated) entries than
    every factor and the result?"""
    keep = _keeper(factors, out_indices)
    sizes = [prod(extents[ix] for ix in f.indices) * d for f, d in zip(factors, density, strict=True)]
    bound = max([*sizes, prod(extents[ix] for ix in out_indices)])
    found = False

    def walk(t):
        nonlocal found
        if isinstance(t, int):
            return frozenset({t}), density[t]
        (sl, dl), (sr, dr) = walk(t[0]), walk(t[1])
        step = _step(sl, sr, dl, dr, keep, factors, extents, density)
        d = 1.0 if step is None else step[1]
        if len(sl | sr) < len(factors) and prod(extents[ix] for ix in keep(sl | sr)) * d > bound:
            found = True
        return sl | sr, d

    walk(tree)
    return found


def _sampling(sampler, part, keep, factors, density) -> float:
    """The fraction of ``part``'s result computed when ``sampler`` (the other
    side of a product that sums nothing) is one sparse factor holding every
    index ``part`` keeps: its density; else 1."""
    if not isinstance(sampler, int) or isinstance(part, int) or density[sampler] >= 1.0:
        return 1.0
    members = _leaves(part)
    if keep(members | {sampler}) != keep(members) | keep(frozenset({sampler})):
        return 1.0  # the pair sums an index: a contraction, not a sampling
    return density[sampler] if set(keep(members)) <= set(factors[sampler].indices) else 1.0


def _keeper(factors, out_indices):
    def keep(members: frozenset) -> frozenset:
        inside = {ix for f in members for ix in factors[f].indices}
        outside = {ix for n, f in enumerate(factors) if n not in members for ix in f.indices}
        return frozenset(inside & (outside | set(out_indices)))
    return keep


def _step(sl, sr, dl, dr, keep, factors, extents, density, storage=None):
    """(cost, density of the result) of contracting parts ``sl`` and ``sr``."""
    carried = keep(sl) | keep(sr)
    kept = keep(sl | sr)
    summed = carried - kept
    if not summed and min(dl, dr) >= 1.0:
        return None   # a product of dense parts: a temporary bigger than any operand
    cost = prod(extents[ix] for ix in carried) * dl * dr
    if storage is not None and projected(sl | sr, kept, storage):
        return float(cost), 1.0
    # Uniform, independent non-zeros: an output entry is non-zero when any of
    # its ``prod(summed)`` terms is (A·X's rows: min(1, nnz/I)).  An index no
    # sparse factor carries spreads no pattern: summing it keeps the density
    # (B[i,j]·C[i,k] summed with D[j,k] over k stays on B's pattern).
    spread = prod(extents[ix] for ix in summed
                  if any(density[f] < 1.0 and ix in factors[f].indices for f in sl | sr))
    return float(cost), min(1.0, dl * dr * spread)


def projected(members, kept, storage) -> bool:
    """Is the pattern of a part's result a *projection* of a sparse factor --
    a kept index stored below an index summed away (X[i,j,k] summed over j
    keeps k under j)?  No level stores such a pattern: iteration spaces make
    it dense (:func:`spfuse.passes.iteration_space._projected`), so the
    temporary is a dense workspace, iterated whole by its consumer.

    ``storage[f]`` lists factor ``f``'s ``(index, compressed)`` per storage
    level, or is None for a dense factor.

    >>> st = [[("i", True), ("j", True), ("k", True)], None]
    >>> projected({0, 1}, {"i", "k"}, st), projected({0, 1}, {"i", "j"}, st)
    (True, False)
    """
    for f in members:
        levels = storage[f]
        if levels is None:
            continue
        gone = False
        for ix, compressed in levels:
            if ix not in kept:
                gone = True
            elif gone and compressed:
                return True
    return False


def _best_tree(factors, out_indices, extents, density, storage=None, concordant=False):
    """Cheapest binary tree over all factors (DP over subsets), or None.
    ``concordant``: only trees whose temporaries are not projections."""
    n = len(factors)
    keep = _keeper(factors, out_indices)
    best: dict[frozenset, tuple] = {frozenset({f}): (0.0, f, density[f]) for f in range(n)}
    subsets = sorted((frozenset(f for f in range(n) if m >> f & 1) for m in range(1, 1 << n)), key=len)
    for s in subsets:
        if len(s) < 2:
            continue
        low, rest = min(s), sorted(s - {min(s)})
        # every split into a part holding the lowest factor and a non-empty rest
        for m in range(0, (1 << len(rest)) - 1):
            left = frozenset({low} | {f for b, f in enumerate(rest) if m >> b & 1})
            right = s - left
            if left not in best or right not in best:
                continue
            (cl, tl, dl), (cr, tr, dr) = best[left], best[right]
            step = _step(left, right, dl, dr, keep, factors, extents, density, storage)
            if step is None:
                continue
            if concordant and len(s) < n and projected(s, keep(s), storage):
                continue
            total = cl + cr + step[0]
            if s not in best or total < best[s][0]:
                best[s] = (total, (tl, tr), step[1])
    full = frozenset(range(n))
    return best.get(full)


def _density(ref: Ref, inputs, dense_temps) -> float | None:
    info = inputs.get(ref.name)
    if info is None:
        return 1.0 if ref.name in dense_temps else None
    if not info.is_sparse:
        return 1.0
    if info.nnz is None or None in info.shape:
        return None
    size = prod(info.shape)
    return info.nnz / size if size else 0.0


def _dense_temporaries(ops, inputs: Mapping[str, TensorInfo]) -> set[str]:
    """Temporaries computed from dense inputs only (dense whatever the op)."""
    dense: set[str] = set()
    for op in ops:
        if all((r.name in inputs and not inputs[r.name].is_sparse) or r.name in dense for r in op.refs):
            dense.add(op.out)
    return dense


def _emit(tree, factors, keep, names, out: tuple[str, tuple] | None, template: UnitOp, emitted: list):
    """Unit ops for ``tree`` (post-order); returns the Ref of its value."""
    if isinstance(tree, int):
        return factors[tree]
    left = _emit(tree[0], factors, keep, names, None, template, emitted)
    right = _emit(tree[1], factors, keep, names, None, template, emitted)
    members = _leaves(tree)
    order = [ix for f in sorted(members) for ix in factors[f].indices]
    carried = list(dict.fromkeys(ix for ix in left.indices + right.indices))
    if out is None:
        kept = set(keep(members))
        out = (names.pop(0), tuple(dict.fromkeys(ix for ix in order if ix in kept)))
    summed = tuple(ix for ix in carried if ix not in out[1])
    emitted.append(UnitOp(0, out[0], out[1], "*", (left, right), "sum" if summed else None, summed,
                          template.statement, template.span))
    return Ref(*out)


def reassociate(ops, inputs: Mapping[str, TensorInfo], results, shapes: Mapping[str, tuple],
                concordant_margin: None | float | Callable[[], float] = None):
    """Re-form every contraction chain of ≥3 factors into its cheapest tree.

    A tree without projected temporaries is kept over a cheaper one with
    them while within ``concordant_margin`` (default :data:`CONCORDANT_MARGIN`;
    a callable is asked only when some chain has such a choice to make).
    Returns ``(ops, associations)``: the new unit operations (renumbered, in
    a valid execution order) and one :class:`Association` per chain.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.passes.decompose import decompose
    >>> from spfuse.ir.ops import TensorInfo
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (1000, 1000), nnz=5000)
    >>> ins = {"A": A, "X": TensorInfo.dense("X", (1000, 64)), "W": TensorInfo.dense("W", (64, 4))}
    >>> shapes = {n: i.shape for n, i in ins.items()}
    >>> new, (a,) = reassociate(decompose(parse_program("Z[i,j] = A[i,k]*X[k,h]*W[h,j]")), ins, ("Z",), shapes)
    >>> [str(op) for op in new]
    ['T0[k,j] = sum(h, X[k,h] * W[h,j])', 'Z[i,j] = sum(k, A[i,k] * T0[k,j])']
    >>> a.written, a.chosen, a.written_cost, a.chosen_cost
    ('((A·X)·W)', '(A·(X·W))', 576000.0, 276000.0)
    """
    uses: dict[str, int] = {}
    for op in ops:
        for r in op.refs:
            uses[r.name] = uses.get(r.name, 0) + 1
    producers = {op.out: op for op in ops}
    internal = {op.out for op in ops if (_is_contraction(op) or _is_product(op)) and op.out not in results
                and op.out not in inputs and uses.get(op.out, 0) == 1}
    # every op a chain walk reaches from some contraction (through contractions
    # and products read once): those are not the roots of chains of their own
    consumed_in_chain = set()
    for op in reversed(ops):
        if _is_contraction(op) and op.out not in consumed_in_chain:
            consumed_in_chain |= {p.out for p in _Chain(op, producers, internal).internal_ops}
    dense_temps = _dense_temporaries(ops, inputs)
    replaced: dict[int, list[UnitOp]] = {}   # root op id -> its new ops
    dropped: set[int] = set()
    decisions = []
    for op in ops:
        if not _is_contraction(op) or op.out in consumed_in_chain:
            continue
        chain = _Chain(op, producers, internal)
        if len(chain.factors) < 3:
            continue
        as_written = _text(chain.written, [f.name for f in chain.factors])
        reordered = _in_canonical_order(chain, inputs)
        factors = chain.factors
        labels = [f.name for f in factors]
        decision = _decide(chain, factors, labels, inputs, dense_temps, shapes,
                           CONCORDANT_MARGIN if concordant_margin is None else concordant_margin,
                           as_written if reordered else None)
        decisions.append(decision)
        if decision.changed or reordered:
            keep = _keeper(factors, op.out_indices)
            emitted: list[UnitOp] = []
            temp_names = [p.out for p in chain.internal_ops]
            _emit(decision.tree, factors, keep, temp_names, (op.out, op.out_indices), op, emitted)
            replaced[op.id] = emitted
            dropped |= {p.id for p in chain.internal_ops}
    if not replaced:
        return tuple(ops), tuple(decisions)
    out: list[UnitOp] = []
    for op in ops:
        if op.id in dropped:
            continue
        out.extend(replaced.get(op.id, [op]))
    return tuple(replace(op, id=n) for n, op in enumerate(out)), tuple(decisions)


def _in_canonical_order(chain: _Chain, inputs: Mapping[str, TensorInfo]) -> bool:
    """Take a chain written as a plain product ``f0·f1·f2·…`` (a left fold
    of contractions) in an order that does not depend on how the factors
    were written: the first sparse input, then at each step a factor sharing
    an index with those taken (a sparse one first, else the one sharing the
    inner stored level of a sparse matrix taken, else the first written).
    ``W[h,j]·X[k,h]·A[i,k]`` is then ``(A·X)·W``, as ``A[i,k]·X[k,h]·W[h,j]``
    is, so a near-tie keeps one tree for both spellings (and the temporary
    is ``A·X[i,h]``, in the rows' order, not ``(W·X)[j,k]``).  Parenthesised
    chains, chains through products that sum nothing and chains of dense
    factors keep the written order.  Returns whether the order changed."""
    factors, n = chain.factors, len(chain.factors)
    left_fold = chain.written
    for f in range(n - 1, 0, -1):   # ((0, 1), 2), ... the tree of the text without parentheses
        left_fold = left_fold[0] if isinstance(left_fold, tuple) and left_fold[1] == f else None
        if left_fold is None:
            return False
    sparse = {f for f in range(n) if (info := inputs.get(factors[f].name)) is not None and info.is_sparse}
    if left_fold != 0 or chain.through_products or not sparse:
        return False
    order = [min(sparse)]
    held = set(factors[order[0]].indices)
    levels: list[str] = []   # the indices of the sparse matrices taken, by storage level
    while True:
        taken = order[-1]
        if taken in sparse and len(factors[taken].indices) == 2:
            levels.extend(ix for ix, _ in _storage(factors[taken], inputs) or ())
        if len(order) == n:
            break
        rest = [f for f in range(n) if f not in order]
        near = [f for f in rest if held & set(factors[f].indices)] or rest
        # a sparse factor first; then the one summing a sparse matrix's inner
        # stored level (CSR A[i,j]: x[j] before x[i], the rows' own gather;
        # a tensor's factors stay in the written order, the MTTKRP kernels'
        # trees)
        pick = min(near, key=lambda f: (f not in sparse,
                                        -max((levels.index(ix) for ix in factors[f].indices if ix in levels),
                                             default=-1), f))
        order.append(pick)
        held |= set(factors[pick].indices)
    if order == list(range(n)):
        return False
    chain.factors = [factors[f] for f in order]
    tree: object = 0
    for f in range(1, n):
        tree = (tree, f)
    chain.written = tree
    return True


def _decide(chain, factors, labels, inputs, dense_temps, shapes, margin, as_written: str | None = None) -> Association:
    """``as_written``: the chain as the text has it, when
    :func:`_in_canonical_order` took its factors in another order (the
    association then reports it as written and takes the canonical order
    where it would keep the written one)."""
    root = chain.root
    canonical = _text(chain.written, labels)
    written = as_written or canonical
    unknown = [f.name for f in factors if _density(f, inputs, dense_temps) is None]
    if unknown:
        why = (f"nnz of {', '.join(dict.fromkeys(unknown))} unknown at planning time"
               if all(f in inputs for f in unknown) else "a factor is a sparse temporary")
        return _association(root, labels, written, canonical, None, None, why, chain.written)
    extents: dict[str, int | None] = {}
    for f in factors:
        for ix, n in zip(f.indices, shapes.get(f.name, (None,) * len(f.indices)), strict=True):
            extents[ix] = n if extents.get(ix) is None else extents[ix]
    if any(v is None for v in extents.values()):
        return _association(root, labels, written, canonical, None, None, "an extent is unknown",
                            chain.written)
    if any(f.indices.count(ix) > 1 for f in factors for ix in f.indices):
        return _association(root, labels, written, canonical, None, None, "a factor repeats an index",
                            chain.written)
    density = [_density(f, inputs, dense_temps) for f in factors]
    storage = [_storage(f, inputs) for f in factors]
    w_cost = chain_cost(chain.written, factors, root.out_indices, extents, density, storage)
    best = _best_tree(factors, root.out_indices, extents, density, storage)
    if w_cost is None or best is None:
        return _association(root, labels, written, canonical, None, None, "no cheaper valid tree",
                            chain.written)
    b_cost, b_tree, _ = best
    keep = _keeper(factors, root.out_indices)
    # A tree that sums a sparse factor's outer level before an inner one
    # (MTTKRP's j before k) holds a *projected* temporary: a dense workspace
    # per outer coordinate, iterated whole.  Contracting inner levels first
    # keeps a row per stored fiber instead (the tree the fused templates
    # implement); such a tree is preferred while within ``margin``.
    conc = best if not _has_projection(b_tree, keep, storage) else \
        _best_tree(factors, root.out_indices, extents, density, storage, concordant=True)
    written_projected = _has_projection(chain.written, keep, storage)
    note = ""
    if conc is not None and (written_projected or conc is not best):
        margin = margin() if callable(margin) else margin  # asked only when there is a choice
        if conc[0] <= b_cost * margin:
            if conc[0] > b_cost:
                note = (f"; {_text(b_tree, labels)} = {b_cost:.4g} is within the {margin:g}× margin"
                        + (" for a statement a fused template kernel runs" if margin == TEMPLATE_MARGIN else "")
                        + " but keeps a dense workspace over a summed sparse level")
            b_cost, b_tree = conc[0], conc[1]
            if written_projected and _text(b_tree, labels) != canonical:
                return _association(root, labels, written, _text(b_tree, labels), w_cost, b_cost,
                                    "the written order sums an outer sparse level first (a dense "
                                    "workspace per outer coordinate)" + note, b_tree)
    # A chain through a product that sums nothing was always kept as written
    # before such products could be re-formed: it changes now at the usual
    # margin only when the written order blows a temporary up (G·B·C·D's
    # dense [l,j,k]); else only when far cheaper -- the written order is
    # often a fused template's, which the estimate does not see.
    change_margin = REASSOCIATE_MARGIN
    if chain.through_products and not _blows_up(chain.written, factors, root.out_indices, extents, density):
        change_margin = TEMPLATE_MARGIN
    if b_cost * change_margin < w_cost:
        return _association(root, labels, written, _text(b_tree, labels), w_cost, b_cost,
                            (f"cheaper by {w_cost / b_cost:.2f}×" if b_cost else "cheaper") + note, b_tree)
    why = (("cheapest" if not note else "cheapest without a projected temporary")
           if _text(b_tree, labels) == canonical else
           f"best alternative {_text(b_tree, labels)} = {b_cost:.4g} is within the "
           f"{change_margin:g}× margin")
    if as_written is not None:
        why += f"; {canonical}: the factors taken sparse first, not in the order written"
    return _association(root, labels, written, canonical, w_cost, w_cost, why + note, chain.written)


def _storage(ref: Ref, inputs) -> list | None:
    """``(index, compressed)`` per storage level of a sparse input factor, else None."""
    info = inputs.get(ref.name)
    if info is None or not info.is_sparse:
        return None
    return [(ref.indices[m], lv == "compressed") for lv, m in zip(info.levels, info.mode_order, strict=True)]


def _has_projection(tree, keep, storage) -> bool:
    """Does any temporary of ``tree`` (not its root) hold a projected pattern?"""
    if isinstance(tree, int):
        return False

    def walk(t) -> bool:
        if isinstance(t, int):
            return False
        members = _leaves(t)
        return projected(members, keep(members), storage) or walk(t[0]) or walk(t[1])

    return walk(tree[0]) or walk(tree[1])


def _association(root, labels, written, chosen, w, c, why, tree) -> Association:
    return Association(root.statement, tuple(labels), written, chosen, w, c, why, tree)
