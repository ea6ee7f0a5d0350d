"""Budgets of a spfuse strategy on a case, estimated from its Plan before running it.

The library-style plans (``fusion="none"``, and ``"max"`` where it cannot
reduce a temporary) materialise whole temporaries: at the medium size the
``none`` plan of SpAdd-7 keeps five 20000×20000 dense temporaries (16 GB),
and a first medium run was killed by the OOM killer.  The harness therefore
asks :func:`skip_reason` first and reports the case ``skip`` with the figure
instead of running it.

* **memory**: every temporary after dimension reduction, kept dense dims at
  their extent; the compressed kept dims of one temporary share a sparse
  operand's pattern, so together they hold at most that operand's nnz.
* **result coordinates**: the generic executor emits one coordinate per
  iteration into a sparse result (:func:`result_coordinate_bytes`);
* **time**: only for plans run by the generic loop-tree executor (templates
  are not the problem): auto's measured call scaled by the ratio of the cost
  model's estimates (``Plan.report.estimate``, the iteration count
  ``explain()`` prints) over :data:`ENGINE_MARGIN` -- a lower bound -- or,
  with no measured auto call, the estimate times :data:`SECONDS_PER_ITERATION`.

>>> import numpy as np, scipy.sparse as sp, spfuse
>>> a = sp.random_array((3000, 3000), density=0.001, format="csr", rng=0)
>>> ops = {"B": a, "C": np.ones((3000, 8)), "D": np.ones((8, 3000))}
>>> prog = "A[i,j] = B[i,j] * (C[i,k] * D[k,j])"
>>> temporary_bytes(spfuse.compile(prog, fusion="none").plans(**ops)["none"])
(72000000, 'T0[i,j] 3000×3000 dense')
>>> skip_reason(prog, ops, "none", max_bytes=1 << 20, max_seconds=60)
'skipped: dense temporary of 68.7 MiB (T0[i,j] 3000×3000 dense) exceeds budget (1.0 MiB)'
>>> skip_reason(prog, ops, "auto", max_bytes=1 << 20, max_seconds=60) is None
True
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["temporary_bytes", "result_coordinate_bytes", "estimated_seconds", "skip_reason", "SECONDS_PER_ITERATION",
           "ENGINE_MARGIN"]

#: The generic executor ran up to this many times faster per estimated
#: iteration than auto's template on the same case (GNN-2's ``none`` plan does
#: its dense ``X·Y`` in BLAS: 0.7 vs 1.4 ns per iteration at the small size);
#: the time bound from auto's measured call is divided by it.
ENGINE_MARGIN = 10.0

#: Seconds per iteration of the cost model for the generic executor.  On this
#: machine (2-core VM, one thread, small size) the generic executor ran the
#: ``max``/``none`` plans at 0.5–180 ns per estimated iteration (median ~10);
#: 1 ns is on the fast side, so only cases that are surely too long are skipped.
SECONDS_PER_ITERATION = 1e-9


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 / 10 else f"{nbytes / 2**20:.1f} MiB"


def _nnz_of_atom(plan, atom: str) -> int | None:
    name = plan.atoms[atom][1] if atom in plan.atoms else atom
    info = plan.inputs.get(name)
    return None if info is None else info.nnz


def temporary_bytes(plan, itemsize: int = 8) -> tuple[int, str]:
    """Bytes of the temporaries ``plan`` stores (after dimension reduction) and a description of the largest.

    Unknown extents count as 0 (nothing to estimate from).
    """
    total, largest, what = 0, -1, ""
    for t in plan.temporaries.values():
        dense, comp_extent, comp_nnz, any_comp, dims = 1, 1, [], False, []
        kept = [e or 0 for d, e in zip(t.dims, t.extents, strict=True) if d in t.kept]
        for e, m in zip(kept, t.masks, strict=True):  # one mask per kept dim
            if m.is_true:
                dense *= e
            else:
                any_comp = True
                comp_extent *= e
                comp_nnz += [n for n in (_nnz_of_atom(plan, a) for a in m.atoms) if n is not None]
            dims.append(str(e))
        entries = dense * (min([comp_extent] + comp_nnz) if any_comp else 1)
        nbytes = entries * itemsize
        total += nbytes
        if nbytes > largest:
            largest = nbytes
            kind = "dense" if not any_comp else "sparse"
            what = f"{t.name}[{','.join(t.kept)}] {'×'.join(dims) or 'scalar'} {kind}"
    return total, what


def result_coordinate_bytes(plan) -> tuple[int, str]:
    """Bytes of the coordinates the generic executor emits for ``plan``'s sparse results.

    It emits one ``(coords..., value)`` per iteration of the computation that
    writes a result stored with a compressed level, merging duplicates only
    at the end, so the cost model's estimate bounds the entries.  (Measured at
    the medium size: SpTTM-SpTTM's ``max`` plan passed 4 GB this way; the
    estimate overcounts where the cost model does -- SpGEMM's
    ``nnz(A)·nnz(B)``.)
    """
    est = plan.report.estimate
    if est is None or not math.isfinite(est):
        return 0, ""
    total, what = 0, ""
    for r in plan.results:
        fmt = plan.formats.get(r)
        if fmt is None or fmt.format_name == "dense":
            continue
        nbytes = int(est) * (len(plan.shapes.get(r, ())) + 1) * 8
        total += nbytes
        what = f"{r}: {fmt.format_name}, ≈{est:.3g} coordinates emitted"
    return total, what


def estimated_seconds(plan, auto_plan=None, auto_seconds: float | None = None) -> float | None:
    """Estimated seconds of one call of ``plan`` (None when unknown).

    With the measured time of the ``auto`` plan on the same operands, the
    estimate is ``auto_seconds · estimate(plan) / estimate(auto) / ENGINE_MARGIN``:
    a lower bound, as the generic executor never did more than
    :data:`ENGINE_MARGIN` times better per estimated iteration than the
    template kernels auto runs on.  Without it, the plan's estimate
    times :data:`SECONDS_PER_ITERATION` (the cost model's worst-case terms,
    e.g. SpGEMM's ``nnz(A)·nnz(B)``, overcount: prefer the first form).
    """
    est = plan.report.estimate
    if est is None or not math.isfinite(est):
        return None
    if auto_plan is not None and auto_seconds is not None:
        ref = auto_plan.report.estimate
        if ref and math.isfinite(ref):
            return auto_seconds * est / ref / ENGINE_MARGIN if est > ref else None
    return est * SECONDS_PER_ITERATION


def skip_reason(program: str, operands: Mapping[str, Any], fusion: str, max_bytes: int,
                max_seconds: float, auto_seconds: float | None = None, generic: bool = False) -> str | None:
    """Why ``spfuse.compile(program, fusion=fusion)`` should not run on ``operands`` (None: run it).

    ``auto_seconds``: a measured call of ``fusion="auto"`` on the same operands
    (see :func:`estimated_seconds`); ``generic``: the plan will run on the
    generic executor even if a template matches it.  Planning errors return
    None (running the case reports them as usual).
    """
    import spfuse
    from spfuse.api import describe_execution
    try:
        plans = spfuse.compile(program, fusion=fusion).plans(**operands)
    except Exception:
        return None
    plan, auto = plans.get(fusion), plans.get("auto")
    if plan is None or isinstance(plan, Exception):
        return None
    auto = None if isinstance(auto, Exception) else auto
    nbytes, what = temporary_bytes(plan)
    if nbytes > max_bytes:
        kind = "dense temporary" if what.endswith("dense") else "temporaries"
        return f"skipped: {kind} of {_size(nbytes)} ({what}) exceeds budget ({_size(max_bytes)})"
    if not generic and describe_execution(plan).startswith("template"):
        return None
    nbytes, what = result_coordinate_bytes(plan)
    if nbytes > max_bytes:
        return f"skipped: result coordinates of {_size(nbytes)} ({what}) exceed budget ({_size(max_bytes)})"
    secs = estimated_seconds(plan, auto, auto_seconds)
    if secs is not None and secs > max_seconds:
        if auto is not None and auto_seconds is not None:
            how = (f"auto's {auto_seconds:.3g} s × cost-model ratio {plan.report.estimate:.3g}/"
                   f"{auto.report.estimate:.3g} / {ENGINE_MARGIN:g}")
        else:
            how = f"{plan.report.estimate:.3g} iterations × {SECONDS_PER_ITERATION * 1e9:g} ns"
        return f"skipped: estimated ≥ {secs:.3g} s ({how}) exceeds {max_seconds:g} s"
    return None
