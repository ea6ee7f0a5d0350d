"""Which index variables of a program are distributed, and how each result is assembled.

A *dimension* is one partitioned extent: the row blocks of a sparse operand,
or the chunks of a dense dask operand along one axis.  Indices are scoped
per statement, so dimensions are tracked by *axis*: an input axis chunked
into blocks carries a dimension, every statement maps its indices to the
dimensions of the axes they touch, and a temporary's axes inherit the
dimension of their index.  Each index of a statement is then

* **distributed** (it carries a dimension and appears in the target: the
  result is assembled block by block),
* **contracted-and-distributed** (it carries a dimension and is summed over:
  every block computes a partial sum and the partials are added), or
* **local** (no dimension: the operands it indexes are broadcast whole).

A contraction over a dimension is exact only if the statement is *linear*
in that index (``sum_j(...)`` is the whole value, up to factors free of
``j``): adding the blocks' partials of ``relu(sum_j ...)`` or of
``sum_j(...) + b`` would be wrong, so such programs are refused.  A block
whose share of an operand is empty may be skipped when that operand
*annihilates* the statement (a zero operand gives a zero result: a factor of
a product, the numerator of a division -- spfuse's ``0/x = 0`` -- or both
sides of a sum).

Nothing here imports dask: the classification is plain data.

>>> from spfuse.frontend.parser import parse_program
>>> p = parse_program("C[i,k] = A[i,j] * B[j,k]")
>>> c = classify(p, {"A": ("rows", "cols"), "B": ("cols", None)})
>>> c.results["C"].out_dims, c.results["C"].contracted_dims
(('rows', None), ('cols',))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import (
    Access,
    Binary,
    Expr,
    Literal,
    Program,
    Reduce,
    Unary,
    Where,
    iter_accesses,
)

__all__ = ["ResultLayout", "Classification", "classify", "is_linear_in", "annihilated_by", "statement_of"]

#: Unary functions with f(0) == 0: a zero argument gives a zero result.
_ZERO_PRESERVING = frozenset({"relu", "tanh", "abs", "sqrt", "neg"})


@dataclass(frozen=True)
class ResultLayout:
    """How one result is assembled from the blocks.

    ``out_dims``: the dimension of each target axis (``None``: one whole
    chunk); ``contracted_dims``: dimensions summed over (partials added);
    ``index_dims``: the statement's index -> dimension map.
    """

    name: str
    out_dims: tuple
    contracted_dims: tuple
    index_dims: tuple  # ((index, dim), ...), sorted: hashable

    def index_of(self, dim) -> str:
        """The statement's index variable that carries ``dim``.

        >>> ResultLayout("y", ("r",), (), (("i", "r"),)).index_of("r")
        'i'
        """
        return next(i for i, d in self.index_dims if d == dim)


@dataclass(frozen=True)
class Classification:
    """Every dimension of a program and the layout of each result."""

    dims: tuple
    results: Mapping[str, ResultLayout]


def classify(program: Program, input_dims: Mapping[str, Sequence]) -> Classification:
    """Classify ``program``'s indices given the dimension of each input axis.

    ``input_dims[name]`` lists one entry per axis of input ``name``: a
    hashable dimension label, or ``None`` when the axis is not partitioned.
    Two axes joined by one index must carry the same dimension (or one of
    them none).

    >>> from spfuse.frontend.parser import parse_program
    >>> c = classify(parse_program("y[i] = A[i,j] * x[j]"), {"A": ("r", None), "x": (None,)})
    >>> c.results["y"]
    ResultLayout(name='y', out_dims=('r',), contracted_dims=(), index_dims=(('i', 'r'),))
    >>> classify(parse_program("y[j] = relu(A[i,j] * x[i])"), {"A": ("r", None), "x": ("r",)})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    spfuse.errors.UnsupportedError: cannot distribute 'y': it sums over the partitioned index 'i' ... one chunk)
    """
    axis_dims: dict[str, tuple] = {n: tuple(d) for n, d in input_dims.items()}
    dims: dict = {}
    for ds in axis_dims.values():
        for d in ds:
            if d is not None:
                dims.setdefault(d, None)
    layouts: dict[str, ResultLayout] = {}
    results = set(program.results)
    for stmt in program.statements:
        index_dims: dict[str, object] = {}
        for acc in iter_accesses(stmt.value):
            for idx, d in zip(acc.indices, axis_dims.get(acc.name, (None,) * len(acc.indices)), strict=True):
                if d is None:
                    continue
                other = index_dims.setdefault(idx, d)
                if other != d:
                    raise UnsupportedError(
                        f"index {idx!r} of {stmt.target.name!r} joins two differently partitioned axes "
                        f"({other!r} and {d!r}); give them the same chunks")
        by_dim: dict = {}
        for idx, d in index_dims.items():
            if by_dim.setdefault(d, idx) != idx:
                raise UnsupportedError(
                    f"indices {by_dim[d]!r} and {idx!r} of {stmt.target.name!r} index the same partitioned "
                    "axes (an operand used twice with a partitioned axis?); pass a second copy of it")
        target = stmt.target
        out_dims = tuple(index_dims.get(i) for i in target.indices)
        contracted = tuple(dict.fromkeys(d for i, d in index_dims.items() if i not in target.indices))
        name = target.name
        if contracted:
            if name not in results:
                raise UnsupportedError(
                    f"cannot distribute: temporary {name!r} sums over a partitioned index and is used "
                    "later (only returned results may be reduced across blocks)")
            for i, d in index_dims.items():
                if d in contracted and not is_linear_in(stmt.value, i):
                    raise UnsupportedError(
                        f"cannot distribute {name!r}: it sums over the partitioned index {i!r} inside a "
                        "non-linear expression (adding per-block partial sums would be wrong); pass the "
                        f"operands indexed by {i!r} whole (numpy, or one chunk)")
        axis_dims[name] = out_dims
        layouts[name] = ResultLayout(name, out_dims, contracted, tuple(sorted(index_dims.items(), key=str)))
    return Classification(tuple(dims), {n: layouts[n] for n in program.results})


def _uses(expr: Expr, index: str) -> bool:
    return any(index in a.indices for a in iter_accesses(expr))


def is_linear_in(expr: Expr, index: str) -> bool:
    """Whether ``expr`` is a sum over ``index`` times factors free of ``index``.

    Then the value over all of ``index``'s extent is the sum of the values
    over its blocks.

    >>> from spfuse.frontend.parser import parse_program
    >>> v = lambda s: parse_program(s).statements[0].value
    >>> is_linear_in(v("y[i] = 2 * A[i,j] * x[j]"), "j"), is_linear_in(v("y[i] = A[i,j] * x[j] + b[i]"), "j")
    (True, False)
    """
    if isinstance(expr, Reduce):
        if expr.index == index:
            return expr.op == "sum"
        return expr.op == "sum" and is_linear_in(expr.body, index)
    if isinstance(expr, Binary):
        if expr.op == "*":
            lu, ru = _uses(expr.left, index), _uses(expr.right, index)
            return (lu != ru) and is_linear_in(expr.left if lu else expr.right, index)
        if expr.op == "/":
            return not _uses(expr.right, index) and is_linear_in(expr.left, index)
        if expr.op in ("+", "-"):
            return is_linear_in(expr.left, index) and is_linear_in(expr.right, index)
        return False
    if isinstance(expr, Unary):
        return expr.fn == "neg" and is_linear_in(expr.arg, index)
    return False


def annihilated_by(expr: Expr, name: str) -> bool:
    """Whether ``expr`` is zero wherever operand ``name`` is zero (so a block
    whose share of ``name`` is empty contributes nothing).

    >>> from spfuse.frontend.parser import parse_program
    >>> v = lambda s: parse_program(s).statements[0].value
    >>> annihilated_by(v("A[i,j] = B[i,j] / (C[i,k] * D[k,j])"), "B"), annihilated_by(v("y[i] = exp(A[i,j])"), "A")
    (True, False)
    """
    if isinstance(expr, Access):
        return expr.name == name
    if isinstance(expr, Literal):
        return False
    if isinstance(expr, Binary):
        left, right = annihilated_by(expr.left, name), annihilated_by(expr.right, name)
        if expr.op == "*":
            return left or right
        if expr.op == "/":
            return left
        return left and right
    if isinstance(expr, Unary):
        return expr.fn in _ZERO_PRESERVING and annihilated_by(expr.arg, name)
    if isinstance(expr, Where):
        return annihilated_by(expr.then, name) and annihilated_by(expr.other, name)
    if isinstance(expr, Reduce):
        return expr.op == "sum" and annihilated_by(expr.body, name)
    return False


def statement_of(program: Program, name: str):
    """The statement assigning ``name``.

    >>> from spfuse.frontend.parser import parse_program
    >>> statement_of(parse_program("y[i] = A[i,j] * x[j]"), "y").target.name
    'y'
    """
    return next(s for s in program.statements if s.target.name == name)
