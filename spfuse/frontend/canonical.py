"""Printing programs: :func:`to_text` (round-trips through the parser) and
:func:`canonical_key` (alpha-canonical text used as the plan-cache key)."""
from __future__ import annotations

import math

from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Literal, Program, Reduce, Unary, Where

__all__ = ["to_text", "canonical_key"]

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


class _Identity(dict):
    __slots__ = ()

    def __missing__(self, key):
        return key


class _Renamer(dict):
    """``i0, i1, ...`` in order of first lookup (= order of appearance in print)."""

    __slots__ = ()

    def __missing__(self, key):
        v = self[key] = f"i{len(self)}"
        return v


def _prec(e: Expr) -> int:
    t = type(e)
    if t is Binary:
        return _PREC[e.op]
    if t is Unary and e.fn == "neg":
        return 3
    return 4


def _literal(value: float) -> str:
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"a literal {v!r} has no text form; write it as a computed value")
    return repr(v) if v >= 0 else f"({v!r})"


def _fmt(e: Expr, ren: dict) -> str:
    t = type(e)
    if t is Access:
        if not e.indices:
            return e.name
        return f"{e.name}[{', '.join([ren[k] for k in e.indices])}]"
    if t is Binary:
        p = _PREC[e.op]
        left = _fmt(e.left, ren)
        if _prec(e.left) < p:
            left = f"({left})"
        right = _fmt(e.right, ren)
        if _prec(e.right) <= p:
            right = f"({right})"
        return f"{left} {e.op} {right}"
    if t is Reduce:
        op = e.op
        if e.pattern is not None:
            return f"{op}({ren[e.index]} in {_fmt(e.pattern, ren)}, {_fmt(e.body, ren)})"
        idx = [ren[e.index]]
        body = e.body
        while type(body) is Reduce and body.op == op and body.pattern is None:
            idx.append(ren[body.index])
            body = body.body
        return f"{op}({', '.join(idx)}, {_fmt(body, ren)})"
    if t is Unary:
        if e.fn == "neg":
            arg = _fmt(e.arg, ren)
            return f"-{arg}" if _prec(e.arg) >= 3 else f"-({arg})"
        return f"{e.fn}({_fmt(e.arg, ren)})"
    if t is Literal:
        return _literal(e.value)
    if t is Where:
        return f"where({_fmt(e.cond, ren)}, {_fmt(e.then, ren)}, {_fmt(e.other, ren)})"
    raise TypeError(f"expected an expression node, got {type(e).__name__}")


def _statement(s: Assignment, ren: dict) -> str:
    return f"{_fmt(s.target, ren)} = {_fmt(s.value, ren)}"


def to_text(node: Program | Assignment | Expr) -> str:
    """Print a program, statement or expression in index notation.

    Parentheses appear only where the tree needs them, reductions (implicit
    ones too) print as ``sum(k, ...)`` with nested reductions of the same kind
    merged, 0-d operands print bare, and ``parse(to_text(p)) == p``. Negative
    literals print parenthesised (``(-2.0)``) and re-parse as ``neg(2.0)``;
    non-finite literals raise ``ValueError``.

    >>> from spfuse.frontend.parser import parse_program
    >>> print(to_text(parse_program("A[i,j] = B[i,j] / (C[i,k]*D[k,j]) - -(x + 1)")))
    A[i, j] = B[i, j] / sum(k, C[i, k] * D[k, j]) - -(x + 1.0)
    """
    ren = _Identity()
    if isinstance(node, Program):
        return "\n".join([_statement(s, ren) for s in node.statements])
    if isinstance(node, Assignment):
        return _statement(node, ren)
    return _fmt(node, ren)


def canonical_key(program: Program) -> str:
    """Alpha-canonical one-line text of ``program`` (the plan-cache key).

    Index names are renamed per statement in order of first appearance
    (``i0, i1, ...``); tensor names and structure are kept. Reductions are
    printed as they are in the tree, so pass programs from
    :func:`~spfuse.frontend.parser.parse_program`.

    >>> from spfuse.frontend.parser import parse_program
    >>> canonical_key(parse_program("C[i,k] = A[i,j]*B[j,k]"))
    'C[i0, i1] = sum(i2, A[i0, i2] * B[i2, i1])'
    >>> canonical_key(parse_program("C[a,c] = A[a,b]*B[b,c]")) == canonical_key(
    ...     parse_program("C[i,k] = A[i,j] * B[j,k]"))
    True
    """
    return "; ".join([_statement(s, _Renamer()) for s in program.statements])
