"""SpMV right after a numpy BLAS call: the GNN-training pattern ``X @ W`` then ``A @ (.)``.

After a multi-threaded OpenBLAS call, OpenBLAS's worker threads busy-wait for
~0.1 s.  A 2-thread OpenMP team on a 2-core machine then shares a core with a
spinner and waits at its closing barrier for a time slice.  This study times,
interleaved in one process (each case after a pause that lets every pool fall
asleep):

* ``rest``: spfuse SpMV, no BLAS call before (the reference);
* ``after``: spfuse SpMV right after ``X @ W``, team from
  :func:`spfuse.threads.threads_for_call` (what a kernel call does);
* ``after, fixed team``: the same with the requested team forced (the
  behaviour before ``threads_for_call`` left busy cores out);
* ``after, 1 thread``; ``scipy after``; ``torch after`` (if installed, torch's
  own threads at the same count);
* ``X @ W at rest`` and ``X @ W after SpMV``: whether our team's spinning
  slows the next BLAS call.

The SpMV is the catalogue kernel itself (``_csr_kernels.spmv``), so the
figures measure thread scheduling, not planning.

    python -m spfuse.bench.after_blas --reps 50 --threads 2
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from spfuse._kernels import _csr_kernels
from spfuse.threads import threads_for_call

__all__ = ["format_table", "main", "run"]

# Longer than OpenBLAS's default spin (2**28 TSC ticks, ~0.1 s at 2.5 GHz).
PAUSE_S = 0.2


def _operands(n: int, nnz: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    # uniform positions (sp.random draws without replacement: minutes at this size)
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, n, nnz)
    A = sp.csr_array((rng.standard_normal(nnz), (rows, cols)), shape=(n, n))
    A.sum_duplicates()
    return A, rng.standard_normal(n), rng.standard_normal((n, k)), rng.standard_normal((k, k))


def run(reps: int = 50, n: int = 39_000, nnz: int = 560_000, k: int = 64,
        threads: int = 2, seed: int = 0, peers: bool = True) -> dict[str, np.ndarray]:
    """Times in seconds per case (``reps`` each, interleaved); see the module docstring.

    >>> t = run(reps=1, n=500, nnz=2_000, k=8, peers=False)
    >>> sorted(t) == sorted(["rest", "after", "after, fixed team", "after, 1 thread",
    ...                      "X @ W at rest", "X @ W after SpMV"])
    True
    """
    A, x, X, W = _operands(n, nnz, k, seed)
    out = np.empty(n)

    def spmv(team: int) -> None:
        bad = _csr_kernels.spmv(A.indptr, A.indices, A.data, x, out, team)
        assert bad < 0

    def blas() -> None:
        X @ W

    cases: dict[str, tuple[Callable[[], None] | None, Callable[[], None]]] = {
        "rest": (None, lambda: spmv(threads_for_call(threads))),
        "after": (blas, lambda: spmv(threads_for_call(threads))),
        "after, fixed team": (blas, lambda: spmv(threads)),
        "after, 1 thread": (blas, lambda: spmv(1)),
        "X @ W at rest": (None, blas),
        "X @ W after SpMV": (lambda: spmv(threads), blas),
    }
    if peers:
        cases["scipy after"] = (blas, lambda: A @ x)
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            At = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                         torch.from_numpy(A.indices.astype(np.int64)),
                                         torch.from_numpy(A.data), size=A.shape)
            xt = torch.from_numpy(x)

            def torch_mv() -> None:
                old = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    torch.mv(At, xt)
                finally:
                    torch.set_num_threads(old)

            cases["torch after"] = (blas, torch_mv)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(reps + 1):  # round 0 warms up and is dropped
        for name, (before, timed) in cases.items():
            time.sleep(PAUSE_S)
            if before is not None:
                before()
            t0 = time.perf_counter()
            timed()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return {name: np.array(t) for name, t in times.items()}


def format_table(times: dict[str, np.ndarray], reference: str = "rest") -> str:
    """Median / max in ms and the median's ratio to ``reference``, one row per case.

    >>> print(format_table({"rest": np.array([1e-3]), "after": np.array([2e-3])}))
    case                    median ms    max ms   median / rest
    rest                        1.000     1.000            1.0x
    after                       2.000     2.000            2.0x
    """
    ref = float(np.median(times[reference]))
    rows = [f"{'case':22s} {'median ms':>10s} {'max ms':>9s}   median / {reference}"]
    for name, t in times.items():
        med = float(np.median(t))
        rows.append(f"{name:22s} {med * 1e3:10.3f} {t.max() * 1e3:9.3f} {med / ref:14.1f}x")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m spfuse.bench.after_blas [--reps N] [--threads T] ...``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=39_000)
    ap.add_argument("--nnz", type=int, default=560_000)
    ap.add_argument("--k", type=int, default=64, help="columns of X and size of W")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args(argv)
    times = run(args.reps, args.rows, args.nnz, args.k, args.threads, peers=not args.no_peers)
    print(f"SpMV {args.rows} rows, {args.nnz} nnz, {args.threads} threads, after X @ W "
          f"({args.rows}x{args.k} @ {args.k}x{args.k}); {args.reps} interleaved rounds")
    print(format_table(times))


if __name__ == "__main__":
    main()
