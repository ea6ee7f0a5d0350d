"""Input-sensitive fusion, second rule (ReACT 4.3.3): small temporary → separate kernels.

Fusing a dense × dense contraction into its producer's loop (GNN-1's
``T0[h]·W[h,j]`` under ``i``, SparseLNR's ``<SpMM,GEMM>``) keeps the
temporary a row, but multiplies it row by row with scalar loops.  Run as a
separate kernel the same product is one BLAS call on the whole temporary,
several times faster; what it costs is writing the temporary out and reading
it back -- cheap while it stays in cache, a DRAM round trip beyond it.

A contraction is split out of its fused group when

    flops / BLAS_SPEEDUP + 2 · |T| · traffic + KERNEL_OVERHEAD  <  flops

with ``traffic`` = :data:`CACHE_TRAFFIC` when the temporaries fit in half of
:data:`L2_BYTES` (the rest holds the streamed operands) and
:data:`DRAM_TRAFFIC` otherwise, all in multiply-add equivalents.

Calibration (this machine, AMD EPYC, 1 MiB L2, one thread, median of 15;
``csr.spmm_gemm`` fused vs ``csr.spmm`` + ``dense.gemm``; load ≈ 1.5): the
fused kernel's row GEMM ran 1.2-6.8× slower than the BLAS call on the same
data (n=2000..200000, H=J=4..64), so ``BLAS_SPEEDUP = 2`` is conservative;
with T = 25 MB (beyond every cache) and J = 16 the two were within 4%
(150 vs 145 ms), which ``DRAM_TRAFFIC = 4`` reproduces (split when J > 16).
Through ``spfuse.evaluate`` the extra kernel cost ≈ 30 µs more (Python
dispatch, the temporary's allocation; n=2000, H=J=16: 431-454 vs 422-449 µs
fused), ≈ 1.5e5 madds at the 0.23 ns/madd the fused row product ran at.
"""
from __future__ import annotations

from collections.abc import Mapping
from math import prod

from spfuse.ir.masks import Mask
from spfuse.ir.ops import Ref, TensorInfo, UnitOp
from spfuse.ir.tree import Root
from spfuse.passes.fusion import ops_under, trie_fuse

__all__ = ["separate_small_temporaries", "L2_BYTES", "BLAS_SPEEDUP", "CACHE_TRAFFIC", "DRAM_TRAFFIC",
           "KERNEL_OVERHEAD"]

L2_BYTES = 1 << 20   # typical per-core L2 of current x86 server parts (1-2 MiB); wheels must not probe
BLAS_SPEEDUP = 2.0   # BLAS gemm vs the fused row-by-row product (measured 1.2-6.8×)
CACHE_TRAFFIC = 0.5  # madd-equivalents per temporary element written or read from cache
DRAM_TRAFFIC = 4.0   # ... from memory
KERNEL_OVERHEAD = 1.5e5  # one more kernel call from Python, in madd-equivalents


def _dense_ref(ref: Ref, inputs: Mapping[str, TensorInfo], dense_temps: set) -> bool:
    info = inputs.get(ref.name)
    return (info is not None and not info.is_sparse) or ref.name in dense_temps


def _is_gemm(op: UnitOp) -> bool:
    """A 2-D × 2-D product summing one index into a 2-D result (one BLAS call)."""
    if op.operator != "*" or op.reduction != "sum" or len(op.reduced) != 1 or len(op.args) != 2:
        return False
    if not all(isinstance(a, Ref) and len(a.indices) == 2 for a in op.args) or len(op.out_indices) != 2:
        return False
    (s,), (x, y) = op.reduced, op.args
    return s in x.indices and s in y.indices and len(set(x.indices) | set(y.indices)) == 3


def separate_small_temporaries(fused: Root, unfused: Root, ops, masks: Mapping[int, Mapping[str, Mask]],
                               shapes: Mapping[str, tuple], inputs: Mapping[str, TensorInfo],
                               itemsize: int = 8) -> tuple[Root, tuple[str, ...], tuple[int, ...]]:
    """Split dense × dense contractions out of their fused groups when the
    cost model prefers separate kernels; returns the new fused tree, one
    decision note (with its numbers) per candidate, and the ids of the ops split out.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.planner import plan_program
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (2000, 2000), nnz=16000)
    >>> ins = {"A": A, "X": TensorInfo.dense("X", (2000, 16)), "W": TensorInfo.dense("W", (16, 16))}
    >>> p = plan_program(parse_program("Z[i,j] = A[i,k] * X[k,h] * W[h,j]"), ins)
    >>> len(p.tree.children), p.decisions[-1].split(":")[0]
    (2, 'separate kernels for Z[i,j] = sum(h, T0[i,h] * W[h,j])')
    """
    producers = {op.out: op for op in ops}
    dense_temps = {op.out for op in ops
                   if all(masks[op.id].get(ix) is None or masks[op.id][ix].is_true for ix in op.out_indices)}
    children = list(fused.children)
    notes, split_ids = [], []
    out = []
    for node in children:
        group = ops_under(node)
        split = None
        if len(group) > 1:
            for op in group:
                if not _is_gemm(op) or not all(_dense_ref(a, inputs, dense_temps) for a in op.args):
                    continue
                if any(r.name == op.out for o in group if o is not op for r in o.refs):
                    continue  # read inside the group: splitting would need a third group
                decision = _cost(op, group, producers, shapes, itemsize)
                if decision is None:
                    continue
                separate, note = decision
                notes.append(note)
                if separate:
                    split = op
                    break
        if split is None:
            out.append(node)
            continue
        rest = [o for o in group if o is not split]
        out.extend(trie_fuse(Root(tuple(unfused.children[o.id] for o in rest))).children)
        out.append(unfused.children[split.id])
        split_ids.append(split.id)
    return Root(tuple(out)), tuple(notes), tuple(split_ids)


def _cost(op: UnitOp, group, producers, shapes, itemsize) -> tuple[bool, str] | None:
    ext: dict[str, int | None] = {}
    for a in op.args:
        for ix, n in zip(a.indices, shapes.get(a.name, (None,) * len(a.indices)), strict=True):
            ext[ix] = n
    if any(v is None for v in ext.values()):
        return None
    flops = prod(ext.values())
    in_group = {o.out for o in group}
    temps = [a for a in op.args if a.name in in_group and a.name in producers]
    elems = sum(prod(shapes[a.name]) for a in temps)
    nbytes = elems * itemsize
    fits = nbytes <= L2_BYTES // 2
    traffic = CACHE_TRAFFIC if fits else DRAM_TRAFFIC
    separate_cost = flops / BLAS_SPEEDUP + 2 * elems * traffic + KERNEL_OVERHEAD
    separate = separate_cost < flops
    where = (f"temporary {', '.join(a.name for a in temps)} of {nbytes / 1024:.0f} KiB "
             + (f"fits in L2/2 ({L2_BYTES // 2048} KiB)" if fits else f"exceeds L2/2 ({L2_BYTES // 2048} KiB)")
             if temps else "no temporary shared with the group")
    costs = (f"fused row-by-row {flops:.3g} vs BLAS {flops:.3g}/{BLAS_SPEEDUP:g} + traffic "
             f"2·{elems}·{traffic:g} + call {KERNEL_OVERHEAD:.3g} = {separate_cost:.3g} madd-equivalents")
    verdict = "separate kernels" if separate else "kept fused"
    return separate, f"{verdict} for {op}: {where}; {costs}"
