"""Measure the cost-model constants of :mod:`spfuse.passes.cost_model` on this machine.

Each constant comes from a micro-benchmark of code spfuse itself runs, on
one thread, best of ``repeat`` runs (the minimum is the least disturbed by
other processes on a shared machine):

=================  ==========================================================
constant           micro-benchmark
=================  ==========================================================
sparse_step        SpMV (``_csr_kernels.spmv``), random CSR, x larger than L2:
                   time / nnz -- a crd read plus a gather per step
dense_madd         SpMM (``_csr_kernels.spmm``) with a wide dense B:
                   (time - nnz · sparse_step) / (nnz · K) -- streamed axpy
scatter            SpGEMM (``_csr_kernels.spgemm``): time / multiply-adds
                   -- each a scatter into the row workspace, its reset and
                   drain into the compressed result
transpose_sparse   ``Tensor.asformat("csc")`` of a CSR tensor: time / nnz
transpose_csf      ``Tensor.asformat`` of a CSF tensor to mode order (1,0,2):
                   time / nnz
transpose_dense    ``Tensor.asformat`` of a dense matrix to the transposed
                   mode order: time / element
strided            numpy gather with a stride of 4 KiB minus the same gather
                   with stride 1, per element: the cache-miss penalty
=================  ==========================================================

``python -m spfuse calibrate [--rounds N] [--json FILE]`` prints them (and writes the JSON
that ``SPFUSE_COST_MODEL`` reads).
"""
from __future__ import annotations

import datetime
import json
import platform
import time
from collections.abc import Callable

import numpy as np

from spfuse.passes.cost_model import CostConstants

__all__ = ["calibrate", "format_constants", "write_json"]


def _best(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up: page faults, first-touch of the output
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _random_csr(rng, m: int, n: int, per_row: int):
    import scipy.sparse as sp
    indptr = np.arange(0, m * per_row + 1, per_row, dtype=np.int32)
    indices = np.sort(rng.integers(0, n, (m, per_row)), axis=1).astype(np.int32).reshape(-1)
    a = sp.csr_array((rng.random(m * per_row), indices, indptr), shape=(m, n))
    a.sum_duplicates()
    return a


def calibrate(scale: float = 1.0, repeat: int = 5, seed: int = 0, rounds: int = 1) -> CostConstants:
    """Measure every constant (``scale`` < 1 shrinks the problems, for tests).

    ``rounds`` > 1 runs the whole suite again and keeps each constant's
    minimum: on a shared machine a burst of load spans one round's few
    seconds, which the best of ``repeat`` back-to-back runs cannot escape.

    >>> c = calibrate(scale=0.02, repeat=1)
    >>> all(v > 0 for v in c.as_dict().values())
    True
    """
    if rounds < 1 or repeat < 1:
        raise ValueError(f"rounds and repeat must be >= 1, got {rounds} and {repeat}")
    runs = [_calibrate_once(scale, repeat, seed) for _ in range(rounds)]
    best = {n: min(getattr(r, n) for r in runs) for n in CostConstants.names()}
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return CostConstants(**best, source=f"calibrated {when} on {platform.node() or 'this machine'}"
                         + (f", best of {rounds} rounds" if rounds > 1 else ""))


def _calibrate_once(scale: float, repeat: int, seed: int) -> CostConstants:
    from spfuse._kernels import _csr_kernels as K
    from spfuse.tensor import Tensor

    rng = np.random.default_rng(seed)
    n = max(int(400_000 * scale), 1000)
    per_row = 8
    A = _random_csr(rng, n, n, per_row)
    nnz = A.nnz
    ip, ix, vals = A.indptr, A.indices, A.data
    x = rng.random(n)
    y = np.empty(n)
    t = _best(lambda: K.spmv(ip, ix, vals, x, y, 1), repeat)
    sparse_step = t / nnz * 1e9

    kk = 64
    m = max(n // 16, 100)
    As = _random_csr(rng, m, m, per_row)
    B = rng.random((m, kk))
    out = np.empty((As.shape[0], kk))
    t = _best(lambda: K.spmm(As.indptr, As.indices, As.data, B, out, 1), repeat)
    dense_madd = max((t * 1e9 - As.nnz * sparse_step) / (As.nnz * kk), t * 1e9 / (As.nnz * kk) / 4)

    mg = max(n // 8, 200)
    G = _random_csr(rng, mg, mg, per_row)
    flops = float(np.diff(G.indptr)[G.indices].sum())
    t = _best(lambda: K.spgemm(G.indptr, G.indices, G.data, G.indptr, G.indices, G.data, mg, 1), repeat)
    scatter = t / flops * 1e9

    T = Tensor.from_scipy(A)
    t = _best(lambda: T.asformat("csc"), repeat)
    transpose_sparse = t / nnz * 1e9

    d3 = max(int(round((nnz / 0.001) ** (1 / 3))), 10)
    nz3 = max(int(nnz / 4), 100)
    coords = np.vstack([rng.integers(0, d3, nz3) for _ in range(3)])
    X = Tensor.from_coo(coords, rng.random(nz3), (d3, d3, d3), format="csf")
    from spfuse.formats import Format
    perm = Format(("compressed",) * 3, (1, 0, 2))
    t = _best(lambda: X.asformat(perm), repeat)
    transpose_csf = t / X.nnz * 1e9

    side = max(int(2048 * scale ** 0.5), 256)
    D = Tensor.from_numpy(rng.random((side, side)))
    dt = Format(("dense", "dense"), (1, 0))
    t = _best(lambda: D.asformat(dt), repeat)
    transpose_dense = t / (side * side) * 1e9

    big = rng.random(max(int(32_000_000 * scale), 1_000_000))  # 256 MB at scale 1: beyond L3
    count = len(big) // 512
    contiguous = np.arange(count)
    strided_ix = (np.arange(count) * 512) % len(big)
    t1 = _best(lambda: big.take(contiguous), repeat)
    t2 = _best(lambda: big.take(strided_ix), repeat)
    strided = max((t2 - t1) / count * 1e9, 1e-3)

    return CostConstants(dense_madd, sparse_step, scatter, transpose_sparse, transpose_csf,
                         transpose_dense, strided)


def format_constants(c: CostConstants) -> str:
    """The constants as a small table.

    >>> from spfuse.passes.cost_model import DEFAULTS
    >>> print(format_constants(DEFAULTS).splitlines()[1])
    constant          ns per unit
    """
    rows = [f"cost-model constants ({c.source})", f"{'constant':17} ns per unit"]
    rows += [f"{n:17} {v:.4g}" for n, v in c.as_dict().items()]
    return "\n".join(rows)


def write_json(c: CostConstants, path: str, command: str | None = None) -> None:
    """Write ``c`` as the JSON ``SPFUSE_COST_MODEL`` reads (with a ``meta`` record)."""
    data = dict(c.as_dict())
    data["meta"] = {"source": c.source, "command": command or "python -m spfuse calibrate",
                    "machine": platform.platform(), "processor": platform.processor(), "threads": 1,
                    "units": "nanoseconds per unit of work"}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
