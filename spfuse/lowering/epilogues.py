"""Element-wise tails of an SpMM, SpMV or gemm run inside its kernel, as each output row is stored.

``relu(A·X)``, a GCN layer's ``relu(A·(X·W) + b)``, ``c · (A·X)`` or a
residual ``A·X + R`` are an SpMM, then element-wise work over its whole
``m × K`` result: numpy passes that read and write the result again (at
100k rows and K=64, 51 MB each way per pass; on one thread, numpy's).  The
SpMM kernel takes the tail as a small register program instead
(``spmm(..., epilogue=...)``, :mod:`spfuse._kernels._csr_kernels`): each
output row segment, still in cache, goes through the operations before it
is stored.  Interpretation is paid per row segment, never per element.

:func:`fuse_epilogues` is a pure function from a plan's groups to groups: an
element-wise group (:class:`~spfuse.lowering.entrywise.EntrywiseGroup`)
whose one outside operand is the result of an ``spmm`` group, read by it
alone, becomes one group holding both (``Group.epilogue``), when every
operation is one the kernel runs (``+ - * /``, ``relu neg abs sqrt``,
``where``, a copy) over the SpMM's result, the group's own temporaries, constants, 0-d
operands, vectors along the result's rows (``b[i]``) or columns (``b[k]``)
and dense matrices read in the result's index order.  :func:`run_epilogue`
runs it.  The arithmetic is the element-wise group's, bit for bit: float64
over the SpMM's result as stored (rounded to its value type), operation by
operation, stored once in the result's value type.

A dense product (``gemm``) takes its tail the same way: BLAS runs in row
blocks of a few dozen rows, and each block goes through the tail before the
next (``relu(b + A·X·W)``, whose chain runs ``(A·X)·W``, finishes in gemm).
An element-wise group with no product to finish (sparse attention's
``Y[i,h] = T[i,h] / s[i]`` after its pattern program) runs as such a program
alone over its result's rows (``rows_program``): one pass on the thread
team instead of numpy's pass per operation on one thread.

Measured at 100k rows, 10 per row, K=64 (``relu(A·X)``): see BENCHMARKS.md.
"""
from __future__ import annotations

import functools
from math import prod
from typing import Any

import numpy as np

from spfuse._kernels import _csr_kernels as csr
from spfuse._kernels import _dense_kernels
from spfuse._kernels._result_pool import empty as _result
from spfuse.errors import IndexCheckFailed
from spfuse.ir.ops import Const
from spfuse.lowering import templates
from spfuse.lowering.group_flow import producers_and_readers

__all__ = ["KERNELS", "encoded_epilogue", "fuse_epilogues", "run_epilogue"]

#: per product kernel, the name a group with an epilogue reports (``explain()``, ``TemplateMatch.kernel``)
KERNELS = {"spmm": "spmm+epilogue", "spmv": "spmv+epilogue", "gemm": "gemm+epilogue"}

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)

#: an element-wise group with no product to finish runs as a program of its
#: own (``rows_program``: one pass, in parallel) from this many result elements;
#: below, its numpy passes cost less than setting the program up
ROWS_MIN_ELEMENTS = 1 << 16


def fuse_epilogues(plan, groups: tuple) -> tuple:
    """``groups`` with each element-wise tail of an ``spmm``, ``spmv`` or ``gemm`` group merged into it.

    The merged group takes the tail's place (the SpMM's operands exist by
    then; nothing else reads its result).  Under ``fusion="none"`` groups
    stay as they are.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> from spfuse.lowering.groups import split_groups
    >>> A = sp.random_array((50, 40), density=0.2, format="csr", random_state=0)
    >>> ops = {"A": A, "X": np.ones((40, 3)), "b": np.ones(3)}
    >>> plan = spfuse.compile("Y[i,k] = relu(A[i,j] * X[j,k] + b[k])").plans(**ops)["auto"]
    >>> [g.kernel for g in split_groups(plan)]
    ['spmm+epilogue']
    """
    if plan.fusion == "none":
        return groups
    producer, readers = producers_and_readers(groups)
    merged: dict[int, Any] = {}
    dropped: set[int] = set()
    for n, g in enumerate(groups):
        m = _head(plan, g, n, groups, producer, readers)
        if m is None or m in dropped or m in merged:
            continue
        head = groups[m]
        program = _program(plan, g, head.outputs[0], len(plan.shapes[head.outputs[0]]))
        if program is not None:
            merged[n] = type(g)(g.node, head.ops + g.ops, g.outputs, KERNELS[head.kernel], head.names,
                                head.einsum, epilogue=(head, g, program))
            dropped.add(m)
    for n, g in enumerate(groups):
        if n in merged or n in dropped or len(g.outputs) != 1:
            continue
        if _routed(g) and g.route.scalars:   # a product scaled by its route (``2.5 * A·x``): the scale as the tail
            merged[n] = type(g)(g.node, g.ops, g.outputs, KERNELS[g.kernel], g.names, g.einsum, g.route,
                                epilogue=(g, None, ((), 0, 1)))
        elif g.entrywise is not None and g.outputs == (g.ops[-1].out,) and \
                prod(plan.shapes[g.outputs[0]]) >= ROWS_MIN_ELEMENTS:   # no head: a program of its own
            program = _program(plan, g, None, len(plan.shapes[g.outputs[0]]), temporaries=True)
            if program is not None:
                merged[n] = type(g)(g.node, g.ops, g.outputs, "rows+epilogue", epilogue=(None, g, program))
    return tuple(merged.get(n, g) for n, g in enumerate(groups) if n not in dropped)


def _routed(head) -> bool:
    """Is ``head`` an SpMM, SpMV or gemm group whose kernel can store its result
    itself (not transposed, not kept on a pattern)?"""
    r = head.route
    if head.kernel == "gemm":
        # (a scaled product keeps its own run)
        return r is not None and not r.scalars
    return head.kernel in KERNELS and r is not None and not r.out_swapped and r.pattern is None


def _head(plan, g, n: int, groups, producer, readers) -> int | None:
    """The position of the ``spmm``, ``spmv`` or ``gemm`` group whose result the
    element-wise group ``n`` finishes, or None."""
    if g.entrywise is None or g.outputs != (g.ops[-1].out,):
        return None
    made = {op.out for op in g.ops}
    outside = {a.name for op in g.ops for a in op.refs if a.name not in made and a.name in producer}
    if len(outside) != 1:
        return None
    (t,) = outside
    m = producer[t]
    head = groups[m]
    if m >= n or not _routed(head) or head.outputs != (t,) or t in plan.results or readers.get(t) != {n}:
        return None
    return m


def _program(plan, g, product: str | None, ndim: int, temporaries: bool = False) -> tuple | None:
    """The tail as instructions ``(opcode, destination, args)``, each
    argument ``(kind, what, coefficient)`` -- ``what`` a register, a
    constant or an operand's name (resolved per call) -- and the output
    register; None when an operation or operand is not one the kernel runs.
    ``ndim``: the product's (2: SpMM's rows; 1: SpMV's, whose kernel takes a
    vector along its rows as one along its segment, a "column").
    ``product`` None: no product (register 0 unread); ``temporaries``: other
    groups' results may be read too (an element-wise group's operands are
    dense ones; the run checks)."""
    out_ix = tuple(g.ops[0].out_indices)
    if len(out_ix) != ndim:
        return None
    kinds = ({(): "scalar", out_ix: "column"} if ndim == 1 else
             {(): "scalar", out_ix[:1]: "row", out_ix[1:]: "column", out_ix: "matrix"})
    registers = {product: 0}
    instructions = []
    for op in g.ops:
        opcode = csr.EPILOGUE_OPS.get(op.operator)
        if opcode is None or op.operator == "round" or tuple(op.out_indices) != out_ix:
            return None
        linear = op.operator in ("+", "-")
        if not linear and op.operator not in ("*", "/") and len(op.args) != (3 if op.operator == "where" else 1):
            return None
        coefs = op.coefficients if linear else (1.0,) * len(op.args)
        args = []
        for a, c in zip(op.args, coefs, strict=True):
            if isinstance(a, Const):
                args.append(("constant", a.value * c if linear else a.value, 1.0))
                continue
            ix = tuple(a.indices)
            if a.name in registers:
                if ix != out_ix:
                    return None
                args.append(("register", registers[a.name], c))
                continue
            info = plan.inputs.get(a.name)
            if (info is None and not temporaries) or (info is not None and info.is_sparse):
                return None
            kind = kinds.get(ix)
            if kind is None:
                return None   # (a transposed or broadcast matrix: numpy's)
            args.append((kind, a.name, c))
        registers[op.out] = len(registers)
        instructions.append((op.operator, registers[op.out], tuple(args)))
    return tuple(instructions), registers[g.ops[-1].out], len(registers)


@functools.lru_cache(maxsize=256)
def _static_encoding(program: tuple, scale: float, rounded: bool) -> tuple:
    """The epilogue arrays of ``program`` as far as they do not depend on the
    call (opcodes, argument kinds, registers, constants), and the argument
    slots each call fills from its operands: ``(position, kind, name, c)``."""
    instructions, out_reg, n_regs = program
    code: list[int] = []
    kinds: list[int] = []
    refs: list[int] = []
    consts: list[float] = []
    slots = []
    ops = csr.EPILOGUE_OPS
    kind_codes = csr.EPILOGUE_ARGS

    def emit(operator, dst, args):
        code.extend((ops[operator], dst, len(kinds), len(args)))
        for kind, what, c in args:
            ref, value = 0, c
            if kind == "register":
                ref = what
            elif kind == "constant":
                value = what
            else:   # a 0-d operand (a constant per call) or an array (its address per call)
                slots.append((len(kinds), kind, what, c))
                kind = "constant" if kind == "scalar" else kind
            kinds.append(kind_codes[kind])
            refs.append(ref)
            consts.append(value)

    if scale != 1.0:
        emit("*", 0, (("register", 0, 1.0), ("constant", scale, 1.0)))
        if rounded:
            emit("round", 0, (("register", 0, 1.0),))
    for operator, dst, args in instructions:
        emit(operator, dst, args)
    arrays = (np.array(code, np.int64), np.array(kinds, np.int64), np.array(refs, np.int64),
              np.array(consts, _F64), n_regs, out_reg)
    for a in arrays[:4]:
        a.flags.writeable = False   # (shared by every call: a call fills copies)
    return arrays, tuple(slots)


def encoded_epilogue(program: tuple, env, scale: float, rounded: bool):
    """The kernel's epilogue arrays for this call (operands as float64
    C-ordered arrays, kept alive in the returned list), with the
    SpMM route's scale multiplied in first (rounded like the kernel's
    stored result when the values are float32).  A program reading no
    operand is encoded once."""
    (code, kinds, refs, consts, n_regs, out_reg), slots = _static_encoding(program, scale, rounded)
    if not slots:
        return (code, kinds, refs, consts, n_regs, out_reg), []
    refs, consts = refs.copy(), consts.copy()
    keep = []
    for pos, kind, what, c in slots:
        t = env[what]
        if kind == "scalar":
            consts[pos] = float(t.values.reshape(-1)[0]) * c
            continue
        v = np.ascontiguousarray(t.todense() if not t.format.is_identity_order else t.values.reshape(t.shape),
                                 dtype=_F64)
        keep.append(v)
        refs[pos] = v.ctypes.data
    return (code, kinds, refs, consts, n_regs, out_reg), keep


def run_epilogue(plan, g, env: dict, nt: int) -> dict:
    """A merged group's result: its SpMM with the tail run as each row is
    stored, or the two groups in turn when this call's operands do not fit
    (a merged or checked route that fails per call, values of mixed types:
    the tail's float64 arithmetic would then be stored in float32)."""
    from spfuse.lowering import groups as lowering
    head, tail, program = g.epilogue
    parts = (head,) if tail is None else (head, tail)
    if head is None:
        return _run_rows(plan, g, env, nt)
    if head.kernel == "gemm":
        return _run_gemm_epilogue(plan, g, env, nt)
    found = lowering._routed_operands(plan, head, env, nt)
    if found is None:
        return lowering.run_in_turn(plan, parts, env, nt)
    local, scale, _ = found
    S, D = local[head.names[0]], local[head.names[1]]
    itype, dtype = templates._types([S, D])
    if dtype != _F64 and any(t.dtype != _F32 for t in env.values()):
        return lowering.run_in_turn(plan, parts, env, nt)
    nt = templates._threads([S, D], nt)
    indptr, indices, values = templates._csr(S, itype, dtype)
    dense = templates._dense(D, dtype, nt)
    epilogue, keep = encoded_epilogue(program, env, scale, dtype == _F32)
    name = g.outputs[0]
    out = _result(tuple(plan.shapes[name]), dtype)
    if head.kernel == "spmv":
        bad = csr.spmv(indptr, indices, values, dense, out, nt, S.shape[1], epilogue)
    else:
        bad = csr.spmm(indptr, indices, values, dense, out, nt, 0, False, epilogue)
    del keep   # (the kernel has returned: the operands' float64 copies may go)
    if bad >= 0:
        raise IndexCheckFailed(head.names[0], bad)
    return {name: out}


def _run_gemm_epilogue(plan, g, env: dict, nt: int) -> dict:
    """A merged gemm group's result: BLAS in row blocks, each block's rows
    through the tail while in cache (``_dense_kernels.gemm``'s epilogue)."""
    from spfuse.lowering import groups as lowering
    head, tail, program = g.epilogue
    x, y = head.names[:2]
    _, dtype = templates._types([env[x], env[y]])
    if dtype != _F64 and any(t.dtype != _F32 for t in env.values()):
        return lowering.run_in_turn(plan, (head, tail), env, nt)
    epilogue, keep = encoded_epilogue(program, env, 1.0, False)
    out = lowering._run_gemm(head.names, None, env, nt, epilogue)
    del keep   # (the kernel has returned: the operands' float64 copies may go)
    return {g.outputs[0]: out}


def _run_rows(plan, g, env: dict, nt: int) -> dict:
    """An element-wise group run as a register program of its own over the
    rows of its result (``_dense_kernels.rows_program``), or as numpy
    passes when an operand is a sparse temporary (kept on a pattern)."""
    from spfuse.lowering import groups as lowering
    _, tail, program = g.epilogue
    made = {op.out for op in tail.ops}
    if any(not env[r.name].format.is_dense for op in tail.ops for r in op.refs if r.name not in made):
        return lowering._run_group(plan, tail, env, nt)
    epilogue, keep = encoded_epilogue(program, env, 1.0, False)
    name = g.outputs[0]
    shape = tuple(plan.shapes[name])
    out = _result(shape, _F64)
    _dense_kernels.rows_program(epilogue, out.reshape(1, -1) if len(shape) == 1 else out, nt)
    del keep
    return {name: out}
