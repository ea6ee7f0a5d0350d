"""Reports of a benchmark run: text tables, JSON, and an optional bar chart.

Cells read ``time ratio`` where ratio = peer time / spfuse time, so a ratio
above 1 means spfuse is faster.  Entries that were not timed say why:
``n/a`` (the peer cannot express the kernel), ``skip`` (input too large for
the peer's formulation), ``slow`` (over the time budget), ``error``,
``unsupported``, and ``MISMATCH!`` — the peer's result disagrees with
spfuse's, which is a bug somewhere and is also listed under the table.

>>> fmt_time(0.00123)
'1.23ms'
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable

__all__ = ["fmt_time", "tables", "bandwidth_table", "planning_table", "summary_table", "write_json",
           "plot_speedups", "SECTION_TITLES"]

SECTION_TITLES = {"synthetic": "synthetic inputs", "builtin": "shipped real inputs (spfuse/data)",
                  "data": "inputs from --data"}


def machine_line(load: float | None = None) -> str:
    """The ``machine:`` header line of every study (load average when known).

    >>> machine_line().startswith("machine: ")
    True
    """
    import os
    import platform

    import numpy as np
    return (f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
            f"numpy {np.__version__}" + (f", load average {load:.2f} before the run" if load is not None else ""))


def fmt_time(t: float | None) -> str:
    """Seconds as a short string with a unit."""
    if t is None:
        return "-"
    if t < 1e-3:
        return f"{t * 1e6:.0f}us"
    if t < 1:
        return f"{t * 1e3:.3g}ms"
    return f"{t:.3g}s"


def _cell(r) -> str:
    if r.status != "ok" or r.median is None:
        return "MISMATCH!" if r.status == "MISMATCH" else r.status
    star = "*" if "rounds (time budget)" in r.note else ""
    if r.peer == "spfuse":
        return fmt_time(r.median) + star
    return (f"{fmt_time(r.median)} {r.ratio:.2g}x" if r.ratio else fmt_time(r.median)) + star


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _peers_in(records) -> list[str]:
    seen = []
    for r in records:
        if r.peer not in seen:
            seen.append(r.peer)
    return seen


def tables(records: list, inputs_desc: dict) -> str:
    """One table per (thread count, input section): rows = input x kernel, columns = peers."""
    out = []
    peers = _peers_in(records)
    for n in sorted({r.threads for r in records}):
        for section, title in SECTION_TITLES.items():
            recs = [r for r in records if r.threads == n and r.section == section]
            if not recs:
                continue
            cases = []
            for r in recs:
                if (r.input, r.kernel) not in cases:
                    cases.append((r.input, r.kernel))
            cell = {(r.input, r.kernel, r.peer): r for r in recs}
            rows = [[inp, k] + [_cell(cell[(inp, k, p)]) if (inp, k, p) in cell else "" for p in peers]
                    for inp, k in cases]
            out.append(f"== {n} thread{'s' if n > 1 else ''}: {title} ==")
            out.append(_grid(["input", "kernel"] + peers, rows))
            notes = sorted({f"  {r.peer} on {r.input}/{r.kernel}: {r.status}: {r.note}" for r in recs
                            if r.status in ("MISMATCH", "error", "skip", "slow")})
            if notes:
                out.append("notes:\n" + "\n".join(notes))
            out.append("")
    out.append("*: fewer timed rounds than --repeat, to keep within the case's time budget")
    if inputs_desc:
        out.append("inputs: " + "; ".join(inputs_desc.values()))
    return "\n".join(out)


def summary_table(records: list) -> str:
    """Geometric-mean ratio per peer and thread count over the cases both timed."""
    peers = [p for p in _peers_in(records) if p != "spfuse"]
    threads = sorted({r.threads for r in records})
    rows = []
    for p in peers:
        row = [p]
        for n in threads:
            rs = [r.ratio for r in records if r.peer == p and r.threads == n and r.ratio]
            wins = sum(1 for x in rs if x > 1)
            row.append(f"{math.exp(sum(map(math.log, rs)) / len(rs)):.2g}x ({wins}/{len(rs)} spfuse faster)"
                       if rs else "-")
        rows.append(row)
    return "geometric mean of peer/spfuse time (>1: spfuse faster)\n" + _grid(
        ["peer"] + [f"{n} thread{'s' if n > 1 else ''}" for n in threads], rows)


def bandwidth_table(records: list, copy_gbps: dict) -> str:
    """Achieved GB/s on SpMV/SpMM per peer, and as a fraction of the copy bandwidth at that thread count."""
    recs = [r for r in records if r.gbps]
    if not recs:
        return ""
    peers = _peers_in(recs)
    cell = {(r.input, r.kernel, r.threads, r.peer): r for r in recs}
    rows = []
    for key in dict.fromkeys((r.input, r.kernel, r.threads) for r in recs):
        bw = copy_gbps.get(key[2])
        row = [key[0], key[1], str(key[2])]
        for p in peers:
            r = cell.get(key + (p,))
            row.append("" if r is None else f"{r.gbps:.2f} ({r.gbps / bw:.0%})" if bw else f"{r.gbps:.2f}")
        rows.append(row)
    head = "memory bandwidth, GB/s (fraction of copy); bytes = A's indptr+indices+data + dense in + dense out\n"
    head += "STREAM-style copy: " + ", ".join(f"{n} thread{'s' if n > 1 else ''} {g:.1f} GB/s"
                                               for n, g in sorted(copy_gbps.items())) + "\n"
    return head + _grid(["input", "kernel", "threads"] + peers, rows)


def planning_table(rows: list[dict]) -> str:
    """First (uncached) call, cached call and planning time per kernel on a tiny input."""
    body = [[r["kernel"], fmt_time(r.get("first_call")), fmt_time(r.get("cached_call")),
             fmt_time(r.get("planning")) if "error" not in r else r["error"]] for r in rows]
    return "planning (tiny input; planning = first call after clear_cache() - cached call)\n" + _grid(
        ["kernel", "first call", "cached call", "planning"], body)


def write_json(path: str, meta: dict, records: list, planning: list[dict]) -> None:
    """Everything measured, machine-readable."""
    with open(path, "w") as f:
        json.dump({"meta": meta, "records": [r.as_dict() for r in records], "planning": planning}, f,
                  indent=1, default=str)


def plot_speedups(path: str, records: list) -> str:
    """Grouped bar chart (log scale) of the geometric-mean ratio per kernel and peer; returns a message."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib: pip install 'spfuse[plot]' (or matplotlib); no plot written"
    threads = sorted({r.threads for r in records})
    kernels = [k for k in dict.fromkeys(r.kernel for r in records)]
    peers = [p for p in _peers_in(records) if p != "spfuse"]
    fig, axes = plt.subplots(len(threads), 1, figsize=(max(8, len(kernels) * 0.9), 3.6 * len(threads)),
                             squeeze=False)
    width = 0.8 / max(len(peers), 1)
    for ax, n in zip(axes[:, 0], threads, strict=True):
        for pi, p in enumerate(peers):
            ys = []
            for k in kernels:
                rs = [r.ratio for r in records if r.threads == n and r.peer == p and r.kernel == k and r.ratio]
                ys.append(math.exp(sum(map(math.log, rs)) / len(rs)) if rs else float("nan"))
            ax.bar([i + (pi - (len(peers) - 1) / 2) * width for i in range(len(kernels))], ys, width, label=p)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(kernels)), kernels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("peer time / spfuse time")
        ax.set_title(f"{n} thread{'s' if n > 1 else ''} (>1: spfuse faster; geometric mean over inputs)")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"


def inputs_description(inputs: Iterable) -> dict:
    """``{name: 'name shape nnz'}`` for the report footer."""
    return {i.name: i.describe() for i in inputs}
