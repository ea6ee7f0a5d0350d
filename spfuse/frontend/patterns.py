"""Reductions restricted to an operand's stored pattern: ``op(j in A[i,j], e)``.

``sum(j in A[i,j], e)`` sums ``e`` over the ``j`` where ``A[i,j]`` is stored;
``max``/``min`` likewise look only at stored positions (the implicit zeros
of the row do not take part), as ``torch.sparse.softmax`` needs.  An empty
pattern row gives 0.

The front end lowers them to forms the planner and executor already run,
with the pattern indicator ``P = A[i,j] / A[i,j]`` (1 on stored entries,
0 elsewhere by ``0/x = 0``; sparse on ``A``'s pattern, so only stored entries
are visited)::

    sum(j in A[i,j], e)  ->  sum(j, P * e)
    max(j in A[i,j], e)  ->  max(j, P * (e - c)) + c,   c = min(j', P' * e')
    min(j in A[i,j], e)  ->  min(j, P * (e - c)) + c,   c = max(j', P' * e')

``c`` bounds the stored values from the other side (the fill zeros included),
so ``e - c`` has the sign that makes every unstored position lose; the result
is exact up to one rounding of ``(e - c) + c``.  A stored entry whose value is
0 (or not finite) counts as absent.
"""
from __future__ import annotations

from spfuse.frontend.ast import _NOSPAN, Access, Assignment, Binary, Expr, Program, Reduce, Span, Unary, Where
from spfuse.passes.rename import rename

__all__ = ["lower_pattern_reduction", "lower_pattern_reductions"]

_OTHER = {"max": "min", "min": "max"}


def lower_pattern_reduction(op: str, index: str, pattern: Access, body: Expr, bound_name: str,
                            span: Span = _NOSPAN) -> Expr:
    """The plain-reduction form of ``op(index in pattern, body)`` (``body``'s
    reductions already explicit); ``bound_name`` is a fresh index name for the
    bound ``c`` of max/min.

    >>> from spfuse.frontend.canonical import to_text
    >>> A, S = Access("A", ("i", "j")), Access("S", ("i", "j"))
    >>> print(to_text(lower_pattern_reduction("sum", "j", A, S, "j_")))
    sum(j, A[i, j] / A[i, j] * S[i, j])
    >>> print(to_text(lower_pattern_reduction("max", "j", A, S, "j_")))  # doctest: +ELLIPSIS
    max(j, A[i, j] / A[i, j] * (S[i, j] - min(j_, A[i, j_] / A[i, j_] * S[i, j_]))) + min(j_, ...)
    """
    indicator = Binary("/", pattern, pattern, pattern.span)
    if op == "sum":
        return Reduce("sum", index, Binary("*", indicator, body, span), span)
    bound = Reduce(_OTHER[op], bound_name,
                   Binary("*", rename(indicator, index, bound_name), rename(body, index, bound_name), span), span)
    shifted = Binary("*", indicator, Binary("-", body, bound, span), span)
    return Binary("+", Reduce(op, index, shifted, span), bound, span)


def _indices(e: Expr, out: set) -> set:
    if isinstance(e, Access):
        out.update(e.indices)
    elif isinstance(e, Binary):
        _indices(e.left, out)
        _indices(e.right, out)
    elif isinstance(e, Unary):
        _indices(e.arg, out)
    elif isinstance(e, Where):
        for c in (e.cond, e.then, e.other):
            _indices(c, out)
    elif isinstance(e, Reduce):
        out.add(e.index)
        if e.pattern is not None:
            out.update(e.pattern.indices)
        _indices(e.body, out)
    return out


def _lower(e: Expr, taken: set) -> Expr:
    if isinstance(e, Binary):
        return Binary(e.op, _lower(e.left, taken), _lower(e.right, taken), e.span)
    if isinstance(e, Unary):
        return Unary(e.fn, _lower(e.arg, taken), e.span)
    if isinstance(e, Where):
        return Where(_lower(e.cond, taken), _lower(e.then, taken), _lower(e.other, taken), e.span)
    if isinstance(e, Reduce):
        body = _lower(e.body, taken)
        if e.pattern is None:
            return Reduce(e.op, e.index, body, e.span, e.implicit)
        bound = next(f"{e.index}_{n}" if n else f"{e.index}_" for n in range(10**6)
                     if (f"{e.index}_{n}" if n else f"{e.index}_") not in taken)
        taken.add(bound)
        return lower_pattern_reduction(e.op, e.index, e.pattern, body, bound, e.span)
    return e


def lower_pattern_reductions(program: Program) -> Program:
    """Every ``op(j in A[...], e)`` of ``program`` in its plain-reduction form
    (run after implicit reductions are made explicit).

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.frontend.canonical import to_text
    >>> print(to_text(parse_program("Z[i] = sum(j in A[i,j], exp(S[i,j]))")))
    Z[i] = sum(j, A[i, j] / A[i, j] * exp(S[i, j]))
    """
    statements = []
    changed = False
    for st in program.statements:
        taken = _indices(st.value, set(st.target.indices))
        value = _lower(st.value, taken)
        if value != st.value or _has_pattern(st.value):
            changed = True
            st = Assignment(st.target, value, st.span)
        statements.append(st)
    return Program(tuple(statements), program.text) if changed else program


def _has_pattern(e: Expr) -> bool:
    if isinstance(e, Reduce):
        return e.pattern is not None or _has_pattern(e.body)
    if isinstance(e, Binary):
        return _has_pattern(e.left) or _has_pattern(e.right)
    if isinstance(e, Unary):
        return _has_pattern(e.arg)
    if isinstance(e, Where):
        return any(_has_pattern(c) for c in (e.cond, e.then, e.other))
    return False
