"""Make implicit reductions explicit.

In ``A[i,j] = B[i,j] / (C[i,k] * D[k,j])`` the index ``k`` is absent from
the left side, so it is summed over the *smallest sub-expression containing
all its free uses*: ``B / sum(k, C*D)``. Several indices whose smallest
sub-expression is the same node nest in order of first appearance (the first
one outermost). Indices bound by an explicit ``sum/max/min(k, ...)`` are not
free inside it.
"""
from __future__ import annotations

import re

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Literal, Program, Reduce, Unary, Where

__all__ = ["make_reductions_explicit", "free_indices", "children", "map_children", "bound_indices", "leading_sums",
           "reduce_index_position"]


def children(e: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions of ``e``, left to right.

    >>> for child in children(Binary("*", Access("A", ("i",)), Literal(2.0))):
    ...     print(child)
    Access(name='A', indices=('i',), span=Span(start=0, end=0), index_spans=())
    Literal(value=2.0, span=Span(start=0, end=0))
    """
    if isinstance(e, Binary):
        return (e.left, e.right)
    if isinstance(e, Unary):
        return (e.arg,)
    if isinstance(e, Reduce):
        return (e.body,)
    if isinstance(e, Where):
        return (e.cond, e.then, e.other)
    return ()


def bound_indices(e: Expr) -> set[str]:
    """Indices bound by a reduction somewhere inside ``e``.

    >>> sorted(bound_indices(Reduce("sum", "j", Reduce("max", "k", Access("A", ("i", "j", "k"))))))
    ['j', 'k']
    """
    out: set[str] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Reduce):
            out.add(node.index)
        stack.extend(children(node))
    return out


def map_children(e: Expr, f) -> Expr:
    """``e`` with ``f`` applied to each direct sub-expression (spans kept).

    >>> e = Binary("*", Access("A", ("i",)), Literal(2.0))
    >>> map_children(e, lambda c: Literal(3.0) if isinstance(c, Literal) else c).right.value
    3.0
    """
    return _rebuild(e, [f(c) for c in children(e)])


def _rebuild(e: Expr, kids: list) -> Expr:
    if isinstance(e, Binary):
        return Binary(e.op, kids[0], kids[1], e.span)
    if isinstance(e, Unary):
        return Unary(e.fn, kids[0], e.span)
    if isinstance(e, Reduce):
        return Reduce(e.op, e.index, kids[0], e.span, e.implicit, e.pattern)
    if isinstance(e, Where):
        return Where(kids[0], kids[1], kids[2], e.span)
    return e


def leading_sums(e: Expr) -> tuple[list[str], Expr]:
    """The indices of the plain sums ``e`` starts with (outermost first),
    and what they sum (a sum over a pattern is not plain).

    >>> e = Reduce("sum", "j", Reduce("sum", "k", Binary("*", Access("B", ("i", "j", "k")), Access("C", ("k",)))))
    >>> bound, body = leading_sums(e); bound, type(body).__name__
    (['j', 'k'], 'Binary')
    >>> leading_sums(Access("x", ("i",)))[0]
    []
    """
    bound: list[str] = []
    while isinstance(e, Reduce) and e.op == "sum" and e.pattern is None:
        bound.append(e.index)
        e = e.body
    return bound, e


def free_indices(e: Expr) -> tuple[str, ...]:
    """Indices used in ``e`` and not bound by a reduction inside it, in order
    of first appearance.

    >>> free_indices(Reduce("sum", "j", Binary("*", Access("A", ("i", "j")), Access("x", ("j",)))))
    ('i',)
    """
    counts: dict[str, int] = {}
    _count_free(e, (), counts, (), "", None)
    return tuple(counts)


_CALL_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*\(\s*([A-Za-z_]\w*)")


def reduce_index_position(text: str, red: Reduce) -> int | None:
    """Character position of ``red``'s index name in ``text`` (for carets);
    ``None`` when there is no text.

    >>> from spfuse.frontend.parser import parse
    >>> text = "y = sum(k, j, A[k,j])"
    >>> outer = parse(text).statements[0].value
    >>> reduce_index_position(text, outer), reduce_index_position(text, outer.body)
    (8, 11)
    """
    if not text:
        return None
    start = red.span.start
    m = _CALL_RE.match(text, start)
    if m and m.group(1) == red.op:
        return m.start(2)
    return start


def _count_free(e: Expr, bound: tuple, counts: dict, out: tuple, text: str, target) -> None:
    """Count free uses of every index (dict order = first appearance) and
    reject explicit reductions over an output index."""
    t = type(e)
    if t is Access:
        for k in e.indices:
            if k not in bound:
                counts[k] = counts.get(k, 0) + 1
    elif t is Binary:
        _count_free(e.left, bound, counts, out, text, target)
        _count_free(e.right, bound, counts, out, text, target)
    elif t is Reduce:
        if e.index in out:
            raise ProgramError(
                f"reduction index {e.index!r} also appears on the left side of "
                f"{target.name}[{', '.join(out)}]", text or None,
                reduce_index_position(text, e))
        if e.pattern is not None:
            _count_free(e.pattern, bound + (e.index,), counts, out, text, target)
        _count_free(e.body, bound + (e.index,), counts, out, text, target)
    elif t is not Literal:
        for c in children(e):
            _count_free(c, bound, counts, out, text, target)


def _wrap(e: Expr, total: dict, pending: list, bound: tuple) -> tuple[Expr, dict]:
    """Rebuild ``e`` bottom-up; return it with its counts of free uses of the
    still-pending implicit indices. An index is wrapped at the first (deepest)
    node whose count reaches its total."""
    t = type(e)
    if t is Access:
        counts: dict = {}
        for k in e.indices:
            if k in total and k not in bound:
                counts[k] = counts.get(k, 0) + 1
        node = e
    elif t is Literal:
        return e, {}
    else:
        kids = children(e)
        new = []
        counts = {}
        inner = bound + (e.index,) if t is Reduce else bound
        if t is Reduce and e.pattern is not None:  # the pattern's indices are uses too
            for k in e.pattern.indices:
                if k in total and k not in inner:
                    counts[k] = counts.get(k, 0) + 1
        for c in kids:
            nc, cc = _wrap(c, total, pending, inner)
            new.append(nc)
            for k, v in cc.items():
                counts[k] = counts.get(k, 0) + v
        node = e if all(a is b for a, b in zip(new, kids, strict=True)) else _rebuild(e, new)
    done = [k for k in pending if counts.get(k, 0) == total[k]]
    if done:
        for k in reversed(done):
            node = Reduce("sum", k, node, node.span, implicit=True)
            pending.remove(k)
            del counts[k]
    return node, counts


def _explicit_value(st: Assignment, text: str) -> Expr:
    target = st.target
    out = target.indices
    counts: dict[str, int] = {}
    _count_free(st.value, (), counts, out, text, target)
    for n, k in enumerate(out):
        if k not in counts:
            spans = target.index_spans
            raise ProgramError(f"output index {k!r} is not bound on the right",
                               text or None, spans[n].start if spans else None)
    if len(counts) == len(out):
        return st.value
    total = {k: v for k, v in counts.items() if k not in out}
    return _wrap(st.value, total, list(total), ())[0]


def make_reductions_explicit(program: Program) -> Program:
    """Wrap every implicitly reduced index in ``Reduce("sum", k, ..., implicit=True)``.

    Raises :class:`~spfuse.errors.ProgramError` when an output index is not
    used on the right, or an explicit reduction binds an output index.

    >>> from spfuse.frontend.parser import parse
    >>> from spfuse.frontend.canonical import to_text
    >>> p = make_reductions_explicit(parse("Z[i,j] = A[i,k] * X[k,h] * W[h,j]"))
    >>> print(to_text(p))
    Z[i, j] = sum(h, sum(k, A[i, k] * X[k, h]) * W[h, j])
    >>> make_reductions_explicit(parse("y[i,j] = A[i,k]"))
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: output index 'j' is not bound on the right
      y[i,j] = A[i,k]
          ^
    """
    statements = []
    changed = False
    for st in program.statements:
        value = _explicit_value(st, program.text)
        if value is not st.value:
            changed = True
            st = Assignment(st.target, value, st.span)
        statements.append(st)
    return Program(tuple(statements), program.text) if changed else program
