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
