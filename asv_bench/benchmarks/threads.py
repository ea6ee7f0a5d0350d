"""SpMV right after a numpy BLAS call (``X @ W`` then ``A @ x``, as in a GNN
training step): OpenBLAS's pool spins ~0.1 s after each call; a kernel call
must not wait for a core it spins on (see :mod:`spfuse.bench.after_blas`)."""
from __future__ import annotations

import os

import numpy as np

from spfuse._kernels import _csr_kernels
from spfuse.bench.after_blas import _operands
from spfuse.threads import threads_for_call

_cache: dict = {}


class SpMVAfterBLAS:
    """39k rows, 560k nnz, 2 threads; ``adaptive`` False forces the full team
    (``SPFUSE_ADAPTIVE_THREADS=0``, the behaviour before)."""

    params = ([True, False],)
    param_names = ["adaptive"]
    # one call per sample, each right after the X @ W of its setup
    number = 1
    repeat = 50
    warmup_time = 0
    timeout = 300

    def setup(self, adaptive):
        if "ops" not in _cache:
            _cache["ops"] = _operands(39_000, 560_000, 64, 0)
        self.A, self.x, X, W = _cache["ops"]
        self.out = np.empty(self.A.shape[0])
        os.environ["SPFUSE_ADAPTIVE_THREADS"] = "1" if adaptive else "0"
        X @ W

    def teardown(self, adaptive):
        os.environ.pop("SPFUSE_ADAPTIVE_THREADS", None)

    def time_spmv_after_matmul(self, adaptive):
        A = self.A
        _csr_kernels.spmv(A.indptr, A.indices, A.data, self.x, self.out, threads_for_call(2))
