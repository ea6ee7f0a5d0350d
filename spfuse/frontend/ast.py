"""Expression AST produced by the front end and consumed by ``spfuse.ir``.

Nodes are frozen dataclasses: hashable, comparable with ``==`` (spans are
excluded from comparison so structural tests stay readable), safe to share.
Every node keeps the character span of the text it came from so later stages
can point a caret at it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

__all__ = [
    "Span", "Access", "Literal", "Binary", "Unary", "Where", "Reduce",
    "Assignment", "Program", "Expr", "BINARY_OPS", "UNARY_FUNCTIONS", "REDUCTIONS",
]

BINARY_OPS = ("+", "-", "*", "/")
UNARY_FUNCTIONS = ("relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "neg")
REDUCTIONS = ("sum", "max", "min")


@dataclass(frozen=True)
class Span:
    """Half-open character range ``[start, end)`` in the program text."""

    start: int
    end: int


_NOSPAN = Span(0, 0)


@dataclass(frozen=True)
class Access:
    """``name[i, j, ...]``; a 0-d operand has ``indices == ()``."""

    name: str
    indices: tuple[str, ...]
    span: Span = field(default=_NOSPAN, compare=False)
    index_spans: tuple[Span, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Literal:
    """A numeric scalar constant."""

    value: float
    span: Span = field(default=_NOSPAN, compare=False)


@dataclass(frozen=True)
class Binary:
    """``left op right`` with ``op`` one of ``+ - * /`` (element-wise)."""

    op: str
    left: Expr
    right: Expr
    span: Span = field(default=_NOSPAN, compare=False)


@dataclass(frozen=True)
class Unary:
    """``fn(arg)`` for ``fn`` in :data:`UNARY_FUNCTIONS`; ``-x`` parses as ``neg(x)``."""

    fn: str
    arg: Expr
    span: Span = field(default=_NOSPAN, compare=False)


@dataclass(frozen=True)
class Where:
    """``where(cond, then, other)``: ``then`` where ``cond != 0``, else ``other``."""

    cond: Expr
    then: Expr
    other: Expr
    span: Span = field(default=_NOSPAN, compare=False)


@dataclass(frozen=True)
class Reduce:
    """``op(index, body)`` for ``op`` in :data:`REDUCTIONS`.

    Implicit reductions (an index absent from the left side) are made explicit
    by the front end as ``Reduce("sum", index, smallest_enclosing_subexpr)``.
    """

    op: str
    index: str
    body: Expr
    span: Span = field(default=_NOSPAN, compare=False)
    implicit: bool = field(default=False, compare=False)
    #: ``op(index in pattern, body)``: only where ``pattern`` is stored
    #: (:mod:`spfuse.frontend.patterns`; lowered away by ``parse_program``).
    pattern: Access | None = None


Expr = Access | Literal | Binary | Unary | Where | Reduce


@dataclass(frozen=True)
class Assignment:
    """``target = value``; ``target`` is an :class:`Access` of free indices."""

    target: Access
    value: Expr
    span: Span = field(default=_NOSPAN, compare=False)


@dataclass(frozen=True)
class Program:
    """A straight-line program: statements in order, plus the source text."""

    statements: tuple[Assignment, ...]
    text: str = field(default="", compare=False)

    def __hash__(self) -> int:
        # Programs key the plan caches: hash the statement tree once, not per call.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(self.statements)
            object.__setattr__(self, "_hash", h)
        return h

    @functools.cached_property
    def assigned(self) -> tuple[str, ...]:
        """Names assigned, in assignment order."""
        return tuple(s.target.name for s in self.statements)

    @functools.cached_property
    def inputs(self) -> tuple[str, ...]:
        """Names read before (or without) being assigned, in order of first use."""
        seen: dict[str, None] = {}
        assigned: set[str] = set()
        for s in self.statements:
            for a in iter_accesses(s.value):
                if a.name not in assigned:
                    seen.setdefault(a.name, None)
            assigned.add(s.target.name)
        return tuple(seen)

    @functools.cached_property
    def results(self) -> tuple[str, ...]:
        """Names assigned and never read by a later statement (what is returned)."""
        out = []
        for k, s in enumerate(self.statements):
            later = self.statements[k + 1:]
            if not any(a.name == s.target.name for t in later for a in iter_accesses(t.value)):
                out.append(s.target.name)
        return tuple(dict.fromkeys(out))


def iter_accesses(expr: Expr):
    """Yield every :class:`Access` in ``expr``, left to right."""
    if isinstance(expr, Access):
        yield expr
    elif isinstance(expr, Binary):
        yield from iter_accesses(expr.left)
        yield from iter_accesses(expr.right)
    elif isinstance(expr, Unary):
        yield from iter_accesses(expr.arg)
    elif isinstance(expr, Where):
        yield from iter_accesses(expr.cond)
        yield from iter_accesses(expr.then)
        yield from iter_accesses(expr.other)
    elif isinstance(expr, Reduce):
        yield from iter_accesses(expr.body)
