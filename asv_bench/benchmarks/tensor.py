"""Sparse 3-tensor kernels: TTV, MTTKRP."""
from __future__ import annotations

from .common import THREADS, KernelBench, tensor


class TensorKernels(KernelBench):
    """spfuse (fusion='auto') on a seeded random CSF 3-tensor."""

    params = (["TTV", "MTTKRP"], THREADS)
    param_names = ["kernel", "threads"]
    timeout = 120

    def setup(self, kernel, threads):
        self._setup(kernel, tensor(), threads=threads)

    def time_kernel(self, kernel, threads):
        self.run()
