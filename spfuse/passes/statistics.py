"""Run-time statistics of the actual operands, and the kernel choices they drive.

A static compiler knows formats and shapes; spfuse also sees the operands at
call time.  Cheap statistics of them (O(rows x operands): stored entries,
each row's upper bound of output entries, the output width) refine a
decision the plan leaves open -- here, how SpAdd-n builds each output row:

* ``merge``: a k-way tournament (loser tree) over the operand rows (which
  are sorted), cost per entry growing with log2 of the rows merged; two or
  three rows (or more than 64) by a chain of branch-free two-way merges,
  cost growing with the chain's running lengths; needs no n_cols workspace;
* ``scatter``: Gustavson's dense accumulator with a two-level bitmap that
  reads the row back sorted; cost per entry, plus the row's column span
  (4096 columns a word), plus an ``n_cols``-wide workspace per thread --
  dearer per entry once that workspace outgrows the L2 cache;
* ``auto``: the kernel decides per row with the same cost model (skewed
  rows: short ones merge, long ones scatter).

:func:`choose_spadd` evaluates the model on the mean row and on the longest
row: if both prefer one variant the whole call uses it (no per-row test, no
workspace when merging), otherwise each row decides.  The constants are the
kernel's (``spfuse._kernels._csr_kernels.SPADD_COSTS``, fitted on this
machine; a test keeps the two in sync).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["SpAddStats", "SpAddChoice", "SPADD_COSTS", "spadd_stats", "choose_spadd",
           "DENSE_OUTPUT_DENSITY"]

#: Cost model of the SpAdd row variants, in merge steps (see the kernel).
SPADD_COSTS: Mapping[str, float] = {
    "merge_row": 14.0, "tourney_row": 40.0, "tourney_entry_level": 0.65, "tourney_min_runs": 4, "tourney_max_runs": 64,
    "scatter_row": 6.5, "scatter_row_miss": 100.0, "scatter_entry": 1.7,
    "scatter_entry_miss": 2.3, "acc_fits_columns": 65536, "scan_word": 1.0,
}

#: Expected output density above which a dense accumulator *would* be the
#: cheaper way to build the sum -- reported, not taken (see choose_spadd).
DENSE_OUTPUT_DENSITY = 1.0 / 3.0


@dataclass(frozen=True)
class SpAddStats:
    """What :func:`choose_spadd` reads about one call's operands."""

    n_operands: int          #: operands with at least one stored entry
    n_rows: int
    n_cols: int
    nnz: int                 #: stored operand entries = upper bound of nnz(C)
    max_row: int             #: largest row upper bound (sum of the operands' row lengths)
    est_density: float       #: expected nnz(C) / (rows * cols) for independent uniform patterns

    @property
    def mean_row(self) -> float:
        """Mean row upper bound."""
        return self.nnz / self.n_rows if self.n_rows else 0.0


@dataclass(frozen=True)
class SpAddChoice:
    """The variant for one call and the numbers behind it."""

    variant: str             #: "merge", "scatter" or "auto" (per row)
    costs: Mapping[str, float]
    reason: str

    def describe(self) -> str:
        """One line for ``explain()``."""
        return f"rows by {self.variant}: {self.reason}"


def spadd_stats(nnzs: Sequence[int], n_rows: int, n_cols: int, max_row: int | None = None) -> SpAddStats:
    """Statistics of ``len(nnzs)`` operands of shape ``(n_rows, n_cols)``.

    ``max_row`` (the longest row's upper bound) comes from the row pointers
    at call time; when only nnz is known (planning, ``explain``) the mean
    row stands in for it.

    >>> s = spadd_stats([20, 20, 0], 4, 100)
    >>> s.n_operands, s.mean_row, s.max_row, round(s.est_density, 4)
    (2, 10.0, 10, 0.0975)
    """
    live = [int(z) for z in nnzs if z]
    total = sum(live)
    cells = n_rows * n_cols
    empty = 1.0
    for z in live:
        empty *= 1.0 - min(1.0, z / cells)
    mean = total / n_rows if n_rows else 0.0
    return SpAddStats(len(live), n_rows, n_cols, total,
                      int(math.ceil(mean)) if max_row is None else int(max_row), 1.0 - empty if cells else 0.0)


def _row_costs(ub: float, runs: int, n_cols: int, c: Mapping[str, float]) -> tuple[float, float]:
    """(merge, scatter) cost of a row of ``ub`` entries in ``runs`` equal
    runs spread over the whole width (the kernel sees the real span)."""
    if runs <= 1 or ub <= 0:
        return 0.0, float("inf")
    per = ub / runs
    lo, hi = c["tourney_min_runs"], c["tourney_max_runs"]
    if lo <= runs <= hi:    # the tournament: one replay per entry, ceil(log2 runs) levels
        merge = c["tourney_row"] + c["tourney_entry_level"] * ub * math.ceil(math.log2(runs))
    else:                   # the chain: running lengths 2, 3, ... runs
        merge = c["merge_row"] + per * (runs * (runs + 1) / 2 - 1)
    fits = n_cols <= c["acc_fits_columns"]
    entry = c["scatter_entry"] if fits else c["scatter_entry_miss"]
    fixed = c["scatter_row"] if fits else c["scatter_row_miss"]
    span_words = n_cols / 4096 + 1
    return merge, fixed + entry * ub + c["scan_word"] * span_words


def choose_spadd(stats: SpAddStats, costs: Mapping[str, float] = SPADD_COSTS) -> SpAddChoice:
    """Pick SpAdd's row variant for one call from its statistics.

    The mean row and the longest row (its runs = the operands) are costed
    both ways: one verdict for both -> that variant for every row; split
    verdicts (skewed rows) -> ``auto``, the kernel's per-row choice.  A dense
    output is never chosen: the caller's world is sparse (scipy in, scipy
    out), so a dense accumulator would still have to be compressed -- three
    passes over rows x cols x 8 bytes against the union's nnz(C) x 12 bytes
    -- even at the density where it starts to pay for a dense result
    (``DENSE_OUTPUT_DENSITY``, noted in the reason).

    >>> choose_spadd(spadd_stats([2_000_000] * 7, 200_000, 200_000)).variant
    'merge'
    >>> choose_spadd(spadd_stats([600_000] * 7, 20_000, 20_000)).variant
    'scatter'
    >>> choose_spadd(spadd_stats([350_000] * 9, 200_000, 200_000, max_row=9_000)).variant
    'auto'
    """
    k = stats.n_operands
    if k <= 1 or stats.nnz == 0:
        return SpAddChoice("merge", {}, f"{k} operand(s) with entries: a scaled copy, nothing to merge")
    mean_m, mean_s = _row_costs(stats.mean_row, k, stats.n_cols, costs)
    max_m, max_s = _row_costs(stats.max_row, k, stats.n_cols, costs)
    numbers = {"mean_row": stats.mean_row, "max_row": stats.max_row, "merge_mean": mean_m,
               "scatter_mean": mean_s, "merge_max": max_m, "scatter_max": max_s,
               "est_density": stats.est_density}
    if (mean_m <= mean_s) == (max_m <= max_s):
        variant = "merge" if mean_m <= mean_s else "scatter"
        why = "mean and longest row agree"
    else:
        variant = "auto"
        why = "mean and longest row disagree: each row decides (same model)"
    dense = (f"; est. density {stats.est_density:.2g} > {DENSE_OUTPUT_DENSITY:.2g} but the sparse result "
             "stays (a dense accumulator would still be compressed)"
             if stats.est_density > DENSE_OUTPUT_DENSITY else f"; est. density {stats.est_density:.2g}")
    reason = (f"{k} operands, {stats.n_cols} columns, row upper bound mean {stats.mean_row:.3g} / "
              f"max {stats.max_row}; cost in merge steps, mean row merge {mean_m:.3g} vs scatter "
              f"{mean_s:.3g}, longest row merge {max_m:.3g} vs scatter {max_s:.3g} ({why}){dense}")
    return SpAddChoice(variant, numbers, reason)
