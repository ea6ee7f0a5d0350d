"""SpMV, SpMM (K=64), SpGEMM and SpAdd of 7 operands on 200k-row matrices
(~10 nnz/row) against scipy, torch and python-graphblas in one process, at 1
and 2 threads (SpAdd: scipy's and GraphBLAS's chained additions).

``python -m spfuse.bench.large_kernels`` (about 5 minutes on 2 cores; torch
and graphblas are used when importable).  Calls are interleaved: each
contender called twice per round (the second timed), medians over rounds.  Prints spfuse/peer time ratios
(< 1: spfuse faster): issue 5's table, quicker than ``spfuse bench --size
large``, which runs every peer on every kernel.
"""
from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np

import spfuse
from spfuse.bench.suite import powerlaw_matrix, uniform_matrix

ROWS = 200_000
ROW_NNZ = 10
RANK = 64


def median_seconds(f: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls after one warm-up call.

    >>> median_seconds(lambda: sum(range(10)), 3) >= 0.0
    True
    """
    return interleaved_medians({"f": f}, repeat)["f"]


def interleaved_medians(calls: dict, repeat: int) -> dict:
    """Median wall time of each callable over ``repeat`` rounds; in a round
    each is called twice back to back and the second call is timed.

    Interleaved, so a drift of the machine's load hits every contender alike
    (design.md); back to back, so each timed call finds its own operands as
    warm as in a loop -- a single call would favour whichever contender
    follows one that has just read the same arrays.

    >>> sorted(interleaved_medians({"a": lambda: 1, "b": lambda: 2}, 3))
    ['a', 'b']
    """
    times: dict = {name: [] for name in calls}
    for _ in range(repeat):
        for name, f in calls.items():
            f()
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


SPADD_TERMS = 7


def _chain(terms):
    """``terms[0] + terms[1] + ...``, one library call per ``+`` (scipy's way)."""
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _gb_chain(mats):
    """GraphBLAS's chained addition: one ``ewise_add`` per ``+``."""
    out = mats[0]
    for m in mats[1:]:
        out = out.ewise_add(m).new()
    return out


def _peers(A, x, B, adds=()) -> dict:
    """Per kernel, the peers' callables (only the libraries that import);
    ``adds`` are the SpAdd-7 operands (no SpAdd entry without them)."""
    peers = {"SpMV": {"scipy": lambda: A @ x}, "SpMM": {"scipy": lambda: A @ B},
             "SpGEMM": {"scipy": lambda: A @ A}}
    if adds:
        peers["SpAdd-7"] = {"scipy": lambda: _chain(adds)}
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    try:
        import torch
        tA = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                     torch.from_numpy(A.indices.astype(np.int64)), torch.from_numpy(A.data),
                                     size=A.shape)
        tx, tB = torch.from_numpy(x), torch.from_numpy(B)
        peers["SpMV"]["torch"] = lambda: tA @ tx
        peers["SpMM"]["torch"] = lambda: tA @ tB
    except ImportError:
        pass
    try:
        import graphblas as gb
        gA, gx = gb.io.from_scipy_sparse(A), gb.Vector.from_dense(x)
        peers["SpMV"]["graphblas"] = lambda: (gA @ gx).new()
        peers["SpGEMM"]["graphblas"] = lambda: (gA @ gA).new()
        if adds:
            gadds = [gb.io.from_scipy_sparse(a) for a in adds]
            peers["SpAdd-7"]["graphblas"] = lambda: _gb_chain(gadds)
    except ImportError:
        pass
    return peers


def _set_peer_threads(n: int) -> None:
    try:
        import torch
        torch.set_num_threads(n)
    except ImportError:
        pass
    try:
        import graphblas as gb
        gb.ss.config["nthreads"] = n
    except ImportError:
        pass


def main() -> None:
    programs = {"SpMV": "y[i] = A[i,j] * x[j]", "SpMM": "C[i,k] = A[i,j] * B[j,k]",
                "SpGEMM": "C[i,k] = A[i,j] * D[j,k]",
                "SpAdd-7": "C[i,j] = " + " + ".join(f"A{q}[i,j]" for q in range(SPADD_TERMS))}
    for make in (uniform_matrix, powerlaw_matrix):
        A = make(ROWS, ROWS, ROW_NNZ, 0)
        x, B = np.random.rand(ROWS), np.random.rand(ROWS, RANK)
        adds = [make(ROWS, ROWS, ROW_NNZ, q) for q in range(SPADD_TERMS)]  # seeds 0..6: A is A0
        operands = {"SpMV": dict(A=A, x=x), "SpMM": dict(A=A, B=B), "SpGEMM": dict(A=A, D=A),
                    "SpAdd-7": {f"A{q}": a for q, a in enumerate(adds)}}
        peers = _peers(A, x, B, adds)
        for threads in (1, 2):
            _set_peer_threads(threads)
            for name, program in programs.items():
                repeat = {"SpMV": 15, "SpAdd-7": 3}.get(name, 5)
                kernel = spfuse.compile(program)
                with spfuse.threads(threads):
                    theirs = interleaved_medians({"spfuse": functools.partial(kernel, **operands[name]), **peers[name]},
                                                 repeat)
                ours = theirs.pop("spfuse")
                cells = "  ".join(f"{p} {t * 1e3:8.2f} ms ({ours / t:.2f})" for p, t in theirs.items())
                print(f"{make.__name__[:-7]:8s} nnz={A.nnz} threads={threads} {name:6s} "
                      f"spfuse {ours * 1e3:8.2f} ms | {cells}", flush=True)


if __name__ == "__main__":
    main()
