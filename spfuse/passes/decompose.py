"""Break compound statements into unit operations (ReACT 4.1.3).

Input: a :class:`~spfuse.frontend.ast.Program` whose reductions are explicit
(the front end wraps each implicit reduction around the smallest
sub-expression containing all uses of its index).  Output: a tuple of
:class:`~spfuse.ir.ops.UnitOp` in execution order, introducing temporaries
``T0, T1, ...`` whose indices are inferred from the operators.

A sum of any number of terms (``+``/``-``, scaled terms ``2*A[i,j]``,
negated terms) stays ONE operation -- an n-way union (TACO's merge
lattice for ``+``), each term a leaf with a scalar coefficient; compound
terms (products, reductions, functions) become temporaries as usual.  With
``nary=False`` (the library approach, ``fusion="none"``) a sum is split into
binary adds in text order, as ``scipy`` evaluates ``A + B + C``.

Before splitting, sums are *factored*: in ``sum(k, a * b)`` every factor that
does not use ``k`` is pulled out of the reduction (distributivity), so the
three-address form never multiplies inside a loop it does not depend on --
the algebraic half of removing ReACT's reduction redundancy.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable

from spfuse.frontend.ast import Access, Binary, Expr, Literal, Program, Reduce, Unary, Where, iter_accesses
from spfuse.ir.ops import Const, Leaf, Ref, UnitOp
from spfuse.passes.rename import distinct_binders

__all__ = ["decompose", "factor_reductions", "free_indices"]


def free_indices(expr: Expr) -> tuple[str, ...]:
    """Indices used in ``expr`` and not bound by a reduction inside it, in order
    of first appearance.

    >>> from spfuse.frontend.ast import Access, Binary, Reduce
    >>> e = Reduce("sum", "k", Binary("*", Access("C", ("i", "k")), Access("D", ("k", "j"))))
    >>> free_indices(e)
    ('i', 'j')
    """
    if isinstance(expr, Access):
        return tuple(dict.fromkeys(expr.indices))
    if isinstance(expr, Literal):
        return ()
    if isinstance(expr, Reduce):
        return tuple(i for i in free_indices(expr.body) if i != expr.index)
    out: dict[str, None] = {}
    for child in _children(expr):
        out.update(dict.fromkeys(free_indices(child)))
    return tuple(out)


def _children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Binary):
        return (expr.left, expr.right)
    if isinstance(expr, Unary):
        return (expr.arg,)
    if isinstance(expr, Where):
        return (expr.cond, expr.then, expr.other)
    if isinstance(expr, Reduce):
        return (expr.body,)
    return ()


def _product_factors(expr: Expr) -> list[Expr]:
    """Flatten a chain of ``*`` into its factors (left to right)."""
    if isinstance(expr, Binary) and expr.op == "*":
        return _product_factors(expr.left) + _product_factors(expr.right)
    return [expr]


def _product(factors: Iterable[Expr], span) -> Expr:
    factors = list(factors)
    out = factors[0]
    for f in factors[1:]:
        out = Binary("*", out, f, span)
    return out


def factor_reductions(expr: Expr) -> Expr:
    """Pull factors that do not use a summed index out of the sum.

    ``sum(k, B[i,j] * C[i,k] * D[k,j])`` becomes ``B[i,j] * sum(k, C[i,k] * D[k,j])``.
    Only ``sum`` over products is rewritten (max/min do not distribute).

    >>> from spfuse.frontend.ast import Access, Binary, Reduce
    >>> B, C, D = Access("B", ("i", "j")), Access("C", ("i", "k")), Access("D", ("k", "j"))
    >>> e = factor_reductions(Reduce("sum", "k", Binary("*", Binary("*", B, C), D)))
    >>> e == Binary("*", B, Reduce("sum", "k", Binary("*", C, D)))
    True
    """
    if isinstance(expr, (Access, Literal)):
        return expr
    if isinstance(expr, Binary):
        return Binary(expr.op, factor_reductions(expr.left), factor_reductions(expr.right), expr.span)
    if isinstance(expr, Unary):
        return Unary(expr.fn, factor_reductions(expr.arg), expr.span)
    if isinstance(expr, Where):
        return Where(factor_reductions(expr.cond), factor_reductions(expr.then), factor_reductions(expr.other),
                     expr.span)
    assert isinstance(expr, Reduce)
    body = factor_reductions(expr.body)
    if expr.op == "sum":
        distributed = _distribute_sum(expr, body)
        if distributed is not None:
            return distributed
        factors = _product_factors(body)
        dependent = [f for f in factors if expr.index in free_indices(f)]
        independent = [f for f in factors if expr.index not in free_indices(f)]
        if independent and dependent:
            inner = Reduce("sum", expr.index, _product(dependent, expr.span), expr.span, expr.implicit)
            return _product(independent + [inner], expr.span)
    return Reduce(expr.op, expr.index, body, expr.span, expr.implicit)


def _distribute_sum(expr: Reduce, body: Expr) -> Expr | None:
    """``sum(k, t1 ± t2 ...)`` as ``sum(k, t1) ± sum(k, t2) ...`` when every
    term uses ``k``, else None.

    Summing the terms of a sum separately is exact in real arithmetic and
    lets each term iterate its own operands (``sum(j, A[i,j]*X[j,k] -
    B[i,j]*Y[j,k])`` is two SpMMs, not a union of A's and B's patterns with a
    temporary per (i, j, k)).  A term without ``k`` would be counted once per
    ``k``, so such sums are left alone.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.frontend.canonical import to_text
    >>> p = parse_program("C[i,k] = sum(j, A[i,j]*X[j,k] - B[i,j]*Y[j,k])")
    >>> to_text(factor_reductions(p.statements[0].value))
    'sum(j, A[i, j] * X[j, k]) - sum(j, B[i, j] * Y[j, k])'
    """
    terms = sum_terms(body)
    if len(terms) < 2 or any(expr.index not in free_indices(t) for _, t in terms):
        return None
    out: Expr | None = None
    for c, t in terms:
        part = t if abs(c) == 1.0 else Binary("*", Literal(abs(c)), t, expr.span)
        red = factor_reductions(Reduce("sum", expr.index, part, expr.span, expr.implicit))
        if out is None:
            out = red if c > 0 else Unary("neg", red, expr.span)
        else:
            out = Binary("+" if c > 0 else "-", out, red, expr.span)
    return out


def sum_terms(expr: Expr) -> list[tuple[float, Expr]]:
    """The terms of a sum as ``(coefficient, term)`` pairs, left to right.

    ``+``/``-`` chains and ``neg`` are flattened; a term that is a literal
    times something (``2*A``, ``A*2``) carries the literal as its coefficient.

    >>> from spfuse.frontend.parser import parse_program
    >>> e = parse_program("Z[i] = A[i] - 2*B[i] + (C[i]*3 - D[i])").statements[0].value
    >>> [(c, t.name) for c, t in sum_terms(e)]
    [(1.0, 'A'), (-2.0, 'B'), (3.0, 'C'), (-1.0, 'D')]
    """
    out: list[tuple[float, Expr]] = []

    def walk(e: Expr, c: float) -> None:
        if isinstance(e, Binary) and e.op in ("+", "-"):
            walk(e.left, c)
            walk(e.right, -c if e.op == "-" else c)
        elif isinstance(e, Unary) and e.fn == "neg":
            walk(e.arg, -c)
        elif isinstance(e, Binary) and e.op == "*" and (scaled := _scaled_access(e)) is not None:
            # Only a literal times an access is folded (c is ±1 here, so the
            # coefficient times the access rounds exactly like the text).
            lit, acc = scaled
            out.append((c * lit, acc))
        else:
            out.append((c, e))

    walk(expr, 1.0)
    return out


def _scaled_access(e: Binary) -> tuple[float, Access] | None:
    if isinstance(e.left, Literal) and isinstance(e.right, Access):
        return float(e.left.value), e.right
    if isinstance(e.right, Literal) and isinstance(e.left, Access):
        return float(e.right.value), e.left
    return None


class _Decomposer:
    def __init__(self, program: Program, nary: bool = True):
        self.nary = nary
        taken = set(program.assigned) | set(program.inputs)
        self._names = (f"T{n}" for n in itertools.count() if f"T{n}" not in taken)
        self.ops: list[UnitOp] = []
        self.statement = 0
        self.target: tuple[str, ...] = ()   # the indices of the statement being decomposed

    def _emit(self, out, out_indices, operator, args, reduction=None, reduced=(), span=None, coefs=()):
        op = UnitOp(len(self.ops), out, tuple(out_indices), operator, tuple(args), reduction,
                    tuple(reduced), self.statement, span or _nospan(), tuple(coefs))
        self.ops.append(op)
        return Ref(out, tuple(out_indices))

    def _temp_indices(self, expr: Expr) -> tuple[str, ...]:
        # The order of appearance in the widest accesses first keeps a
        # temporary's layout concordant with the operands it is computed from
        # (T[i,j,r] for X[i,j,k]*C[k,r]), whichever factor is written first
        # (T[i,j] for b[j] + S[i,j], not a transposed T[j,i]); a temporary
        # indexed by the statement's result indices only takes their order
        # (relu(sum(j, B[j,k] * A[i,j])) into C[i,k]: T[i,k]).
        free = free_indices(expr)
        if set(free) <= set(self.target):   # indexed like the result: laid out like it
            return tuple(ix for ix in self.target if ix in free)
        accesses = sorted(iter_accesses(expr), key=lambda a: -len(a.indices))
        order = dict.fromkeys(ix for a in accesses for ix in a.indices if ix in free)
        return tuple(order) + tuple(ix for ix in free if ix not in order)

    def leaf(self, expr: Expr) -> Leaf:
        """Return a leaf for ``expr``, emitting ops for anything compound."""
        if isinstance(expr, Access):
            return Ref(expr.name, expr.indices)
        if isinstance(expr, Literal):
            return Const(float(expr.value))
        if isinstance(expr, Unary) and expr.fn == "neg" and isinstance(expr.arg, Literal):
            return Const(-float(expr.arg.value))   # -4.0 is a constant, not an op on one (exact)
        return self.node(expr, None, None)

    def node(self, expr: Expr, out: str | None, out_indices: tuple[str, ...] | None) -> Ref:
        if out is None:
            out, out_indices = next(self._names), self._temp_indices(expr)
        reduced: list[str] = []
        reduction = None
        body = expr
        if isinstance(expr, Reduce):
            reduction = expr.op
            while isinstance(body, Reduce) and body.op == reduction:
                reduced.append(body.index)
                body = body.body
        coefs: tuple[float, ...] = ()
        if isinstance(body, Binary) and body.op in ("+", "-") and self.nary:
            terms = sum_terms(body)
            args, operator = tuple(self.leaf(t) for _, t in terms), "+"
            coefs = tuple(c for c, _ in terms)
            if all(c == 1.0 for c in coefs):
                coefs = ()
        elif isinstance(body, Binary):
            args, operator = (self.leaf(body.left), self.leaf(body.right)), body.op
        elif isinstance(body, Unary):
            args, operator = (self.leaf(body.arg),), body.fn
        elif isinstance(body, Where):
            args, operator = tuple(self.leaf(c) for c in (body.cond, body.then, body.other)), "where"
        else:  # Access, Literal, or a reduction of another kind
            args, operator = (self.leaf(body),), None
        return self._emit(out, out_indices, operator, args, reduction, reduced, expr.span, coefs)


def _nospan():
    from spfuse.frontend.ast import Span
    return Span(0, 0)


def decompose(program: Program, nary: bool = True) -> tuple[UnitOp, ...]:
    """Three-address form of ``program`` (reductions must already be explicit);
    ``nary=False`` splits sums into binary adds (the library approach).

    >>> from spfuse.frontend.ast import Access, Assignment, Binary, Program, Reduce
    >>> B, C, D = Access("B", ("i", "j")), Access("C", ("i", "k")), Access("D", ("k", "j"))
    >>> sddmm = Program((Assignment(Access("A", ("i", "j")),
    ...                  Binary("*", B, Reduce("sum", "k", Binary("*", C, D)))),))
    >>> for op in decompose(sddmm): print(op)
    T0[i,j] = sum(k, C[i,k] * D[k,j])
    A[i,j] = B[i,j] * T0[i,j]
    >>> from spfuse.frontend.parser import parse_program
    >>> spadd = parse_program("C[i,j] = A0[i,j] + A1[i,j] - 2*A2[i,j] + A3[j,i]")
    >>> for op in decompose(spadd): print(op)
    C[i,j] = A0[i,j] + A1[i,j] - 2*A2[i,j] + A3[j,i]
    >>> for op in decompose(spadd, nary=False): print(op)
    T1[i,j] = A0[i,j] + A1[i,j]
    T2[i,j] = 2 * A2[i,j]
    T0[i,j] = T1[i,j] - T2[i,j]
    C[i,j] = T0[i,j] + A3[j,i]
    """
    d = _Decomposer(program, nary)
    for n, stmt in enumerate(program.statements):
        d.statement, d.target = n, stmt.target.indices
        value = factor_reductions(distinct_binders(stmt))
        d.node(value, stmt.target.name, stmt.target.indices)
    return tuple(d.ops)
