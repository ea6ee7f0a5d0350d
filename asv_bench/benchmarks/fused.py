"""Compound kernels where fusion matters, under each fusion strategy."""
from __future__ import annotations

from .common import THREADS, KernelBench, matrix, tensor

MATRIX_KERNELS = ["GNN-1", "GNN-2", "SDDMM-SpMM", "SpMM-GEMM", "SDDMM-SpMM-GEMM", "SDDMM-div"]
TENSOR_KERNELS = ["MTTKRP-GEMM", "SpTTM-SpTTM"]


class FusedMatrixKernels(KernelBench):
    """Matrix chains on the power-law matrix."""

    params = (MATRIX_KERNELS, ["auto", "max", "none"], THREADS)
    param_names = ["kernel", "fusion", "threads"]
    timeout = 180

    def setup(self, kernel, fusion, threads):
        self._setup(kernel, matrix("powerlaw"), fusion=fusion, threads=threads)

    def time_kernel(self, kernel, fusion, threads):
        self.run()


class FusedTensorKernels(KernelBench):
    """Tensor chains (SparseLNR's MTTKRP-GEMM, SpTTM-SpTTM)."""

    params = (TENSOR_KERNELS, ["auto", "max", "none"], THREADS)
    param_names = ["kernel", "fusion", "threads"]
    timeout = 180

    def setup(self, kernel, fusion, threads):
        self._setup(kernel, tensor(), fusion=fusion, threads=threads)

    def time_kernel(self, kernel, fusion, threads):
        self.run()
