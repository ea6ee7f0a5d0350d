"""Common subexpressions: a unit operation computed twice is computed once.

Decomposing a program names every compound sub-expression, so one
expression written twice becomes two unit operations: ``exp(x[i]) / (1 +
exp(x[i]))`` computed ``exp`` twice, ``sum(j, A[i,j] * x[j]) * sum(k, x[k] *
A[i,k])`` the product twice.

:func:`eliminate_common_subexpressions` keeps the first of equal operations
and makes every reader of a later one read the first, within a statement: a
pure function from unit operations to unit operations.  Two operations are
equal when they apply the same operator, coefficients and reduction to the
same operands at the same positions.  The indices an operation reduces are
its own, so their names do not matter (``sum(j, ...)`` and ``sum(k, ...)``
above are equal); the free ones do: they place the operation in its
statement's loops, and ``S[i,j] - m[i]`` under the ``j`` of an element-wise
product and ``S[i,j_1] - m[i]`` under a ``sum(j_1, ...)`` are visited on
different sets of positions -- shared, one temporary would be computed on
the union of both, densely (measured: a pattern program fell back to the
generic executor that way).  Only the planner's own temporaries go: a
named statement target stays, and so does anything assigned twice.  An
operation reading only dense inputs is shared across statements too: it
is visited on every position of its indices wherever it stands (a
gradient's ``grad_A·Wᵀ``, written in two adjoint statements, was two BLAS
calls).  The
two arguments of a ``*`` or a ``+`` may come in either order (both commute
exactly in floating point); longer sums keep their order, which fixes their
rounding.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from spfuse.ir.ops import Const, Leaf, Ref, UnitOp

__all__ = ["eliminate_common_subexpressions"]

#: operators whose two arguments commute exactly
_COMMUTATIVE = frozenset({"*", "+"})


def eliminate_common_subexpressions(ops: Iterable[UnitOp], kept: Collection[str],
                                    dense_inputs: Collection[str] = ()) -> tuple[UnitOp, ...]:
    """``ops`` without the repeats of an earlier operation, numbered again
    in order; ``kept``: names that must stay computed (statement targets,
    results); ``dense_inputs``: the program's dense operands (an operation
    reading only these is shared across statements).

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.passes.decompose import decompose
    >>> p = parse_program("y[i] = sum(j, A[i,j] * x[j]) * sum(k, x[k] * A[i,k])")
    >>> for op in decompose(p): print(op)
    T0[i] = sum(j, A[i,j] * x[j])
    T1[i] = sum(k, x[k] * A[i,k])
    y[i] = T0[i] * T1[i]
    >>> for op in eliminate_common_subexpressions(decompose(p), {"y"}): print(op)
    T0[i] = sum(j, A[i,j] * x[j])
    y[i] = T0[i] * T0[i]
    >>> p = parse_program("y[i] = sum(j, A[i,j] * sum(k, G[i,k] * W[j,k])); "
    ...                   "z[j] = sum(i, B[i,j] * sum(k, G[i,k] * W[j,k]))")
    >>> for op in eliminate_common_subexpressions(decompose(p), {"y", "z"}, {"G", "W"}): print(op)
    T0[i,j] = sum(k, G[i,k] * W[j,k])
    y[i] = sum(j, A[i,j] * T0[i,j])
    z[j] = sum(i, B[i,j] * T0[i,j])
    """
    ops = tuple(ops)
    assigned: dict[str, int] = {}
    for op in ops:
        assigned[op.out] = assigned.get(op.out, 0) + 1
    renamed: dict[str, str] = {}
    first: dict[tuple, str] = {}
    out: list[UnitOp] = []
    for op in ops:
        args = tuple(Ref(renamed.get(a.name, a.name), a.indices) if isinstance(a, Ref) else a for a in op.args)
        if args != op.args or op.id != len(out):   # (ids stay positions: later passes index by them)
            op = replace(op, id=len(out), args=args)
        # (shared across statements: a temporary only -- a kept name read
        # by a later statement would be a result read back)
        shared = all(a.name in dense_inputs for a in op.refs)
        key = (None if shared else op.statement, _canonical(op))
        if assigned[op.out] == 1 and not any(a.name == op.out for a in op.refs):
            earlier = first.get(key)
            if earlier is not None and op.out not in kept:
                renamed[op.out] = earlier
                continue
            if not (shared and op.out in kept):
                first.setdefault(key, op.out)
        out.append(op)
    return tuple(out)


def _canonical(op: UnitOp) -> tuple:
    """What ``op`` computes, its reduced indices named by their positions in
    the reduction (the free ones keep their names)."""
    bound = {ix: f"#{n}" for n, ix in enumerate(op.reduced)}   # ('#': in no index name)

    def leaf(a: Leaf) -> tuple:
        if isinstance(a, Const):
            return ("const", float(a.value).hex())
        return ("ref", a.name, tuple(bound.get(ix, ix) for ix in a.indices))

    args = tuple(leaf(a) for a in op.args)
    coefs = tuple(float(c).hex() for c in op.coefficients)
    if op.operator in _COMMUTATIVE and len(args) == 2 and coefs[0] == coefs[1]:
        args = tuple(sorted(args))
    return (op.operator, op.out_indices, op.reduction, len(op.reduced), args, coefs)
