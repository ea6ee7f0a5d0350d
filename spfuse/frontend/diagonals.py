"""Accesses with a repeated index (``A[i,i]``, ``T[i,j,i]``): the program
rewritten to read a diagonal operand made from the tensor, per call.

>>> import numpy as np
>>> from spfuse.frontend.parser import parse_program
>>> from spfuse.tensor import Tensor
>>> ops = {"A": Tensor.from_numpy(np.arange(4.0).reshape(2, 2), "csr")}
>>> p = without_diagonals(parse_program("t = A[i,i]"), ops)
>>> p.inputs, ops["A__diag_0_0"].todense().tolist()
(('A__diag_0_0',), [0.0, 3.0])
"""
from __future__ import annotations

import functools

import numpy as np

from spfuse.frontend.ast import Access, Assignment, Program, iter_accesses
from spfuse.frontend.reductions import map_children
from spfuse.tensor import Tensor

__all__ = ["has_diagonal", "without_diagonals"]


@functools.lru_cache(maxsize=1024)
def has_diagonal(program: Program) -> bool:
    return any(len(set(a.indices)) != len(a.indices) for s in program.statements for a in iter_accesses(s.value))


def without_diagonals(program: Program, tensors: dict) -> Program:
    """Replace accesses with a repeated index (``A[i,i]``) by a diagonal operand."""
    def take(acc: Access) -> Access:
        if len(set(acc.indices)) == len(acc.indices):
            return acc
        uniq = tuple(dict.fromkeys(acc.indices))
        name = f"{acc.name}__diag_{'_'.join(str(uniq.index(i)) for i in acc.indices)}"
        if name not in tensors:
            t = tensors[acc.name]
            groups = [uniq.index(i) for i in acc.indices]
            coords = t.coords
            keep = np.ones(coords.shape[1], dtype=bool)
            first: dict[int, int] = {}
            for m, g in enumerate(groups):
                if g in first:
                    keep &= coords[m] == coords[first[g]]
                else:
                    first[g] = m
            sel = coords[[first[g] for g in range(len(uniq))]][:, keep]
            shape = tuple(t.shape[first[g]] for g in range(len(uniq)))
            fmt = "dense" if not t.format.levels or "compressed" not in t.format.levels else (
                "csr" if len(uniq) == 2 else "csf")
            if len(uniq) == 1 and fmt != "dense":
                fmt = "csf"
            tensors[name] = Tensor.from_coo(sel, t.values[keep], shape, format=fmt)
        return Access(name, uniq, acc.span, ())

    def walk(e):
        return take(e) if isinstance(e, Access) else map_children(e, walk)

    stmts = tuple(Assignment(s.target, walk(s.value), s.span) for s in program.statements)
    return Program(stmts, program.text)
