"""Helpers shared by the asv suites: inputs from :mod:`spfuse.bench.suite`, threads, skipping.

Inputs are built in ``setup`` (seeded), each benchmark makes one warm-up call
there (which also plans and caches the kernel), and a parameter combination
that does not apply raises ``NotImplementedError`` so asv skips it.
``SPFUSE_ASV_SIZE`` (default ``small``) picks the suite size.
"""
from __future__ import annotations

import os

import spfuse
from spfuse.bench import suite

SIZE = suite.SIZES[os.environ.get("SPFUSE_ASV_SIZE", "small")]
THREADS = sorted({1, spfuse.get_num_threads()})

_cache: dict = {}


def matrix(kind: str):
    """The seeded synthetic matrix ``"uniform"`` or ``"powerlaw"`` at :data:`SIZE` (cached per process)."""
    key = ("m", kind)
    if key not in _cache:
        make = suite.uniform_matrix if kind == "uniform" else suite.powerlaw_matrix
        _cache[key] = suite.Input(kind, "synthetic", make(SIZE.n, SIZE.n, SIZE.row_nnz, seed=0))
    return _cache[key]


def tensor():
    """The seeded synthetic 3-tensor at :data:`SIZE` (cached per process)."""
    if "t" not in _cache:
        _cache["t"] = suite.Input("tensor", "synthetic", suite.random_tensor(SIZE.tensor_shape, SIZE.tensor_nnz, 2))
    return _cache["t"]


def operands(kernel: str, inp, fmt: str = "csr") -> dict:
    """Operands of ``kernel`` on ``inp``; sparse matrices converted to ``fmt`` (csr or csc)."""
    ops = suite.KERNELS_BY_NAME[kernel].operands(inp, SIZE)
    if fmt == "csc":
        ops = {n: (v.tocsc() if hasattr(v, "tocsc") else v) for n, v in ops.items()}
    return ops


class KernelBench:
    """Base: ``setup`` compiles ``kernel`` with ``fusion``, builds operands, warms up once."""

    def _setup(self, kernel: str, inp, fmt: str = "csr", fusion: str = "auto", threads: int = 1):
        if threads not in THREADS:
            raise NotImplementedError(f"{threads} threads > cores")
        self.ops = operands(kernel, inp, fmt)
        self.kernel = spfuse.compile(suite.KERNELS_BY_NAME[kernel].program, fusion=fusion)
        self.threads = threads
        try:
            self.run()
        except spfuse.UnsupportedError as e:
            raise NotImplementedError(str(e)) from None

    def run(self):
        """One call of the kernel at the benchmark's thread count."""
        with spfuse.threads(self.threads):
            return self.kernel(**self.ops)
