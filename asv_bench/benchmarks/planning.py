"""Planning cost: uncached planning, cached-call overhead, import time."""
from __future__ import annotations

import spfuse
from spfuse.bench import suite

KERNELS = [k.name for k in suite.KERNELS]
_TINY = suite.SIZES["tiny"]


class Planning:
    """On the tiny inputs, where the kernel itself costs next to nothing."""

    params = (KERNELS,)
    param_names = ["kernel"]

    def setup(self, kernel):
        k = suite.KERNELS_BY_NAME[kernel]
        inp = {i.kind: i for i in reversed(suite.synthetic_inputs(_TINY))}[k.kind]
        self.ops = k.operands(inp, _TINY)
        self.program = k.program
        self.kernel = spfuse.compile(self.program)
        self.kernel(**self.ops)  # warm-up; plan now cached

    def time_first_call_uncached(self, kernel):
        spfuse.clear_cache()
        spfuse.compile(self.program)(**self.ops)

    def time_cached_call(self, kernel):
        self.kernel(**self.ops)

    def time_explain(self, kernel):
        spfuse.compile(self.program).explain(**self.ops)


def timeraw_import_spfuse():
    """Import time of the package (fresh interpreter)."""
    return "import spfuse"


class CachedCall:
    """A cached call on a 50×50 CSR with ~250 stored values, where the call
    path (validation, binding, executor setup) is all there is to time:
    issue 14 asks for at most 30 µs.  Programs on a template kernel and on
    the generic loop-tree executor; ``threads`` None is the default a user
    gets (the count resolved per call), 1 is explicit."""

    PROGRAMS = {
        "spmv": "y[i] = A[i,j] * x[j]",
        "spmm": "C[i,k] = A[i,j] * B[j,k]",
        "spmv+bias": "y[i] = sum(j, A[i,j] * x[j]) + b[i]",
        "relu(spmm)": "C[i,k] = relu(A[i,j] * B[j,k])",
    }
    params = (list(PROGRAMS), [None, 1])
    param_names = ["program", "threads"]

    def setup(self, program, threads):
        import numpy as np
        import scipy.sparse as sp
        rng = np.random.default_rng(0)
        A = sp.random_array((50, 50), density=0.1, format="csr", rng=rng)
        text = self.PROGRAMS[program]
        ops = {"A": A, "x": rng.random(50), "b": rng.random(50), "B": rng.random((50, 8))}
        self.ops = {n: v for n, v in ops.items() if f"{n}[" in text}
        self.kernel = spfuse.compile(text, num_threads=threads)
        self.kernel(**self.ops)  # warm-up: plans, lowers and caches

    def time_cached_call(self, program, threads):
        self.kernel(**self.ops)
