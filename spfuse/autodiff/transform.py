"""Reverse mode by program transformation: forward program → adjoint program.

For a statement ``T[o] = e`` and an access ``X[a]`` inside ``e``, the
adjoint contribution is the cotangent ``dT[o]`` times the chain of local
derivative factors (:mod:`spfuse.autodiff.rules`) from ``e``'s root down to
``X[a]``, summed over every index in scope there that is not in ``a``.  A
sum reduction on the way only widens the scope (its adjoint broadcasts);
``max``/``min`` multiply by the tie indicator over the tie count.  The
result is again index notation, so the planner fuses and schedules it like
any program.  For SDDMM::

    A[i,j] = B[i,j] * (C[i,k] * D[k,j])
    dC[i,k] = sum(j, dA[i,j] * B[i,j] * D[k,j])        # an SpMM on B's pattern

Choices made visible by :meth:`Adjoint.describe`:

* **Within a statement**, sub-expression values a factor needs are
  recomputed inside the adjoint program; sub-reductions among them are
  hoisted into statements of their own (``A_r[...] = sum(k, ...)``), so each
  is computed once and its bound indices never clash with the scope.
* **Across statements**, a forward temporary read by the adjoint is *kept*
  (saved by the forward run and passed in) when its statement reduces --
  recomputing would repeat a contraction -- or when it is stored on a
  sparse input's pattern (``E[i,j] = A[i,j] * exp(...)``: as many values as
  ``A``, where recomputing walks the operands' patterns again), and
  *recomputed* inside the adjoint program when it is otherwise element-wise,
  where the planner fuses it.
  ``temporaries="keep"|"recompute"`` forces either.
* A **sparse operand**'s gradient is restricted to its stored pattern by a
  pattern operand (ones on the pattern), so only stored entries are computed.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from spfuse.autodiff.rules import ONE, ZERO, apply_factor, binary_factors, unary_factors, where_factors
from spfuse.errors import ProgramError, UnsupportedError
from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Literal, Program, Reduce, Unary, Where, iter_accesses
from spfuse.frontend.canonical import to_text
from spfuse.frontend.parser import parse_program
from spfuse.frontend.reductions import (
    bound_indices,
    children,
    free_indices,
    leading_sums,
    make_reductions_explicit,
    map_children,
)
from spfuse.passes.rename import all_indices

__all__ = ["Adjoint", "adjoint", "TEMPORARY_POLICIES"]

TEMPORARY_POLICIES = ("auto", "keep", "recompute")


@dataclass(frozen=True)
class Adjoint:
    """An adjoint program and what its operands mean.

    ``program`` reads the forward inputs it needs, one cotangent operand per
    differentiated result (``cotangents``), a ones-on-the-pattern operand per
    sparse ``wrt`` operand (``patterns``), ones vectors spanning a statement
    index (``ones``: name → (forward statement number, index name)) and the
    kept forward temporaries (``kept``, under their own names).  It returns
    one gradient per name in ``gradients`` (``wrt`` name → result name); a
    ``wrt`` operand missing there gets a zero gradient.
    """

    forward: Program
    wrt: tuple[str, ...]
    program: Program | None
    gradients: Mapping[str, str]
    cotangents: Mapping[str, str]
    patterns: Mapping[str, str]
    ones: Mapping[str, tuple[int, str]]
    kept: tuple[str, ...] = ()
    recomputed: tuple[str, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    saved: Mapping[str, str] = field(default_factory=dict)   # kept temporary -> name it is saved under
    transposed: Mapping[str, str] = field(default_factory=dict)  # sparse input -> operand holding its transpose
    #: how each gradient's contractions were written: multiplied out (their
    #: order the planner's) or shared between gradients
    contractions: tuple[str, ...] = ()
    #: the same gradients with parts of the multiplied-out chains computed
    #: once and shared (fewer multiply-adds, one statement more): which of
    #: the two runs faster is measured by the first backward pass
    #: (:func:`~spfuse.autodiff.run.run_adjoint`), as the cost model does not
    #: price a statement's fixed cost; it reads the same operands
    alternative: Adjoint | None = None

    @property
    def read_transposed(self) -> frozenset[str]:
        """The sparse inputs this adjoint or its alternative reads transposed.

        >>> sorted(adjoint("Y[i,k] = A[i,j] * X[j,k]", wrt=("X",), sparse=frozenset("A")).read_transposed)
        ['A']
        """
        both = (self,) if self.alternative is None else (self, self.alternative)
        return frozenset(n for v in both for n in v.transposed)

    @property
    def text(self) -> str:
        """The adjoint program in index notation ('' when no gradient flows)."""
        return self.program.text if self.program is not None else ""

    def saving_program(self, with_results: bool = True) -> Program | None:
        """The forward program extended to also return the kept temporaries
        (``T_saved[o] = T[o]``); with ``with_results=False`` only the statements
        the kept temporaries need.  ``None`` when nothing is kept."""
        if not self.kept:
            return None
        statements = list(self.forward.statements)
        if not with_results:
            statements = _needed_statements(statements, set(self.kept))
        by_name = {s.target.name: s for s in self.forward.statements}
        for name in self.kept:
            target = by_name[name].target
            statements.append(Assignment(Access(self.saved[name], target.indices),
                                         Access(name, target.indices)))
        return parse_program(to_text(Program(tuple(statements))))

    def describe(self) -> str:
        """What was derived, and the keep/recompute choice for each forward temporary.

        >>> print(adjoint("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", wrt=("C",)).describe())
        adjoint of  A[i,j] = B[i,j] * (C[i,k] * D[k,j])
        with respect to  C
        cotangents  grad_A (of A)
        program:
          grad_C[i, k] = sum(j, grad_A[i, j] * B[i, j] * D[k, j])
        """
        lines = [f"adjoint of  {self.forward.text or to_text(self.forward)}",
                 f"with respect to  {', '.join(self.wrt)}"]
        if self.patterns:
            lines.append("gradient on the stored pattern of  " + ", ".join(
                f"{n} (via {p})" for n, p in self.patterns.items()))
        lines.append("cotangents  " + (", ".join(f"{c} (of {r})" for r, c in self.cotangents.items())
                                       or "none"))
        for name, t in self.transposed.items():
            lines.append(f"transposed  {name} (read as {t}, the CSR of its transpose: its rows are summed)")
        for name in (*self.kept, *self.recomputed):
            lines.append(f"temporary {name}: {self.reasons[name]}")
        lines.extend(self.contractions)
        zero = [n for n in self.wrt if n not in self.gradients]
        if zero:
            lines.append("zero gradient (no path from a cotangent)  " + ", ".join(zero))
        if self.program is not None:
            lines.append("program:")
            lines.extend("  " + line for line in self.text.splitlines())
        if self.alternative is not None:
            lines.append("alternative (measured against the program above on the first backward pass):")
            lines.extend("  " + line for line in self.alternative.contractions if line.startswith("shared"))
            lines.extend("  " + line for line in self.alternative.text.splitlines())
        return "\n".join(lines)


class _Names:
    """Fresh tensor and index names that clash with nothing already used."""

    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name


def _rename(e: Expr, mapping: Mapping[str, str]) -> Expr:
    """``e`` with index names (free and bound) replaced through ``mapping``."""
    if isinstance(e, Access):
        return Access(e.name, tuple(mapping.get(k, k) for k in e.indices))
    if isinstance(e, Literal):
        return e
    if isinstance(e, Binary):
        return Binary(e.op, _rename(e.left, mapping), _rename(e.right, mapping))
    if isinstance(e, Unary):
        return Unary(e.fn, _rename(e.arg, mapping))
    if isinstance(e, Where):
        return Where(_rename(e.cond, mapping), _rename(e.then, mapping), _rename(e.other, mapping))
    return Reduce(e.op, mapping.get(e.index, e.index), _rename(e.body, mapping))


def _common_factors(a: list, b: list) -> list[Expr]:
    """The factors of chain ``a`` also in chain ``b`` (a multiset intersection, in ``a``'s order)."""
    left = [f for _, f in b]
    out = []
    for _, f in a:
        if f in left:
            left.remove(f)
            out.append(f)
    return out


@dataclass
class _ProductChain:
    """A contribution whose chain is all products, its product factors split
    into their terms (``(B*C)`` shares ``B``); written back to the
    contribution only when a shared part is taken out."""

    chain: list
    indices: tuple[str, ...]
    negate: bool
    source_contribution: _Contribution


def _product_chains(contributions, planner_ordered: bool = False) -> list[_ProductChain]:
    """The contributions whose chains are all products (``planner_ordered``:
    also those with a forward partial product multiplied out)."""
    out = []
    for c in contributions:
        if all(op == "*" for op, _ in c.chain) and (planner_ordered or not c.planner_ordered):
            chain = [("*", t) for _, f in c.chain for t in _product_terms(f)]
            if len(chain) > 2:
                out.append(_ProductChain(chain, c.indices, c.negate, c))
    return out


def _largest_shared(plain: list[_ProductChain], parts, judge) -> tuple | None:
    """Over every pair of chains, the largest factor list ``parts(common)``
    proposes (in order, the first accepted per pair) that ``judge(part,
    members)`` accepts, with the chains holding it: ``(part, members,
    verdict)``, or None."""
    best = None
    for n, a in enumerate(plain):
        for b in plain[n + 1:]:
            for part in parts(_common_factors(a.chain, b.chain)):
                members = [c for c in plain if _remove_factors(c.chain, part) is not None]
                found = judge(part, members)
                if found is not None:
                    if best is None or len(part) > len(best[0]):
                        best = (part, members, found)
                    break
    return best


def _kept_indices(common: list[Expr], members: list[_ProductChain]) -> tuple[set[str], set[str]] | None:
    """``(inside, kept)``: the indices of the shared factors ``common``, and
    those of them the members use outside it (their own indices or their
    other factors'); None when a member would have nothing left."""
    inside = set().union(*(_all_indices(f) for f in common))
    needed: set[str] = set()
    for c in members:
        remaining = _remove_factors(c.chain, common)
        if not remaining:
            return None
        needed |= set(c.indices).union(*(_all_indices(f) for _, f in remaining))
    return inside, inside & needed


def _take_out(shared: Access, common: list[Expr], members: list[_ProductChain]) -> None:
    """Each member's contribution reads ``shared`` instead of the factors ``common``."""
    for c in members:
        remaining = _remove_factors(c.chain, common)
        assert remaining is not None
        c.source_contribution.chain = [("*", shared)] + remaining


def _remove_factors(chain: list, factors: list[Expr]) -> list | None:
    """``chain`` without one occurrence of each of ``factors``; None when one is missing."""
    rest = list(chain)
    for f in factors:
        at = next((n for n, (_, g) in enumerate(rest) if g == f), None)
        if at is None:
            return None
        del rest[at]
    return rest


def _all_indices(e: Expr) -> set[str]:
    """Every index name in ``e``: used by an access or bound by a reduction."""
    return all_indices(e) | bound_indices(e)


def _unique_bound(value: Expr, outputs: tuple[str, ...]) -> tuple[Expr, dict[str, str]]:
    """Rename reduction indices so that no two reductions (nor an output) share
    a name; also return each new name's original."""
    used = set(outputs)
    origin: dict[str, str] = {}
    names = _Names(_all_indices(value) | used)

    def walk(e: Expr) -> Expr:
        if isinstance(e, Reduce):
            body = e.body
            index = e.index
            if index in used:
                index = names.fresh(e.index)
                # (an index renamed by an enclosing reduction's rename is renamed
                # again here: its original is the first name)
                origin[index] = origin.get(e.index, e.index)
                body = _rename(body, {e.index: index})
            used.add(index)
            return Reduce(e.op, index, walk(body))
        return map_children(e, walk)

    return walk(value), origin


def _canonical(e: Expr) -> Expr:
    """``e`` with its indices renamed in order of appearance (free ones and
    reduction ones apart), so two expressions that differ only in index
    names compare equal: a dict key for deduplicating hoisted statements,
    never printed.  Free indices are renamed in :func:`free_indices` order,
    so a hit is read back as ``Access(name, free_indices(e))``."""
    free = {k: f"\1{n}" for n, k in enumerate(free_indices(e))}
    count = [0]

    def walk(x: Expr, mapping: Mapping[str, str]) -> Expr:
        if isinstance(x, Access):
            return Access(x.name, tuple(mapping.get(k, k) for k in x.indices))
        if isinstance(x, Reduce):
            bound = f"\0{count[0]}"
            count[0] += 1
            return Reduce(x.op, bound, walk(x.body, {**mapping, x.index: bound}))
        return map_children(x, lambda c: walk(c, mapping))

    return walk(e, free)


def _sparse_factor(e: Expr, sparse: frozenset, wanted, through_reductions: bool = False) -> Access | None:
    """A sparse input access ``A`` with ``wanted(A)`` that ``e`` is a product
    with (through ``*``, the left of ``/`` and, with ``through_reductions``,
    reduction bodies): ``e`` is then 0 wherever ``A`` stores nothing."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Binary) and x.op == "*":
            stack.extend((x.left, x.right))
        elif isinstance(x, Binary) and x.op == "/":
            stack.append(x.left)
        elif isinstance(x, Reduce) and through_reductions:
            stack.append(x.body)
        elif isinstance(x, Access) and x.name in sparse and wanted(x):
            return x
    return None


def _pattern_mask(e: Expr, index: str, sparse: frozenset) -> Expr | None:
    """``A[o] / A[o]`` when ``e`` is a product with a sparse input ``A[o]``
    that reads ``index`` (see :func:`_sparse_factor`)."""
    found = _sparse_factor(e, sparse, lambda a: index in a.indices)
    return Binary("/", found, found) if found is not None else None


def _product_terms(e: Expr) -> list[Expr]:
    """The terms of a product ``a * b * c`` (``[e]`` for anything else)."""
    if isinstance(e, Binary) and e.op == "*":
        return _product_terms(e.left) + _product_terms(e.right)
    return [e]


def _product(terms: list[Expr]) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = Binary("*", out, t)
    return out


def _summed_within(e: Expr, inner: str, outer: str) -> bool:
    """Is a sum over ``inner`` nested inside the sum over ``outer`` in ``e``?

    >>> from spfuse.frontend.parser import parse_expression
    >>> e = parse_expression("sum(j, sum(i, G[i,h] * A[i,j]) * X[j,f])")
    >>> _summed_within(e, "i", "j"), _summed_within(e, "j", "i")
    (True, False)
    """
    if isinstance(e, Reduce) and e.index == outer:
        return any(isinstance(x, Reduce) and x.index == inner for x in _subexpressions(e.body))
    return any(_summed_within(c, inner, outer) for c in children(e))


def _has_reduce(e: Expr) -> bool:
    return isinstance(e, Reduce) or any(_has_reduce(c) for c in children(e))


def _needed_statements(statements, wanted: set[str]) -> list[Assignment]:
    """The statements computing ``wanted`` (and what they read), in order."""
    keep = []
    for s in reversed(statements):
        if s.target.name in wanted:
            keep.append(s)
            wanted |= {a.name for a in iter_accesses(s.value)}
    return keep[::-1]


def sum_terms(e: Expr, negate: bool = False) -> list[tuple[bool, Expr]]:
    """``e``'s top-level ``+``/``-`` terms as ``(negated, term)``.

    >>> from spfuse.frontend.parser import parse_expression
    >>> [(n, to_text(t)) for n, t in sum_terms(parse_expression("a[i] - (b[i] - c[i])"))]
    [(False, 'a[i]'), (True, 'b[i]'), (False, 'c[i]')]
    """
    if isinstance(e, Binary) and e.op in ("+", "-"):
        return sum_terms(e.left, negate) + sum_terms(e.right, negate ^ (e.op == "-"))
    return [(negate, e)]


def _node_count(e: Expr) -> int:
    return 1 + sum(_node_count(c) for c in children(e))


def _reading(e: Expr, found: Mapping[Expr, tuple[str, tuple[int, ...]]]) -> Expr:
    """``e`` with every sub-expression equal (up to index names) to one in
    ``found`` replaced by a read of the statement computing it: ``found``
    maps it to that statement's target and the target's modes as positions
    in the sub-expression's free indices (in the order they appear)."""
    if not isinstance(e, (Access, Literal)):
        hit = found.get(_canonical(e))
        if hit is not None:
            name, modes = hit
            free = tuple(free_indices(e))
            return Access(name, tuple(free[m] for m in modes))
    return map_children(e, lambda c: _reading(c, found))


def split_reducing_terms(statement: Assignment, taken: set[str]) -> list[Assignment]:
    """A statement adding up two or more terms of which some reduce, as one
    statement per reducing term (``{target}_term{k}``, a name not in
    ``taken``, which is updated) and one adding them up; other statements
    are returned as they are.

    Each term is then planned alone and can reach its template kernel (a
    gradient summing an SpMM-shaped and a GEMM-shaped contribution), where
    the whole sum would run on the generic executor.  A term that another
    contains is computed first and read there: the pattern max
    ``max(j, S - min(j, S)) + min(j, S)`` computes its min once.

    >>> st = parse_program("m[i] = max(j, S[i,j] - min(k, S[i,k])) + min(k, S[i,k])").statements[0]
    >>> for s in split_reducing_terms(st, {"m", "S"}):
    ...     print(to_text(s))
    m_term1[i] = min(k, S[i, k])
    m_term0[i] = max(j, S[i, j] - m_term1[i])
    m[i] = m_term0[i] + m_term1[i]
    """
    terms = sum_terms(statement.value)
    if len(terms) < 2 or not any(_has_reduce(t) for _, t in terms):
        return [statement]
    names: dict[int, str] = {}
    for k, (_, term) in enumerate(terms):
        if _has_reduce(term):
            name = f"{statement.target.name}_term{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            names[k] = name
    # every term laid out as the first (its free indices in that order): the
    # sum then adds arrays of one layout (GNN-2's grad_Y read one term
    # transposed: a strided add of 2-3 ms at 20000 x 32)
    first = tuple(free_indices(terms[min(names)][1]))

    def layout(term: Expr) -> tuple:
        own = tuple(free_indices(term))
        return tuple(sorted(own, key=lambda ix: first.index(ix) if ix in first else len(first) + own.index(ix)))

    out: list[Assignment] = []
    found: dict[Expr, tuple[str, tuple[int, ...]]] = {}
    for k in sorted(names, key=lambda k: _node_count(terms[k][1])):  # contained terms first
        term = terms[k][1]
        own, laid = tuple(free_indices(term)), layout(term)
        out.append(Assignment(Access(names[k], laid), _reading(term, found)))
        found.setdefault(_canonical(term), (names[k], tuple(own.index(ix) for ix in laid)))
    total: Expr | None = None
    for k, (negate, term) in enumerate(terms):
        if k in names:
            term = Access(names[k], layout(term))
        if total is None:
            total = Binary("-", Literal(0.0), term) if negate else term
        else:
            total = Binary("-" if negate else "+", total, term)
    assert total is not None
    out.append(Assignment(statement.target, total))
    return out


def _extremum_terms(e: Expr) -> bool:
    """Is one of ``e``'s terms a max/min reduction, or contained in another
    term?  Split, such a term's value is a kept forward temporary the adjoint
    reads (a max's ties), or is computed once."""
    terms = [t for _, t in sum_terms(e) if _has_reduce(t)]
    if len(terms) < 1 or len(sum_terms(e)) < 2:
        return False
    inside = {_canonical(x) for t in terms for x in _subexpressions(t) if x is not t}
    return any((isinstance(t, Reduce) and t.op in ("max", "min")) or _canonical(t) in inside for t in terms)


def _subexpressions(e: Expr) -> list[Expr]:
    return [e] + [x for c in children(e) for x in _subexpressions(c)]


def split_forward(program: Program) -> Program:
    """``program`` with every sum of terms of which one is a max/min
    reduction or is contained in another split (:func:`split_reducing_terms`):
    the adjoint is derived over this form, so such a term is a forward
    temporary of its own, kept by the forward run instead of reduced again
    by the adjoint (the pattern max's min and max).

    >>> print(split_forward(parse_program("y[i] = max(j, A[i,j]) + x[i]")).text)
    y_term0[i] = max(j, A[i, j])
    y[i] = y_term0[i] + x[i]
    >>> split_forward(parse_program("y[i] = sum(j, A[i,j]) + x[i]")).text
    'y[i] = sum(j, A[i,j]) + x[i]'
    """
    taken = set(program.inputs) | set(program.assigned)
    statements = [part for st in program.statements
                  for part in (split_reducing_terms(st, taken) if _extremum_terms(st.value) else [st])]
    if len(statements) == len(program.statements):
        return program
    return parse_program(to_text(Program(tuple(statements))))


_OTHER_EXTREMUM = {"max": "min", "min": "max"}


def pattern_extrema(program: Program) -> dict[str, str]:
    """The pattern max/min of :mod:`spfuse.frontend.patterns` in a
    :func:`split_forward` program: ``{E: B}`` for each triple

        B[i] = min(j_, P[i,j_] * e_)          (the bound: any lower bound would do)
        E[i] = max(j, P[i,j] * (e - B[i]))    (the shifted extremum)
        m[i] = E[i] + B[i]                    (the pattern max)

    with ``P = A/A`` and ``e_`` the body ``e`` renamed, B read only by E and m,
    and E only by m (``min`` with max and min swapped).  The gradient m sends
    to B directly and the one E sends back through ``- B`` cancel exactly
    when E's ties are counted on the pattern only -- which is the pattern
    extremum's meaning: the implicit zeros take no part.  So the adjoint
    gives B no gradient and counts E's ties on the pattern (saving the
    bound's own tie statements and the two cancelling terms: about a third
    of a sparse-attention adjoint).

    >>> text = "m[i] = max(j in A[i,j], S[i,j])"
    >>> pattern_extrema(split_forward(parse_program(text)))
    {'m_term0': 'm_term1'}
    """
    by_name = {st.target.name: st for st in program.statements}
    readers: dict[str, set[str]] = {}
    for st in program.statements:
        for a in iter_accesses(st.value):
            readers.setdefault(a.name, set()).add(st.target.name)
    found = {}
    for st in program.statements:
        v = st.value
        if not (isinstance(v, Binary) and v.op == "+" and isinstance(v.left, Access)
                and isinstance(v.right, Access) and v.left.indices == v.right.indices == st.target.indices):
            continue
        e_name, b_name = v.left.name, v.right.name
        e_st, b_st = by_name.get(e_name), by_name.get(b_name)
        if e_st is None or b_st is None or readers.get(e_name) != {st.target.name} \
                or readers.get(b_name) != {st.target.name, e_name}:
            continue
        ev, bv = e_st.value, b_st.value
        if not (isinstance(ev, Reduce) and isinstance(bv, Reduce) and ev.op in _OTHER_EXTREMUM
                and bv.op == _OTHER_EXTREMUM[ev.op] and isinstance(ev.body, Binary) and ev.body.op == "*"
                and isinstance(ev.body.right, Binary) and ev.body.right.op == "-"
                and ev.body.right.right == Access(b_name, st.target.indices)):
            continue
        indicator = ev.body.left
        if not (isinstance(indicator, Binary) and indicator.op == "/" and indicator.left == indicator.right
                and isinstance(indicator.left, Access)):
            continue
        unshifted = Reduce(bv.op, ev.index, Binary("*", indicator, ev.body.right.left))
        if _canonical(unshifted) == _canonical(bv):
            found[e_name] = b_name
    return found


@dataclass
class _Contribution:
    """``cotangent (op factor)*``, negated or not, in the forward statement's index names."""

    name: str
    indices: tuple[str, ...]
    chain: list          # [(op, expr)], the first one ("*", cotangent access)
    negate: bool
    source: str = ""     # the forward statement's target
    #: a forward partial product was multiplied out into the chain: its
    #: contraction order is the planner's, no part of it is shared
    planner_ordered: bool = False

    def expression(self, mapping: Mapping[str, str], target: tuple[str, ...]) -> Expr:
        """The contribution as one expression (indices renamed by ``mapping``)
        with every index not in ``target`` summed.  Each sum wraps the
        shortest prefix of the product chain holding all its uses: a factor
        is atomic (a sum never enters ``sigmoid(...)``), and the prefix
        before it distributes."""
        chain = [(op, _rename(f, mapping)) for op, f in self.chain]
        last: dict[str, int] = {}
        for pos, (_, f) in enumerate(chain):
            for k in free_indices(f):
                if k not in target:
                    last[k] = pos
        term: Expr = chain[0][1]
        for pos, (op, f) in enumerate(chain):
            if pos and op == "*" and isinstance(term, Reduce) and target and isinstance(f, Access) \
                    and target[0] in f.indices and target[0] not in free_indices(term):
                # a finished contraction times the factor holding the first output index:
                # written first, the product (a GEMM) stores its result in the output's order
                term = Binary("*", f, term)
            elif pos:
                term = apply_factor(term, op, f)
            for k in reversed([k for k, p in last.items() if p == pos]):
                term = Reduce("sum", k, term)
        return Unary("neg", term) if self.negate else term


class _Builder:
    """One adjoint derivation (mutable scratch state, used once)."""

    def __init__(self, forward: Program, wrt, cotangents, sparse, policy, share_ordered: bool = False):
        self.forward = forward
        self.wrt = wrt
        self.sparse = sparse
        self.on_pattern: set[str] = set()  # hoisted temporaries recomputed on a sparse pattern
        self.policy = policy
        self.share_ordered = share_ordered   # share parts of chains whose order is otherwise the planner's
        all_names = set(forward.inputs) | set(forward.assigned)
        self.names = _Names(all_names)
        self.temporaries = set(forward.assigned) - set(forward.results)
        self.hoisted: dict[Expr, Access] = {}
        self.transposed: dict[str, str] = {}
        self.hoisted_statements: list[Assignment] = []
        self.contraction_notes: list[str] = []
        self.ones: dict[str, tuple[int, str]] = {}
        self.ones_by_key: dict[tuple[int, str], str] = {}
        self.grad = {r: self.names.fresh(f"grad_{r}") for r in cotangents}
        self.cotangents = dict(self.grad)
        active = set(wrt)
        for s in forward.statements:
            if any(a.name in active for a in iter_accesses(s.value)):
                active.add(s.target.name)
        # a pattern extremum's bound gets no gradient (see pattern_extrema), when its
        # ties can be counted on the pattern: the pattern operand is a sparse input
        by_name = {st.target.name: st.value for st in forward.statements}
        self.pattern_extrema = {e: b for e, b in pattern_extrema(forward).items()
                                if _pattern_mask(by_name[e].body, by_name[e].index, sparse) is not None}
        self.active = active - set(self.pattern_extrema.values())

    # -- hoisting ---------------------------------------------------------
    def hoist(self, e: Expr, base: str, hoisted_below: bool = False) -> Access:
        """A statement-of-its-own for ``e`` (deduplicated); the access reading it.
        ``hoisted_below``: ``e``'s inner reductions are already as they should stay."""
        if isinstance(e, Access):
            return e
        key = _canonical(e)
        found = self.hoisted.get(key)
        if found is None:
            if not hoisted_below:
                e = self.hoist_reductions(e, base, inner=True)
            found = Access(self.names.fresh(f"{base}_r"), free_indices(e))
            self.hoisted_statements.append(Assignment(found, e))
            self.hoisted[key] = found
            self.hoisted.setdefault(_canonical(e), found)
            return found
        # the same values under other index names: read them renamed
        return Access(found.name, free_indices(e))

    def hoist_factor(self, f: Expr, base: str, factors: list, product: bool = False) -> Expr:
        """A chain factor with its reductions hoisted.  A reduction that is
        the factor, or one of its product terms, multiplied (in the factor or
        elsewhere in the chain) by a sparse input over exactly its free indices
        is recomputed on that input's pattern only (``A[i,h] / A[i,h] * sum(k,
        X[i,k] * Y[k,h])``: SDDMM, not the whole dense product) -- every term
        it enters is zero off the pattern.  ``product``: ``f`` multiplies the
        chain (not a divisor, not a selection's condition), so a sum in it
        may be multiplied out (:meth:`projection_terms`)."""
        terms = _product_terms(f)
        if product:
            inlined = [u for t in terms for u in (self.projection_terms(t) or [t])]
            if inlined != terms:
                terms, f = inlined, _product(inlined)
        if not any(isinstance(t, Reduce) for t in terms):
            return self.hoist_reductions(f, base)
        sparse = [g for op, g in factors if op == "*" and isinstance(g, Access)]
        sparse = [g for g in sparse + [t for t in terms if isinstance(t, Access)]
                  if g.name in self.sparse and len(set(g.indices)) == len(g.indices)]
        out: Expr | None = None
        for t in terms:
            mask = next((g for g in sparse if isinstance(t, Reduce) and set(g.indices) == set(free_indices(t))),
                        None)
            if mask is None:
                t = self.hoist_reductions(t, base)
            else:
                t = self.hoist(Binary("*", Binary("/", mask, mask), self.hoist_reductions(t, base, inner=True)),
                               base, hoisted_below=True)
                self.on_pattern.add(t.name)
            out = t if out is None else Binary("*", out, t)
        assert out is not None
        return out

    def multiplied_out(self, factors: list, wanted: tuple[str, ...], name: str) -> list:
        """``factors`` with every sum :meth:`contracted_terms` accepts
        replaced by its product terms, each a factor of its own (so that the
        sums of the gradient nest in the chain's order, one contraction after
        another)."""
        around = [g for op, f in factors if op == "*" for g in _product_terms(f)]
        self.contribution_of = f"the gradient of {name}"
        out = []
        for op, f in factors:
            if op != "*":   # (a divisor or a selection is a factor as it is)
                out.append((op, f))
                continue
            terms = _product_terms(f)
            inlined = [u for t in terms for u in (
                None if self.projection_terms(t) else self.contracted_terms(t, wanted, around)) or [t]]
            if inlined == terms:
                out.append((op, f))
                continue
            out.extend(("*", u) for u in inlined)
            for t in terms:
                if t not in inlined:
                    note = (f"multiplied out  {to_text(t)} (a partial product of the forward) into the "
                            f"contraction of {self.contribution_of}: the forward's nesting fixes no order "
                            "(the planner's reassociation orders it by cost"
                            + (", after any part shared below)" if self.share_ordered else ")"))
                    if note not in self.contraction_notes:
                        self.contraction_notes.append(note)
        return out

    def contracted_terms(self, t: Expr, wanted: tuple[str, ...] | None, around: list[Expr]) -> list[Expr] | None:
        """The product terms of a sum ``t`` to multiply into the chain, when
        the gradient sums some of ``t``'s free indices too: the chain is then
        one contraction of several factors, whose order is left to the
        planner's reassociation (cost model) instead of being fixed here by
        the forward's nesting; the adjoint's ``alternative`` shares a part of
        it with another gradient (measured against this on the first run).  GCN's ``grad_W2[h,c] = sum(i, grad_Z[i,c] *
        sum(j, A[i,j] * H[j,h]))`` becomes ``sum(i, j, grad_Z[i,c] * A[i,j] *
        H[j,h])``, which may run as ``Hᵀ·(Aᵀ·grad_Z)`` (``nnz·C`` instead of
        ``nnz·H``).  Not when ``t`` is masked -- a sparse input in the
        chain (``around``) over exactly its free indices (SDDMM: ``t`` is
        then computed on that pattern) or one in ``t`` that reads no index
        ``t`` sums -- since the planner's chains are plain contractions."""
        if wanted is None or not isinstance(t, Reduce):
            return None
        bound, body = leading_sums(t)
        terms = _product_terms(body)
        free = set(free_indices(t))
        if not bound or isinstance(body, Reduce) or len(terms) < 2 or free <= set(wanted) \
                or not all(isinstance(u, Access) or self.on_a_pattern(u) for u in terms):
            return None
        if any(isinstance(g, Access) and g.name in self.sparse and set(g.indices) == free for g in around):
            return None
        if any(isinstance(u, Access) and u.name in self.sparse and not set(u.indices) & set(bound) for u in terms):
            return None
        return terms

    def on_a_pattern(self, t: Expr) -> bool:
        """Is ``t`` a sum over a product with a sparse input that reads
        exactly its free indices (an SDDMM: ``sum(k, B[i,j] * C[i,k] *
        D[j,k])``)?  Multiplied into a chain, it is hoisted whole, stored on
        that input's pattern: one sparse factor of the chain."""
        if not (isinstance(t, Reduce) and t.op == "sum" and t.pattern is None):
            return False
        free = set(free_indices(t))
        return any(isinstance(u, Access) and u.name in self.sparse and set(u.indices) == free
                   and len(u.indices) == len(free) for u in _product_terms(leading_sums(t)[1]))

    def projection_terms(self, t: Expr) -> list[Expr] | None:
        """The product terms of a sum ``t`` to multiply into the chain
        themselves, when stored ``t`` would be a projection of a sparse input
        off its leading modes: ``sum(j, X[i,j,k] * C[j,r])`` (MTTKRP's, for
        ``grad_D``) is stored on the (i, k) pairs of X -- a merge of every
        (i, j) fiber, assembled as sorted coordinates -- where the
        contraction it feeds, ``sum(i, j, G[i,r] * C[j,r] * X[i,j,k])``, is
        an MTTKRP of its own.  A sum over trailing modes (SpTTM's ``sum(k,
        B[i,j,k] * C[k,l])``, on B's (i, j) fibers) is hoisted as before.
        The bound indices are unique in the statement, so nothing clashes."""
        bound, body = leading_sums(t)
        terms = _product_terms(body)
        if not bound or not all(isinstance(u, Access) for u in terms):
            return None
        for u in terms:
            if u.name not in self.sparse or len(set(u.indices)) != len(u.indices):
                continue
            summed = [n for n, ix in enumerate(u.indices) if ix in bound]
            if summed and (len(u.indices) >= 3 or any(
                    n < len(u.indices) - 1 and any(ix not in bound for ix in u.indices[n + 1:]) for n in summed)):
                return terms
        return None

    def hoist_reductions(self, e: Expr, base: str, inner: bool = False) -> Expr:
        """``e`` with every maximal reduction replaced by a hoisted temporary
        (``inner``: ``e`` itself stays, only reductions below it are kept in place)."""
        if isinstance(e, Reduce):
            if inner:
                return e  # the hoisted statement itself: reductions inside stay fused
            return self.hoist(e, base)
        if isinstance(e, (Access, Literal)):
            return e
        kids = [self.hoist_reductions(c, base) for c in children(e)]
        if isinstance(e, Binary):
            return Binary(e.op, *kids)
        if isinstance(e, Unary):
            return Unary(e.fn, *kids)
        return Where(*kids)

    def ones_vector(self, statement: int, index: str) -> str:
        key = (statement, self.index_origin.get(index, index))
        name = self.ones_by_key.get(key)
        if name is None:
            name = self.ones_by_key[key] = self.names.fresh(f"ones_{index}")
            self.ones[name] = key
        return name

    # -- derivation -------------------------------------------------------
    def contributions(self, n: int, stmt: Assignment, value: Expr) -> list[_Contribution]:
        target = stmt.target
        base = target.name
        out: list[_Contribution] = []
        cot = Access(self.grad[target.name], target.indices)

        def walk(e: Expr, factors: list, negate: bool, scope: tuple[str, ...]):
            if isinstance(e, Access):
                if e.name not in self.active:
                    return
                if len(set(e.indices)) != len(e.indices):
                    raise UnsupportedError(
                        f"gradient through {to_text(e)}: an operand read with a repeated index "
                        "(a diagonal) is not differentiated; give the diagonal as its own operand")
                flat = self.multiplied_out(factors, e.indices, e.name)
                chain = [("*", cot)] + [(op, self.hoist_factor(f, base, factors, op == "*")) for op, f in flat]
                present = {k for _, f in chain for k in free_indices(f)}
                for k in scope:
                    if k not in present:  # broadcast, or a sum over an index the term lacks
                        chain.append(("*", Access(self.ones_vector(n, k), (k,))))
                out.append(_Contribution(e.name, e.indices, chain, negate, target.name, flat != factors))
            elif isinstance(e, Binary):
                (lf, ln), (rf, rn) = binary_factors(e.op, e.left, e.right)
                walk(e.left, factors + lf, negate ^ ln, scope)
                walk(e.right, factors + rf, negate ^ rn, scope)
            elif isinstance(e, Unary):
                # a temporary's root function reads the temporary itself
                # (relu' from H, not from recomputing its argument)
                own = target if e is value and target.name in self.temporaries else None
                f, flip = unary_factors(e.fn, e.arg, own)
                walk(e.arg, factors + f, negate ^ flip, scope)
            elif isinstance(e, Where):
                to_then, to_other = where_factors(e.cond)
                walk(e.then, factors + [to_then], negate, scope)
                walk(e.other, factors + [to_other], negate, scope)
            elif isinstance(e, Reduce):
                inner = scope + (e.index,)
                if e.op == "sum":
                    walk(e.body, factors, negate, inner)
                    return
                # amax/amin: the body is materialised once so that the extremum
                # and the tie test read the very same values
                body = self.hoist(self.hoist_reductions(e.body, base), base)
                if e is value and target.name in self.temporaries:
                    # a temporary's extremum is the temporary: the forward's
                    # values, read (kept) rather than reduced again
                    extremum = target
                else:
                    extremum = self.hoist(Reduce(e.op, e.index, body), base)
                # the same extremum written over the un-hoisted body reads this one
                self.hoisted.setdefault(_canonical(e), extremum)
                tie = Where(Binary("-", body, extremum), ZERO, ONE)
                ties = self.tie_count(n, e, tie, extremum, base,
                                      on_pattern=e is value and target.name in self.pattern_extrema)
                walk(e.body, factors + [("*", tie), ("/", ties)], negate, inner)

        walk(value, [], False, target.indices)
        return out

    def tie_count(self, n: int, e: Reduce, tie: Expr, extremum: Access, base: str,
                  on_pattern: bool = False) -> Access:
        """How many ``e.index`` positions tie with the extremum (``sum(j, tie)``).

        When ``e``'s body is a product with a sparse input ``A`` read at
        ``e.index`` (a pattern reduction's ``A/A * ...``), the body is 0
        wherever ``A`` stores nothing, so those positions tie exactly when the
        extremum is 0: the count is ``sum(j, A/A * tie) + (extent - stored) *
        [extremum == 0]``, with every loop on ``A``'s pattern instead of the
        dense row.  ``on_pattern``: only the stored positions count (a
        pattern extremum's, :func:`pattern_extrema`)."""
        mask = _pattern_mask(e.body, e.index, self.sparse)
        if mask is None:
            return self.hoist(Reduce("sum", e.index, tie), base)
        on_pattern_ties = self.hoist(Reduce("sum", e.index, Binary("*", mask, tie)), base)
        if on_pattern:
            return on_pattern_ties
        stored = self.hoist(Reduce("sum", e.index, mask), base)
        extent = self.hoist(Reduce("sum", e.index, Access(self.ones_vector(n, e.index), (e.index,))), base)
        off_pattern = Binary("*", Binary("-", extent, stored), Where(extremum, ZERO, ONE))
        return self.hoist(Binary("+", on_pattern_ties, off_pattern), base)

    def note_shared(self, shared: Access, value: Expr, names: list[str]) -> None:
        self.contraction_notes.append(
            f"shared  {to_text(Assignment(shared, value))}: computed once, read by the gradients of "
            + ", ".join(dict.fromkeys(names)))

    def share_sparse_prefixes(self, target: str, contributions: list[_Contribution]) -> list[Assignment]:
        """Compute once the product-chain prefix several contributions of one
        statement share, when it is sparse: the cotangent times a sparse
        input's pattern (``grad_D[i,j] * P[i,j]`` feeding both ``grad_H`` and
        ``grad_Wd``) becomes a statement of its own on that pattern, which
        the contributions then read instead of co-iterating both operands
        each.  A dense prefix is left inline (a later sparse factor of the
        chain may restrict it).  Returns the new statements; rewrites the
        chains in place."""
        out: list[Assignment] = []
        while True:
            best = None
            for length in range(len(min((c.chain for c in contributions), key=len, default=())), 1, -1):
                groups: dict[tuple, list[_Contribution]] = {}
                for c in contributions:
                    if len(c.chain) > length:  # something must stay after the prefix
                        groups.setdefault(tuple(c.chain[:length]), []).append(c)
                for prefix, members in groups.items():
                    if len(members) > 1 and self.sparse_prefix(prefix):
                        best = (prefix, members)
                        break
                if best:
                    break
            if best is None:
                return out
            prefix, members = best
            value: Expr = prefix[0][1]
            for op, f in prefix[1:]:
                value = apply_factor(value, op, f)
            shared = Access(self.names.fresh(f"grad_{target}_p"), free_indices(value))
            if all(c.negate for c in members):
                # negated once on the pattern, so each member is a plain
                # contraction (-sum(j, P*D) would be an SpMM then a dense pass)
                value = Unary("neg", value)
                for c in members:
                    c.negate = False
            out.append(Assignment(shared, value))
            self.note_shared(shared, value, [c.name for c in members])
            for c in members:
                c.chain = [("*", shared)] + c.chain[len(prefix):]

    def share_sparse_products(self, target: str, contributions: list[_Contribution]) -> list[Assignment]:
        """Compute once the factors several contributions of one statement
        have in common -- in any order, all products -- when, with the
        indices only they use summed, they live on a sparse input's pattern.
        SDDMM-SpMM's ``sum(l, grad_A[i,l] * E[j,l]) * B[i,j]`` feeds ``grad_C``
        (times ``D[j,k]``) and ``grad_D`` (times ``C[i,k]``): one SDDMM on
        B's pattern, then two SpMMs, instead of each gradient redoing the
        SDDMM inside a fused SDDMM-SpMM.  Returns the new statements;
        rewrites the chains in place."""
        out: list[Assignment] = []
        while True:
            best = _largest_shared(_product_chains(contributions, self.share_ordered), lambda common: [common],
                                   self.sparse_product)
            if best is None:
                return out
            common, members, sparse = best
            rest = [f for f in common if f is not sparse] + [sparse]
            value = _Contribution("", sparse.indices, [("*", f) for f in rest], False).expression(
                {}, sparse.indices)
            if all(c.negate for c in members):
                value = Unary("neg", value)
                for c in members:
                    c.source_contribution.negate = False
            shared = Access(self.names.fresh(f"grad_{target}_p"), sparse.indices)
            out.append(Assignment(shared, value))
            self.note_shared(shared, value, [c.source_contribution.name for c in members])
            _take_out(shared, common, members)

    def share_dense_contractions(self, target: str, contributions: list[_Contribution]) -> list[Assignment]:
        """Compute once a contraction several contributions of one statement
        share, stored dense: MTTKRP-GEMM's ``sum(m, grad_A[i,m] * E[j,m])``
        feeds ``grad_C`` and ``grad_D``, SpTTM-SpTTM's ``sum(i, j, grad_A[i,j,m]
        * B[i,j,k])`` both of its gradients; each statement's plan would
        compute it whole anyway, once each (and without it ``grad_C`` of
        MTTKRP-GEMM is a three-factor contraction a template kernel runs).
        Not when a member reads it next to a sparse input spanning two of its
        indices (SDDMM's ``C·D`` on B's pattern: stored whole it would be
        dense)."""
        def parts(common: list[Expr]) -> list[list[Expr]]:
            # operands and the cotangent, not temporaries; the whole common part, else without its sparse inputs
            common = [f for f in common if isinstance(f, Access) and f.name not in self.on_pattern
                      and f.name not in self.temporaries]
            return [common, [f for f in common if f.name not in self.sparse]]

        out: list[Assignment] = []
        while True:
            best = _largest_shared(_product_chains(contributions, self.share_ordered), parts, self.dense_contraction)
            if best is None:
                return out
            common, members, kept = best
            # a sparse matrix summed over its rows: stored by its columns, read as its transpose's rows
            sparse = self.sparse | {h.target.name for h in self.hoisted_statements if self.on_a_pattern(h.value)}
            kept = tuple(sorted(kept, key=lambda ix: not any(
                f.name in sparse and len(f.indices) == 2 and f.indices[1] == ix for f in common)))
            value = _Contribution("", kept, [("*", f) for f in common], False).expression({}, kept)
            value = self.transpose_reads(value, kept, target)
            shared = Access(self.names.fresh(f"grad_{target}_c"), kept)
            out.append(Assignment(shared, value))
            self.note_shared(shared, value, [c.source_contribution.name for c in members])
            _take_out(shared, common, members)

    def dense_contraction(self, common: list[Expr], members: list[_ProductChain]) -> tuple[str, ...] | None:
        """The indices a shared dense contraction keeps (those its members
        use elsewhere), or None (see :meth:`share_dense_contractions`)."""
        found = _kept_indices(common, members) if len(members) >= 2 and len(common) >= 2 else None
        if found is None:
            return None
        inside, kept = found
        if kept == inside:
            return None   # nothing summed: an outer product, no contraction to share
        if any(f.name in self.sparse and len(kept & set(f.indices)) >= 2 for f in common):
            return None   # two modes of a sparse input kept: stored dense, it would be dense
        for c in members:
            for _, f in _remove_factors(c.chain, common) or ():
                for a in iter_accesses(f):
                    if a.name in self.sparse and len(kept & set(a.indices)) >= 2:
                        return None
        return tuple(dict.fromkeys(ix for f in common for ix in free_indices(f) if ix in kept))

    def sparse_product(self, common: list[Expr], members: list[_ProductChain]) -> Access | None:
        """The sparse input access ``common`` lives on, once the indices used
        by no member outside it are summed; None when there is none (or
        fewer than two members, or a member with nothing left)."""
        found = _kept_indices(common, members) if len(members) >= 2 and len(common) >= 3 else None
        if found is None:
            return None
        kept = found[1]
        for f in common:
            if isinstance(f, Access) and f.name in self.sparse and set(f.indices) == kept \
                    and len(set(f.indices)) == len(f.indices):
                return f
        return None

    def sparse_prefix(self, prefix: tuple) -> bool:
        """Whether the product ``prefix`` is zero off a sparse input's pattern
        that spans all its indices (so its statement stores only that pattern)."""
        if any(op not in ("*", "/") for op, _ in prefix[1:]):
            return False
        indices = set()
        for _, f in prefix:
            indices |= set(free_indices(f))
        return any(op == "*" and isinstance(f, Access) and f.name in self.sparse and set(f.indices) == indices
                   for op, f in prefix[1:])

    def target_indices(self, name: str) -> tuple[str, ...]:
        for s in self.forward.statements:
            if s.target.name == name:
                return s.target.indices
        for s in self.forward.statements:
            for a in iter_accesses(s.value):
                if a.name == name:
                    if len(set(a.indices)) == len(a.indices):
                        return a.indices
                    return tuple(f"i{m}" for m in range(len(a.indices)))
        raise ProgramError(f"{name!r} is not read by the program")

    def gradient_statement(self, name: str, contributions: list[_Contribution]) -> Assignment:
        target = self.target_indices(name)
        gname = self.grad[name]
        terms = []
        for c in contributions:
            mapping = dict(zip(c.indices, target, strict=True))
            present = set().union(*(_all_indices(f) for _, f in c.chain))
            index_names = _Names(present | set(target))
            for k in sorted(present - set(c.indices)):
                if k in target:
                    mapping[k] = index_names.fresh(k)
            terms.append(self.transpose_reads(c.expression(mapping, target), target, c.source))
        # equal terms (x*x gives two) are computed once and doubled: x + x == 2*x exactly
        counts: dict[Expr, int] = {}
        for t in terms:
            counts[t] = counts.get(t, 0) + 1
        merged = [t if k == 1 else Binary("*", Literal(float(k)), t) for t, k in counts.items()]
        value = merged[0]
        for t in merged[1:]:
            value = Binary("+", value, t)
        if name in self.sparse and name in self.patterns:
            value = Binary("*", Access(self.patterns[name], target), value)
        elif name in self.temporaries:
            mask = self.structural_mask(name)
            if mask is not None:
                value = Binary("*", mask, value)
        return Assignment(Access(gname, target), value)

    def transpose_reads(self, term: Expr, target: tuple[str, ...], source: str) -> Expr:
        """Read a sparse matrix ``A[k,j]`` whose row index ``k`` is summed and
        column ``j`` is an output as ``A_T[j,k]`` (its transpose in CSR, made
        by the runner): a row-wise SpMM instead of a scatter over ``k``.  Only
        when it is the term's one sparse read and the cotangent is dense (the
        forward result is not structurally sparse), so no co-iteration of
        differently ordered sparse operands is created; and not into a vector
        (``sum(i, g[i] * A[i,j])``, SpMV's adjoint): its rows scatter into
        the one dense vector as stored (spmv_t), no transpose needed."""
        # a sub-reduction recomputed on a sparse pattern (hoist_factor) is sparse too
        sparse = [a for a in iter_accesses(term) if a.name in self.sparse or a.name in self.on_pattern]
        if len(sparse) != 1 or self.structural_mask(source) is not None:
            return term
        acc = sparse[0]
        if len(acc.indices) != 2 or acc.indices[0] in target:
            return term
        if acc.indices[1] not in target and not _summed_within(term, acc.indices[0], acc.indices[1]):
            return term   # (a column summed first: its rows scatter; summed after the row, as an SpMM's output)
        if len(target) == 1:
            return term   # a vector result: the rows scatter into it as stored (SpMV's adjoint is spmv_t)
        name = self.transposed.get(acc.name)
        if name is None:
            name = self.transposed[acc.name] = self.names.fresh(f"{acc.name}_T")
        swapped = Access(name, acc.indices[::-1])

        def walk(e: Expr) -> Expr:
            if isinstance(e, Binary) and e.op == "*" and e.right == acc:
                # written first: the SpMM over its rows stores its result row by row
                return Binary("*", swapped, walk(e.left))
            return swapped if e == acc else map_children(e, walk)

        return walk(term)

    def structural_mask(self, name: str) -> Expr | None:
        """``A[o] / A[o]`` (1 on A's pattern) when temporary ``name[o]`` is a
        product with the sparse input ``A[o]`` at its root: ``name`` is then
        zero off that pattern, every path out of its adjoint multiplies by
        ``A``, and masking the adjoint changes no gradient -- but tells the
        planner to compute it on the pattern only (not densely)."""
        stmt = next(s for s in self.forward.statements if s.target.name == name)
        target = stmt.target.indices
        # through reductions too: a sum of terms all 0 where A is (A reads no bound index)
        found = _sparse_factor(stmt.value, self.sparse, lambda a: a.indices == target, through_reductions=True)
        return Binary("/", found, found) if found is not None else None

    def build(self) -> Adjoint:
        forward = self.forward
        statements = forward.statements
        self.patterns = {n: self.names.fresh(f"pattern_{n}") for n in self.wrt if n in self.sparse}
        pending: dict[str, list[_Contribution]] = {}
        grads: list[Assignment] = []
        for n in range(len(statements) - 1, -1, -1):
            stmt = statements[n]
            name = stmt.target.name
            if name in self.temporaries:
                found = pending.pop(name, None)
                if found is None:
                    continue  # no adjoint reaches this temporary
                self.grad[name] = self.names.fresh(f"grad_{name}")
                g = self.gradient_statement(name, found)
                if isinstance(g.value, Access) and g.value.indices == g.target.indices:
                    self.grad[name] = g.value.name  # the very cotangent of another statement: read it
                else:
                    grads.append(g)
            elif name not in self.grad or name not in self.active:
                continue
            value, self.index_origin = _unique_bound(stmt.value, stmt.target.indices)
            contributions = self.contributions(n, stmt, value)
            grads.extend(self.share_sparse_prefixes(name, contributions))
            grads.extend(self.share_sparse_products(name, contributions))
            grads.extend(self.share_dense_contractions(name, contributions))
            for c in contributions:
                pending.setdefault(c.name, []).append(c)
        gradients = {}
        for name in self.wrt:
            if name in pending:
                self.grad[name] = self.names.fresh(f"grad_{name}")
                grads.append(self.gradient_statement(name, pending[name]))
                gradients[name] = self.grad[name]
        if not gradients:
            return Adjoint(forward, self.wrt, None, {}, self.cotangents, self.patterns, {})
        hoisted = _read_by(self.hoisted_statements, grads)
        kept, recomputed, reasons = self.temporary_choices(hoisted + grads)
        recompute = [s for s in statements if s.target.name in recomputed]
        body = Program(tuple(recompute + hoisted + grads))
        program = parse_program(to_text(body))
        if set(program.results) != set(gradients.values()):  # pragma: no cover - a bug guard
            raise AssertionError(f"adjoint program returns {program.results}, expected {gradients}")
        saved = {t: self.names.fresh(f"{t}_saved") for t in kept}
        used = {a.name for s in program.statements for a in iter_accesses(s.value)}
        ones = {k: v for k, v in self.ones.items() if k in used}
        transposed = {n: t for n, t in self.transposed.items() if t in used}
        return Adjoint(forward, self.wrt, program, gradients, self.cotangents, self.patterns, ones,
                       tuple(kept), tuple(recomputed), reasons, saved, transposed, tuple(self.contraction_notes))

    def _on_pattern(self, statement) -> bool:
        """Is the statement's value a product with a sparse input read at the
        target's own indices (``E[i,j] = A[i,j] * exp(...)``): zero off that
        input's pattern, so stored as its values?"""
        target = tuple(statement.target.indices)
        return any(isinstance(f, Access) and f.name in self.sparse and tuple(f.indices) == target
                   for f in _product_terms(statement.value))

    def temporary_choices(self, adjoint_statements):
        """Which forward temporaries the adjoint reads are kept, which recomputed."""
        by_name = {s.target.name: s for s in self.forward.statements}
        wanted = [a.name for s in adjoint_statements for a in iter_accesses(s.value)
                  if a.name in self.temporaries]
        kept: list[str] = []
        recomputed: list[str] = []
        reasons: dict[str, str] = {}
        while wanted:
            name = wanted.pop(0)
            if name in reasons:
                continue
            value = by_name[name].value
            reduces = _has_reduce(value)
            on_pattern = self._on_pattern(by_name[name])
            if self.policy == "keep" or (self.policy == "auto" and (reduces or on_pattern)):
                kept.append(name)
                reasons[name] = ("kept: saved by the forward run and passed in "
                                 + ("(forced)" if self.policy == "keep" else
                                    "(its statement reduces; recomputing would repeat that work)" if reduces else
                                    "(stored on a sparse operand's pattern: as many values as that operand, "
                                    "where recomputing walks the operands' patterns again)"))
            else:
                recomputed.append(name)
                reasons[name] = ("recomputed inside the adjoint program "
                                 + ("(forced)" if self.policy == "recompute" else
                                    "(element-wise: cheaper to fuse than to store)"))
                wanted.extend(a.name for a in iter_accesses(value) if a.name in self.temporaries)
        order = [s.target.name for s in self.forward.statements]
        return (sorted(kept, key=order.index), sorted(recomputed, key=order.index), reasons)


def _read_by(hoisted: list[Assignment], grads: list[Assignment]) -> list[Assignment]:
    """The hoisted statements the gradient statements read, directly or
    through one another (a hoisted reduction whose every use simplified
    away -- a gradient through a constant branch of ``where`` -- is dropped,
    not left as a stray result of the adjoint program)."""
    live = {a.name for g in grads for a in iter_accesses(g.value)}
    out = []
    for h in reversed(hoisted):
        if h.target.name in live:
            out.append(h)
            live.update(a.name for a in iter_accesses(h.value))
    return out[::-1]


def adjoint(program: str | Program, wrt: Iterable[str] | None = None,
            cotangents: Iterable[str] | None = None, sparse: Iterable[str] = (),
            temporaries: str = "auto") -> Adjoint:
    """Derive the adjoint (reverse-mode) program of ``program``.

    ``wrt``: the input operands to differentiate (default: all inputs);
    ``cotangents``: the results a cotangent is given for (default: all);
    ``sparse``: the inputs stored sparse (a ``wrt`` one gets its gradient on
    its stored pattern; a temporary that is a product with one at its root
    gets its adjoint computed on that pattern only); ``temporaries``: ``"auto"``, ``"keep"`` or ``"recompute"``.
    A pure function of the program text: no operand is needed.

    >>> adj = adjoint("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", wrt=("C", "D"))
    >>> print(adj.text)
    grad_C[i, k] = sum(j, grad_A[i, j] * B[i, j] * D[k, j])
    grad_D[k, j] = sum(i, grad_A[i, j] * B[i, j] * C[i, k])
    >>> print(adjoint("y[i] = A[i,j] * x[j]", wrt=("A",), sparse=("A",)).text)
    grad_A[i, j] = pattern_A[i, j] * (grad_y[i] * x[j])
    """
    if isinstance(program, str):
        program = parse_program(program)
    elif not isinstance(program, Program):
        raise TypeError(f"program must be a str or a Program, got {type(program).__name__}")
    else:
        program = make_reductions_explicit(program)
    if temporaries not in TEMPORARY_POLICIES:
        raise ValueError(f"temporaries must be one of {TEMPORARY_POLICIES}, got {temporaries!r}")
    inputs = program.inputs
    wrt = tuple(inputs) if wrt is None else ((wrt,) if isinstance(wrt, str) else tuple(wrt))
    for name in wrt:
        if name not in inputs:
            raise ValueError(f"wrt: {name!r} is not an input of the program; inputs: {', '.join(inputs)}")
    if len(set(wrt)) != len(wrt):
        raise ValueError(f"wrt names an operand twice: {wrt}")
    results = program.results
    cots = tuple(results) if cotangents is None else tuple(cotangents)
    for name in cots:
        if name not in results:
            raise ValueError(f"a cotangent is given for {name!r}, which is not a result; "
                             f"results: {', '.join(results)}")
    sparse = frozenset(sparse) & set(inputs)
    forward = split_forward(program)
    adj = _Builder(forward, wrt, cots, sparse, temporaries).build()
    shared = _Builder(forward, wrt, cots, sparse, temporaries, share_ordered=True).build()
    if shared.program is None or adj.program is None or shared.program == adj.program:
        return adj
    same_operands = (shared.kept == adj.kept and shared.patterns == adj.patterns
                     and shared.gradients == adj.gradients and shared.cotangents == adj.cotangents
                     and all(adj.ones.get(n, k) == k for n, k in shared.ones.items())
                     and all(adj.transposed.get(n, t) == t for n, t in shared.transposed.items()))
    return replace(adj, alternative=shared) if same_operands else adj
