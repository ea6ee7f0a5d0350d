"""Complex SpMM: scipy ``csr_array @ dense`` against spfuse, complex128 and real, side by side.

spfuse computes a complex SpMM as four real SpMMs on the real and imaginary
parts (:mod:`spfuse.complex_values`); scipy does one complex pass.  The real
SpMM of the same shape is timed too, so the ratio can be read against it.
Cases are interleaved in rounds in one process; medians are reported.

    python -m spfuse.bench.complex_spmm --n 20000 --density 1e-3 --k 32 --threads 1
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

import spfuse

__all__ = ["run", "main"]


def _median_seconds(f: Callable[[], object], reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run(n: int = 20000, density: float = 1e-3, k: int = 32, threads: int = 1, reps: int = 15,
        rounds: int = 3, seed: int = 0) -> dict[str, float]:
    """Median seconds per case: ``scipy complex``, ``spfuse complex``, ``scipy real``, ``spfuse real``.

    >>> t = run(n=200, density=0.05, k=4, reps=2, rounds=1)
    >>> sorted(t)
    ['scipy complex', 'scipy real', 'spfuse complex', 'spfuse real']
    """
    rng = np.random.default_rng(seed)
    real = sp.random_array((n, n), density=density, rng=rng, format="csr")
    A = sp.csr_array((real.data + 1j * rng.standard_normal(real.nnz), real.indices, real.indptr), shape=real.shape)
    B = rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k))
    Br = np.ascontiguousarray(B.real)
    kernel = spfuse.compile("C[i,k] = A[i,j] * B[j,k]", num_threads=threads)
    if not np.allclose(kernel(A=A, B=B), A @ B):
        raise AssertionError("spfuse's complex SpMM differs from scipy's")
    cases = {"scipy complex": lambda: A @ B, "spfuse complex": lambda: kernel(A=A, B=B),
             "scipy real": lambda: real @ Br, "spfuse real": lambda: kernel(A=real, B=Br)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            times[name].append(_median_seconds(f, reps))
    return {name: float(np.median(v)) for name, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    """Command line: print the medians and the scipy/spfuse ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--density", type=float, default=1e-3)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    t = run(args.n, args.density, args.k, args.threads, args.reps)
    for name, s in t.items():
        print(f"{name:16s} {s * 1e3:9.2f} ms")
    print(f"complex: scipy/spfuse = {t['scipy complex'] / t['spfuse complex']:.2f}x;  "
          f"real: scipy/spfuse = {t['scipy real'] / t['spfuse real']:.2f}x  "
          f"(n={args.n}, density={args.density}, k={args.k}, threads={args.threads})")


if __name__ == "__main__":
    main()
