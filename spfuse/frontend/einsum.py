"""``numpy.einsum`` subscripts → index-notation program.

``"ij,jk->ik"`` becomes ``out[i, k] = T0[i, j] * T1[j, k]`` (then implicit
reductions are made explicit as usual).  Semantics follow ``numpy.einsum``:

* implicit output = the labels appearing exactly once, sorted (uppercase
  before lowercase), after the broadcast (ellipsis) dimensions;
* a label repeated on one operand takes a diagonal; ``->`` with nothing after
  it gives a 0-d result; spaces are ignored;
* ``...`` stands for an operand's unlabelled dimensions; they are aligned
  from the right across operands and named ``_0, _1, ...`` (outermost first)
  in the generated program;
* the interleaved form ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` is turned into
  subscripts by :func:`subscripts_from_sublists` (0-25 → ``A-Z``, 26-51 →
  ``a-z``, ``Ellipsis`` → ``...``);
* size-1 dimensions broadcast against the same label's extent elsewhere:
  :func:`broadcast_labels` drops them, given the operands' shapes.

Errors are :class:`~spfuse.errors.ProgramError` (a ``ValueError``) worded
like numpy's, with a caret into the subscripts; a wrongly typed sublist is a
``TypeError``, as in numpy.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Program
from spfuse.frontend.parser import parse_program

__all__ = ["einsum_to_program", "parse_subscripts", "labels_to_program", "broadcast_labels",
           "subscripts_from_sublists", "EinsumLabels", "OUTPUT_NAME", "operand_name"]

OUTPUT_NAME = "out"
#: Sublist subscripts are integers in ``range(MAX_SUBLIST_LABEL)``, as in numpy.
MAX_SUBLIST_LABEL = 52
_TOO_FEW_DIMS = ("operand has more dimensions than subscripts given in einstein sum, but no '...' "
                 "ellipsis provided to broadcast the extra dimensions.")
_OUT_TOO_FEW_DIMS = ("output has more dimensions than subscripts given in einstein sum, but no '...' "
                     "ellipsis provided to broadcast the extra dimensions.")


def operand_name(n: int) -> str:
    """Name of the ``n``-th einsum operand in the generated program.

    >>> operand_name(2)
    'T2'
    """
    return f"T{n}"


def broadcast_name(n: int) -> str:
    """Program name of the ``n``-th broadcast (ellipsis) dimension, outermost first.

    >>> broadcast_name(0)
    '_0'
    """
    return f"_{n}"


def _is_label(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def _shown(label: str) -> str:
    """A label as the user wrote it (broadcast dimensions are part of '...')."""
    return "..." if label.startswith("_") else label


@dataclass(frozen=True)
class EinsumLabels:
    """Resolved subscripts: one label per axis of every operand, and the output's.

    Letters stand for themselves; broadcast (ellipsis) dimensions are
    ``_0, _1, ...``, right-aligned across operands.

    >>> parse_subscripts("...ij,j->...i", [3, 1])
    EinsumLabels(inputs=(('_0', 'i', 'j'), ('j',)), output=('_0', 'i'))
    """

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]


def _split_terms(text: str) -> tuple[list[tuple[str, int]], tuple[str, int] | None]:
    """``text`` cut into (term, start) pieces for the inputs and the output (or None)."""
    arrow = text.find("->")
    for pos, c in enumerate(text):
        if c in "->" and not (arrow >= 0 and arrow <= pos <= arrow + 1):
            if c == "-" and text.startswith("->", pos):  # a second '->'
                raise ProgramError("einstein sum subscript string contains more than one '->'", text, pos)
            raise ProgramError(f"invalid subscript {c!r} in einstein sum subscripts string, "
                               "subscripts must be letters", text, pos)
    lhs = text if arrow < 0 else text[:arrow]
    terms, start = [], 0
    for piece in lhs.split(","):
        terms.append((piece, start))
        start += len(piece) + 1
    return terms, (None if arrow < 0 else (text[arrow + 2:], arrow + 2))


def _term_labels(text: str, term: str, start: int, where: str) -> tuple[list[str], int | None]:
    """Letters of one term and the label index where its '...' stands (None if absent)."""
    labels: list[str] = []
    ellipsis = None
    pos = 0
    while pos < len(term):
        c = term[pos]
        if c == ".":
            if term[pos:pos + 3] != "..." or ellipsis is not None:
                what = "more than one ellipsis ('...')" if term[pos:pos + 3] == "..." else \
                    "a '.' that is not part of an ellipsis ('...')"
                raise ProgramError(f"einstein sum subscripts string contains {what} in {where}", text, start + pos)
            ellipsis = len(labels)
            pos += 3
            continue
        if _is_label(c):
            labels.append(c)
        elif not c.isspace():
            raise ProgramError(f"invalid subscript {c!r} in einstein sum subscripts string, "
                               "subscripts must be letters", text, start + pos)
        pos += 1
    return labels, ellipsis


@functools.lru_cache(maxsize=1024)
def _parse_cached(subscripts: str, ndims: tuple[int, ...]) -> EinsumLabels:
    text = subscripts
    if not ndims:
        raise ProgramError("must specify the einstein sum subscripts string and at least one operand", text, 0)
    terms, out_term = _split_terms(text)
    if len(terms) != len(ndims):
        more = len(ndims) > len(terms)
        raise ProgramError(
            f"{'more' if more else 'fewer'} operands provided to einstein sum function than specified in the "
            f"subscripts string ({len(ndims)} given, the subscripts name {len(terms)})",
            text, terms[-1][1] + len(terms[-1][0]) if more else terms[len(ndims)][1] - 1)
    parsed = []
    for n, ((term, start), nd) in enumerate(zip(terms, ndims, strict=True)):
        labels, ellipsis = _term_labels(text, term, start, f"operand {n}")
        if len(labels) > nd:
            raise ProgramError(f"einstein sum subscripts string contains too many subscripts for operand {n} "
                               f"(it has {nd} dimension(s))", text, start)
        if ellipsis is None and len(labels) < nd:
            raise ProgramError(f"{_TOO_FEW_DIMS} (operand {n} has {nd} dimension(s), its subscripts "
                               f"{''.join(labels)!r} give {len(labels)})", text, start)
        parsed.append((labels, ellipsis, nd - len(labels)))
    nbroadcast = max((k for _, _, k in parsed), default=0)
    inputs = []
    for labels, ellipsis, k in parsed:
        if ellipsis is None:
            inputs.append(tuple(labels))
            continue
        dims = [broadcast_name(nbroadcast - k + t) for t in range(k)]
        inputs.append(tuple(labels[:ellipsis] + dims + labels[ellipsis:]))
    broadcast = [broadcast_name(t) for t in range(nbroadcast)]
    if out_term is None:
        counts: dict[str, int] = {}
        for labels, _, _ in parsed:
            for c in labels:
                counts[c] = counts.get(c, 0) + 1
        output = tuple(broadcast + sorted(c for c, n in counts.items() if n == 1))
        return EinsumLabels(tuple(inputs), output)
    term, start = out_term
    labels, ellipsis = _term_labels(text, term, start, "the output")
    seen = {c for t in inputs for c in t}
    for offset, c in enumerate(term):
        if not _is_label(c):
            continue
        if c not in seen:
            raise ProgramError(f"einstein sum subscripts string included output subscript {c!r} which never "
                               "appeared in an input", text, start + offset)
        if term.count(c) > 1 and term.index(c) != offset:
            raise ProgramError(f"einstein sum subscripts string includes output subscript {c!r} multiple times",
                               text, start + offset)
    if ellipsis is None:
        if nbroadcast:
            raise ProgramError(f"{_OUT_TOO_FEW_DIMS} (the inputs' '...' cover {nbroadcast} dimension(s))",
                               text, start)
        return EinsumLabels(tuple(inputs), tuple(labels))
    return EinsumLabels(tuple(inputs), tuple(labels[:ellipsis] + broadcast + labels[ellipsis:]))


def parse_subscripts(subscripts: str, ndims: Sequence[int]) -> EinsumLabels:
    """Resolve einsum ``subscripts`` for operands of ``ndims`` dimensions.

    >>> parse_subscripts("ij,jk", [2, 2])
    EinsumLabels(inputs=(('i', 'j'), ('j', 'k')), output=('i', 'k'))
    >>> parse_subscripts("i...,...->...i", [3, 1]).output
    ('_0', '_1', 'i')
    >>> parse_subscripts("ij,jk->iz", [2, 2])
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: einstein sum subscripts string included output subscript 'z' which never appeared \
in an input
      ij,jk->iz
              ^
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum subscripts must be a str, got {type(subscripts).__name__}")
    return _parse_cached(subscripts, tuple(operator.index(d) for d in ndims))


def broadcast_labels(labels: EinsumLabels, shapes: Sequence[Sequence[int]]
                     ) -> tuple[EinsumLabels, tuple[tuple[int, ...], ...], dict[str, int]]:
    """Size-1 broadcasting: drop the axes of extent 1 whose label is longer elsewhere.

    Returns the labels without those axes, the dropped axes of every operand,
    and the extent of every label.  A label repeated on one operand (a
    diagonal) must have one extent there, as in numpy.

    >>> lab = parse_subscripts("ij,j->ij", [2, 1])
    >>> new, dropped, extents = broadcast_labels(lab, [(2, 1), (3,)])
    >>> new.inputs, dropped, extents
    ((('i',), ('j',)), ((1,), ()), {'i': 2, 'j': 3})
    >>> broadcast_labels(parse_subscripts("i,i", [1, 1]), [(2,), (3,)])
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: operands could not be broadcast together with remapped shapes \
[original->remapped]: (2,)->(2,) (3,)->(3,) (label 'i' has extents 2 and 3)
    """
    extents: dict[str, int] = {}
    for n, (term, shape) in enumerate(zip(labels.inputs, shapes, strict=True)):
        mine: dict[str, int] = {}
        for c, e in zip(term, shape, strict=True):
            if mine.setdefault(c, e) != e:
                raise ProgramError(f"dimensions in operand {n} for collapsing index {_shown(c)!r} don't match "
                                   f"({mine[c]} != {e})")
        for c, e in mine.items():
            have = extents.get(c)
            if have is None or have == 1:
                extents[c] = e
            elif e not in (1, have):
                remapped = " ".join(f"{tuple(s)}->{tuple(s)}" for s in shapes)
                raise ProgramError("operands could not be broadcast together with remapped shapes "
                                   f"[original->remapped]: {remapped} (label {_shown(c)!r} has extents "
                                   f"{have} and {e})")
    dropped = tuple(tuple(a for a, (c, e) in enumerate(zip(term, shape, strict=True)) if e == 1 and extents[c] != 1)
                    for term, shape in zip(labels.inputs, shapes, strict=True))
    if not any(dropped):
        return labels, dropped, extents
    inputs = tuple(tuple(c for a, c in enumerate(term) if a not in drop)
                   for term, drop in zip(labels.inputs, dropped, strict=True))
    return EinsumLabels(inputs, labels.output), dropped, extents


def subscripts_from_sublists(args: Sequence[Any]) -> tuple[str, list[Any]]:
    """The interleaved form ``(op0, sub0, op1, sub1, ..., [out])`` as (subscripts, operands).

    >>> subscripts_from_sublists(["A", [0, 1], "B", [1, 2], [0, 2]])
    ('AB,BC->AC', ['A', 'B'])
    >>> subscripts_from_sublists(["A", [Ellipsis, 30]])[0]
    '...e'
    """
    args = list(args)
    npairs = len(args) // 2
    if npairs == 0:
        raise ProgramError("must specify the einstein sum subscripts string and at least one operand, or at "
                           "least one operand and its corresponding subscripts list")
    operands = args[0:2 * npairs:2]
    terms = [_sublist_text(s) for s in args[1:2 * npairs:2]]
    text = ",".join(terms)
    if len(args) % 2:
        text += "->" + _sublist_text(args[-1])
    return text, operands


def _sublist_text(sublist: Any) -> str:
    import numpy as np
    if isinstance(sublist, np.ndarray):
        sublist = sublist.tolist()
    if not isinstance(sublist, (list, tuple)):
        raise TypeError("the subscripts for each operand must be a list or a tuple, got "
                        f"{type(sublist).__name__}")
    out = []
    for s in sublist:
        if s is Ellipsis:
            out.append("...")
            continue
        try:
            k = operator.index(s)
        except TypeError:
            raise TypeError(f"each subscript must be either an integer or an ellipsis, got {s!r}") from None
        if not 0 <= k < MAX_SUBLIST_LABEL:
            raise ProgramError(f"subscript is not within the valid range [0, {MAX_SUBLIST_LABEL}): got {k}")
        out.append(chr(ord("A") + k) if k < 26 else chr(ord("a") + k - 26))
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def labels_to_program(labels: EinsumLabels) -> tuple[Program, list[str]]:
    """The index-notation program of resolved einsum labels, and its operand names.

    >>> from spfuse.frontend.canonical import to_text
    >>> p, names = labels_to_program(parse_subscripts("...j,j", [2, 1]))
    >>> print(to_text(p)); names
    out[_0] = sum(j, T0[_0, j] * T1[j])
    ['T0', 'T1']
    """
    names = [operand_name(n) for n in range(len(labels.inputs))]

    def access(name: str, idx: Sequence[str]) -> str:
        return f"{name}[{', '.join(idx)}]" if idx else name

    rhs = " * ".join(access(name, term) for name, term in zip(names, labels.inputs, strict=True))
    return parse_program(f"{access(OUTPUT_NAME, labels.output)} = {rhs}"), names


def einsum_to_program(subscripts: str, ndims: Sequence[int]) -> tuple[Program, list[str]]:
    """Translate einsum ``subscripts`` for operands of ``ndims`` dimensions.

    Returns the program (operands ``T0, T1, ...``, result ``out``) and the
    list of operand names. Errors point a caret into ``subscripts``.
    (No size-1 broadcasting here: that needs the shapes, see
    :func:`broadcast_labels`.)

    >>> from spfuse.frontend.canonical import to_text
    >>> p, names = einsum_to_program("ij,jk", [2, 2])
    >>> print(to_text(p)); names
    out[i, k] = sum(j, T0[i, j] * T1[j, k])
    ['T0', 'T1']
    >>> print(to_text(einsum_to_program("ii", [2])[0]))
    out = sum(i, T0[i, i])
    >>> print(to_text(einsum_to_program("...ij,...jk->...ik", [3, 2])[0]))
    out[_0, i, k] = sum(j, T0[_0, i, j] * T1[j, k])
    """
    return labels_to_program(parse_subscripts(subscripts, ndims))
