"""Static checks of a program against operand shapes.

Names must be given or assigned earlier (and never both), each name is
assigned once, every access has one index per dimension, and an index name
has one extent within a statement (indices are statement-local: the same
name may have different extents in different statements). A repeated index
in one access (a diagonal, ``A[i,i]``) is legal when the extents agree.
Every error is a :class:`~spfuse.errors.ProgramError` pointing at the token.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Access, Expr, Program, Reduce
from spfuse.frontend.canonical import to_text
from spfuse.frontend.reductions import children, reduce_index_position

__all__ = ["check_program", "result_shapes", "shape_of"]


def shape_of(value: Any) -> tuple[int, ...]:
    """A shape from a tuple/list of extents or from anything with ``.shape``.

    >>> shape_of((3, 4)), shape_of(__import__("numpy").zeros((2, 0)))
    ((3, 4), (2, 0))
    """
    shape = getattr(value, "shape", value)
    try:
        out = tuple(int(n) for n in shape)
    except TypeError:
        raise TypeError(f"expected a shape (tuple of ints) or an array, got "
                        f"{type(value).__name__}") from None
    if any(n < 0 for n in out):
        raise ValueError(f"negative extent in shape {out}")
    return out


def _walk(e: Expr):
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def _check(program: Program, shapes: Mapping[str, Any]):
    text = program.text or None
    given = {name: shape_of(v) for name, v in shapes.items()}
    known = dict(given)
    assigned_at: dict[str, int] = {}
    for n, st in enumerate(program.statements):
        assigned_at.setdefault(st.target.name, n)
    extents_per_statement: list[dict[str, int]] = []
    results: dict[str, tuple[int, ...]] = {}

    def err(message: str, pos: int | None) -> NoReturn:
        raise ProgramError(message, text, pos if text else None)

    for st in program.statements:
        target = st.target
        if target.name in given:
            err(f"{target.name!r} is an input operand and cannot also be assigned "
                f"(Hint: give the result another name)", target.span.start)
        if target.name in results:
            err(f"{target.name!r} is assigned twice", target.span.start)
        ext: dict[str, int] = {}
        where: dict[str, str] = {}
        for node in _walk(st.value):
            if isinstance(node, Reduce):
                if node.index in target.indices:
                    err(f"reduction index {node.index!r} also appears on the left side",
                        reduce_index_position(program.text, node))
                continue
            if not isinstance(node, Access):
                continue
            shape = known.get(node.name)
            if shape is None:
                if node.name in assigned_at:
                    err(f"reading {node.name!r} before it is assigned", node.span.start)
                names = ", ".join(sorted(known)) or "none"
                err(f"unknown operand {node.name!r}; known names: {names}", node.span.start)
            if len(shape) != len(node.indices):
                err(f"{node.name!r} has {len(shape)} dimension(s) {shape} but "
                    f"{to_text(node)} gives {len(node.indices)} index(es)", node.span.start)
            spans = node.index_spans
            for axis, (k, extent) in enumerate(zip(node.indices, shape, strict=True)):
                old = ext.get(k)
                if old is None:
                    ext[k] = extent
                    where[k] = f"{to_text(node)} (axis {axis})"
                elif old != extent:
                    err(f"index {k!r} has extent {old} in {where[k]} but extent {extent} "
                        f"in {to_text(node)} (axis {axis})",
                        spans[axis].start if spans else node.span.start)
        for node in _walk(st.value):
            if isinstance(node, Reduce) and node.index not in ext:
                err(f"reduction index {node.index!r} is not used in its body",
                    reduce_index_position(program.text, node))
        for axis, k in enumerate(target.indices):
            if k not in ext:
                spans = target.index_spans
                err(f"output index {k!r} is not bound on the right",
                    spans[axis].start if spans else target.span.start)
        shape = tuple(ext[k] for k in target.indices)
        results[target.name] = shape
        known[target.name] = shape
        extents_per_statement.append(ext)
    return extents_per_statement, results


def check_program(program: Program, shapes: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """Check ``program`` against input ``shapes``; return each statement's
    index extents (one dict per statement, in order).

    ``shapes`` maps input names to shapes (or to arrays: ``.shape`` is used).

    >>> from spfuse.frontend.parser import parse_program
    >>> p = parse_program("T[i,k] = A[i,j] * B[j,k]; y[i] = T[i,k] * x[k]")
    >>> check_program(p, {"A": (2, 3), "B": (3, 4), "x": (4,)})
    [{'i': 2, 'j': 3, 'k': 4}, {'i': 2, 'k': 4}]
    >>> check_program(p, {"A": (2, 3), "B": (5, 4), "x": (4,)})
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: index 'j' has extent 3 in A[i, j] (axis 1) but extent 5 in B[j, k] (axis 0)
      T[i,k] = A[i,j] * B[j,k]; y[i] = T[i,k] * x[k]
                          ^
    """
    return _check(program, shapes)[0]


def result_shapes(program: Program, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Shapes of every assigned name (temporaries too), in assignment order,
    after the same checks as :func:`check_program`.

    >>> from spfuse.frontend.parser import parse_program
    >>> result_shapes(parse_program("s = A[i,i]; B[j,i] = A[i,j] / s"), {"A": (3, 3)})
    {'s': (), 'B': (3, 3)}
    """
    return _check(program, shapes)[1]
