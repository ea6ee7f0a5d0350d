"""``numpy.einsum`` subscripts → index-notation program.

``"ij,jk->ik"`` becomes ``out[i, k] = T0[i, j] * T1[j, k]`` (then implicit
reductions are made explicit as usual). Semantics follow ``numpy.einsum``:
implicit output = labels appearing exactly once, sorted (uppercase before
lowercase); a label repeated on one operand takes a diagonal; ``->`` with
nothing after it gives a 0-d result; spaces are ignored. Ellipsis is not
supported.
"""
from __future__ import annotations

from typing import Sequence

from spfuse.errors import ProgramError
from spfuse.frontend.ast import Program
from spfuse.frontend.parser import parse_program

__all__ = ["einsum_to_program", "OUTPUT_NAME", "operand_name"]

OUTPUT_NAME = "out"


def operand_name(n: int) -> str:
    """Name of the ``n``-th einsum operand in the generated program.

    >>> operand_name(2)
    'T2'
    """
    return f"T{n}"


def _is_label(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


def einsum_to_program(subscripts: str, ndims: Sequence[int]) -> tuple[Program, list[str]]:
    """Translate einsum ``subscripts`` for operands of ``ndims`` dimensions.

    Returns the program (operands ``T0, T1, ...``, result ``out``) and the
    list of operand names. Errors point a caret into ``subscripts``.

    >>> from spfuse.frontend.canonical import to_text
    >>> p, names = einsum_to_program("ij,jk", [2, 2])
    >>> print(to_text(p)); names
    out[i, k] = sum(j, T0[i, j] * T1[j, k])
    ['T0', 'T1']
    >>> print(to_text(einsum_to_program("ii", [2])[0]))
    out = sum(i, T0[i, i])
    >>> einsum_to_program("ij,jk->iz", [2, 2])
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: output label 'z' does not appear in any input
      ij,jk->iz
              ^
    """
    text = subscripts
    ndims = [int(d) for d in ndims]
    if not ndims:
        raise ProgramError("einsum needs at least one operand", text, 0)
    dots = text.find(".")
    if dots >= 0:
        raise ProgramError("ellipsis ('...') is not supported; write the labels out",
                           text, dots)
    arrow = text.find("->")
    lhs_end = arrow if arrow >= 0 else len(text)
    # terms as lists of (label, position)
    terms: list[list[tuple[str, int]]] = [[]]
    term_starts = [0]
    for pos in range(lhs_end):
        c = text[pos]
        if c == ",":
            terms.append([])
            term_starts.append(pos + 1)
        elif _is_label(c):
            terms[-1].append((c, pos))
        elif not c.isspace():
            raise ProgramError(f"invalid character {c!r} in einsum subscripts "
                               "(labels are letters a-z, A-Z)", text, pos)
    if len(terms) != len(ndims):
        pos = term_starts[len(ndims)] - 1 if len(terms) > len(ndims) else lhs_end
        raise ProgramError(f"subscripts name {len(terms)} operand(s) but {len(ndims)} "
                           f"were given", text, pos)
    for n, (term, nd) in enumerate(zip(terms, ndims)):
        if len(term) != nd:
            pos = term[0][1] if term else term_starts[n]
            raise ProgramError(
                f"operand {n} has {nd} dimension(s) but its subscripts "
                f"{''.join(c for c, _ in term)!r} give {len(term)}", text, pos)
    counts: dict[str, int] = {}
    for term in terms:
        for c, _ in term:
            counts[c] = counts.get(c, 0) + 1
    if arrow >= 0:
        out: list[str] = []
        for pos in range(arrow + 2, len(text)):
            c = text[pos]
            if c.isspace():
                continue
            if c == "-" or c == ">":
                raise ProgramError("more than one '->' in einsum subscripts", text, pos)
            if not _is_label(c):
                raise ProgramError(f"invalid character {c!r} in einsum output", text, pos)
            if c in out:
                raise ProgramError(f"output label {c!r} is repeated", text, pos)
            if c not in counts:
                raise ProgramError(f"output label {c!r} does not appear in any input",
                                   text, pos)
            out.append(c)
    else:
        out = sorted(c for c, n in counts.items() if n == 1)
    names = [operand_name(n) for n in range(len(ndims))]

    def access(name: str, labels) -> str:
        return f"{name}[{', '.join(labels)}]" if labels else name

    rhs = " * ".join(access(name, [c for c, _ in term]) for name, term in zip(names, terms))
    program = parse_program(f"{access(OUTPUT_NAME, out)} = {rhs}")
    return program, names
