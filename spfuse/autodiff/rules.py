"""Local derivatives: for each construct, the factors that carry an adjoint
from a node down to one of its children.

A factor is ``("*", e)`` or ``("/", e)``: the child's adjoint is the
parent's adjoint multiplied (divided) by ``e``; or a selection ``("then", c)``
/ ``("else", c)``: the adjoint where ``c != 0`` (``c == 0``), else 0 -- a
select, not a product with an indicator, so an ``inf``/``nan`` adjoint on the
unselected side is dropped, as torch's ``where`` and ``relu`` backward drop it.  Every factor is itself an
index-notation expression, so the chain of factors from a statement's root
to an operand access *is* the adjoint expression of that access.

Conventions (each chosen to match torch's dense autograd on densified operands):

* ``relu'``: the adjoint where ``relu(x) != 0`` (``x > 0``), else 0 (also at 0), as torch.
* ``abs'(x) = abs(x) / x``: with spfuse's ``0 / x = 0`` this is ``sign(x)``
  with ``sign(0) = 0``, as torch.
* ``sqrt'(x) = 1 / (2 sqrt(x))``: ``inf`` at 0, as torch.
* ``l / r``: the gradient to ``l`` is 0 where ``r == 0`` (see :func:`binary_factors`).
* ``where(c, a, b)``: the adjoint goes to ``a`` where ``c != 0`` and to ``b``
  elsewhere; ``c`` is piecewise constant and gets none.
* ``max``/``min`` reductions mirror ``torch.amax``/``torch.amin``: the adjoint
  is split evenly between tied extrema (``torch.max(x, dim)`` would pick one).
"""
from __future__ import annotations

from spfuse.frontend.ast import Binary, Expr, Literal, Unary, Where

__all__ = ["ONE", "ZERO", "apply_factor", "binary_factors", "unary_factors", "where_factors"]

ONE, ZERO = Literal(1.0), Literal(0.0)

Factor = tuple[str, Expr]


def unary_factors(fn: str, arg: Expr, value: Expr | None = None) -> tuple[list[Factor], bool]:
    """Factors carrying ``fn(arg)``'s adjoint to ``arg``, and whether the sign flips.

    ``value``: an expression equal to ``fn(arg)`` to read instead of
    recomputing it (a forward temporary holding it): ``sigmoid'`` is then
    ``T * (1 - T)``, ``relu'`` selects where ``T != 0``, ``exp'`` is ``T``.

    >>> from spfuse.frontend.ast import Access
    >>> from spfuse.frontend.canonical import to_text
    >>> factors, negate = unary_factors("tanh", Access("x", ("i",)))
    >>> [(op, to_text(e)) for op, e in factors], negate
    ([('*', '1.0 - tanh(x[i]) * tanh(x[i])')], False)
    >>> [(op, to_text(e)) for op, e in unary_factors("sigmoid", Access("x", ("i",)), Access("T", ("i",)))[0]]
    [('*', 'T[i] * (1.0 - T[i])')]
    """
    if value is None:
        value = Unary(fn, arg)
    if fn == "neg":
        return [], True
    if fn == "relu":
        return [("then", value)], False
    if fn == "sigmoid":
        return [("*", Binary("*", value, Binary("-", ONE, value)))], False
    if fn == "tanh":
        return [("*", Binary("-", ONE, Binary("*", value, value)))], False
    if fn == "exp":
        return [("*", value)], False
    if fn == "log":
        return [("/", arg)], False
    if fn == "abs":
        return [("*", Binary("/", value, arg))], False
    if fn == "sqrt":
        return [("/", Binary("*", Literal(2.0), value))], False
    raise ValueError(f"no derivative rule for unary function {fn!r}")


def binary_factors(op: str, left: Expr, right: Expr) -> tuple[tuple[list[Factor], bool], tuple[list[Factor], bool]]:
    """Factors (and sign flips) to the left and to the right operand of ``left op right``.

    ``d(l/r)/dr = -l/r/r``: zero wherever ``l`` is, as spfuse's ``0/x = 0`` requires;
    ``d(l/r)/dl = 1/r`` where ``r != 0`` and 0 where ``r == 0`` (the only finite
    value there is ``0/0 = 0``; the gradient through it is 0, as torch.sparse
    gives for the softmax of an empty row).

    >>> from spfuse.frontend.ast import Access
    >>> (lf, ln), (rf, rn) = binary_factors("/", Access("a", ()), Access("b", ()))
    >>> [op for op, _ in lf], ln, [op for op, _ in rf], rn
    (['*'], False, ['*', '/', '/'], True)
    """
    if op == "+":
        return ([], False), ([], False)
    if op == "-":
        return ([], False), ([], True)
    if op == "*":
        return ([("*", right)], False), ([("*", left)], False)
    if op == "/":
        # d/dl = 1/r, except 0 where r == 0: there l/r is only finite as 0/0 = 0
        # (an empty row's sum, say), and that zero is a constant, as in torch.sparse
        reciprocal = Where(right, Binary("/", ONE, right), ZERO)
        return ([("*", reciprocal)], False), ([("*", left), ("/", right), ("/", right)], True)
    raise ValueError(f"no derivative rule for operator {op!r}")


def where_factors(cond: Expr) -> tuple[Factor, Factor]:
    """Selections routing ``where(cond, a, b)``'s adjoint to ``a`` and to ``b``.

    >>> from spfuse.frontend.ast import Access
    >>> where_factors(Access("c", ("i",)))[1][0]
    'else'
    """
    return ("then", cond), ("else", cond)


def apply_factor(adjoint: Expr, op: str, factor: Expr) -> Expr:
    """``adjoint`` carried through one factor.

    >>> from spfuse.frontend.ast import Access
    >>> from spfuse.frontend.canonical import to_text
    >>> to_text(apply_factor(Access("g", ("i",)), "then", Access("c", ("i",))))
    'where(c[i], g[i], 0.0)'
    """
    if op == "then":
        return Where(factor, adjoint, ZERO)
    if op == "else":
        return Where(factor, ZERO, adjoint)
    return Binary(op, adjoint, factor)
