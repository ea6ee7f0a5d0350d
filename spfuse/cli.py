"""The ``spfuse`` command line: ``bench``, ``explain``, ``calibrate`` and ``config``.

``spfuse bench`` runs the benchmark suite (see :mod:`spfuse.bench`)::

    spfuse bench --size small --kernels SpMV,SDDMM --threads 1,2 --json out.json --plot out.png
    spfuse bench --fusion-study --size medium     # auto vs max vs none (spfuse.bench.fusion)
    spfuse bench --tiling                         # SpMM tiled vs untiled (spfuse.bench.tiling)
    spfuse bench --suite offcatalog --size medium --threads 1,2   # issue 14 (spfuse.bench.offcatalog)

``spfuse explain`` prints what :func:`spfuse.compile` plans for a program,
on example operands built from ``--shape`` (random, seeded) so the report
has extents::

    spfuse explain "A[i,j] = B[i,j] * (C[i,k] * D[k,j])" --format B=csr \\
        --shape B=1000x1000 --shape C=1000x32 --shape D=32x1000

``spfuse calibrate`` measures the loop-order cost model's constants on this
machine (see :mod:`spfuse.bench.calibrate`) and can write them as the JSON
that ``SPFUSE_COST_MODEL=FILE`` makes planning use::

    spfuse calibrate --json costs.json

``python -m spfuse ...`` is the same program.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["main", "build_parser", "parse_assignments", "example_operands"]

_PUBLIC_SIZES = ("small", "medium", "large")
_SIZES = _PUBLIC_SIZES + ("tiny",)  # tiny: hidden, for tests


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return vals


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def parse_assignments(items: Sequence[str], what: str) -> dict[str, str]:
    """``["B=csr", "C=dense,D=csr"]`` → ``{"B": "csr", "C": "dense", "D": "csr"}``.

    >>> parse_assignments(["B=csr", "C=dense,D=csc"], "--format")
    {'B': 'csr', 'C': 'dense', 'D': 'csc'}
    """
    out = {}
    for item in items or ():
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            if not sep or not name.strip() or not value.strip():
                raise ValueError(f"{what} expects NAME=VALUE, got {part!r}")
            out[name.strip()] = value.strip()
    return out


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(t) for t in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shape expects extents like 1000x1000, got {text!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"--shape extents must be >= 0, got {text!r}")
    return shape


def example_operands(shapes: dict[str, str], formats: dict[str, str], density: float = 0.01,
                     seed: int = 0) -> dict:
    """Seeded random operands: dense numpy, or sparse :class:`spfuse.Tensor` where a format says so.

    >>> ops = example_operands({"B": "4x5", "x": "5"}, {"B": "csr"}, density=0.5)
    >>> ops["B"].format.name, ops["B"].shape, ops["x"].shape
    ('csr', (4, 5), (5,))
    """
    import spfuse
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name, text in shapes.items():
        shape = _parse_shape(text)
        fmt = formats.get(name, "dense")
        if fmt == "dense":
            out[name] = rng.random(shape)
            continue
        size = int(np.prod(shape, dtype=np.int64))
        nnz = min(size, max(1, int(round(density * size))), 5_000_000) if size else 0
        flat = np.unique(rng.integers(0, size, nnz)) if size else np.zeros(0, np.int64)
        coords = np.array(np.unravel_index(flat, shape)) if size else np.zeros((len(shape), 0), np.int64)
        out[name] = spfuse.Tensor.from_coo(coords, rng.random(flat.size), shape,
                                           format="csr" if fmt == "coo" else fmt)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    p = argparse.ArgumentParser(prog="spfuse", description="spfuse: fused sparse/dense tensor expressions")
    sub = p.add_subparsers(dest="command", metavar="{bench,explain,calibrate,config}")
    sub.required = True

    b = sub.add_parser("bench", help="benchmark spfuse against scipy, numpy, GraphBLAS, torch, sparse",
                       description="Run the kernel suite of design.md section 4 against every importable "
                                   "peer; report median times and peer/spfuse ratios (>1: spfuse faster).")
    b.add_argument("--size", choices=_SIZES, default="small", metavar="{small,medium,large}",
                   help="input size (small finishes in about a minute on 2 cores)")
    b.add_argument("--suite", choices=tuple(BENCH_SUITES), default="catalogue",
                   help="; ".join(f"{name}: {what}" for name, what in BENCH_SUITES.items()))
    b.add_argument("--kernels", help="comma-separated kernel names (default: all), e.g. SpMV,SDDMM "
                                     "(with --suite offcatalog: program names, e.g. AT-SpMV,GCN)")
    b.add_argument("--call-budget", type=float, metavar="SECONDS",
                   help="--suite offcatalog: a call slower than this is reported with its single call, not timed "
                        "further (default: the size's)")
    b.add_argument("--threads", type=_int_list, help="comma-separated thread counts (default: 1 and all cores)")
    b.add_argument("--repeat", type=_positive, help="timed calls per peer (median reported)")
    b.add_argument("--peers", help="comma-separated peers to run besides spfuse: spfuse[max], spfuse[none], scipy, "
                        "numpy, graphblas, torch, sparse (default: all importable)")
    b.add_argument("--data", metavar="DIR", help="also run on every .mtx/.tns/.mat under DIR (reported apart); "
                        "--suite training: also train the GCN on DIR's Planetoid graphs (cora, citeseer)")
    b.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="grouped bar chart of speedups (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--no-planning", action="store_true", help="skip the planning-time table")
    b.add_argument("--fusion-study", action="store_true",
                   help="instead of the peer suite: auto vs max vs none on every kernel (issue 6 criteria)")
    b.add_argument("--epochs", type=_positive, default=20, help="epochs per model (--suite training)")
    b.add_argument("--tiling", action="store_true",
                   help="instead of the peer suite: SpMM with the planner's k tile vs untiled "
                        "(200k rows, K in 64..4096; --size/--kernels/--peers ignored)")

    e = sub.add_parser("explain", help="print the plan spfuse chooses for a program",
                       description="Print spfuse.compile(PROGRAM).explain() on example operands.")
    e.add_argument("program", help='index notation, e.g. "y[i] = A[i,j] * x[j]"')
    e.add_argument("--format", action="append", default=[], metavar="NAME=FMT",
                   help="operand format (csr, csc, dcsr, dcsc, csf, coo, dense); repeatable or comma-separated")
    e.add_argument("--shape", action="append", default=[], metavar="NAME=AxB",
                   help="operand shape, e.g. B=1000x1000; operands get seeded random values")
    e.add_argument("--density", type=float, default=0.01, help="density of sparse example operands")
    e.add_argument("--fusion", choices=("auto", "max", "none"), default="auto")
    e.add_argument("--png", metavar="FILE", help="draw the index tree (not implemented yet)")

    c = sub.add_parser("calibrate", help="measure the loop-order cost model's constants on this machine",
                       description="Micro-benchmark spfuse's kernels (SpMV, SpMM, SpGEMM, transpositions) "
                                   "and print the cost-model constants in ns per unit of work.")
    c.add_argument("--json", metavar="FILE", help="also write them as JSON (use with SPFUSE_COST_MODEL=FILE)")
    c.add_argument("--repeat", type=_positive, default=5, help="runs per micro-benchmark (the best is kept)")
    c.add_argument("--rounds", type=_positive, default=3,
                   help="run the whole suite this many times and keep each constant's minimum (default 3)")
    c.add_argument("--scale", type=float, default=1.0, help="problem-size factor (default 1: about 3 s a round)")

    sub.add_parser("config", help="print how spfuse was built (spfuse.show_config())")
    return p


#: ``spfuse bench --suite NAME``: the suites and what each measures (the
#: option's choices and help come from this one table).
BENCH_SUITES = {
    "catalogue": "the kernels of design.md section 4 against every importable peer",
    "offcatalog": "everyday programs outside the catalogue, with the no-cliff ratios of their equivalent "
                  "spellings (sizes small and medium)",
    "dask": "spfuse.dask on LocalClusters -- weak scaling, memory, predicted vs measured communication, "
            "dask+sparse comparison, 64-node projection (--plot FILE.png draws it; needs the dask extra)",
    "training": "the example models (GCN, sparse autoencoder, sparse attention) per epoch against "
                "torch.sparse and dense torch (needs torch)",
    "backward": "backward/forward time per catalogue kernel (spfuse.vjp)",
}


def _bench(args, out) -> int:
    from spfuse.bench.runner import run_benchmark
    if args.suite == "dask":
        from spfuse.bench.dask_suite import run_dask_suite
        run_dask_suite(size=args.size, repeat=args.repeat, kernels=args.kernels, json_path=args.json,
                       plot_path=args.plot, out=out)
        return 0
    if args.suite == "training":
        from spfuse.bench.training import run_training_suite
        run_training_suite(args.size, args.epochs, out=out, json_path=args.json, data=args.data)
        return 0
    if args.suite == "backward":
        from spfuse.bench.training import run_backward_suite
        run_backward_suite(args.size, args.kernels, args.repeat or 5, out=out)
        return 0
    if args.tiling:
        from spfuse.bench.tiling import run_tiling_study
        run_tiling_study(threads=args.threads, repeat=args.repeat or 3, out=out)
        return 0
    if args.fusion_study:
        from spfuse.bench.fusion import run_fusion_study
        run_fusion_study(args.size, args.kernels, args.threads, args.repeat, out=out,
                         progress=not args.no_progress, json_path=args.json)
        return 0
    peers = [s.strip() for s in args.peers.split(",")] if args.peers else None
    if args.suite == "offcatalog":
        from spfuse.bench.offcatalog_run import run_offcatalog
        run_offcatalog(args.size, args.kernels, args.threads, args.repeat, out=out, progress=not args.no_progress,
                       json_path=args.json, call_budget=args.call_budget, peers=peers)
        return 0
    run_benchmark(size=args.size, kernels=args.kernels, threads=args.threads, repeat=args.repeat,
                  data=args.data, json_path=args.json, plot_path=args.plot, peers=peers, out=out,
                  progress=not args.no_progress, planning=not args.no_planning)
    return 0


def _explain(args, out) -> int:
    import spfuse
    formats = parse_assignments(args.format, "--format")
    shapes = parse_assignments(args.shape, "--shape")
    operands = example_operands(shapes, formats, args.density)
    # (typed Any: mypy would match the str values against compile's other keyword parameters)
    declared: dict[str, Any] = {n: ("csr" if f == "coo" else f) for n, f in formats.items() if n not in operands}
    kernel = spfuse.compile(args.program, fusion=args.fusion, **declared)
    print(kernel.explain(**operands), file=out)
    if args.png:
        print(f"--png {args.png}: drawing the index tree is not implemented yet; the text report above "
              "is the whole plan", file=sys.stderr)
    return 0


def _calibrate(args, out, argv: Sequence[str]) -> int:
    from spfuse.bench.calibrate import calibrate, format_constants, write_json
    if not args.scale > 0:
        raise ValueError(f"--scale must be > 0, got {args.scale}")
    constants = calibrate(scale=args.scale, repeat=args.repeat, rounds=args.rounds)
    print(format_constants(constants), file=out)
    if args.json:
        write_json(constants, args.json, "python -m spfuse " + " ".join(argv))
        print(f"wrote {args.json} (use it with SPFUSE_COST_MODEL={args.json})", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out=None) -> int:
    """Entry point of ``spfuse`` / ``python -m spfuse``; returns the exit status."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        if args.command == "bench":
            return _bench(args, out)
        if args.command == "explain":
            return _explain(args, out)
        if args.command == "calibrate":
            return _calibrate(args, out, sys.argv[1:] if argv is None else argv)
        import spfuse
        spfuse.show_config()
        return 0
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"spfuse {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
