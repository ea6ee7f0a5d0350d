"""Element-wise work on whole dense arrays, run as numpy operations.

A group split off a template head is often only an element-wise tail over
dense arrays: GCN's ``H[i,h] = relu(T[i,h])`` after SpMM and GEMM, its
gradient's ``where(H[i,h], dH[i,h], 0)`` before a GEMM.  The generic
executor runs such a group element by element through its interpreter
(about 60 µs for 34 x 16 entries, where one numpy call takes 2 µs, and tens
of ns per element at any size).  Here each operation is one numpy call over
the whole arrays.

A group qualifies (:func:`entrywise_group`, at planning) when every
operation is element-wise -- no reduction, every operand read at distinct
indices among the operation's own (a transposed read is a numpy view, a
missing index a broadcast: ``T[i,h] + b[h]``) or a constant -- over dense
operands, its iteration space is not restricted by a
propagated mask (the executor computes every element too), its operator is
one numpy evaluates exactly as the executor does, and the outputs that are
results of the plan are stored dense (in either mode order: a result the
planner stores transposed -- a gradient's ``grad_Y[k,h] = T0[h,k] +
T1[h,k]`` -- comes out C-ordered all the same, 2.2-2.5 ms on the executor
against about 1 ms here at 20000 x 32).

The arithmetic is the executor's, bit for bit (a NaN's sign aside): in float64 (operands are
read as float64, as the executor reads them), ``a / b`` is 0 where ``a`` is
0, ``where`` tests ``!= 0`` (NaN is true), ``relu(x)`` is ``x`` where
``x > 0`` and ``+0.0`` elsewhere (NaN and -0.0 included), a linear
combination is evaluated left to right.  ``exp``, ``log``, ``tanh`` and
``sigmoid`` run through :func:`spfuse._kernels._dense_kernels.map_unary`,
with the executor's formulas (libm, and spfuse's own vectorised ``exp``,
within 1 ulp of libm's): numpy's vectorised versions may round
differently.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spfuse._kernels._dense_kernels import UNARY_OPS, map_unary
from spfuse._kernels._result_pool import empty as _result
from spfuse.formats import Format
from spfuse.ir.ops import Const, UnitOp
from spfuse.lowering.pattern_values import _entrywise
from spfuse.lowering.templates import c_ordered

__all__ = ["EntrywiseGroup", "bind_entrywise", "entrywise_group", "run_entrywise_group"]

#: unary operators run through map_unary (the executor's formulas and exp)
LIBM = frozenset({"exp", "log", "tanh", "sigmoid"})
#: operators evaluated exactly as the executor does (see the module's docstring)
EXACT = frozenset({None, "+", "-", "*", "/", "where", "relu", "neg", "abs", "sqrt"}) | LIBM

_F64 = np.dtype(np.float64)


@dataclass(frozen=True)
class EntrywiseGroup:
    """A group run as numpy operations: its ops in order, each with its
    output's shape, and the outputs handed on."""

    ops: tuple[UnitOp, ...]
    shapes: tuple[tuple[int, ...], ...]
    outputs: tuple[str, ...]

    def describe(self) -> str:
        """How the group runs, for ``explain()``."""
        return "numpy, element-wise over whole dense arrays"


def _unrestricted(plan, op: UnitOp) -> bool:
    return all(m is None or m.is_true for m in plan.masks.get(op.id, {}).values())


def entrywise_group(plan, ops, outputs) -> EntrywiseGroup | None:
    """The :class:`EntrywiseGroup` running ``ops`` (a fused group of ``plan``
    with these outputs), or None when the group does not qualify.

    >>> import numpy as np, spfuse
    >>> plan = spfuse.compile("H[i,h] = relu(T[i,h]) * S[i,h]").plans(T=np.ones((3, 2)), S=np.ones((3, 2)))["auto"]
    >>> entrywise_group(plan, plan.ops, ("H",)).describe()
    'numpy, element-wise over whole dense arrays'
    >>> plan = spfuse.compile("y[i] = sum(j, T[i,j])").plans(T=np.ones((3, 2)))["auto"]
    >>> entrywise_group(plan, plan.ops, ("y",)) is None
    True
    """
    produced: set[str] = set()
    shapes = []
    for op in ops:
        if type(op) is not UnitOp or op.reduction is not None or op.operator not in EXACT:
            return None   # (a whole fused statement of fusion="max" is the executor's)
        if op.operator == "-" and any(c != 1.0 for c in op.coefficients):
            return None   # (the executor's ``a - b`` reads no coefficients)
        out = tuple(op.out_indices)
        shape = plan.shapes.get(op.out)
        if shape is None or None in shape or len(shape) != len(out) or len(set(out)) != len(out):
            return None
        if not _unrestricted(plan, op):
            return None
        for a in op.args:
            if isinstance(a, Const):
                continue
            if not set(a.indices) <= set(out) or len(set(a.indices)) != len(a.indices):
                return None
            info = plan.inputs.get(a.name)
            if info is not None and info.is_sparse:
                return None
            if info is None and a.name not in produced and plan.shapes.get(a.name) is None:
                return None
        produced.add(op.out)
        shapes.append(tuple(shape))
    if not set(outputs) <= produced:
        return None
    for name in outputs:
        decision = plan.formats.get(name)
        if name in plan.results and (decision is None or any(lv != "dense" for lv in decision.levels)):
            return None
    return EntrywiseGroup(tuple(ops), tuple(shapes), tuple(outputs))


def _relu(x, out: np.ndarray) -> np.ndarray:
    """The executor's ``x if x > 0 else 0.0``: ``fmax`` gives 0 for NaN and
    the negatives, and adding +0.0 turns a -0.0 into +0.0 (and nothing else)."""
    np.fmax(x, 0.0, out=out)
    return np.add(out, 0.0, out=out)


def run_entrywise_group(eg: EntrywiseGroup, env: dict) -> dict[str, Any] | None:
    """Run ``eg`` on ``env``'s operands (spfuse Tensors): ``{output: float64
    ndarray}``, or None when an operand turns out not to be dense (a sparse
    temporary kept on a pattern): the caller then runs the generic executor.

    >>> import numpy as np, spfuse
    >>> from spfuse.tensor import as_tensor
    >>> T = np.array([[1.0, -2.0], [np.nan, -0.0]])
    >>> plan = spfuse.compile("H[i,h] = relu(T[i,h])").plans(T=T)["auto"]
    >>> run_entrywise_group(entrywise_group(plan, plan.ops, ("H",)), {"T": as_tensor(T)})["H"]
    array([[1., 0.],
           [0., 0.]])
    """
    local: dict[str, np.ndarray] = {}
    for op, shape in zip(eg.ops, eg.shapes, strict=True):
        out_ix = tuple(op.out_indices)
        xs: list[Any] = []
        for a in op.args:
            if isinstance(a, Const):
                xs.append(a.value)
                continue
            ix = tuple(a.indices)
            v = local.get(a.name)
            if v is None:
                t = env[a.name]
                fmt = t.format
                if not fmt.is_dense:
                    return None
                v = t.values
                if v.dtype != _F64:
                    v = v.astype(_F64)
                stored = t.shape
                if fmt.is_identity_order:
                    v = v.reshape(stored)
                else:   # the logical order, as a view
                    order = fmt.mode_order
                    v = v.reshape(tuple(stored[m] for m in order)).transpose(np.argsort(order))
            xs.append(v if ix == out_ix else _aligned(v, ix, out_ix))
        local[op.out] = _apply(op, xs, shape)
    return {name: local[name] for name in eg.outputs}


def bind_entrywise(eg: EntrywiseGroup, env: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], dict] | None:
    """:func:`run_entrywise_group` bound to the operand signature of ``env``
    (every operand read a C-ordered float64 array, viewed as stored), or
    None; each call checks that signature by identity and runs
    :func:`run_entrywise_group` when it differs.

    >>> import numpy as np, spfuse
    >>> from spfuse.tensor import as_tensor
    >>> T = np.array([[1.0, -2.0]])
    >>> plan = spfuse.compile("H[i,h] = relu(T[i,h])").plans(T=T)["auto"]
    >>> run = bind_entrywise(entrywise_group(plan, plan.ops, ("H",)), {"T": as_tensor(T)})
    >>> run({"T": as_tensor(T)})["H"]
    array([[1., 0.]])
    """
    formats: dict[str, Any] = {}
    steps = []
    produced: set[str] = set()
    for op, shape in zip(eg.ops, eg.shapes, strict=True):
        out_ix = tuple(op.out_indices)
        args: list[tuple] = []   # (constant or None, operand name, (indices, out indices) when not aligned)
        for a in op.args:
            if isinstance(a, Const):
                args.append((a.value, None, None))
                continue
            ix = tuple(a.indices)
            if a.name not in produced:
                t = env.get(a.name)
                if t is None or t._format is not Format.dense(len(t._shape)) or t._values.dtype is not _F64:
                    return None
                formats[a.name] = t._format
            args.append((None, a.name, None if ix == out_ix else (ix, out_ix)))
        steps.append((op, shape, tuple(args)))
        produced.add(op.out)
    outputs = eg.outputs

    def run(env: Mapping[str, Any]) -> dict | None:
        for name, fmt in formats.items():
            t = env[name]
            if t._format is not fmt or t._values.dtype is not _F64:
                return run_entrywise_group(eg, env)
        local: dict[str, np.ndarray] = {}
        for op, shape, args in steps:
            xs: list[Any] = []
            for constant, name, align in args:
                if name is None:
                    xs.append(constant)
                    continue
                v = local.get(name)
                if v is None:
                    t = env[name]
                    v = t._values.reshape(t._shape)
                xs.append(v if align is None else _aligned(v, *align))
            local[op.out] = _apply(op, xs, shape)
        return {name: local[name] for name in outputs}
    return run


#: an operation over at least this many elements whose matrix operands are
#: all read transposed runs in their layout, then its result is transposed
TRANSPOSED_MIN_ELEMENTS = 1 << 16


def _apply(op: UnitOp, xs: list, shape: tuple) -> np.ndarray:
    """One operation on its operands' arrays (aligned to its output), float64.

    When every matrix operand is a transposed view (a gradient's terms
    ``grad_Y[k,h] = T0[h,k] + T1[h,k]``, each scattered into ``[h,k]``), the
    operation runs over them as stored and one tiled copy transposes the
    result: numpy's element-wise loop writing across the operands' rows
    took 2.3-3 ms at 20000 x 32, against 0.5 ms plus 1 ms for the copy."""
    if _all_transposed(xs, shape):
        return c_ordered(_apply(op, [x.T if isinstance(x, np.ndarray) else x for x in xs], shape[::-1]).T)
    if op.operator == "where":   # (one numpy call: ``c != 0`` picks ``a``, NaN included)
        r = np.where(np.not_equal(xs[0], 0.0), xs[1], xs[2])
        return r if r.shape == shape and r.dtype == _F64 else np.broadcast_to(r, shape).astype(_F64)
    out = _result(shape, _F64)
    if op.operator == "relu":
        return _relu(xs[0], out)
    if op.operator in LIBM:
        np.copyto(out, xs[0])
        map_unary(out.reshape(-1), UNARY_OPS[op.operator], out.reshape(-1), 1)
        return out
    return _entrywise(op, xs, out)


def _all_transposed(xs: list, shape: tuple) -> bool:
    """Are ``xs`` (an operation's operands, aligned to its ``shape``) large
    matrices, each a transposed view of a C-ordered array (constants aside)?

    >>> a = np.ones((400, 300))
    >>> _all_transposed([a.T, 2.0, a.T], (300, 400)), _all_transposed([a.T, a.T.copy()], (300, 400))
    (True, False)
    """
    if len(shape) != 2 or shape[0] * shape[1] < TRANSPOSED_MIN_ELEMENTS:
        return False
    seen = False
    for x in xs:
        if isinstance(x, np.ndarray):
            if x.shape != shape or x.flags.c_contiguous or not x.flags.f_contiguous:
                return False
            seen = True
    return seen


def _aligned(v: np.ndarray, indices: tuple, out_indices: tuple) -> np.ndarray:
    """``v`` (axes ``indices``) as a view that broadcasts against ``out_indices``:
    its axes in their order there, a length-1 axis for each index it lacks.

    >>> _aligned(np.arange(6.0).reshape(2, 3), ("h", "i"), ("i", "k", "h")).shape
    (3, 1, 2)
    """
    v = v.transpose(sorted(range(len(indices)), key=lambda n: out_indices.index(indices[n])))
    return v.reshape(tuple(v.shape[sorted(indices, key=out_indices.index).index(k)] if k in indices else 1
                           for k in out_indices))
