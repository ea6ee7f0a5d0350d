"""The tiling study: SpMM's dense ``k`` loop tiled (as the planner chooses) vs untiled.

Scorch (Algorithm 2) tiles the dense loops of a mixed sparse-dense kernel
that are neither sparse nor parents of sparse loops -- SpMM's ``k`` -- and
reports up to 6x on large SpMM.  spfuse's tiling pass (``Plan.tiles``) picks
the tile; the ``spmm`` template kernel takes it as its ``tile`` argument
(``0`` = untiled: one accumulator over the whole row).  This study calls the
kernel directly with the planner's tile, with ``0``, and with a few fixed
tiles, on the same operands, interleaved (one call of every variant per
round, median of the rounds), so the only difference is the tile.

Rows shrink for large ``K`` so that ``B`` and ``C`` (``n x K`` doubles each)
fit in ``mem_bytes``.

>>> import io
>>> buf = io.StringIO()
>>> rows = run_tiling_study(ks=(600,), rows=2000, row_nnz=4, threads=[1], repeat=1, out=buf)
>>> sorted({r["variant"] for r in rows})
['planned', 'tile=0', 'tile=256', 'tile=64']
>>> "untiled/planned" in buf.getvalue()
True
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import numpy as np

import spfuse
from spfuse.bench import report, suite

__all__ = ["planned_tile", "rows_for", "run_tiling_study"]

SPMM = "C[i,k] = A[i,j] * B[j,k]"


def planned_tile(a, K: int) -> int:
    """The tile of ``k`` the planner chooses for SpMM of CSR ``a`` by an ``n x K`` dense matrix (0: untiled).

    >>> import scipy.sparse as sp
    >>> a = sp.random_array((100, 100), density=0.05, format="csr", rng=0)
    >>> planned_tile(a, 16), planned_tile(a, 1 << 18)
    (0, 256)
    """
    from spfuse.frontend.parser import parse_program
    from spfuse.ir.ops import TensorInfo
    from spfuse.planner import plan_program
    A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), tuple(a.shape), nnz=int(a.nnz))
    plan = plan_program(parse_program(SPMM), {"A": A, "B": TensorInfo.dense("B", (a.shape[1], K))})
    return max((d.get("k", 0) for d in plan.tiles.values()), default=0)


def rows_for(K: int, rows: int, mem_bytes: int, itemsize: int = 8) -> int:
    """Rows (= columns) of the square sparse matrix so that ``B`` and ``C`` fit in ``mem_bytes``.

    >>> rows_for(64, 200_000, 4 << 30), rows_for(4096, 200_000, 4 << 30)
    (200000, 65536)
    """
    return int(max(1, min(rows, mem_bytes // (2 * K * itemsize))))


def _time(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


def run_tiling_study(ks: Sequence[int] = (64, 256, 1024, 4096), rows: int = 200_000, row_nnz: int = 10,
                     threads: list[int] | None = None, repeat: int = 3, mem_bytes: int = 4 << 30,
                     fixed_tiles: Sequence[int] = (64, 256, 1024), out: TextIO = sys.stdout,
                     seed: int = 0) -> list[dict]:
    """Time SpMM tiled (planner's tile and ``fixed_tiles``) vs untiled; print a table; return the rows.

    Each returned row: ``matrix, n, nnz, K, threads, variant, tile, median, times``; variant
    ``planned`` is the planner's tile (the same as ``tile=0`` when it leaves ``k`` untiled).
    Results of every variant are checked equal (bitwise: tiling never changes the sums).
    """
    from spfuse._kernels import _csr_kernels as csr
    threads = threads or sorted({1, spfuse.get_num_threads()})
    t_start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    records: list[dict] = []
    mats: dict = {}
    for K in ks:
        n = rows_for(K, rows, mem_bytes)
        for kind in ("uniform", "powerlaw"):
            key = (kind, n)
            if key not in mats:
                mats.clear()  # one matrix alive at a time: the big ones take memory
                make = suite.uniform_matrix if kind == "uniform" else suite.powerlaw_matrix
                mats[key] = make(n, n, row_nnz, seed if kind == "uniform" else seed + 1)
            a = mats[key]
            ip, ix = a.indptr.astype(np.int32), a.indices.astype(np.int32)
            B = np.random.default_rng(seed + K).random((n, K))
            outs = {}
            plan_t = planned_tile(a, K)
            variants = {"planned": plan_t, "tile=0": 0}
            for t in fixed_tiles:
                if 0 < t < K:
                    variants[f"tile={t}"] = t
            for v in variants:
                outs[v] = np.empty((n, K))
            for nt in threads:
                timed = {v: [] for v in variants}
                for r in range(repeat + 1):  # round 0 warms up (and checks results)
                    for v, t in variants.items():
                        dt = _time(csr.spmm, ip, ix, a.data, B, outs[v], nt, t)
                        if r:
                            timed[v].append(dt)
                    if r == 0:
                        ref = outs["tile=0"]
                        for v in variants:
                            if not np.array_equal(outs[v], ref):
                                raise AssertionError(f"spmm tile {variants[v]} disagrees with untiled")
                for v, t in variants.items():
                    records.append(dict(matrix=kind, n=n, nnz=int(a.nnz), K=K, threads=nt, variant=v, tile=t,
                                        median=statistics.median(timed[v]), times=timed[v]))
            del outs, B
    _report(records, out, threads, repeat, rows, row_nnz, mem_bytes, load, time.perf_counter() - t_start)
    return records


def _report(records, out, threads, repeat, rows, row_nnz, mem_bytes, load, elapsed) -> None:
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"spfuse {spfuse.__version__} tiling study: SpMM C = A·B, A square CSR (up to {rows} rows, "
      f"~{row_nnz} nnz/row), B and C dense float64 within {mem_bytes / 2**30:.1f} GiB; "
      f"median of {repeat} interleaved rounds after 1 warm-up")
    w(report.machine_line(load))
    w("cells: median ms of the spmm template kernel; untiled/planned > 1: the planner's tile is faster; "
      "best tiled/untiled < 1: some tile beats the untiled kernel")
    w()
    fixed = sorted({r["variant"] for r in records} - {"planned", "tile=0"}, key=lambda v: int(v[5:]))
    head = ["matrix", "n", "nnz", "K", "thr", "planned tile", "planned", "tile=0"] + fixed + [
        "untiled/planned", "best tiled/untiled", "best"]
    rows_out = []
    groups: dict = {}
    for r in records:
        groups.setdefault((r["matrix"], r["n"], r["nnz"], r["K"], r["threads"]), {})[r["variant"]] = r
    for (kind, n, nnz, K, nt), g in groups.items():
        best = min(g.values(), key=lambda r: r["median"])
        cells = [kind, str(n), str(nnz), str(K), str(nt), str(g["planned"]["tile"] or "untiled")]
        cells += [f"{g[v]['median'] * 1e3:.1f}" if v in g else "-" for v in ["planned", "tile=0"] + fixed]
        tiled = [r["median"] for r in g.values() if r["tile"]]
        cells += [f"{g['tile=0']['median'] / g['planned']['median']:.2f}",
                  f"{min(tiled) / g['tile=0']['median']:.2f}" if tiled else "-",
                  f"tile={best['tile']}" if best["variant"] != "planned" else f"planned ({best['tile']})"]
        rows_out.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in rows_out)) for i, h in enumerate(head)]
    w("  ".join(h.rjust(wd) for h, wd in zip(head, widths, strict=True)))
    for c in rows_out:
        w("  ".join(x.rjust(wd) for x, wd in zip(c, widths, strict=True)))
    w()
    w(f"wall time {elapsed:.1f} s")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spfuse.bench.tiling [--rows N] [--ks 64,256] [--threads 1,2] [--repeat R] [--mem-gib G]``."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m spfuse.bench.tiling", description=run_tiling_study.__doc__)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--row-nnz", type=int, default=10)
    p.add_argument("--ks", default="64,256,1024,4096")
    p.add_argument("--threads", default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--mem-gib", type=float, default=4.0)
    a = p.parse_args(argv)
    run_tiling_study(ks=[int(k) for k in a.ks.split(",")], rows=a.rows, row_nnz=a.row_nnz,
                     threads=[int(t) for t in a.threads.split(",")] if a.threads else None, repeat=a.repeat,
                     mem_bytes=int(a.mem_gib * 2**30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
