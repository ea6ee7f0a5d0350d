"""Alpha-renaming of reduction indices.

An explicit ``sum(k, ...)`` binds ``k`` inside it; the same name may also be
used (and summed on its own) elsewhere in the statement.  Passes that move
reductions or compare index names need every binder to be distinct, so each
binder whose name is also used outside its reduction gets a fresh name.
"""
from __future__ import annotations

from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Reduce, Unary, Where, iter_accesses

__all__ = ["all_indices", "rename", "distinct_binders"]


def all_indices(e: Expr) -> set[str]:
    """Every index name used by an access in ``e``."""
    return {ix for a in iter_accesses(e) for ix in a.indices}


def rename(e: Expr, old: str, new: str) -> Expr:
    """Rename free occurrences of index ``old`` (a Reduce over ``old`` shadows it)."""
    if isinstance(e, Access):
        return Access(e.name, tuple(new if ix == old else ix for ix in e.indices), e.span, e.index_spans)
    if isinstance(e, Binary):
        return Binary(e.op, rename(e.left, old, new), rename(e.right, old, new), e.span)
    if isinstance(e, Unary):
        return Unary(e.fn, rename(e.arg, old, new), e.span)
    if isinstance(e, Where):
        return Where(rename(e.cond, old, new), rename(e.then, old, new), rename(e.other, old, new), e.span)
    if isinstance(e, Reduce) and e.index != old:
        return Reduce(e.op, e.index, rename(e.body, old, new), e.span, e.implicit)
    return e


def _distinct(e: Expr, outside: set[str], taken: set[str]) -> Expr:
    if isinstance(e, Reduce):
        index, body = e.index, e.body
        if index in outside:
            index = next(f"{e.index}{k}" for k in range(1, 10**6) if f"{e.index}{k}" not in taken)
            taken.add(index)
            body = rename(body, e.index, index)
        return Reduce(e.op, index, _distinct(body, outside | {index}, taken), e.span, e.implicit)
    kids = (e.left, e.right) if isinstance(e, Binary) else (e.arg,) if isinstance(e, Unary) else \
        (e.cond, e.then, e.other) if isinstance(e, Where) else ()
    new = []
    for n, k in enumerate(kids):
        others = set().union(*(all_indices(o) for m, o in enumerate(kids) if m != n))
        new.append(_distinct(k, outside | others, taken))
    if isinstance(e, Binary):
        return Binary(e.op, new[0], new[1], e.span)
    if isinstance(e, Unary):
        return Unary(e.fn, new[0], e.span)
    if isinstance(e, Where):
        return Where(new[0], new[1], new[2], e.span)
    return e


def distinct_binders(stmt: Assignment) -> Expr:
    """``stmt.value`` with every reduction binder distinct from all other uses.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.frontend.canonical import to_text
    >>> s = parse_program("R[i] = A[i,k] * sum(k, B[k])").statements[0]
    >>> to_text(s.value)
    'sum(k, A[i, k]) * sum(k, B[k])'
    >>> to_text(distinct_binders(s))
    'sum(k1, A[i, k1]) * sum(k2, B[k2])'
    """
    taken = all_indices(stmt.value) | set(stmt.target.indices)
    return _distinct(stmt.value, set(stmt.target.indices), taken)
