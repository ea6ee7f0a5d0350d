"""Off-catalogue programs (issue 14): spfuse on each program of ``spfuse.bench.offcatalog`` and each spelling.

``spelling`` 0 is the program as written; 1, 2, ... are its equivalent
spellings (``OffProgram.spellings``: CSC input, a pre-transposed operand,
factor order, ...), absent ones skipped.  Comparing them over commits shows
the no-cliff criterion move; cross-library ratios are
``spfuse bench --suite offcatalog``.  Size: ``SPFUSE_ASV_SIZE`` if the
off-catalogue suite has it (tiny, small, medium), else small.
"""
from __future__ import annotations

import os

import spfuse
from spfuse.bench import offcatalog

from .common import THREADS

SIZE = offcatalog.SIZES.get(os.environ.get("SPFUSE_ASV_SIZE", "small"), offcatalog.SIZES["small"])
NAMES = [p.name for p in offcatalog.PROGRAMS]
SPELLINGS = list(range(max(len(p.spellings) for p in offcatalog.PROGRAMS)))

_inputs: dict = {}


def _input(kind: str):
    if kind not in _inputs:
        _inputs[kind] = offcatalog.make_inputs(SIZE, [kind])[kind]
    return _inputs[kind]


class OffCatalogue:
    """One call of a spelling of an off-catalogue program (fusion='auto'), planned and warmed in setup."""

    params = (NAMES, SPELLINGS, THREADS)
    param_names = ["program", "spelling", "threads"]
    timeout = 300

    def setup(self, name, spelling, threads):
        prog = offcatalog.PROGRAMS_BY_NAME[name]
        if spelling >= len(prog.spellings):
            raise NotImplementedError(f"{name} has {len(prog.spellings)} spellings")
        if threads not in THREADS:
            raise NotImplementedError(f"{threads} threads > cores")
        s = prog.spellings[spelling]
        self.ops = s.adapt(prog.kernel.operands(_input(prog.input), SIZE))
        self.kernel = spfuse.compile(s.program or prog.program)
        self.threads = threads
        self.time_program(name, spelling, threads)  # warm-up: plans and caches

    def time_program(self, name, spelling, threads):
        with spfuse.threads(self.threads):
            self.kernel(**self.ops)
