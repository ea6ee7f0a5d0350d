"""SpMM's dense ``k`` loop tiled vs untiled (Scorch Algorithm 2; ``spfuse bench --tiling``).

Calls the ``spmm`` template kernel directly with ``tile`` = the planner's
choice (``Plan.tiles``), ``0`` (untiled), 64 and 256 (the L1 formula's tile), so
only the tile differs.
``SPFUSE_ASV_TILING_ROWS`` (default 20000) sets the rows of the square
~10 nnz/row matrix; rows shrink for large ``K`` so ``B`` and ``C`` fit in 1 GiB.
"""
from __future__ import annotations

import os

import numpy as np

from spfuse.bench import suite, tiling

from .common import THREADS

ROWS = int(os.environ.get("SPFUSE_ASV_TILING_ROWS", "20000"))
_cache: dict = {}


def _matrix(kind: str, n: int):
    key = (kind, n)
    if key not in _cache:
        make = suite.uniform_matrix if kind == "uniform" else suite.powerlaw_matrix
        a = make(n, n, 10, seed=0)
        _cache.clear()
        _cache[key] = (a, a.indptr.astype(np.int32), a.indices.astype(np.int32))
    return _cache[key]


class SpMMTiling:
    """spmm kernel time per (K, matrix, tile, threads); tile ``planned`` is ``Plan.tiles``' choice."""

    params = ([64, 256, 1024, 4096], ["uniform", "powerlaw"], ["planned", "0", "64", "256"], THREADS)
    param_names = ["K", "matrix", "tile", "threads"]
    timeout = 300

    def setup(self, K, kind, tile, threads):
        from spfuse._kernels import _csr_kernels as csr
        n = tiling.rows_for(K, ROWS, 1 << 30)
        self.a, self.ip, self.ix = _matrix(kind, n)
        self.t = tiling.planned_tile(self.a, K) if tile == "planned" else int(tile)
        self.B = np.random.default_rng(K).random((n, K))
        self.out = np.empty((n, K))
        self.threads = threads
        self.spmm = csr.spmm
        self.run()

    def run(self):
        self.spmm(self.ip, self.ix, self.a.data, self.B, self.out, self.threads, self.t)

    def time_spmm(self, K, kind, tile, threads):
        self.run()
