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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from math import prod
from typing import Any

import numpy as np

from spfuse.frontend.ast import Access
from spfuse.ir.ops import Ref, TensorInfo, UnitOp
from spfuse.ir.tree import Root
from spfuse.passes.decompose import _product_factors
from spfuse.passes.fusion import ops_under

__all__ = ["Group", "split_groups", "lower_groups"]


@dataclass(frozen=True)
class Group:
    """One top-level subtree of a plan and how it runs.

    ``kernel`` is ``"gemm"``, a template name, or ``"generic"``; ``einsum``
    holds ``(out_name, out_indices, summed, factors)`` for template groups.
    """

    node: Any
    ops: tuple[UnitOp, ...]
    outputs: tuple[str, ...]
    kernel: str
    names: tuple[str, ...] = ()
    einsum: tuple | None = None

    def describe(self) -> str:
        what = "; ".join(str(op) for op in self.ops)
        how = "BLAS gemm" if self.kernel == "gemm" else (
            "generic executor" if self.kernel == "generic" else f"template {self.kernel}")
        return f"{how}: {what}"


def _group_einsum(ops: tuple[UnitOp, ...], out: str):
    """The einsum ``out`` is, inlining the group's own product temporaries, or None."""
    producers = {op.out: op for op in ops}
    root = producers[out]
    summed: list[str] = []
    factors: list[tuple[str, tuple]] = []

    def inline(op: UnitOp, taken: set) -> bool:
        if op.operator not in ("*", None) or op.reduction not in ("sum", None):
            return False
        expr = getattr(op, "expr", None)   # a whole fused statement (max_fusion.StatementOp)
        if expr is not None and not all(isinstance(f, Access) for f in _product_factors(expr)):
            return False  # its args are leaves of an expression, not factors: tanh(A*B) is no SpMV
        if op.operator is None and op.reduction is None:
            return False
        for ix in op.reduced:
            if ix in taken:
                return False  # a summed index reused elsewhere: renaming needed, not worth it
            taken.add(ix)
            summed.append(ix)
        for a in op.args:
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
    if not inline(root, taken) or len(factors) < 2:
        return None
    return out, root.out_indices, tuple(summed), factors


def _gemm_roles(einsum, infos) -> tuple | None:
    """``(X, Y, x_t, y_t, out_t)`` when the einsum is one dense 2-D × 2-D product:
    ``out = op(X) @ op(Y)`` with the transposes flagged."""
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
    return x, y, xi != (a, s), yi != (s, b), out_ix != (a, b)


def _run_gemm(roles, out_shape, tensors, nt):
    from spfuse._kernels import _dense_kernels as dense
    from spfuse.lowering.templates import _dense, _types
    x, y, xt, yt, ot = roles
    _, dtype = _types([tensors[x], tensors[y]])
    X, Y = _dense(tensors[x], dtype), _dense(tensors[y], dtype)
    X = np.ascontiguousarray(X.T) if xt else X
    Y = np.ascontiguousarray(Y.T) if yt else Y
    out = np.empty((X.shape[0], Y.shape[1]), dtype)
    dense.gemm(X, Y, out, nt)
    return np.ascontiguousarray(out.T) if ot else out


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
    """
    from spfuse.lowering.templates import SIGNATURES, _unify, follows_template
    infos = dict(plan.inputs)
    produced_in = {}
    children = plan.tree.children
    for n, node in enumerate(children):
        for op in ops_under(node):
            produced_in[op.out] = n
    later_reads: dict[int, set] = {n: set() for n in range(len(children))}
    for n, node in enumerate(children):
        for op in ops_under(node):
            for r in op.refs:
                src = produced_in.get(r.name)
                if src is not None and src != n:
                    later_reads[src].add(r.name)
    groups = []
    for n, node in enumerate(children):
        ops = tuple(ops_under(node))
        outs = tuple(dict.fromkeys([op.out for op in ops if op.out in plan.results]
                                   + sorted(later_reads[n])))
        kernel, names, ein = "generic", (), None
        if len(outs) == 1 and plan.shapes.get(outs[0]) is not None and None not in plan.shapes[outs[0]]:
            ein = _group_einsum(ops, outs[0])
        whole = all(_computed_whole(plan, op) for op in ops if op.out in outs and op.out not in plan.results)
        if ein is not None and whole and all(f in infos or f in produced_in for f, _ in ein[3]):
            local = {f: infos.get(f) or _temp_info(f, plan.shapes[f]) for f, _ in ein[3]}
            roles = _gemm_roles(ein, local)
            if roles is not None:
                kernel, names = "gemm", roles
            elif len(set(ein[2])) == len(ein[2]):
                for name, sig in SIGNATURES.items():
                    found = _unify(sig, ein[1], ein[2], ein[3], local)
                    if found is not None and follows_template(name, found, ops):
                        kernel, names = name, tuple(found)
                        break
        groups.append(Group(node, ops, outs, kernel, names, ein if kernel != "generic" else None))
    return tuple(groups)


def lower_groups(plan):
    """A :class:`~spfuse.lowering.templates.TemplateMatch` running ``plan``
    group by group, or None when no group has a template (or groups cannot
    be split)."""
    from spfuse.lowering.templates import TemplateMatch
    groups = split_groups(plan)
    if all(g.kernel == "generic" for g in groups):
        return None
    roles = {}
    for g in groups:
        if g.kernel == "gemm":
            roles.update({g.names[0]: "dense", g.names[1]: "dense"})
        elif g.kernel != "generic":
            from spfuse.lowering.templates import SIGNATURES
            roles.update(zip(g.names, (k for k, _ in SIGNATURES[g.kernel][1]), strict=True))
    why = "; then ".join(g.describe() for g in groups)
    kernel = " → ".join(g.kernel for g in groups)
    return TemplateMatch(kernel, roles, why, lambda tensors, nt: run_groups(plan, groups, tensors, nt))


def run_groups(plan, groups, tensors: Mapping[str, Any], nt: int) -> dict:
    """Run ``groups`` in order, passing crossing temporaries as dense operands."""
    from spfuse.lowering.looptree import UnrealizableMask
    from spfuse.lowering.templates import _run_einsum
    from spfuse.tensor import Tensor
    env = dict(tensors)
    out = {}
    for g in groups:
        if g.kernel == "gemm":
            values = {g.outputs[0]: _run_gemm(g.names, tuple(plan.shapes[g.outputs[0]]), env, nt)}
        elif g.kernel != "generic":
            name = g.outputs[0]
            values = {name: _run_einsum(g.kernel, list(g.names), name, tuple(plan.shapes[name]), env, nt)}
        else:
            try:
                values = _run_generic(_subplan(plan, g), env, nt)
            except UnrealizableMask:
                return _run_unpropagated(plan, tensors, nt)
        for name, v in values.items():
            if name in plan.results:
                out[name] = v
            else:
                # A crossing temporary is read as a dense operand: a template
                # or BLAS computes it whole; the generic executor computes at
                # least what propagation says later groups read (zeros elsewhere).
                dense = v.todense() if isinstance(v, Tensor) else v
                dense = np.asarray(dense)
                # (ascontiguousarray would make a 0-d temporary 1-d)
                env[name] = Tensor.from_numpy(np.ascontiguousarray(dense).reshape(dense.shape), name=name)
    return out


def _subplan(plan, g: Group):
    """The plan restricted to one group: earlier groups' temporaries are
    operands.  Made once per group (its lowering is cached on it)."""
    made = plan.__dict__.get("_subplans")
    if made is None:
        made = {}
        object.__setattr__(plan, "_subplans", made)
    sub = made.get(id(g))
    if sub is None or sub[0] is not g:
        names = {op.out for op in g.ops}
        temps = {n: t for n, t in plan.temporaries.items() if n in names and n not in g.outputs}
        sub = made[id(g)] = (g, replace(plan, ops=g.ops, tree=Root((g.node,)), temporaries=temps,
                                         results=g.outputs))
    return sub[1]


def _run_generic(plan, tensors, nt: int) -> dict:
    from spfuse.lowering.looptree import lower_cached
    from spfuse.lowering.templates import PARALLEL_MIN_WORK
    from spfuse.runtime import looptree as lt
    work = sum(t.values.size for t in tensors.values()) + sum(
        prod(e or 0 for e in plan.shapes[r]) for r in plan.results)
    lowered = lower_cached(plan, tensors)
    return lowered.results(lt.run(lowered.plan, num_threads=nt if work >= PARALLEL_MIN_WORK else 1))


def _run_unpropagated(plan, tensors, nt: int) -> dict:
    """A propagated mask cannot be iterated in some group: re-plan the whole
    program without propagation and run it on the generic executor."""
    from spfuse.ir.ops import TensorInfo
    from spfuse.planner import plan_program
    infos = {n: TensorInfo(n, t.ndim, tuple(t.format.levels), tuple(t.format.mode_order), tuple(t.shape),
                           nnz=int(t.nnz)) for n, t in tensors.items()}
    return _run_generic(plan_program(plan.program, infos, plan.fusion, propagate=False), tensors, nt)
