"""SpMMs summed into one result, run as one kernel call per term into one output.

A gradient that reaches a dense operand along several paths through one
sparse pattern is a sum of transposed SpMMs.  GNN-2's adjoint has::

    grad_Y[k,h] = sum(i, P[i,h] * X[i,k]) + sum(i, G[i,k] * Q[i,h])

with ``P`` and ``Q`` on ``A``'s pattern.  Group by group that is two
``spmm_t`` scatters, each a read-modify-write of an output row per stored
entry, then a transpose of each result and an add over the whole array.
``spmm_t`` takes several ``(values, dense)`` terms in one walk instead: per
entry, the output row is read and written once for all the terms; the
indices are read once; one transpose, no add (kernel ``spmm_t_sum``).  At
GNN-2's medium size, 20000 rows and K=32, the scatters and the add took
8.9 ms and take 5.9.

A sum of *gathers*, ``A·X + W·Z`` (of any patterns; also ``Aᵀ·X + Wᵀ·G``
of CSC operands, SpMMs of the transposes), runs ``spmm`` once per term into
one result, every term after the first with ``accumulate``: no temporary
per term, no add over whole arrays (kernel ``spmm_sum``).  Measured at
100k rows, 10 per row, K=64: 133 → 112 ms on one thread, 82.6 → 53.8 ms on
two (the add is numpy's, single-threaded).  One walk of a shared pattern
gathering every term per entry was measured too and did not pay (186
against 178 ms apart): the gathered rows, not the output, are its traffic.

:func:`sum_spmms` is a pure function from a plan's groups to groups: it
replaces an element-wise group adding the results of ``spmm_t`` groups, or
of ``spmm`` groups, read nowhere else, by one group holding them
(``Group.summed``).  :func:`run_summed` runs that group.  Scatter terms
must store one pattern, checked per call; when they do not, the groups run
apart, as before.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from spfuse._kernels import _csr_kernels as csr
from spfuse._kernels._result_pool import empty as _result
from spfuse.errors import IndexCheckFailed
from spfuse.ir.ops import Const, Ref
from spfuse.lowering import templates
from spfuse.lowering.group_flow import producers_and_readers
from spfuse.lowering.transposes import SharedCopies
from spfuse.tensor import same_pattern

__all__ = ["KERNELS", "sum_spmms", "run_summed"]

#: per term kernel, the kernel name a summed group reports (``explain()``, ``TemplateMatch.kernel``)
KERNELS = {"spmm_t": "spmm_t_sum", "spmm": "spmm_sum"}


def sum_spmms(plan, groups: tuple) -> tuple:
    """``groups`` with each sum of ``spmm_t`` results, and each sum of
    ``spmm`` results, merged into one group.

    A group qualifies when it is element-wise, one ``+`` of 2 to
    ``SUM_TERMS`` results (each maybe scaled by constants or 0-d operands),
    each made by its own group of one kernel (all ``spmm_t`` or all
    ``spmm``): a dense result, read by this sum only and not a program
    result, all computed in the same orientation.  The merged group takes
    the sum's place: its terms' operands exist by then, and nothing between
    reads their results.  Under ``fusion="none"`` groups stay as they are.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> from spfuse.lowering.groups import split_groups
    >>> A = sp.random_array((50, 40), density=0.2, format="csr", random_state=0)
    >>> ops = {"A": A, "B": A * 2.0, "X": np.ones((50, 3)), "G": np.ones((50, 3))}
    >>> plan = spfuse.compile("Y[j,k] = sum(i, A[i,j] * X[i,k]) + sum(i, B[i,j] * G[i,k])").plans(**ops)["auto"]
    >>> [g.kernel for g in split_groups(plan)]
    ['spmm_t_sum']
    >>> B = sp.random_array((50, 40), density=0.1, format="csr", random_state=1)   # (another pattern)
    >>> ops = {"A": A, "B": B, "X": np.ones((40, 3)), "G": np.ones((40, 3))}
    >>> plan = spfuse.compile("Y[i,k] = A[i,j] * X[j,k] - B[i,j] * G[j,k]").plans(**ops)["auto"]
    >>> [g.kernel for g in split_groups(plan)]
    ['spmm_sum']
    """
    if plan.fusion == "none":
        return groups
    producer, readers = producers_and_readers(groups)
    merged: dict[int, Any] = {}
    dropped: set[int] = set()
    for n, g in enumerate(groups):
        terms = _terms(plan, g, n, groups, producer, readers)
        if terms is not None:
            parts = tuple(groups[m] for m, _ in terms)
            merged[n] = type(g)(g.node, tuple(op for p in parts for op in p.ops) + g.ops, g.outputs,
                                KERNELS[parts[0].kernel], summed=(*parts, g), scalings=tuple(f for _, f in terms))
            dropped.update(m for m, _ in terms)
    return tuple(merged.get(n, g) for n, g in enumerate(groups) if n not in dropped)


def _terms(plan, g, n: int, groups, producer: Mapping[str, int],
           readers: Mapping[str, set]) -> list[tuple[int, tuple]] | None:
    """Per term of the sum group ``n`` makes, the position of the ``spmm_t``
    (or ``spmm``) group computing it and the factors scaling it on the way (constants and
    0-d operands: ``s * T``, ``neg(T)``, factored out of the reductions by
    the planner), or None when the group is anything else."""
    if g.entrywise is None or g.outputs != (g.ops[-1].out,):
        return None   # (a scaled term read elsewhere too is not the sum's to fold)
    *scalings, op = g.ops
    if op.operator != "+" or op.reduction or not 2 <= len(op.args) <= csr.SUM_TERMS:
        return None
    scaled = {s.out: s for s in scalings}
    terms: list[tuple[int, tuple]] = []
    for a, coef in zip(op.args, op.coefficients, strict=True):
        if not isinstance(a, Ref) or a.indices != op.out_indices:
            return None
        factors: tuple = (coef,)
        while a.name in scaled:   # (each scaling op read by this term alone: the group is one sum)
            s = scaled.pop(a.name)
            found = _scaling(plan, s)
            if found is None:
                return None
            a, factor = found
            factors += (factor,)
        if a.indices != op.out_indices or a.name in plan.results:
            return None
        m = producer.get(a.name)
        if m is None or m in (t for t, _ in terms) or readers.get(a.name) != {n}:
            return None
        part = groups[m]
        r = part.route
        if part.kernel not in KERNELS or r is None or r.pattern is not None or part.outputs != (a.name,):
            return None
        terms.append((m, factors))
    if scaled or len({(groups[m].kernel, groups[m].route.out_swapped) for m, _ in terms}) != 1:
        return None
    return terms


def _scaling(plan, op) -> tuple[Ref, float | str] | None:
    """``(the scaled term, its factor)`` of ``out = c * T``, ``out = s * T``
    (``s`` a 0-d input, read per call) or ``out = neg(T)``, ``T`` read in
    ``out``'s index order (not transposed on the way), else None.

    >>> from spfuse.ir.ops import UnitOp
    >>> _scaling(None, UnitOp(0, "T0", ("j", "k"), "*", (Const(2.0), Ref("T1", ("j", "k")))))
    (Ref(name='T1', indices=('j', 'k')), 2.0)
    >>> _scaling(None, UnitOp(0, "T0", ("k", "j"), "*", (Const(2.0), Ref("T1", ("j", "k"))))) is None
    True
    """
    if op.reduction:
        return None
    refs = [a for a in op.args if isinstance(a, Ref) and a.indices]
    if len(refs) != 1 or refs[0].indices != tuple(op.out_indices):
        return None
    if op.operator == "neg" and len(op.args) == 1:
        return refs[0], -1.0
    if op.operator != "*" or len(op.args) != 2:
        return None
    other = op.args[1] if op.args[0] is refs[0] else op.args[0]
    if isinstance(other, Const):
        return refs[0], float(other.value)
    info = plan.inputs.get(other.name)
    if info is None or info.ndim != 0 or info.is_sparse:
        return None
    return refs[0], other.name


def run_summed(plan, g, env: dict, nt: int) -> dict:
    """A summed group's result.  Scatters: one ``spmm_t`` walk of the first
    term's pattern scattering every term (each with its coefficient and its
    route's 0-d factors), or the groups apart when the terms' operands turn
    out not to store one pattern (checked per call, as merged factors are).
    Gathers: ``spmm`` per term into one output, accumulating after the first."""
    from spfuse.lowering import groups as lowering
    *parts, total = g.summed
    operands = []
    for part, factors in zip(parts, g.scalings, strict=True):
        found = lowering._routed_operands(plan, part, env, nt)
        if found is None:
            return lowering.run_in_turn(plan, g.summed, env, nt)
        local, scale, _ = found
        for f in factors:
            scale *= f if isinstance(f, float) else env[f].values.reshape(-1)[0].item()
        operands.append((local[part.names[0]], local[part.names[1]], scale))
    gathers = parts[0].kernel == "spmm"
    first = operands[0][0]
    if not gathers and not all(same_pattern(first, s) for s, _, _ in operands[1:]):
        return lowering.run_in_turn(plan, g.summed, env, nt)
    ts = [t for s, d, _ in operands for t in (s, d)]
    itype, dtype = templates._types(ts)
    nt = templates._threads(ts, nt)
    values = []
    for s, _, c in operands:
        v = templates._as(s._values, dtype)
        values.append(v if c == 1.0 else np.multiply(v, c, dtype=dtype))
    with SharedCopies():   # (an operand two terms read is copied once)
        dense = [templates._dense(d, dtype, nt) for _, d, _ in operands]
    name = total.outputs[0]
    shape = tuple(plan.shapes[name])
    swapped = parts[0].route.out_swapped
    out = _result(shape[::-1] if swapped else shape, dtype)
    if gathers:
        for t, ((s, _, _), v, d) in enumerate(zip(operands, values, dense, strict=True)):
            indptr, indices, _ = templates._csr(s, itype, dtype)
            bad = csr.spmm(indptr, indices, v, d, out, nt, 0, t > 0)
            if bad >= 0:
                raise IndexCheckFailed(parts[t].names[0], bad)
    else:
        indptr, indices, _ = templates._csr(first, itype, dtype)
        bad = csr.spmm_t(indptr, indices, values[0], dense[0], out, nt,
                         tuple(zip(values[1:], dense[1:], strict=True)))
        if bad >= 0:
            raise IndexCheckFailed(parts[0].names[0], bad)
    return {name: templates.c_ordered(out.T, nt) if swapped else out}
