"""Single-operation sparse-matrix kernels: SpMV, SpMM, SDDMM, SpGEMM, SpAdd-7."""
from __future__ import annotations

from .common import THREADS, KernelBench, matrix


class SparseMatrixKernels(KernelBench):
    """spfuse (fusion='auto') on seeded uniform and power-law matrices, CSR and CSC input."""

    params = (["SpMV", "SpMM", "SDDMM", "SpGEMM", "SpAdd-7"], ["uniform", "powerlaw"], ["csr", "csc"], THREADS)
    param_names = ["kernel", "matrix", "format", "threads"]
    timeout = 120

    def setup(self, kernel, kind, fmt, threads):
        self._setup(kernel, matrix(kind), fmt, threads=threads)

    def time_kernel(self, kernel, kind, fmt, threads):
        self.run()
