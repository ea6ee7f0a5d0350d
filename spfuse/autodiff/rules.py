"""Local derivatives: for each construct, the factors that carry an adjoint
from a node down to one of its children.

A factor is ``("*", e)`` or ``("/", e)``: the child's adjoint is the
parent's adjoint multiplied (divided) by ``e``.  Every factor is itself an
index-notation expression, so the chain of factors from a statement's root
to an operand access *is* the adjoint expression of that access.

Conventions (each chosen to match torch's dense autograd on densified operands):

* ``relu'(x) = where(relu(x), 1, 0)``: 0 at ``x = 0``, as torch.
* ``abs'(x) = abs(x) / x``: with spfuse's ``0 / x = 0`` this is ``sign(x)``
  with ``sign(0) = 0``, as torch.
* ``sqrt'(x) = 1 / (2 sqrt(x))``: ``inf`` at 0, as torch.
* ``where(c, a, b)``: the adjoint goes to ``a`` where ``c != 0`` and to ``b``
  elsewhere; ``c`` is piecewise constant and gets none.
* ``max``/``min`` reductions mirror ``torch.amax``/``torch.amin``: the adjoint
  is split evenly between tied extrema (``torch.max(x, dim)`` would pick one).
"""
from __future__ import annotations

from spfuse.frontend.ast import Binary, Expr, Literal, Unary, Where

__all__ = ["ONE", "ZERO", "unary_factors", "binary_factors", "where_factors"]

ONE, ZERO = Literal(1.0), Literal(0.0)

Factor = tuple[str, Expr]


def unary_factors(fn: str, arg: Expr) -> tuple[list[Factor], bool]:
    """Factors carrying ``fn(arg)``'s adjoint to ``arg``, and whether the sign flips.

    >>> from spfuse.frontend.ast import Access
    >>> from spfuse.frontend.canonical import to_text
    >>> factors, negate = unary_factors("tanh", Access("x", ("i",)))
    >>> [(op, to_text(e)) for op, e in factors], negate
    ([('*', '1.0 - tanh(x[i]) * tanh(x[i])')], False)
    """
    value = Unary(fn, arg)
    if fn == "neg":
        return [], True
    if fn == "relu":
        return [("*", Where(value, ONE, ZERO))], False
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

    ``d(l/r)/dr = -l/r/r``: zero wherever ``l`` is, as spfuse's ``0/x = 0`` requires.

    >>> from spfuse.frontend.ast import Access
    >>> (lf, ln), (rf, rn) = binary_factors("/", Access("a", ()), Access("b", ()))
    >>> [op for op, _ in lf], ln, [op for op, _ in rf], rn
    (['/'], False, ['*', '/', '/'], True)
    """
    if op == "+":
        return ([], False), ([], False)
    if op == "-":
        return ([], False), ([], True)
    if op == "*":
        return ([("*", right)], False), ([("*", left)], False)
    if op == "/":
        return ([("/", right)], False), ([("*", left), ("/", right), ("/", right)], True)
    raise ValueError(f"no derivative rule for operator {op!r}")


def where_factors(cond: Expr) -> tuple[Factor, Factor]:
    """Indicator factors routing ``where(cond, a, b)``'s adjoint to ``a`` and to ``b``.

    >>> from spfuse.frontend.ast import Access
    >>> from spfuse.frontend.canonical import to_text
    >>> [to_text(e) for _, e in where_factors(Access("c", ("i",)))]
    ['where(c[i], 1.0, 0.0)', 'where(c[i], 0.0, 1.0)']
    """
    return ("*", Where(cond, ONE, ZERO)), ("*", Where(cond, ZERO, ONE))
