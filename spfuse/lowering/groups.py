"""Lower a plan group by group: a template kernel where one matches, else the generic executor.

After fusion the top-level subtrees of ``plan.tree`` are the plan's fused
groups, in dependence order; temporaries that cross from one group to a later
one are stored whole.  Each group is lowered on its own:

* a dense × dense contraction (GNN-1's ``X·W`` after reassociation, or a
  user's ``T[k,j] = X[k,h]*W[h,j]``) runs as one BLAS ``gemm`` call;
* a group whose operations inline to an einsum a template implements
  (``spmm``, ``sddmm_spmm``, CSF ``ttm``, ...) runs that template kernel;
* anything else runs the generic loop-tree executor on the group alone.

The runnable passes each crossing temporary on as a dense operand (the
whole-plan executor also stores a temporary that no loop reduces whole and
dense, so this costs no extra memory).
"""
from __future__ import annotations

import functools
import itertools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from math import prod
from typing import Any

import numpy as np

from spfuse._kernels import _dense_kernels
from spfuse._kernels._result_pool import empty as _result
from spfuse.formats import Format
from spfuse.frontend.ast import Access
from spfuse.ir.ops import Const, Ref, TensorInfo, UnitOp
from spfuse.ir.tree import Reset, Root, iter_nodes
from spfuse.lowering import templates
from spfuse.lowering.entrywise import EntrywiseGroup, bind_entrywise, entrywise_group, run_entrywise_group
from spfuse.lowering.epilogues import encoded_epilogue, fuse_epilogues, run_epilogue
from spfuse.lowering.looptree import lower_cached
from spfuse.lowering.pattern_values import PatternGroup, _is_csr, pattern_group, run_pattern_group
from spfuse.lowering.summed_spmms import run_summed, sum_spmms
from spfuse.lowering.transposes import sharing_copies
from spfuse.memo import attached_dict
from spfuse.passes.decompose import _product_factors
from spfuse.passes.formats import FormatDecision
from spfuse.passes.fusion import ops_under
from spfuse.passes.mask_drivers import MaskDrivers
from spfuse.runtime import looptree as lt
from spfuse.runtime.blas_pool import hold_blas_once
from spfuse.tensor import Tensor, same_pattern, values_at

__all__ = ["BoundGroups", "Group", "Route", "split_groups", "lower_groups", "transposed_name", "pattern_name",
           "sums_products"]


@dataclass(frozen=True)
class Group:
    """One top-level subtree of a plan and how it runs.

    ``kernel`` is ``"gemm"``, a template name, ``"generic"``, or ``"copy"``
    (a result copying a temporary or result whole: no loop, see
    :func:`copy_source`); ``einsum`` holds ``(out_name, out_indices,
    summed, factors)`` for template groups.
    """

    node: Any
    ops: tuple[UnitOp, ...]
    outputs: tuple[str, ...]
    kernel: str
    names: tuple[str, ...] = ()
    einsum: tuple | None = None
    #: how the einsum reaches the kernel (transposed, scaled, merged operands)
    route: Route | None = None
    #: the group's own temporaries when not the plan's (a split group's tail)
    temporaries: Mapping | None = None
    #: element-wise work on one sparse pattern run on its values (kernel "pattern")
    on_pattern: PatternGroup | None = None
    #: a generic group of element-wise work on whole dense arrays, run as numpy operations
    entrywise: EntrywiseGroup | None = None
    #: ``spmm_t`` (or ``spmm``) groups and the element-wise group adding their
    #: results, run as one walk of their pattern (kernel ``"spmm_t_sum"``) or
    #: one SpMM per term into one result (``"spmm_sum"``, :mod:`.summed_spmms`)
    summed: tuple[Group, ...] = ()
    #: per summed term, the factors scaling it (constants, names of 0-d operands)
    scalings: tuple[tuple[float | str, ...], ...] = ()
    #: ``(spmm group, element-wise group, program)``: the element-wise tail run
    #: in the SpMM kernel as each row is stored (:mod:`.epilogues`)
    epilogue: tuple = ()

    def describe(self) -> str:
        what = "; ".join(str(op) for op in self.ops)
        if self.kernel == "copy":
            return f"no loop (the array of {self.ops[0].refs[0].name}, copied only if it is a result too): {what}"
        how = "BLAS gemm" if self.kernel == "gemm" else (
            "generic executor" if self.kernel == "generic" else f"template {self.kernel}")
        if self.on_pattern is not None:
            how = self.on_pattern.describe()
        if self.entrywise is not None:
            how = self.entrywise.describe()
        if self.epilogue:
            head, tail, _ = self.epilogue
            if head is None:
                return f"one pass over the result's rows, in parallel (a register program): {what}"
            if tail is None:
                return f"{head.describe()} (the factor applied in the kernel, as each row is stored)"
            return (f"{head.describe()}; then in the kernel, as each row is stored: "
                    f"{'; '.join(map(str, tail.ops))}")
        if self.summed:
            *parts, total = self.summed
            how = ("summed in one walk of one pattern (checked per call)" if parts[0].kernel == "spmm_t"
                   else "accumulated one after another into one result")
            return (f"template {parts[0].kernel}, {len(parts)} terms {how} "
                    f"[{'; '.join(p.describe() for p in parts)}]: "
                    f"{'; '.join(map(str, total.ops))}")
        r = self.route
        if r is not None and r.merged:
            how += " on " + ", ".join("∘".join(parts) for _, parts in r.merged) + " (one pattern, checked per call)"
        if r is not None and r.transposed:
            how += f" reading {', '.join(n + 'ᵀ' for n in r.transposed)}"
        if r is not None and r.out_swapped:
            how += " into the transposed result"
        if r is not None and r.scalars:
            how += f" times {' · '.join(r.scalars)}"
        if r is not None and r.pattern:
            how += f" on the pattern of {r.pattern} (kept sparse)"
        return f"{how}: {what}"


def _group_einsum(ops: tuple[UnitOp, ...], out: str, inlined: list | None = None):
    """The einsum ``out`` is, inlining the group's own product temporaries, or
    None; ``inlined`` (when given) receives the ops the einsum is made of."""
    producers = {op.out: op for op in ops}
    root = producers[out]
    summed: list[str] = []
    factors: list[tuple[str, tuple]] = []

    def inline(op: UnitOp, taken: set) -> bool:
        x = op.args[0] if len(op.args) == 2 else None
        if (op.operator == "/" and op.reduction is None and isinstance(x, Ref) and op.args[1] == x
                and x.name not in producers):
            # X/X: ones on X's pattern where X stores finite non-zeros (checked per call)
            if inlined is not None:
                inlined.append(op)
            factors.append((pattern_name(x.name), x.indices))
            return True
        c = op.args[1] if len(op.args) == 2 else None
        if (op.operator == "/" and op.reduction is None and isinstance(x, Ref) and isinstance(c, Const)
                and _exact_reciprocal(c.value)):
            # X / 2^e is X * 2^-e bit for bit (both the correctly rounded x·2^-e):
            # the attention scale Q·Kᵀ / 8 is a scalar factor of the product
            if inlined is not None:
                inlined.append(op)
            factors.append((_constant_name(1.0 / c.value), ()))
            p = producers.get(x.name)
            if p is not None:
                return x.indices == p.out_indices and inline(p, taken)
            factors.append((x.name, x.indices))
            return True
        if op.operator not in ("*", None) or op.reduction not in ("sum", None):
            return False
        expr = getattr(op, "expr", None)   # a whole fused statement (max_fusion.StatementOp)
        if expr is not None and not all(isinstance(f, Access) for f in _product_factors(expr)):
            return False  # its args are leaves of an expression, not factors: tanh(A*B) is no SpMV
        if op.operator is None and op.reduction is None:
            return False
        if inlined is not None:
            inlined.append(op)
        if op.operator == "/":
            return False
        for ix in op.reduced:
            if ix in taken:
                return False  # a summed index reused elsewhere: renaming needed, not worth it
            taken.add(ix)
            summed.append(ix)
        for a in op.args:
            if isinstance(a, Const):
                factors.append((_constant_name(a.value), ()))
                continue
            if not isinstance(a, Ref):
                return False
            p = producers.get(a.name)
            if p is not None and p is not op:
                if a.indices != p.out_indices or not inline(p, taken):
                    return False
            else:
                factors.append((a.name, a.indices))
        return True

    taken = set(root.out_indices)
    if not inline(root, taken) or len(factors) < (1 if summed else 2):
        return None
    return out, root.out_indices, tuple(summed), factors


def _exact_reciprocal(c: float) -> bool:
    """Is dividing by ``c`` the same, bit for bit, as multiplying by
    ``1/c``?  For a power of two whose reciprocal is a normal number.

    >>> _exact_reciprocal(8.0), _exact_reciprocal(0.25), _exact_reciprocal(3.0), _exact_reciprocal(0.0)
    (True, True, False, False)
    """
    if not math.isfinite(c) or c == 0.0:
        return False
    mantissa, _ = math.frexp(abs(c))
    r = 1.0 / c
    return mantissa == 0.5 and math.isfinite(r) and abs(r) >= sys.float_info.min


def _gemm_roles(einsum, infos) -> tuple | None:
    """``(X, Y, x_t, y_t, out_t)`` when the einsum is one dense 2-D × 2-D product:
    ``out = op(X) @ op(Y)`` with the transposes flagged.  A result indexed
    the other way round is ``op(Y)ᵀ @ op(X)ᵀ``: the factors swap and flip
    their flags (BLAS reads a matrix transposed for free), so ``out_t`` is
    False and the result is never copied into its order.

    >>> from spfuse.ir.ops import TensorInfo
    >>> info = TensorInfo("D", 2, ("dense", "dense"), (0, 1), (3, 3), "input", 9)
    >>> _gemm_roles(("W", ("h", "c"), ("j",), [("G", ("j", "c")), ("H", ("j", "h"))]), {"G": info, "H": info})
    ('H', 'G', True, False, False)
    """
    out, out_ix, summed, factors = einsum
    if len(factors) != 2 or len(summed) != 1 or len(out_ix) != 2:
        return None
    (x, xi), (y, yi) = factors
    if any(infos[n].is_sparse or infos[n].ndim != 2 for n in (x, y)):
        return None
    (s,) = summed
    if s not in xi or s not in yi or len(set(xi) | set(yi)) != 3:
        return None
    a, b = (ix for ix in xi if ix != s), (ix for ix in yi if ix != s)
    a, b = next(a), next(b)
    if set(out_ix) != {a, b}:
        return None
    if out_ix != (a, b):
        return y, x, yi == (s, b), xi == (a, s), False
    return x, y, xi != (a, s), yi != (s, b), False


def _run_gemm(roles, out_shape, tensors, nt, epilogue=None):
    """``op(X) @ op(Y)`` through BLAS; ``epilogue``: a tail's program
    (:func:`~spfuse.lowering.epilogues.encoded_epilogue`), each row block
    through it while in cache."""
    x, y, xt, yt, _ = roles   # (a result in the other order swapped the factors: see _gemm_roles)
    _, dtype = templates._types([tensors[x], tensors[y]])
    X, xt = _blas_operand(tensors[x], xt, dtype)
    Y, yt = _blas_operand(tensors[y], yt, dtype)
    out = _result((X.shape[1] if xt else X.shape[0], Y.shape[0] if yt else Y.shape[1]), dtype)
    hold_blas_once()   # (BLAS's own pool left asleep: the blocks run on our team)
    _dense_kernels.gemm(X, Y, out, nt, trans_a=xt, trans_b=yt, epilogue=epilogue)
    return out


def _bind_gemm(roles, tensors, tail=None):
    """:func:`_run_gemm` bound to the operand signature of ``tensors`` (both
    factors C-ordered matrices of the product's dtype: handed to BLAS as
    stored), or None; each call checks the signature by identity and takes
    the general way when it differs.  ``tail``: the merged group whose
    epilogue the rows go through (:func:`~spfuse.lowering.epilogues.run_epilogue`;
    bound for float64 products)."""
    x, y, xt, yt, _ = roles
    _, dtype = templates._types([tensors[x], tensors[y]])
    matrix = Format.dense(2)
    if any(tensors[n]._format is not matrix or tensors[n]._values.dtype is not dtype for n in (x, y)):
        return None
    if tail is not None and dtype is not templates._F64:
        return None
    gemm = templates._specialised(_dense_kernels.gemm, dtype)
    hold_blas_once()

    def run(tensors, nt: int) -> np.ndarray:
        X, Y = tensors[x], tensors[y]
        if X._format is not matrix or Y._format is not matrix or X._values.dtype is not dtype \
                or Y._values.dtype is not dtype:
            return _run_gemm(roles, None, tensors, nt) if tail is None else \
                run_epilogue(tail[0], tail[1], tensors, nt)[tail[1].outputs[0]]
        xs, ys = X._shape, Y._shape
        out = _result((xs[1] if xt else xs[0], ys[0] if yt else ys[1]), dtype)
        epilogue, keep = (None, None) if tail is None else encoded_epilogue(tail[1].epilogue[2], tensors, 1.0, False)
        gemm(X._values.reshape(xs), Y._values.reshape(ys), out, nt, xt, yt, epilogue)
        del keep   # (the kernel has returned: the operands' float64 copies may go)
        return out
    return run


def _blas_operand(t, transposed: bool, dtype) -> tuple[np.ndarray, bool]:
    """A matrix read (``transposed``) by gemm as ``(C-ordered array, BLAS
    transpose flag)``: the stored array itself either way round (BLAS reads
    it transposed -- a (fibres × 16) factor summed over its fibres is not
    copied), a copy only when neither way is C-ordered."""
    fmt, values = t._format, t._values
    if values.dtype == dtype and fmt.is_dense and fmt.is_identity_order:
        return values.reshape(t._shape), transposed   # (the common case: C-ordered as stored)
    view = templates._dense_view(t, dtype)
    view = view.T if transposed else view
    if view.flags.c_contiguous:
        return view, False
    if view.T.flags.c_contiguous:
        return view.T, True
    return np.ascontiguousarray(view), False


def _computed_whole(plan, op: UnitOp) -> bool:
    """May ``op``'s output be computed whole (as a template or BLAS does)?

    Not when propagation restricted it to a pattern living inside its index
    space -- SDDMM's ``C·D`` demanded only on ``B[i,j]``: computing it whole
    would be asymptotically more work.  A pattern that is only a projection
    onto the temporary (``A[i,k]``'s columns for ``T[k,j]`` in ``A·(X·W)``)
    prunes little and is not iterable there anyway."""
    readers = [(o.statement, r.indices) for o in plan.ops for r in o.refs if r.name == op.out]
    for ix in op.out_indices:
        mask = plan.masks.get(op.id, {}).get(ix)
        if mask is None or mask.is_true:
            continue
        for atom in mask.atoms:
            statement, _, indices, _ = plan.atoms[atom]
            if statement == op.statement and set(indices) <= set(op.out_indices):
                return False
            if any(st == statement and set(indices) <= set(rix) for st, rix in readers):
                return False
    return True


def _temp_info(name, shape) -> TensorInfo:
    return TensorInfo.dense(name, tuple(shape))


def _constant_name(value: float) -> str:
    """The factor name of a numeric constant (no program name parses as a number)."""
    return repr(float(value))


@functools.lru_cache(maxsize=1024)
def _constant(name: str) -> float | None:
    """The number a factor name spells, or None (memoised: asked per factor per call)."""
    try:
        return float(name)
    except ValueError:
        return None


_PATTERN = ".pattern"


def _factor_info(plan, name: str) -> TensorInfo | None:
    """What planning knows about an einsum factor: an input, a temporary (on
    a CSR input's pattern when a pattern program hands it on sparse), a
    constant, or an input's pattern (None when that input is not sparse)."""
    if _constant(name) is not None:
        return TensorInfo.dense(name, ())
    on = sparse_temporaries(plan).get(name)
    if on is not None:
        return replace(plan.inputs[on], name=name)
    if name.endswith(_PATTERN):
        src = plan.inputs.get(name[: -len(_PATTERN)])
        return replace(src, name=name) if src is not None and src.is_sparse else None
    return plan.inputs.get(name) or _temp_info(name, plan.shapes[name])


def _factor_source(name: str) -> str | None:
    """The operand a factor reads (None for a constant)."""
    if _constant(name) is not None:
        return None
    return name[: -len(_PATTERN)] if name.endswith(_PATTERN) else name


#: Kernels whose result is a dense array (a transposed result is one copy away).
_DENSE_RESULT = frozenset({"gemm", "spmv", "spmv_t", "bilinear", "row_sums", "col_sums", "spmm", "spmm_t",
                           "spmm_gemm", "gnn2",
                           "sddmm_spmm", "sddmm_spmm_gemm", "ttv_mid", "mttkrp", "mttkrp_mid", "mttkrp_inner",
                           "mttkrp_gemm"})


#: Kernels assembling a new sparse result (not one on an operand's pattern):
#: their inputs may be read transposed, and a result computed transposed is
#: returned in the other mode order (CSR of Cᵀ is CSC of C, no copy): AᵀA
#: and A·Bᵀ run as Gustavson SpGEMM.
_FRESH_SPARSE_RESULT = frozenset({"spgemm"})


#: Kernels doing one multiply-add per stored entry: handing them a CSR
#: operand transposed (a pass over its pattern and a gather of its values per
#: call) costs more than the kernel; Aᵀx runs as ``spmv_t`` instead.  A CSC
#: operand's transpose is free: its arrays are the CSR of the transpose.
_SCALAR_PER_ENTRY = frozenset({"spmv", "spmv_t", "bilinear", "row_sums", "col_sums"})


def _free_transpose(info: TensorInfo) -> bool:
    """Is handing a kernel this matrix's transpose free (dense needs a copy,
    CSR a gather; a CSC matrix's arrays are the CSR of its transpose)?"""
    return info.is_sparse and info.mode_order == (1, 0)


#: Kernels whose sparse result lives on their (first) sparse operand's pattern.
_ON_OPERAND_PATTERN = frozenset({"sddmm", "sddmm_t", "scale", "scale_rows", "scale_cols", "masked_spgemm",
                                 "masked_spgemm_dot"})


def _read_as_stored(sparse: str, factors, swaps, out_swapped: bool, local) -> bool:
    """Is the result, on the pattern of the kernel's first operand
    ``sparse``, the program's result on that operand's own pattern?  Either
    the operand is read as it is and the result not transposed (the other
    factors may be), or ``Cᵀ`` is computed on the pattern of a CSC operand's
    transpose (its own arrays, read as CSR): ``C`` in its storage order, no
    copy."""
    swapped = {transposed_name(factors[n][0]): factors[n][0] for n in swaps}
    if sparse not in swapped:
        return not out_swapped
    return out_swapped and _free_transpose(local[swapped[sparse]])


def transposed_name(name: str) -> str:
    """The operand name a group reads ``name``'s transpose under (no program
    name contains a dot, so it cannot collide).

    >>> transposed_name("Wd")
    'Wd.T'
    """
    return f"{name}.T"


def _swappable(info: TensorInfo) -> bool:
    """A matrix whose transpose is cheap to hand a kernel: dense (one copy of
    a small factor) or CSR/CSC (a remembered transposed pattern, one gather)."""
    if info.ndim != 2:
        return False
    return not info.is_sparse or info.levels == ("dense", "compressed")


def _swapped_info(name: str, info: TensorInfo) -> TensorInfo:
    shape = tuple(reversed(info.shape))
    if not info.is_sparse:
        return TensorInfo.dense(name, shape)
    return TensorInfo(name, 2, ("dense", "compressed"), (0, 1), shape, nnz=info.nnz)


@dataclass(frozen=True)
class Route:
    """How a template group's einsum is handed to its kernel.

    ``transposed``: factors passed transposed (under :func:`transposed_name`);
    ``out_swapped``: the kernel computes the 2-D result transposed;
    ``scalars``: 0-d factors, multiplied into the kernel's result;
    ``merged``: ``(name, parts)`` -- CSR factors read at the same indices,
    passed as one CSR operand (``name``) whose values are the parts' product
    when the parts store one pattern (checked per call; else the group runs
    on the generic executor)."""

    kernel: str
    names: tuple
    transposed: tuple[str, ...] = ()
    out_swapped: bool = False
    scalars: tuple[str, ...] = ()
    merged: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: merged parts read transposed (as :func:`transposed_name`), made before merging
    flipped: tuple[str, ...] = ()
    #: the CSR input on whose pattern a restricted temporary is computed
    #: (read as :func:`pattern_name`); the result stays sparse
    pattern: str | None = None


def _simplified(ein, local) -> tuple[tuple, tuple, tuple, tuple] | None:
    """``(einsum, scalars, merged, flipped)``: ``ein`` without its 0-d factors
    and with its CSR factors of equal indices merged (see :class:`Route`),
    one read with the other's indices swapped taking part transposed
    (``flipped``), or None when there is nothing to simplify."""
    from spfuse.lowering.templates import _kind
    out, out_ix, summed, factors = ein
    scalars = tuple(f for f, ix in factors if not ix)
    groups: dict[tuple, list[int]] = {}   # indices -> positions of the CSR factors read there
    flipped: set[int] = set()             # ... read transposed (A_T[h,i] with Z[i,h]): passed as Zᵀ
    for n, (f, ix) in enumerate(factors):
        if ix and _kind(local[f]) == "csr":
            if ix not in groups and len(ix) == 2 and ix[::-1] in groups:
                flipped.add(n)
                ix = ix[::-1]
            groups.setdefault(ix, []).append(n)
    merged = [ns for ns in groups.values() if len(ns) > 1]
    if not scalars and not merged:
        return None
    first = {ns[0]: ns for ns in merged}
    dropped = {n for ns in merged for n in ns[1:]}
    facs: list = []
    parts_of = []
    for n, (f, ix) in enumerate(factors):
        if not ix or n in dropped:
            continue
        if n in first:
            parts = tuple(transposed_name(factors[m][0]) if m in flipped else factors[m][0] for m in first[n])
            name = "*".join(parts)
            local[name] = replace(local[f], name=name)
            parts_of.append((name, parts))
            f = name
        facs.append((f, ix))
    return ((out, out_ix, summed, facs), scalars, tuple(parts_of),
            tuple(sorted({factors[m][0] for m in flipped if m in dropped})))


def _choose_kernel(ein, local, ops) -> Route | None:
    """The :class:`Route` of an einsum to a template kernel, or None.

    Tried first as written; then with 2-D factors read with their indices
    swapped (``sum(j, G[i,j] * Wd[h,j])`` is SpMM with ``Wdᵀ``; ``sum(i,
    G[i,j] * H[i,h])`` is SpMM with ``Gᵀ``) and a 2-D dense result computed
    transposed, fewest swaps first; then without 0-d factors and with
    same-index CSR factors merged (``sum(j, G[i,j] * s * K[j,h] * A[i,j])``
    is SpMM of ``G∘A`` times ``s``), or, with no summed index, a product
    on one pattern (``G[i,j] * A[i,j]``: kernel ``"values"``)."""
    local = dict(local)
    route = _route(ein, local, ops)
    if route is not None:
        return route
    simple = _simplified(ein, local)
    if simple is None:
        return None
    ein, scalars, merged, flipped = simple
    out, out_ix, summed, factors = ein
    if not summed and len(factors) == 1 and factors[0][1] == out_ix and local[factors[0][0]].is_sparse:
        return Route("values", (factors[0][0],), (), False, scalars, merged, flipped=flipped)
    route = _route(ein, local, ops) if len(factors) > 1 else None
    return None if route is None else replace(route, scalars=scalars, merged=merged, flipped=flipped)


def _route(ein, local, ops) -> Route | None:
    from spfuse.lowering.templates import SIGNATURES, _unify, fits_operands, follows_template
    out, out_ix, summed, factors = ein
    if len(set(summed)) != len(summed):
        return None
    roles = _gemm_roles(ein, local)
    if roles is not None:
        return Route("gemm", roles)
    swappable = [n for n, (f, ix) in enumerate(factors) if len(ix) == 2 and _swappable(local[f])]
    if len(factors) > 5:
        swappable = []  # variants grow as 2^n (the widest template reads five factors)
    outs = [False, True] if len(out_ix) == 2 else [False]
    variants = sorted(((frozenset(c), o) for k in range(len(swappable) + 1)
                       for c in itertools.combinations(swappable, k) for o in outs),
                      key=lambda v: len(v[0]) + v[1])
    for swaps, out_swapped in variants:
        facs = [(transposed_name(f), ix[::-1]) if n in swaps else (f, ix) for n, (f, ix) in enumerate(factors)]
        names_local = dict(local)
        names_local.update({transposed_name(factors[n][0]): _swapped_info(transposed_name(factors[n][0]),
                                                                          local[factors[n][0]]) for n in swaps})
        o_ix = out_ix[::-1] if out_swapped else out_ix
        for name, sig in SIGNATURES.items():
            found = _unify(sig, o_ix, summed, facs, names_local)
            if found is None or not fits_operands(name, found, names_local) \
                    or not follows_template(name, found, ops, names_local):
                continue
            if (swaps or out_swapped) and name not in _DENSE_RESULT | _FRESH_SPARSE_RESULT and not (
                    name in _ON_OPERAND_PATTERN and _read_as_stored(found[0], factors, swaps, out_swapped, local)):
                continue  # its result would live on a transposed operand's pattern
            if name in _SCALAR_PER_ENTRY and any(local[factors[n][0]].is_sparse
                                                 and not _free_transpose(local[factors[n][0]]) for n in swaps):
                continue  # transposing costs more than the kernel
            return Route(name, tuple(found), tuple(sorted({factors[n][0] for n in swaps})), out_swapped)
    return None


def pattern_name(name: str) -> str:
    """The operand name a group reads ``name``'s pattern (ones on its stored
    entries) under.

    >>> pattern_name("P")
    'P.pattern'
    """
    return f"{name}{_PATTERN}"


def _pattern_of(plan, op: UnitOp) -> str | None:
    """A CSR input whose stored pattern holds every entry of ``op``'s 2-D
    output that propagation says is needed (each term of its column mask
    reads the input's column level at the output's own indices), or None.
    SDDMM's ``C·D`` in ``P[i,j] * (C·D - X)`` is needed on ``P`` only."""
    from spfuse.lowering.templates import _kind
    if len(op.out_indices) != 2:
        return None
    row, col = op.out_indices
    masks = plan.masks.get(op.id, {})
    if masks.get(row) is not None and not masks[row].is_true:
        return None
    mask = masks.get(col)
    if mask is None or mask.is_true or not mask.terms:
        return None
    per_term = []
    for term in mask.terms:
        names = set()
        for atom in term:
            _, tensor, indices, mode = plan.atoms[atom]
            info = plan.inputs.get(tensor)
            if info is not None and _kind(info) == "csr" and tuple(indices) == (row, col) and mode == 1:
                names.add(tensor)
        per_term.append(names)
    common = set.intersection(*per_term)
    return min(common) if common else None


def _on_a_pattern(plan, names) -> bool:
    """Is any of ``names`` a temporary the plan computes on a sparse pattern
    only (``T0[i,j] = sum(k, B[i,j]·C[i,k]·D[j,k])``, stored on B's pattern)?
    Handed to BLAS it would be densified: 20000² entries for a gradient of
    SDDMM-SpMM, where the executor reads it on its pattern."""
    for op in plan.ops:
        if op.out in names and op.out not in plan.inputs and not _computed_whole(plan, op):
            return True
    return False


def _head_route(plan, ops, t: str, available, head: list | None = None) -> tuple[tuple, Route] | None:
    """``(einsum, route)`` computing the group's temporary ``t`` on a template
    (with the ops it is made of appended to ``head``): whole when nothing
    restricts it, or on a CSR input's pattern (:func:`_pattern_of`) as SDDMM."""
    producers = {op.out: op for op in ops}
    ein = _group_einsum(ops, t, head)
    if ein is None or not all(_factor_source(f) in available | {None} for f, _ in ein[3]):
        return None
    if plan.fusion == "max" and len(ein[3]) > 2:
        return None   # (see match_template: a longer chain is max's own loop nest)
    infos = plan.inputs
    local = {f: _factor_info(plan, f) for f, _ in ein[3]}
    if any(i is None for i in local.values()):
        return None
    if t in plan.results or _computed_whole(plan, producers[t]):
        route = _choose_kernel(ein, local, ops)
        if route is not None and route.kernel == "gemm" and _on_a_pattern(plan, [f for f, _ in ein[3]]):
            return None   # a temporary stored on a sparse pattern is no dense matrix for BLAS
        return None if route is None else (ein, route)
    pattern = _pattern_of(plan, producers[t])
    if pattern is None:
        return None
    out, out_ix, summed, factors = ein
    local[pattern_name(pattern)] = replace(infos[pattern], name=pattern_name(pattern))
    route = _route((out, out_ix, summed, [*factors, (pattern_name(pattern), out_ix)]), local, ops)
    if route is None or route.kernel not in ("sddmm", "sddmm_t"):
        return None
    return ein, replace(route, pattern=pattern)


def _template_head(plan, ops, available) -> tuple[list, list] | None:
    """``(head, tail)`` when a group that no template runs whole starts with
    an einsum a template runs, followed by element-wise work on its result
    (GCN's ``relu(A·(X·W))``, ``sigmoid(X·W + b)``, a normalising division,
    ``P ∘ (H·Wd - X)``): the template computes the einsum's temporary, whole
    or on the pattern that restricts it, the generic executor the rest.
    None when no such split exists.

    A dense product (a BLAS head, reading no operand of the group) is taken
    before a sparse one, wherever it stands: what it leaves may be one
    pattern program, where taking the sparse head first leaves the product
    between two pieces (an SDDMM-SpMM-GEMM gradient's ``grad_A·Wᵀ`` split
    its sampled products over an ``sddmm_t`` pass and a pattern program)."""
    produced = {op.out for op in ops}
    first = None
    for op in ops:
        t = op.out
        if t in plan.results or not any(r.name == t for o in ops if o is not op for r in o.refs):
            continue
        shape = plan.shapes.get(t)
        if shape is None or None in shape:
            continue
        head: list = []
        found = _head_route(plan, ops, t, available - produced, head)
        if found is None:
            continue
        tail = [o for o in ops if o not in head]
        inner = {h.out for h in head} - {t}
        if not tail or any(r.name in inner for o in tail for r in o.refs):
            continue
        route = found[1]
        # (merged factors and X/X patterns may fall back to the generic executor, which a head has no tree for)
        checked = route.merged or any(_checked_pattern(route, f) for f, _ in found[0][3])
        if (route.kernel in _DENSE_RESULT or route.pattern) and not checked:
            split = [o for o in ops if o in head], tail
            if route.kernel == "gemm":
                return split
            first = first or split
    return first


#: Below this many multiply-adds a contraction stays fused with the
#: element-wise work feeding it (one more kernel call from Python costs
#: ~15-30 µs, the generic executor's fused product ~1-6 ns per multiply-add).
TAIL_MIN_WORK = 1 << 14


def _einsum_work(plan, ein, local) -> float:
    """Multiply-adds of an einsum: the product of its index extents, times the
    density of each sparse factor."""
    out, out_ix, summed, factors = ein
    extents: dict[str, int] = {}
    density = 1.0
    for f, ix in factors:
        info = local[f]
        for i, n in zip(ix, info.shape, strict=True):
            extents[i] = n or 0
        if info.is_sparse and info.nnz is not None:
            size = prod(n or 0 for n in info.shape)
            density *= info.nnz / size if size else 0.0
    return prod(extents.get(i, 1) for i in dict.fromkeys((*out_ix, *summed))) * density


def _template_tail(plan, ops, available) -> tuple[list, list] | None:
    """``(head, tail)`` when a group that no template runs whole ends in an
    einsum a template runs, fed by element-wise work of the group (a ReLU's
    gradient ``where(H, grad_H, 0)`` summed against ``H_r``): the generic
    executor computes the element-wise temporaries whole, the template the
    contraction.  Fused, the generic executor would run the contraction
    itself at several ns per multiply-add.  Not when a temporary crossing to
    the tail is restricted to a pattern (computing it whole would be more
    work), nor below :data:`TAIL_MIN_WORK` multiply-adds."""
    read = {r.name for o in ops for r in o.refs}
    roots = [o for o in ops if o.out not in read]
    if len(roots) != 1:
        return None
    root = roots[0]
    # the einsum inlining the group's products (element-wise ops are the
    # head's: it reads their results as factors), else the root op alone
    products = tuple(o for o in ops if o is root or (o.operator in ("*", None) and o.reduction in ("sum", None)
                                                     and getattr(o, "expr", None) is None))
    for candidates in dict.fromkeys((products, (root,))):
        split = _tail_of(plan, ops, candidates, root.out, available)
        if split is not None:
            return split
    return None


def _tail_of(plan, ops, candidates, root: str, available) -> tuple[list, list] | None:
    """:func:`_template_tail` for the einsum ``root`` is over ``candidates``."""
    tail: list = []
    ein = _group_einsum(candidates, root, tail)
    head = [o for o in ops if o not in tail]
    if ein is None or not head:
        return None
    inner = {o.out for o in tail}
    if any(r.name in inner for o in head for r in o.refs):
        return None
    producers = {o.out: o for o in head}
    if any(_factor_source(f) in producers and f != _factor_source(f) for f, _ in ein[3]):
        return None  # a pattern of a temporary (T/T): the generic executor keeps it
    crossing = {f for f, _ in ein[3] if f in producers}
    if not crossing or any(not _computed_whole(plan, producers[f]) for f in crossing):
        return None
    found = _head_route(plan, tail, root, available | set(producers))
    # (merged factors and X/X patterns may fall back to the generic executor, which a tail has no tree for)
    if found is None or found[1].merged or any(_checked_pattern(found[1], f) for f, _ in found[0][3]):
        return None
    local = {f: _factor_info(plan, f) for f, _ in ein[3]}
    if _einsum_work(plan, ein, local) < TAIL_MIN_WORK:
        return None
    return head, [o for o in ops if o in tail]


def _routes_whole(plan, ops, available) -> bool:
    """Does the whole group (one op whose result nothing in it reads) reach a template?"""
    read = {r.name for o in ops for r in o.refs}
    roots = [o.out for o in ops if o.out not in read]
    return len(roots) == 1 and _head_route(plan, ops, roots[0], available | {o.out for o in ops}) is not None


def copy_source(plan, op: UnitOp) -> str | None:
    """The name a dense result copies whole, or None.

    ``T_saved[i,h] = T[i,h]`` (a differentiated program's saving forward
    keeps ``T`` this way) reads a temporary or result at its own indices in
    the same order.  Such a statement needs no loop: the result is the
    source's dense array (copied once when the source is a result too).
    Fused into its producer's loop it would make a two-statement loop body,
    which the generic executor runs element by element, about ten times
    slower than the producer alone.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> p = plan_program(parse_program("H[i,h] = relu(X[i,h]); S[i,h] = H[i,h]; Y[i] = sum(h, H[i,h])"),
    ...                  {"X": TensorInfo.dense("X", (4, 3))})
    >>> [copy_source(p, op) for op in p.ops]
    [None, 'H', None]
    """
    if op.operator is not None or op.reduction is not None or len(op.args) != 1:
        return None
    (src,) = op.args
    if not isinstance(src, Ref) or src.indices != op.out_indices or op.out not in plan.results:
        return None
    producer = next((o for o in plan.ops if o.out == src.name), None)
    shape = plan.shapes.get(src.name)
    if producer is None or shape is None or None in shape or not _dense_result(plan, op.out):
        return None
    # the source is handed on dense: a dense result, or a temporary computed whole
    if src.name in plan.results:
        return src.name if _dense_result(plan, src.name) else None
    return src.name if _computed_whole(plan, producer) else None


def _dense_result(plan, name: str) -> bool:
    decision = plan.formats.get(name)
    return decision is not None and all(lv == "dense" for lv in decision.levels)


def _without_copies(plan) -> list[tuple[Any, tuple, dict | None]]:
    """The plan's top-level subtrees as pieces ``(node, ops, temporaries)``,
    each whole-result copy (:func:`copy_source`) of a result or of a
    temporary read outside its group taken out of the group as a piece of
    its own, ``(None, (op,), None)``, after the rest of the group (re-fused
    by :func:`_refused`).  A group that cannot be re-fused keeps its copies."""
    out: list = []
    for node in plan.tree.children:
        ops = tuple(ops_under(node))
        # only copies of what is stored whole anyway: a result, or a temporary
        # read outside the group (taking out another copy would store its
        # source whole where the group now keeps a row or a scalar of it)
        outside = {r.name for o in plan.ops if o not in ops and copy_source(plan, o) is None for r in o.refs}
        copies = [o for o in ops if copy_source(plan, o) in outside | set(plan.results)]
        rest = [o for o in ops if o not in copies]
        pieces = (_refused(plan, rest) if rest else []) if copies else None
        if pieces is None:
            out.append((node, ops, None))
        else:
            out += [*pieces, *((None, (o,), None) for o in copies)]
    return out


def _pieces(plan) -> list[tuple[Any, tuple, dict | None]]:
    """The plan's top-level subtrees as ``(node, ops, temporaries)``, a group
    split by :func:`_template_head` replaced by its head and its tail (the
    tail's ops re-fused from their unfused trees and their temporaries
    reduced again: the plan's dimension reduction was made for the whole
    group's tree); one split by :func:`_template_tail` by its re-fused head
    and its tail."""
    available = set(plan.inputs)
    out: list = []
    todo = _without_copies(plan)
    while todo:
        node, ops, temps = todo.pop(0)
        whole = len(ops) < 2 or _routes_whole(plan, ops, available) or _pattern_leaves(plan, ops)
        leaves_split = None if whole else _pattern_leaves_head(plan, ops)
        if leaves_split is not None:
            # (the head re-fused whole: the generic executor runs it from that tree when the patterns differ)
            head, tail, handed = leaves_split
            head_pieces, pieces = _refused(plan, head), _refused(plan, tail)
            if head_pieces is not None and len(head_pieces) == 1 and pieces is not None:
                if handed:   # (recorded once the split is made)
                    object.__setattr__(plan, "_sparse_temporaries", {**sparse_temporaries(plan), **handed})
                todo[:0] = [*head_pieces, *pieces]
                continue
        split = None if whole else _template_head(plan, ops, available)
        if split is not None:
            head, tail = split
            pieces = _refused(plan, tail)
            if pieces is not None:
                out.append(_unfused_piece(plan, head))
                available |= {op.out for op in head}
                # The tail may itself start with a template's einsum (relu(A·X·W): SpMM, then GEMM + relu).
                todo[:0] = pieces
                continue
        split = None if whole else _template_tail(plan, ops, available)
        if split is not None:
            head, tail = split
            pieces = _refused(plan, head)
            if pieces is not None:
                todo[:0] = [*pieces, _unfused_piece(plan, tail)]
                continue
        parts = None if whole else _independent_parts(plan, ops, available)
        if parts is not None:
            todo[:0] = parts
            continue
        out.append((node, ops, temps))
        available |= {op.out for op in ops}
    return out


def _unfused_piece(plan, ops) -> tuple[Root, tuple, dict]:
    """``ops`` as a piece of their own unfused trees, one after another
    (a template's head or tail): what one op makes and another reads is
    stored whole between them (the plan's dimension reduction was made for
    a fused tree), so the generic executor can run the piece when its
    template refuses the operands."""
    from spfuse.passes.memory import full_temporaries
    made = {o.out for o in ops}
    return Root(tuple(plan.unfused.children[o.id] for o in ops)), tuple(ops), full_temporaries(ops, made, plan.shapes)


def _pattern_leaves(plan, ops) -> bool:
    """Do ``ops`` (a group, or its head) run as one pattern program with
    dense-row leaves (an SDDMM's dot, an SpMM's row: :func:`pattern_group`)
    -- one pass over the pattern where a template head and its tail take
    two or three (an SDDMM gradient's recomputed scores, their element-wise
    chain and its SpMM)?"""
    pg = _pattern_program(plan, ops)
    # One pattern, known at planning: operands that might store different
    # patterns would send the group to the generic executor where templates
    # ran each contraction on its own (``A·X - 2·B·Y``); several sparse
    # operands qualify when the call's signature says they store one
    # (``TensorInfo.pattern``: a cotangent on its operand's pattern).  An
    # SpMM's row among the leaves: an SDDMM with only element-wise work
    # after it gains nothing from one pass (measured: the bias gather then
    # competes with the rows gathered for the dots, 1M entries x 64 took
    # 144-158 ms against 114-150 as the sddmm template and a pattern
    # program for its tail).
    return pg is not None and "axpy" in pg.leaves


def _pattern_program(plan, ops) -> PatternGroup | None:
    """``ops`` (a group, or its head) as a pattern program on one pattern
    known at planning (:func:`_one_pattern`), or None."""
    inside = {op.out for op in ops}
    outputs = tuple(op.out for op in ops if op.out in plan.results or any(
        r.name == op.out for o in plan.ops if o.out not in inside for r in o.refs))
    pg = pattern_group(plan, ops, outputs)
    return pg if pg is not None and _one_pattern(plan, pg.sparse) is not None else None


def _one_pattern(plan, names) -> str | None:
    """The input whose pattern every one of ``names`` (sparse inputs) stores,
    known at planning (one name, or ``TensorInfo.pattern``); else None."""
    firsts = {plan.inputs[n].pattern or n for n in names}
    return next(iter(firsts)) if len(firsts) == 1 else None


def _pattern_leaves_head(plan, ops) -> tuple[list, list, dict[str, str]] | None:
    """``(head, tail, handed)`` when a group that is no pattern program is one (a
    head, :func:`_pattern_leaves`) followed by work the program cannot do:
    element-wise work on dense arrays (an attention layer's ``Y[i,e] =
    T[i,e] / s[i]`` after the weighted sum ``T`` of its values' rows), and
    sums over the pattern's rows (a gradient's scatters ``sum(i, P[i,j] *
    C[i,k])``).  The head's outputs on the pattern that the tail reads are
    handed on sparse, on that pattern (``handed``: each with the pattern's
    operand, see :func:`sparse_temporaries`): the tail's contractions run
    as templates over them."""
    sparse = {r.name for op in ops for r in op.refs if r.name in plan.inputs and plan.inputs[r.name].is_sparse}
    pattern = _one_pattern(plan, sparse) if sparse else None
    if pattern is None or not all(_is_csr(plan.inputs[n]) for n in sparse):
        return None
    # the first read's row index (a nested sum names the rows anew: its ops go to the tail)
    row = next(r.indices[0] for op in ops for r in op.refs if r.name in sparse)
    cols = {r.indices[1] for op in ops for r in op.refs if r.name in sparse and r.indices[0] == row}
    on_entries = sparse | {op.out for op in ops if tuple(op.out_indices[:1]) == (row,)
                           and len(op.out_indices) == 2 and op.out_indices[1] in cols}
    tail: list = []
    made_by_tail: set = set()
    for op in ops:
        out = tuple(op.out_indices)
        dense_work = (op.reduction is None and len(out) == 2 and out[1] not in cols
                      and not any(r.name in on_entries for r in op.refs))
        if type(op) is not UnitOp or any(r.name in made_by_tail for r in op.refs) or not out or out[0] != row \
                or dense_work:
            tail.append(op)
            made_by_tail.add(op.out)
    head = [op for op in ops if op not in tail]
    if not tail or not head:
        return None
    read = {r.name for op in tail for r in op.refs}
    pg = _pattern_program(plan, head)
    # (the program's entries come out on its first operand's index arrays: handed on with that operand)
    handed = {} if pg is None else dict.fromkeys(
        (op.out for op in head if op.out in on_entries and op.out in read), pg.sparse[0])
    # (a head of entry-wise work only -- several operands on the pattern, an SDDMM's dot -- pays when
    # the tail's scatters read its entries sparse: as one group they took the generic executor)
    if pg is None or not ("axpy" in pg.leaves or handed):
        return None
    return head, tail, handed


def sparse_temporaries(plan) -> dict[str, str]:
    """Temporaries of ``plan`` handed from a pattern program to later groups
    as sparse operands, each with the CSR input whose pattern stores it."""
    return plan.__dict__.get("_sparse_temporaries", {})


def _independent_parts(plan, ops, available) -> list | None:
    """A group's ops as pieces of their own, one per set of ops that read
    each other's results, when the group fused them only through a shared
    input and one of them reaches a template whole (a shared adjoint's
    ``grad_W2 = grad_Z_cᵀ·H`` fused with ``where(H, grad_H, 0)`` through
    ``H``: fused, the generic executor ran the GEMM -- 7 ms against 1 ms
    apart on GCN-2000).  None when the ops are connected, no part reaches
    a template, or a part cannot be re-fused."""
    made = {o.out: n for n, o in enumerate(ops)}
    parent = list(range(len(ops)))

    def root(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for n, o in enumerate(ops):
        for r in o.refs:
            if r.name in made:
                parent[root(n)] = root(made[r.name])
    parts: dict[int, list] = {}
    for n, o in enumerate(ops):
        parts.setdefault(root(n), []).append(o)
    if len(parts) < 2 or not any(_routes_whole(plan, part, available) for part in parts.values()):
        return None
    pieces: list = []
    for part in parts.values():
        refused = _refused(plan, part)
        if refused is None:
            return None
        pieces += refused
    return pieces


def _refused(plan, part: list) -> list | None:
    """Part of a split group as pieces ``(node, ops, temporaries)``: its ops
    re-fused from their unfused trees and their temporaries reduced again
    (the plan's dimension reduction was made for the whole group's tree) --
    a row or a scalar, not the whole matrix -- except those read outside
    the part, stored whole and passed on by :func:`run_groups`.  None when
    an accumulator reset inside a loop would have to become such a result."""
    from spfuse.passes.fusion import trie_fuse
    from spfuse.passes.memory import reduce_dimensions
    fused = trie_fuse(Root(tuple(plan.unfused.children[o.id] for o in part)))
    crossing = {r.name for o in plan.ops if o not in part for r in o.refs}
    for piece in fused.children:  # read elsewhere: stored whole, passed on by run_groups
        inside = {o.out for o in ops_under(piece)}
        crossing |= {r.name for o in ops_under(piece) for r in o.refs if r.name not in inside}
    if any(isinstance(n, Reset) and n.tensor in crossing for n in iter_nodes(fused)):
        return None
    local = {o.out for o in part} - set(plan.results) - crossing
    reduced, temps = reduce_dimensions(fused, part, local, plan.shapes)
    return [(piece, tuple(ops_under(piece)), temps) for piece in reduced.children]


def split_groups(plan) -> tuple[Group, ...]:
    """The plan's fused groups, in execution order, with the kernel each runs on.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (1000, 1000), nnz=5000)
    >>> ins = {"A": A, "X": TensorInfo.dense("X", (1000, 64)), "W": TensorInfo.dense("W", (64, 4))}
    >>> p = plan_program(parse_program("Z[i,j] = A[i,k] * X[k,h] * W[h,j]"), ins)
    >>> [g.kernel for g in split_groups(p)]
    ['gemm', 'spmm']
    >>> p = plan_program(parse_program("Z[i,j] = relu(A[i,k] * X[k,j])"), ins)
    >>> [g.kernel for g in split_groups(p)]
    ['spmm+epilogue']
    """
    infos = dict(plan.inputs)
    pieces = _pieces(plan)
    produced_in = {}
    for n, (_, ops, _) in enumerate(pieces):
        for op in ops:
            produced_in[op.out] = n
    later_reads: dict[int, set] = {n: set() for n in range(len(pieces))}
    for n, (_, ops, _) in enumerate(pieces):
        for op in ops:
            for r in op.refs:
                src = produced_in.get(r.name)
                if src is not None and src != n:
                    later_reads[src].add(r.name)
    groups = []
    for n, (node, ops, temps) in enumerate(pieces):
        outs = tuple(dict.fromkeys([op.out for op in ops if op.out in plan.results]
                                   + sorted(later_reads[n])))
        if node is None:  # a whole-result copy (_without_copies)
            groups.append(Group(node, ops, outs, "copy"))
            continue
        found = None
        if len(outs) == 1 and plan.shapes.get(outs[0]) is not None and None not in plan.shapes[outs[0]]:
            found = _head_route(plan, ops, outs[0], set(infos) | set(produced_in))
        if found is None:
            on_pattern = pattern_group(plan, ops, outs)
            groups.append(Group(node, ops, outs, "generic" if on_pattern is None else "pattern", temporaries=temps,
                                on_pattern=on_pattern,
                                entrywise=None if on_pattern is not None else entrywise_group(plan, ops, outs)))
        else:
            ein, route = found
            groups.append(Group(node, ops, outs, route.kernel, route.names, ein, route, temps))
    return fuse_epilogues(plan, sum_spmms(plan, tuple(groups)))


def lower_groups(plan):
    """A :class:`~spfuse.lowering.templates.TemplateMatch` running ``plan``
    group by group, or None when no group has a template (or groups cannot
    be split)."""
    from spfuse.lowering.templates import TemplateMatch
    groups = split_groups(plan)
    if all(g.kernel in ("generic", "copy") and g.entrywise is None for g in groups):
        return None  # the whole-plan generic executor: one call, copies in its loops
    from spfuse.lowering.templates import SIGNATURES
    roles = {}
    for part in (p for g in groups for p in g.summed[:-1] or g.epilogue[:1] or (g,)):
        if part is None:   # (an element-wise program of its own: dense operands)
            continue
        if part.kernel == "gemm":
            roles.update({part.names[0]: "dense", part.names[1]: "dense"})
        elif part.kernel == "values":
            roles[part.names[0]] = "csr"
        elif part.on_pattern is not None:
            roles.update(dict.fromkeys(part.on_pattern.sparse, "csr"))
        elif part.kernel not in ("generic", "copy"):
            roles.update(zip(part.names, (k for k, _ in SIGNATURES[part.kernel][1]), strict=True))
    why = "; then ".join(g.describe() for g in groups)
    kernel = " → ".join("numpy" if g.entrywise is not None else g.kernel for g in groups)
    interpreted = any(g.kernel == "generic" and g.on_pattern is None and g.entrywise is None
                      and sums_products(g.ops) for g in groups)
    return TemplateMatch(kernel, roles, why, lambda tensors, nt: run_groups(plan, groups, tensors, nt),
                         _checked_in_kernel(plan, groups), bind=lambda: BoundGroups(plan, groups),
                         interpreted=interpreted)


def sums_products(ops) -> bool:
    """Is any of ``ops`` a contraction (a sum of products)?  One the generic
    executor runs is interpreted element by element, nanoseconds per
    multiply-add, where a template or BLAS runs it whole.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> dot = UnitOp(0, "s", (), "*", (Ref("x", ("i",)), Ref("y", ("i",))), "sum", ("i",))
    >>> sums_products([dot])
    True
    """
    return any(op.reduction == "sum" and op.operator == "*" for op in ops)


def _checked_in_kernel(plan, groups) -> frozenset:
    """The inputs read only as the sparse operand of SpMV/SpMM groups, handed
    over with their own index arrays (not merged or restricted, and
    transposed only when that is free: CSC): the call path need not scan
    their indices first (SpMV+b is SpMV then a tail)."""
    from spfuse.lowering.templates import CHECKS_INDICES, checked_operand
    readers: dict[str, list] = {}
    for g in groups:
        for name in {r.name for op in g.ops for r in op.refs}:
            readers.setdefault(name, []).append(g)

    def plain(g, name) -> bool:
        if g.epilogue:   # (the SpMM reads it; the tail reads dense operands only)
            g = g.epilogue[0]
            if g is None:
                return False
        r = g.route
        if g.kernel not in CHECKS_INDICES or r is None or r.merged or r.flipped or r.pattern is not None:
            return False
        checked = checked_operand(g.kernel, g.names)
        if name in r.transposed:
            return _free_transpose(plan.inputs[name]) and checked == transposed_name(name)
        return checked == name

    return frozenset(n for n, gs in readers.items()
                     if n in plan.inputs and all(plain(g, n) for g in gs))


@sharing_copies   # (an operand several groups read transposed is copied once)
def run_groups(plan, groups, tensors: Mapping[str, Any], nt: int, steps: list | None = None,
               binding: list | None = None) -> dict:
    """Run ``groups`` in order, passing crossing temporaries as dense operands.

    ``steps``: per group, its run bound to this call's operand signature
    (see :class:`BoundGroups`), used instead of working out each group's
    way; ``binding``: a list to append those bound runs to, made from the
    operands each group meets in this call."""
    env = dict(tensors)
    out: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}   # crossing temporaries' dense arrays, for the copies
    handed = sparse_temporaries(plan)
    for n, g in enumerate(groups):
        if g.kernel == "copy":
            out[g.outputs[0]] = _copied(g.ops[0].refs[0].name, out, arrays, env)
            if binding is not None:
                binding.append(None)
            continue
        if binding is not None:
            binding.append(_bound_group(plan, g, env))
        values = steps[n](env, nt) if steps is not None else _run_group(plan, g, env, nt)
        for name, v in values.items():
            if name in plan.results:
                out[name] = v
            elif g.route is not None and g.route.pattern is not None:
                env[name] = v  # on the pattern that restricts it: read sparse
            elif name in handed:   # a pattern program's entries, read by later templates on that pattern
                env[name] = _on_pattern_of(v, env[handed[name]])
            else:
                # A crossing temporary is read as a dense operand: a template
                # or BLAS computes it whole; the generic executor computes at
                # least what propagation says later groups read (zeros elsewhere).
                arrays[name], env[name] = dense_operand(v, name)
    return out


def dense_operand(v, name: str = "temporary") -> tuple[np.ndarray, Tensor]:
    """A group's result ``v`` (an array or a Tensor) as a C-ordered array and
    the dense Tensor a later group reads it as.

    >>> dense_operand(np.ones((2, 3)).T)[0].flags.c_contiguous
    True
    """
    if type(v) is np.ndarray and v.flags.c_contiguous:
        dense = v   # (a kernel's or BLAS's fresh array: the common case, per group per call)
    else:
        dense = np.asarray(v.todense() if isinstance(v, Tensor) else v)
        # (ascontiguousarray would make a 0-d temporary 1-d)
        dense = np.ascontiguousarray(dense).reshape(dense.shape)
    fast = Tensor._fast_dense(dense)  # the common case, without from_numpy's checks
    return dense, fast if fast is not None else Tensor.from_numpy(dense, name=name)


def _on_pattern_of(v, pattern: Tensor) -> Tensor:
    """``v`` (a pattern program's output on ``pattern``'s entries, or the
    generic executor's in its stead: stored on the pattern, or a part of
    it) as a Tensor on that pattern."""
    if isinstance(v, Tensor) and v.format.name == "csr" and same_pattern(v, pattern):
        return v
    return pattern._with_kernel_values(np.asarray(values_at(v, pattern.coords, pattern.shape), dtype=np.float64))


def _run_group(plan, g: Group, env: dict, nt: int) -> dict:
    """One group's results, its way worked out on this call."""
    if g.summed:
        return run_summed(plan, g, env, nt)
    if g.epilogue:
        return run_epilogue(plan, g, env, nt)
    if g.on_pattern is not None:
        values = run_pattern_group(g.on_pattern, env, plan.shapes, nt)
    elif g.entrywise is not None:
        values = run_entrywise_group(g.entrywise, env)
    else:
        values = None if g.kernel == "generic" else _runner(plan, g)(env, nt)
    if values is None:
        values = _run_generic(_subplan(plan, g), env, nt)
    return values


def run_in_turn(plan, parts, env: dict, nt: int) -> dict:
    """The last of ``parts`` (groups merged into one) after the others, one
    after another, their results its dense operands: a merged group's way
    when a call's operands do not fit it."""
    local = dict(env)
    for part in parts[:-1]:
        for name, v in _run_group(plan, part, local, nt).items():
            local[name] = dense_operand(v)[1]
    return _run_group(plan, parts[-1], local, nt)


def _bound_group(plan, g: Group, env: Mapping[str, Any]):
    """``_run_group`` of ``g`` bound to the operands in ``env`` (the signature
    of this call): a plain template or gemm group calls its kernel straight
    (:func:`~spfuse.lowering.templates.bind_einsum`, :func:`_bind_gemm`);
    any other group works out its way per call as before."""
    if g.epilogue and g.epilogue[0] is not None and g.epilogue[0].kernel == "gemm" and g.epilogue[1] is not None:
        run = _bind_gemm(g.names, env, (plan, g))
        if run is not None:
            name = g.outputs[0]
            return lambda env, nt: {name: run(env, nt)}
    if g.epilogue or g.summed:   # (merged groups: their own runs, whatever route they show)
        return functools.partial(_run_group, plan, g)
    if g.entrywise is not None:
        bound = bind_entrywise(g.entrywise, env)
        if bound is not None:
            return lambda env, nt: bound(env) or _run_group(plan, g, env, nt)
    elif g.route is not None and g.on_pattern is None and _route_needs(g)[1]:
        name, shape = g.outputs[0], tuple(plan.shapes[g.outputs[0]])
        run = (_bind_gemm(g.names, env) if g.kernel == "gemm"
               else templates.bind_einsum(g.kernel, g.names, shape, env))
        if run is not None:
            return lambda env, nt: {name: run(env, nt)}
    return functools.partial(_run_group, plan, g)


class BoundGroups:
    """:func:`run_groups` for one operand signature (one call path's
    dispatch): the first call runs as usual and binds each group's run to
    the operands it met; later calls run the bound steps -- the kernels
    called with what was worked out once (dtypes, compiled specialisation,
    team or not), interpretation paid per group, not per decision.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> from spfuse.tensor import as_tensor
    >>> A, X, W = sp.csr_array(np.eye(3)), np.ones((3, 2)), np.ones((2, 2))
    >>> plan = spfuse.compile("Z[i,j] = A[i,k] * X[k,h] * W[h,j]").plans(A=A, X=X, W=W)["auto"]
    >>> run = BoundGroups(plan, split_groups(plan))
    >>> ops = {"A": as_tensor(A), "X": as_tensor(X), "W": as_tensor(W)}
    >>> run(ops, 1)["Z"].tolist() == run(ops, 1)["Z"].tolist() == [[2.0, 2.0]] * 3
    True
    """

    def __init__(self, plan, groups):
        self.plan, self.groups = plan, groups
        self.steps: list | None = None

    def __call__(self, tensors: Mapping[str, Any], nt: int) -> dict:
        if self.steps is not None:
            return run_groups(self.plan, self.groups, tensors, nt, self.steps)
        steps: list = []
        out = run_groups(self.plan, self.groups, tensors, nt, binding=steps)
        if len(steps) == len(self.groups):
            self.steps = steps
        return out


def _copied(src: str, out: Mapping, arrays: dict, env: Mapping) -> np.ndarray:
    """A copy group's result: the crossing temporary ``src``'s dense array
    itself (made fresh this call and read nowhere else once the groups have
    run), or a copy of a result's (the caller gets both)."""
    if src in out:
        v = out[src]
        return np.array(v.todense() if isinstance(v, Tensor) else v)
    if src in arrays:
        return arrays.pop(src)   # (a second copy of it is a copy)
    v = env[src]   # not expected: a copy's source is read dense (copy_source)
    return np.array(v.todense() if isinstance(v, Tensor) else v)


def _checked_pattern(route: Route, factor: str) -> bool:
    """Is ``factor`` an ``X/X`` pattern (checked per call), not a restricting mask?"""
    return factor.endswith(_PATTERN) and factor != (pattern_name(route.pattern) if route.pattern else None)


def _routed_operands(plan, g: Group, env: dict, nt: int) -> tuple[dict, float, Any] | None:
    """``(operands, scale, dtype)``: what a template group's kernel is
    handed as its :class:`Route` says (transposed, merged, restricted
    operands by the names the route gives them), the product of its 0-d
    factors, and the value dtype when the route converts (else None); None
    when merged factors turn out to store different patterns."""
    r, ein = g.route, g.einsum
    assert r is not None and ein is not None  # a routed group
    checked, plain = _route_needs(g)
    # a plain route hands the kernel the operands as they are: no copy of
    # ``env`` and no dtype to work out (this runs per group per call)
    local = env if plain else dict(env)
    dtype = None if plain else np.result_type(
        *(env[src].dtype for src in map(_factor_source, (f for f, _ in ein[3])) if src is not None))
    for f in checked:
        x = env[_factor_source(f)]
        # X/X is 1 where X stores a finite non-zero; 0/0 and inf/inf are the generic executor's to give
        if not bool(np.all(np.isfinite(x.values) & (x.values != 0))):
            return None
        local[f] = x._with_kernel_values(np.ones(x.nnz, dtype=x.values.dtype))
    for src in r.flipped:
        local[transposed_name(src)] = _transposed(env[src], nt)
    for merged, parts in r.merged:
        first = local[parts[0]]
        if not all(same_pattern(first, local[p]) for p in parts[1:]):
            return None
        vals = np.multiply(first.values, local[parts[1]].values, dtype=dtype)
        for p in parts[2:]:
            vals *= local[p].values
        local[merged] = first._with_kernel_values(vals)
    for src in r.transposed:
        local[transposed_name(src)] = _transposed(local[src], nt)
    if r.pattern is not None:
        p = env[r.pattern]
        local[pattern_name(r.pattern)] = p._with_kernel_values(np.ones(p.nnz, dtype=p.values.dtype))
    scale = 1.0
    for s in r.scalars:
        c = _constant(s)
        scale *= c if c is not None else env[s].values.reshape(-1)[0].item()
    return local, scale, dtype


def _run_routed(plan, g: Group, env: dict, nt: int) -> dict | None:
    """Run a template group as its :class:`Route` says; None when merged
    factors turn out to store different patterns (the caller then runs the
    group on the generic executor)."""
    found = _routed_operands(plan, g, env, nt)
    if found is None:
        return None
    local, scale, dtype = found
    r, name = g.route, g.outputs[0]
    assert r is not None  # a routed group
    if g.kernel == "values":
        t = local[g.names[0]]
        return {name: t._with_kernel_values(np.multiply(t.values, scale, dtype=dtype))}
    shape = tuple(plan.shapes[name])
    if g.kernel == "gemm":
        value = _run_gemm(g.names, shape, local, nt)
    else:
        value = templates._run_einsum(g.kernel, list(g.names), name, shape[::-1] if r.out_swapped else shape, local,
                            nt)
    if r.out_swapped:
        value = templates.c_ordered(value.T, nt) if isinstance(value, np.ndarray) else value.T
    if r.scalars:
        if isinstance(value, np.ndarray) and value.dtype == dtype:
            np.multiply(value, scale, out=value)   # the kernel's fresh result: scaled in place
        elif isinstance(value, np.ndarray):
            value = np.multiply(value, scale, dtype=dtype)
        else:
            value = value._with_kernel_values(np.multiply(value.values, scale, dtype=dtype))
    return {name: value}


def _runner(plan, g: Group):
    """How a template group runs, worked out once per group (remembered on
    it): a plain route (the kernel on the operands as they are, see
    :func:`_route_needs`) calls its kernel directly; any other goes through
    :func:`_run_routed`."""
    found = g.__dict__.get("_runner")
    if found is None or found[0] is not plan:
        name = g.outputs[0]
        shape = tuple(plan.shapes[name])
        if not _route_needs(g)[1]:
            def run(env, nt):
                return _run_routed(plan, g, env, nt)
        elif g.kernel == "gemm":
            roles = g.names

            def run(env, nt):
                return {name: _run_gemm(roles, shape, env, nt)}
        else:
            kernel, names = g.kernel, list(g.names)

            def run(env, nt):
                return {name: templates._run_einsum(kernel, names, name, shape, env, nt)}
        found = (plan, run)
        object.__setattr__(g, "_runner", found)
    return found[1]


_needs: dict = {}


def _route_needs(g: Group) -> tuple[tuple[str, ...], bool]:
    """``(checked, plain)`` for a routed group, worked out once per group:
    its ``X/X`` factors (checked per call), and whether its route only
    calls the kernel on the operands as they are (nothing transposed,
    merged, scaled or restricted, no pattern factor, not the values kernel)."""
    found = _needs.get(id(g))
    if found is None or found[0] is not g:
        r = g.route
        assert r is not None and g.einsum is not None  # a routed group
        checked = tuple(f for f, _ in g.einsum[3] if _checked_pattern(r, f))
        plain = not (checked or r.flipped or r.merged or r.transposed or r.pattern is not None or r.scalars
                     or r.out_swapped or g.kernel == "values")
        if len(_needs) >= 4096:
            _needs.clear()
        found = _needs[id(g)] = (g, (checked, plain))
    return found[1]


def _transposed(t, nt: int):
    """A matrix operand's transpose as a kernel reads it: CSR through the
    remembered transposed pattern, dense as a C-ordered copy (one copy,
    tile by tile, from the stored values)."""
    from spfuse.lowering.transposes import transposed_csr
    if not t.format.is_dense:
        return transposed_csr(t)
    arr = templates.dense_transposed(t, t._values.dtype, nt)
    return Tensor._fast_dense(arr) or Tensor.from_numpy(arr)


def _subplan(plan, g: Group):
    """The plan restricted to one group: earlier groups' temporaries are
    operands.  Made once per group (its lowering is cached on it)."""
    made = attached_dict(plan, "_subplans")
    sub = made.get(id(g))
    if sub is None or sub[0] is not g:
        names = {op.out for op in g.ops}
        own = plan.temporaries if g.temporaries is None else g.temporaries
        temps = {n: t for n, t in own.items() if n in names and n not in g.outputs}
        # A crossing temporary is read dense by the later groups (run_groups
        # densifies it): the group stores it dense too.  Left to the mask of
        # its loops it would be emitted as coordinates, sorted and summed,
        # then densified -- a scatter into a 16×80 T0[m,k] under a reduction
        # over 20k fibres cost 50 ms as coordinates, 2 ms stored dense.
        formats = dict(plan.formats)
        for n in g.outputs:
            if n not in plan.results:
                formats[n] = FormatDecision(n, ("dense",) * len(plan.shapes[n]), tuple(range(len(plan.shapes[n]))),
                                            None, "a crossing temporary, read dense by later groups")
        # (a template head's node is already a Root: its ops' own trees)
        tree = g.node if isinstance(g.node, Root) else Root((g.node,))
        own_plan = replace(plan, ops=g.ops, tree=tree, temporaries=temps, results=g.outputs, formats=formats)
        if own_plan.propagated and MaskDrivers.of(own_plan).undriven(own_plan.temporaries):
            # A re-fused group lost the access that drives one of its masks
            # in the plan's tree (a template head's ops, each in a tree of its
            # own).  It then iterates a superset of its masks and clears its
            # temporaries whole, as a template computing it would: the
            # positions later groups read are right, whatever the others hold.
            own_plan = replace(own_plan, propagated=False)
        sub = made[id(g)] = (g, own_plan)
    return sub[1]


def _run_generic(plan, tensors, nt: int) -> dict:
    if nt > 1:
        work = sum(t.values.size for t in tensors.values()) + sum(
            prod(e or 0 for e in plan.shapes[r]) for r in plan.results)
        nt = nt if work >= templates.PARALLEL_MIN_WORK else 1
    lowered = lower_cached(plan, tensors)
    return lowered.results(lt.run(lowered.plan, num_threads=nt))
