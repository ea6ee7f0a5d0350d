"""Alpha-renaming of reduction indices.

An explicit ``sum(k, ...)`` binds ``k`` inside it; the same name may also be
used (and summed on its own) elsewhere in the statement.  Passes that move
reductions or compare index names need every binder to be distinct, so each
binder whose name is also used outside its reduction gets a fresh name.
"""
from __future__ import annotations

from dataclasses import replace

from spfuse.frontend.ast import (
    Access,
    Assignment,
    Binary,
    Expr,
    Program,
    Reduce,
    Unary,
    Where,
    iter_accesses,
)
from spfuse.frontend.reductions import map_children

__all__ = ["all_indices", "rename", "distinct_binders", "alias_access", "operand_reads"]


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


def alias_access(program: Program, name: str, occurrence: int, alias: str) -> Program:
    """``program`` with its ``occurrence``-th read of operand ``name`` (counted
    left to right over the statements) reading operand ``alias`` instead.

    The planner binds ``alias`` to the same tensor stored in another order, so
    that one operand can be read in two storage orders (``Aᵀ·A``: one access
    by columns, one by rows).

    >>> from spfuse.frontend.parser import parse
    >>> p = alias_access(parse("C[j,k] = A[i,j] * A[i,k]"), "A", 1, "A_1")
    >>> [a.name for a in iter_accesses(p.statements[0].value)]
    ['A', 'A_1']
    """
    seen = [0]

    def visit(e: Expr) -> Expr:
        if isinstance(e, Access):
            if e.name != name:
                return e
            seen[0] += 1
            return replace(e, name=alias) if seen[0] - 1 == occurrence else e
        return map_children(e, visit)

    statements = tuple(replace(s, value=visit(s.value)) for s in program.statements)
    return replace(program, statements=statements)


def operand_reads(program: Program, name: str) -> int:
    """How many accesses read operand ``name``.

    >>> from spfuse.frontend.parser import parse
    >>> operand_reads(parse("C[j,k] = A[i,j] * A[i,k]"), "A")
    2
    """
    return sum(a.name == name for s in program.statements for a in iter_accesses(s.value))
