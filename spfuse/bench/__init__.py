"""Benchmarks: spfuse against the libraries a user would pick instead.

The pieces, one idea per module:

* :mod:`spfuse.bench.suite` — the kernels of design.md section 4 and the
  inputs they run on (seeded synthetic matrices and 3-tensors, shipped and
  user-supplied real data);
* :mod:`spfuse.bench.peers` — how each peer library expresses each kernel;
* :mod:`spfuse.bench.harness` — agreement check, then interleaved timing;
* :mod:`spfuse.bench.stream` — a STREAM-style copy for the bandwidth bound;
* :mod:`spfuse.bench.report` — text tables, JSON and an optional plot;
* :mod:`spfuse.bench.budget` — memory/time estimates of a plan, to skip
  cases that would not fit (``skip`` with the figure);
* :mod:`spfuse.bench.fusion` — auto vs max vs none on every kernel
  (``--fusion-study``);
* :mod:`spfuse.bench.tiling` — SpMM with the planner's ``k`` tile vs
  untiled (``--tiling``);
* :mod:`spfuse.bench.offcatalog` — programs outside the catalogue, their
  peers and their equivalent spfuse spellings (issue 14), run and reported
  by :mod:`spfuse.bench.offcatalog_run` (``--suite offcatalog``).

``python -m spfuse bench`` (see :mod:`spfuse.cli`) drives them.
"""
from __future__ import annotations

__all__ = ["suite", "peers", "harness", "stream", "report", "budget", "fusion", "tiling", "offcatalog",
           "offcatalog_run"]
