"""TACO-style maximal fusion: each statement as one loop nest.

A statement whose sums all lift to its top by distributivity (through
``*``, the numerator of ``/`` and ``neg``) is one perfectly nested loop.
Any other -- ``A[i,j]*x[j] + b[i]``, ``B / sum(k, C*D)`` (SDDMM-div),
``exp(sum(...))`` -- is nested as TACO's concrete index notation does with
``where``: each outermost reduction that does not lift is computed into a
workspace (``y_w0[i] = sum(j, A[i,j]*x[j])``) by its own loops, fused with
the consumer's loops over the indices they share (:func:`where_fused`), so
the workspace shrinks to what the inner loops need -- a scalar for SpMV
plus a vector:  ``for i: { t = 0; for j: t += A[i,j]*x[j]; y[i] = t + b[i] }``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Literal, Reduce, Unary, Where, iter_accesses
from spfuse.frontend.reductions import free_indices, leading_sums, map_children
from spfuse.ir.ops import Ref
from spfuse.ir.tree import Root
from spfuse.passes.rename import all_indices as _all_indices
from spfuse.passes.rename import distinct_binders
from spfuse.passes.rename import rename as _rename

__all__ = ["StatementOp", "lift_sums", "maximal_statement_ops", "where_split", "where_fused"]


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


def _spine(e: Expr) -> tuple[tuple[str, ...], str | None, Expr]:
    """``(indices, op, body)`` of the sums at the top of ``e``, or of its
    one max/min (``sum(j, sum(k, b))`` -> ``(("j", "k"), "sum", b)``: one
    loop nest accumulates them; a max/min op reduces over one index)."""
    if isinstance(e, Reduce) and e.pattern is None and e.op != "sum":
        return (e.index,), e.op, e.body
    bound, body = leading_sums(e)
    return tuple(bound), ("sum" if bound else None), body


def _respine(indices: tuple[str, ...], op: str | None, body: Expr) -> Expr:
    for ix in reversed(indices):
        assert op is not None
        body = Reduce(op, ix, body)
    return body


def where_split(stmt: Assignment, taken: set[str]) -> list[Assignment]:
    """``stmt`` as TACO's ``where`` nests it: unchanged when its reductions
    lift to the top; else each outermost reduction below the statement's own
    reduction spine that does not lift becomes a workspace statement (split
    again the same way), read where it was.  Workspace names are new
    (``taken`` grows with them).

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.frontend.canonical import to_text
    >>> st = parse_program("y[i] = A[i,j] * x[j] + b[i]").statements[0]
    >>> [to_text(s) for s in where_split(st, {"y", "A", "x", "b"})]
    ['y_w0[i] = sum(j, A[i, j] * x[j])', 'y[i] = y_w0[i] + b[i]']
    """
    value = distinct_binders(stmt)
    spine, op, body = _spine(value)
    if (op in ("max", "min") and not _has_reduce(body)) or (op != "max" and op != "min"
                                                              and lift_sums(value) is not None):
        return [Assignment(stmt.target, value, stmt.span)]
    bound = list(stmt.target.indices) + list(spine)
    hoisted: list[Assignment] = []

    def hoist(e: Expr) -> Expr:
        if not isinstance(e, Reduce):
            return map_children(e, hoist)
        name = next(f"{stmt.target.name}_w{k}" for k in range(len(taken) + 1)
                    if f"{stmt.target.name}_w{k}" not in taken)
        taken.add(name)
        free = set(free_indices(e))
        target = Access(name, tuple(ix for ix in bound if ix in free))
        hoisted.extend(where_split(Assignment(target, e), taken))
        return target

    rest = _respine(spine, op, hoist(body))
    return hoisted + [Assignment(stmt.target, rest, stmt.span)]


def maximal_statement_ops(program) -> tuple[StatementOp, ...]:
    """One :class:`StatementOp` per statement and per ``where`` workspace
    (:func:`where_split`), in program order; a workspace's op carries its
    statement's number."""
    out: list[StatementOp] = []
    taken = {a.name for st in program.statements for a in (st.target, *iter_accesses(st.value))}
    for n, stmt in enumerate(program.statements):
        for part in where_split(stmt, taken):
            value = part.value
            target = part.target
            if isinstance(value, Reduce) and value.op in ("max", "min") and not _has_reduce(value.body):
                out.append(StatementOp(len(out), target.name, target.indices, value.body, value.op,
                                       (value.index,), n))
                continue
            lifted = lift_sums(value)
            assert lifted is not None   # (where_split leaves only liftable statements)
            reduced, body = lifted
            out.append(StatementOp(len(out), target.name, target.indices, body,
                                   "sum" if reduced else None, reduced, n))
    return tuple(out)


def where_fused(unfused: Root, ops) -> Root:
    """``unfused`` (one loop chain per op, in op order) with the chains of
    one statement's ``where`` workspaces and the statement itself fused over
    their shared loops (the statements stay apart, one loop nest each)."""
    from spfuse.passes.fusion import trie_fuse
    children: list = []
    start = 0
    while start < len(ops):
        end = start + 1
        while end < len(ops) and ops[end].statement == ops[start].statement:
            end += 1
        part = unfused.children[start:end]
        children.extend(trie_fuse(Root(part)).children if end - start > 1 else part)
        start = end
    return Root(tuple(children))
