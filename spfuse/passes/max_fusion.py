"""TACO-style maximal fusion: each statement as one perfectly nested loop.

Legal only when every sum can be lifted to the top of the statement by
distributivity (through ``*``, the numerator of ``/`` and ``neg``).  Other
statements -- ``B / sum(k, C*D)`` (SDDMM-div), ``exp(sum(...))``,
``a + sum(...)`` -- are what TACO reports as unsupported; so do we.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import Access, Binary, Expr, Literal, Reduce, Unary, Where, iter_accesses
from spfuse.ir.ops import Ref
from spfuse.passes.rename import all_indices as _all_indices
from spfuse.passes.rename import distinct_binders
from spfuse.passes.rename import rename as _rename

__all__ = ["StatementOp", "lift_sums", "maximal_statement_ops"]


@dataclass(frozen=True)
class StatementOp:
    """A whole statement computed in one loop nest (duck-types ``UnitOp``)."""

    id: int
    out: str
    out_indices: tuple[str, ...]
    expr: Expr
    reduction: str | None
    reduced: tuple[str, ...]
    statement: int
    operator: str | None = field(default=None)

    @property
    def refs(self) -> tuple[Ref, ...]:
        return tuple(Ref(a.name, a.indices) for a in iter_accesses(self.expr))

    @property
    def args(self):
        return self.refs

    @property
    def indices(self) -> tuple[str, ...]:
        seen = dict.fromkeys(self.out_indices)
        seen.update(dict.fromkeys(self.reduced))
        for r in self.refs:
            seen.update(dict.fromkeys(r.indices))
        return tuple(seen)

    def expr_text(self) -> str:
        from spfuse.frontend.canonical import to_text
        body = to_text(self.expr)
        for ix in reversed(self.reduced):
            body = f"{self.reduction}({ix}, {body})"
        return body

    def __str__(self) -> str:
        return f"{Ref(self.out, self.out_indices)} = {self.expr_text()}"


def _has_reduce(e: Expr) -> bool:
    if isinstance(e, Reduce):
        return True
    if isinstance(e, Binary):
        return _has_reduce(e.left) or _has_reduce(e.right)
    if isinstance(e, Unary):
        return _has_reduce(e.arg)
    if isinstance(e, Where):
        return any(_has_reduce(c) for c in (e.cond, e.then, e.other))
    return False


def lift_sums(e: Expr) -> tuple[tuple[str, ...], Expr] | None:
    """``(summed indices, body)`` with every sum lifted to the top, or ``None``
    when distributivity does not allow it.

    >>> from spfuse.frontend.ast import Access, Binary, Reduce
    >>> B, C, D = Access("B", ("i", "j")), Access("C", ("i", "k")), Access("D", ("k", "j"))
    >>> lift_sums(Binary("*", B, Reduce("sum", "k", Binary("*", C, D))))[0]
    ('k',)
    >>> lift_sums(Binary("/", B, Reduce("sum", "k", Binary("*", C, D)))) is None
    True
    """
    if isinstance(e, (Access, Literal)):
        return (), e
    if isinstance(e, Reduce):
        if e.op != "sum":
            return None
        inner = lift_sums(e.body)
        return None if inner is None else ((e.index,) + inner[0], inner[1])
    if isinstance(e, Binary):
        if e.op == "*":
            a, b = lift_sums(e.left), lift_sums(e.right)
            if a is None or b is None:
                return None
            # Sums lifted from both sides may reuse an index name (each side
            # bound its own): rename the right side's apart before merging.
            taken = set(a[0]) | _all_indices(a[1]) | _all_indices(e)
            b_idx, b_body = list(b[0]), b[1]
            for n, ix in enumerate(b_idx):
                if ix in a[0] or (ix in _all_indices(a[1]) and ix not in a[0]):
                    fresh = next(f"{ix}{k}" for k in range(1, 1000) if f"{ix}{k}" not in taken)
                    taken.add(fresh)
                    b_body = _rename(b_body, ix, fresh)
                    b_idx[n] = fresh
            return a[0] + tuple(b_idx), Binary("*", a[1], b_body, e.span)
        if e.op == "/":
            a = lift_sums(e.left)
            if a is None or _has_reduce(e.right):
                return None
            return a[0], Binary("/", a[1], e.right, e.span)
        return None if _has_reduce(e) else ((), e)
    if isinstance(e, Unary) and e.fn == "neg":
        a = lift_sums(e.arg)
        return None if a is None else (a[0], Unary("neg", a[1], e.span))
    return None if _has_reduce(e) else ((), e)


def maximal_statement_ops(program) -> tuple[StatementOp, ...]:
    """One :class:`StatementOp` per statement, or :class:`UnsupportedError`."""
    out = []
    for n, stmt in enumerate(program.statements):
        value = stmt.value
        if isinstance(value, Reduce) and value.op in ("max", "min") and not _has_reduce(value.body):
            out.append(StatementOp(n, stmt.target.name, stmt.target.indices, value.body, value.op,
                                   (value.index,), n))
            continue
        value = distinct_binders(stmt)
        lifted = lift_sums(value)
        if lifted is None:
            from spfuse.frontend.canonical import to_text
            raise UnsupportedError(
                f"fusion='max' cannot nest statement {n} in one loop: "
                f"'{to_text(stmt.target)} = {to_text(value)}' is not distributive over its "
                "reductions (TACO rejects it too). Hint: use fusion='auto'.")
        reduced, body = lifted
        out.append(StatementOp(n, stmt.target.name, stmt.target.indices, body,
                               "sum" if reduced else None, reduced, n))
    return tuple(out)
