"""One whole benchmark run, as ``spfuse bench`` does it: inputs, cases, report.

>>> import io
>>> buf = io.StringIO()
>>> _ = run_benchmark(size="tiny", kernels="SpMV", threads=[1], peers=["scipy"], out=buf, progress=False,
...                   planning=False, stream_bytes=1 << 20)
>>> "SpMV" in buf.getvalue()
True
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import spfuse
from spfuse.bench import harness, report, stream, suite
from spfuse.bench import peers as peers_mod

__all__ = ["run_benchmark", "Progress"]


class Progress:
    """tqdm when installed and enabled, else a one-line counter on stderr (or nothing)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit="case", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def step(self, label: str) -> None:
        """Announce the case about to run."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_description(label[:40])
        else:
            sys.stderr.write(f"\r[{self.done + 1}/{self.total}] {label[:60]:<60}")
            sys.stderr.flush()

    def advance(self) -> None:
        """One case finished."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        """Clear the bar."""
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\r" + " " * 72 + "\r")


def _default_threads() -> list[int]:
    cores = spfuse.get_num_threads()
    return [1] if cores == 1 else [1, cores]


def _cases(inputs, kernels):
    return [(i, k) for i in inputs for k in kernels if k.kind == i.kind]


def run_benchmark(size: str = "small", kernels: str | None = None, threads: list[int] | None = None,
                  repeat: int | None = None, data: str | None = None, json_path: str | None = None,
                  plot_path: str | None = None, peers: list[str] | None = None, out: TextIO = sys.stdout,
                  progress: bool = True, planning: bool = True, stream_bytes: int | None = None,
                  peer_list: list | None = None) -> list:
    """Run the suite and print the report to ``out``; returns the :class:`~spfuse.bench.harness.Record` list."""
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    sz = suite.SIZES[size]
    ks = suite.select_kernels(kernels)
    threads = threads or _default_threads()
    repeat = repeat or sz.repeat
    if peer_list is None:
        peer_list, peer_notes = peers_mod.available_peers(peers)
    else:
        peer_notes = []
    inputs = suite.synthetic_inputs(sz) + suite.builtin_inputs(sz)
    data_notes = []
    if data:
        if not os.path.isdir(data):
            raise FileNotFoundError(f"--data {data!r} is not a directory")
        extra, data_notes = suite.data_dir_inputs(data)
        inputs += extra
    cases = _cases(inputs, ks)

    nbytes = stream_bytes or (1 << 27 if size in ("tiny", "small") else 1 << 29)
    copy_gbps = {n: stream.copy_bandwidth(nbytes, threads=n) for n in threads}

    bar = Progress(len(cases), progress)
    records, known_slow = [], set()
    try:
        for inp, k in cases:
            bar.step(f"{inp.name}/{k.name}")
            records += harness.run_case(inp, k, sz, threads, repeat, peer_list=peer_list,
                                        known_slow=known_slow)
            bar.advance()
    finally:
        bar.close()
    plan_rows = harness.planning_times(ks, sz) if planning else []

    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"spfuse {spfuse.__version__} bench --size {size}: {len(cases)} cases, threads {threads}, "
      f"median of {repeat} rounds, interleaved, each timed call after an untimed one")
    w(report.machine_line())
    w("peers: " + "; ".join(f"{p.name} {p.version}" + (f" ({p.threads_note})" if p.threads_note else "")
                            for p in peer_list if not p.is_spfuse or p.name == "spfuse"))
    if load_before is not None and load_before > 0.5:
        peer_notes = peer_notes + [f"load average {load_before:.2f} before the run: other processes share "
                                   "the cores, multi-threaded figures are unreliable"]
    for note in peer_notes + data_notes:
        w(f"note: {note}")
    w("cells: median time and peer/spfuse ratio (>1: spfuse faster)")
    w()
    w(report.tables(records, report.inputs_description(inputs)))
    w()
    w(report.summary_table(records))
    w()
    bw = report.bandwidth_table(records, copy_gbps)
    if bw:
        w(bw)
        w()
    if plan_rows:
        w(report.planning_table(plan_rows))
        w()
    elapsed = time.perf_counter() - t_start
    if json_path:
        meta = {"size": size, "threads": threads, "repeat": repeat, "copy_gbps": copy_gbps,
                "peers": {p.name: p.version for p in peer_list}, "notes": peer_notes + data_notes,
                "inputs": report.inputs_description(inputs), "wall_seconds": elapsed,
                "spfuse": spfuse.config_info() if hasattr(spfuse, "config_info") else {}}
        report.write_json(json_path, meta, records, plan_rows)
        w(f"JSON written to {json_path}")
    if plot_path:
        w(report.plot_speedups(plot_path, records))
    w(f"wall time {elapsed:.1f} s")
    return records
