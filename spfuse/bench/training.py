"""``spfuse bench --suite training``: the three example models per epoch, and
``--suite backward``: backward/forward cost per catalogue kernel.

Training: each model (:mod:`spfuse.examples`) is trained through spfuse,
torch.sparse and dense torch from the same seed, in one process; reported
are the median ms per epoch (forward, backward, optimiser step; the first,
planning epoch excluded), the ratio torch.sparse / spfuse (> 1: spfuse
faster) and the largest loss difference to spfuse over all epochs.

Backward: per catalogue kernel (:mod:`spfuse.bench.suite`), the median time
of ``spfuse.vjp`` with respect to every dense operand over the median time
of the forward ``spfuse.evaluate``, same operands, same run, the two timed
alternately (one call of each per round); both after a warm-up call
(planning; for vjp also the fused-or-split measurement of
:class:`spfuse.autodiff.run.ExecutionChoice`).
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any

__all__ = ["run_training_suite", "run_backward_suite", "SIZES"]

#: per size: (GCN nodes, degree, features), (AE users, items, per user), (attention nodes, per row)
SIZES = {
    "tiny": ((200, 4, 16), (100, 80, 5), (100, 4)),
    "small": ((2000, 8, 32), (2000, 1000, 20), (1000, 16)),
    "medium": ((20_000, 10, 64), (20_000, 5000, 40), (5000, 32)),
    "large": ((100_000, 10, 64), (100_000, 20_000, 50), (20_000, 32)),
}
#: sizes at which dense torch is trained too (above them: "skip")
DENSE_SIZES = ("tiny", "small")


#: Planetoid graphs trained when a data directory is given (their features are sparse)
PLANETOID = ("cora", "citeseer")


def _models(size: str, data: str | None = None):
    import numpy as np

    from spfuse.examples import attention, autoencoder, gcn
    (gn, gd, gf), (au, ai, ap), (an, ar) = SIZES[size]
    A, y = gcn.karate()
    yield "GCN karate", gcn.model(A, y)
    for name in PLANETOID if data else ():
        found = gcn.planetoid(name, data)
        if found is not None:
            A, X, y = found
            # Planetoid's split: 20 labelled nodes per class
            labelled = np.concatenate([np.flatnonzero(y == c)[:20] for c in range(int(y.max()) + 1)])
            yield f"GCN {name} (sparse X)", gcn.model(A, y, features=X, labelled=labelled)
    A, y = gcn.graph(gn, gd, 8, seed=0)
    labelled = np.arange(0, gn, 10)
    yield f"GCN {gn} nodes", gcn.model(A, y, features=gf, hidden=16, labelled=labelled)
    yield f"autoencoder {au}x{ai}", autoencoder.model(autoencoder.ratings(au, ai, ap))
    yield f"attention {an} nodes", attention.model(attention.pattern(an, ar))


def run_training_suite(size: str = "small", epochs: int = 20, out=None, json_path: str | None = None,
                       data: str | None = None) -> list[dict]:
    """Train every model on every backend; print the table and return its rows.
    ``data``: a directory holding ``graphs/<name>_adj.mtx`` and
    ``_features.mtx`` of the :data:`PLANETOID` graphs, each then trained too."""
    import json
    import sys

    from spfuse.examples.training import compare
    out = out or sys.stdout
    rows = []
    print(f"training suite (size={size}, {epochs} epochs, median ms/epoch without the first; "
          "ratio = torch.sparse / spfuse)", file=out)
    print(f"  {'model':<24} {'spfuse':>9} {'torch.sparse':>13} {'dense':>9} {'ratio':>7} {'max |Δloss|':>12}",
          file=out)
    # dense torch only where its O(n^2) operands and products stay small: at
    # medium its GCN multiplies a 20000x20000 adjacency every step
    ways = ("spfuse", "torch.sparse", "dense") if size in DENSE_SIZES else ("spfuse", "torch.sparse")
    for name, (backends, params) in _models(size, data):
        r = compare(backends, params, epochs, backends=ways)
        row = {"model": name, **{f"{b}_ms": r[b]["ms_per_epoch"] for b in r},
               "max_loss_diff": max(r[b].get("max_loss_diff", 0.0) for b in r)}
        row["ratio"] = row["torch.sparse_ms"] / row["spfuse_ms"]
        rows.append(row)
        dense = f"{row['dense_ms']:>9.2f}" if "dense_ms" in row else f"{'skip':>9}"
        print(f"  {name:<24} {row['spfuse_ms']:>9.2f} {row['torch.sparse_ms']:>13.2f} {dense} "
              f"{row['ratio']:>7.2f} {row['max_loss_diff']:>12.2e}", file=out)
    ratios = [r["ratio"] for r in rows]
    geo = statistics.geometric_mean(ratios) if ratios else float("nan")
    print(f"  geomean ratio torch.sparse / spfuse: {geo:.2f}", file=out)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def _median_times(fs, repeat: int) -> tuple[list[float], list[float]]:
    """Median seconds of each callable in ``fs``, timed interleaved (one call
    of each per round), so load on a shared machine hits them alike; and
    the seconds of each one's first call (it plans; a vjp's also derives
    the adjoint and chooses fused or split: ExecutionChoice)."""
    firsts = []
    for f in fs:
        start = time.perf_counter()
        f()
        firsts.append(time.perf_counter() - start)
    times: list[list[float]] = [[] for _ in fs]
    for _ in range(repeat):
        for f, ts in zip(fs, times, strict=True):
            start = time.perf_counter()
            f()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times], firsts


def run_backward_suite(size: str = "small", kernels: str | None = None, repeat: int = 5, out=None) -> list[dict]:
    """Backward/forward time per catalogue kernel (gradients w.r.t. every dense operand)."""
    import sys

    import numpy as np

    import spfuse
    from spfuse.bench.suite import SIZES as KERNEL_SIZES
    from spfuse.bench.suite import select_kernels, synthetic_inputs
    out = out or sys.stdout
    size_ = KERNEL_SIZES[size]
    inputs = synthetic_inputs(size_)
    rows = []
    print(f"backward/forward per catalogue kernel (size={size}, median of {repeat}; "
          "vjp w.r.t. every dense operand; first vjp: its first call, planning and choosing included)", file=out)
    for kernel in select_kernels(kernels):
        inp = next(i for i in inputs if i.kind == kernel.kind)
        ops: dict[str, Any] = kernel.operands(inp, size_)
        wrt = tuple(n for n, v in ops.items() if isinstance(v, np.ndarray))
        if not wrt:
            print(f"  {kernel.name:<16} (no dense operand)", file=out)
            continue
        result = spfuse.evaluate(kernel.program, **ops)
        cot = result.copy() if hasattr(result, "copy") else float(result)
        try:
            (fwd, bwd), (_, first) = _median_times(
                [functools.partial(spfuse.evaluate, kernel.program, **ops),
                 functools.partial(spfuse.vjp, kernel.program, cot, wrt=wrt, **ops)], repeat)
        except Exception as e:  # report, keep going
            print(f"  {kernel.name:<16} error: {type(e).__name__}: {e}", file=out)
            continue
        rows.append({"kernel": kernel.name, "input": inp.name, "forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3,
                     "ratio": bwd / fwd, "first_backward_ms": first * 1e3})
        print(f"  {kernel.name:<16} {inp.name:<18} forward {fwd * 1e3:9.2f} ms  backward {bwd * 1e3:9.2f} ms  "
              f"ratio {bwd / fwd:6.2f}  first vjp {first * 1e3:8.1f} ms", file=out)
    return rows
