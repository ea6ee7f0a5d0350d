"""``spfuse bench --suite offcatalog``: the off-catalogue programs against their peers, and the no-cliff ratios.

For every program of :mod:`spfuse.bench.offcatalog` this runs, through the
bench harness (:func:`spfuse.bench.harness.run_case`: each peer's result is
checked against spfuse's before it is timed; interleaved rounds; medians;
each peer's own thread setting), spfuse on the program as written, spfuse on
each other spelling of it, and every importable peer library.  It prints,
per thread count:

* the **peer table**: spfuse's median, each peer's median and ratio, the best
  peer and ``best peer / spfuse`` (>1: spfuse faster), with the geometric
  mean and issue 14's targets (>= 1.0 in every cell at 2 threads, >= 0.8 at
  1 thread, geomean >= 1.5);
* the **no-cliff table**: every spelling's median over the fastest spelling's
  (target: <= 1.5);
* **how spfuse ran** each spelling: the ``execution:`` line of ``explain()``
  (a template kernel, or the generic loop-tree interpreter), so the
  interpreter's share is visible.

A call slower than the size's call budget is not timed further: its single
checked call (at the largest thread count) stands in for the median, marked
``(1)`` -- such cells are reported, never dropped.

>>> import io
>>> buf = io.StringIO()
>>> res = run_offcatalog("tiny", programs="AT-SpMV,row-sums", threads=[1], repeat=1, out=buf, progress=False)
>>> {"scipy", "spfuse", "spfuse~1"} <= {r["peer"] for r in res["records"] if r["status"] == "ok"}
True
>>> "no cliff" in buf.getvalue()
True
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Optional, TextIO

import spfuse
from spfuse.bench import harness, offcatalog, peers as peers_mod, report

__all__ = ["run_offcatalog", "build_peers", "execution_line", "engine_of", "spelling_peer", "CLIFF_LIMIT",
           "TARGETS"]

#: No-cliff criterion: every spelling within this factor of the fastest.
CLIFF_LIMIT = 1.5

#: Issue 14's per-cell minimum of ``best peer / spfuse`` by thread count (others: the 1-thread figure).
TARGETS = {1: 0.8, 2: 1.0}
GEOMEAN_TARGET = 1.5


def spelling_peer(index: int) -> str:
    """Peer name of a program's ``index``-th spelling (0 is the program as written, run as ``spfuse``).

    >>> spelling_peer(0), spelling_peer(2)
    ('spfuse', 'spfuse~2')
    """
    return "spfuse" if index == 0 else f"spfuse~{index}"


def _library_peer(name: str, programs: list) -> Optional[peers_mod.Peer]:
    mod = peers_mod._try_import(name)
    if mod is None:
        return None
    impls = {p.name: p.peers[name] for p in programs if name in p.peers}
    if name == "torch":
        return peers_mod.Peer(name, peers_mod._version(mod), impls, threads=lambda n: peers_mod._torch_threads(mod, n),
                              threads_note="torch.set_num_threads(n)")
    if name == "graphblas":
        return peers_mod.Peer(name, peers_mod._version(mod), impls, threads=lambda n: peers_mod._gb_threads(mod, n),
                              threads_note='SuiteSparse:GraphBLAS, gb.ss.config["nthreads"]')
    note = "scipy.sparse is single-threaded (BLAS limited by threadpoolctl)" if name == "scipy" else \
        "vectorised numpy, single-threaded gathers (BLAS limited by threadpoolctl)"
    return peers_mod.Peer(name, peers_mod._version(mod), impls, threads=peers_mod.blas_limits, threads_note=note)


def build_peers(programs: list, libraries: Optional[list] = None,
                call_limit: Optional[float] = None) -> tuple[list, list[str]]:
    """spfuse (as written), one peer per further spelling index, then the importable libraries.

    ``call_limit``: seconds after which a spfuse spelling's first call is
    stopped.  Returns the peers and notes on libraries that are not installed.
    """
    width = max((len(p.spellings) for p in programs), default=1)
    out = []
    for idx in range(width):
        impls = {p.name: p.spellings[idx].impl(p.program, call_limit) for p in programs if idx < len(p.spellings)}
        out.append(peers_mod.Peer(spelling_peer(idx), spfuse.__version__, impls, threads=spfuse.threads,
                                  threads_note="OpenMP prange, spfuse.threads(n)", is_spfuse=idx == 0,
                                  fusion="auto" if idx == 0 else None))
    notes = []
    wanted = offcatalog.LIBRARIES if libraries is None else [n for n in offcatalog.LIBRARIES if n in libraries]
    if libraries is not None:
        unknown = sorted(set(libraries) - set(offcatalog.LIBRARIES))
        if unknown:
            raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(offcatalog.LIBRARIES)}")
    for name in wanted:
        peer = _library_peer(name, programs)
        if peer is None:
            notes.append(f"{name}: not installed, skipped")
        else:
            out.append(peer)
    return out, notes


def execution_line(program: str, operands: dict) -> str:
    """How spfuse runs ``program`` on ``operands``: the ``execution:`` line of ``explain()``.

    >>> import numpy as np, scipy.sparse as sp
    >>> a = sp.random_array((30, 30), density=0.1, format="csr", rng=0)
    >>> execution_line("y[i] = A[i,j] * x[j]", {"A": a, "x": np.ones(30)}).startswith("template")
    True
    """
    try:
        text = spfuse.compile(program).explain(**operands)
    except Exception as e:  # a planning failure is a table entry
        return f"explain failed: {harness._short(e)}"
    for line in text.splitlines():
        if line.startswith("execution:"):
            return line.split(":", 1)[1].strip()
    try:  # explain without the line: ask the API directly
        from spfuse.api import describe_execution
        return describe_execution(spfuse.compile(program).plans(**operands)["auto"])
    except Exception:
        return "unknown (explain() has no execution line)"


def engine_of(line: str) -> str:
    """A short form of an execution line: ``template NAME``, ``generic interpreter`` or the line's start.

    >>> engine_of("template kernel 'spmv' (A csr; A=A)"), engine_of("generic loop-tree executor (Cython)")
    ('template spmv', 'generic interpreter')
    """
    if line.startswith("template kernel '"):
        return "template " + line.split("'")[1]
    if "generic" in line or "interpreter" in line:
        return "generic interpreter"
    return line[:40]


def _stopped_after(rec) -> Optional[float]:
    """The call limit a record's call was stopped at (None: not stopped)."""
    if rec is None or rec.status != "skip" or not rec.note.startswith(offcatalog.CallTimeout.PREFIX):
        return None
    return float(rec.note.split()[2])


def _time_of(rec) -> tuple[Optional[float], bool]:
    """(seconds, single-call?) of a record: its median, the checked call of a ``slow`` one, or the limit
    a stopped call ran into (a lower bound)."""
    if rec is None:
        return None, False
    if rec.status == "ok" and rec.median is not None:
        return rec.median, False
    if rec.status == "slow" and rec.first_call:
        return rec.first_call, True
    stopped = _stopped_after(rec)
    return (stopped, True) if stopped is not None else (None, False)


def _fmt(t: Optional[float], single: bool, rec=None) -> str:
    if t is None:
        return "-" if rec is None else ("MISMATCH!" if rec.status == "MISMATCH" else rec.status)
    if _stopped_after(rec) is not None:
        return ">" + report.fmt_time(t)
    return report.fmt_time(t) + ("(1)" if single else "")


def _geomean(xs: list) -> Optional[float]:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _ratio_text(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}x"


def _peer_rows(programs, by, n, libs, engines):
    """Rows of the peer table at ``n`` threads and the per-program summary dicts."""
    rows, summary = [], []
    target = TARGETS.get(n, TARGETS[1])
    for p in programs:
        g = by.get((p.name, n), {})
        t_spf, single = _time_of(g.get("spfuse"))
        row = [p.name, p.kind, _fmt(t_spf, single, g.get("spfuse"))]
        best, best_name = None, "-"
        for lib in libs:
            rec = g.get(lib)
            t, one = _time_of(rec)
            if lib not in p.peers:
                row.append("")
                continue
            ratio = t / t_spf if t is not None and t_spf else None
            row.append(_fmt(t, one, rec) + (f" {ratio:.2g}x" if ratio else ""))
            if t is not None and (best is None or t < best):
                best, best_name = t, lib
        ratio = best / t_spf if best is not None and t_spf else None
        ok = None if ratio is None else ratio >= target
        row += [best_name, _ratio_text(ratio), {True: "ok", False: "BEHIND", None: "-"}[ok],
                engines.get((p.name, 0), "-")]
        rows.append(row)
        summary.append({"program": p.name, "kind": p.kind, "threads": n, "spfuse": t_spf, "spfuse_single_call": single,
                        "best_peer": best_name if best is not None else None, "best_peer_time": best,
                        "ratio": ratio, "meets_target": ok, "target": target})
    return rows, summary


def _cliff_rows(programs, by, threads, engines):
    rows, summary = [], []
    for p in programs:
        per_thread = {}
        for n in threads:
            g = by.get((p.name, n), {})
            ts = [_time_of(g.get(spelling_peer(i))) for i in range(len(p.spellings))]
            got = [t for t, _ in ts if t is not None]
            per_thread[n] = (ts, min(got) if got else None)
        worst = {}
        for i, s in enumerate(p.spellings):
            row = [p.name if i == 0 else "", s.label]
            for n in threads:
                (t, one), best = per_thread[n][0][i], per_thread[n][1]
                r = t / best if t is not None and best else None
                if r is not None:
                    worst[n] = max(worst.get(n, 0.0), r)
                row += [_fmt(t, one, by.get((p.name, n), {}).get(spelling_peer(i))), _ratio_text(r)]
            row.append(engines.get((p.name, i), "-"))
            rows.append(row)
        verdict = {n: (None if n not in worst else worst[n] <= CLIFF_LIMIT) for n in threads}
        verdicts = [cell for n in threads
                    for cell in (_ratio_text(worst.get(n)), {True: "pass", False: "FAIL", None: "-"}[verdict[n]])]
        rows.append(["", "  worst/best", *verdicts, ""])
        summary.append({"program": p.name, "spellings": [s.label for s in p.spellings],
                        "worst_over_best": {str(n): worst.get(n) for n in threads},
                        "within_limit": {str(n): verdict[n] for n in threads}})
    return rows, summary


def run_offcatalog(size: str = "small", programs: Optional[str] = None, threads: Optional[list[int]] = None,
                   repeat: Optional[int] = None, out: TextIO = sys.stdout, progress: bool = True,
                   json_path: Optional[str] = None, call_budget: Optional[float] = None,
                   peers: Optional[list[str]] = None, call_limit: Optional[float] = None) -> dict:
    """Run the off-catalogue suite at ``size`` and print its tables; returns everything measured as a dict.

    ``programs``: comma-separated names (default all); ``peers``: libraries
    to run (default every importable one of :data:`~spfuse.bench.offcatalog.LIBRARIES`);
    ``call_budget`` overrides the size's seconds per call (slower: one call,
    not timed further), ``call_limit`` its seconds after which a spfuse call is stopped.
    """
    from spfuse.bench.runner import Progress, _default_threads
    if size not in offcatalog.SIZES:
        raise ValueError(f"--suite offcatalog has sizes {', '.join(offcatalog.SIZES)}; got {size!r}")
    t0 = time.perf_counter()
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    sz = offcatalog.SIZES[size]
    if call_budget is not None:
        if not call_budget > 0:
            raise ValueError(f"call budget must be > 0 seconds, got {call_budget}")
        sz = dataclasses.replace(sz, call_budget=call_budget)
    if call_limit is not None:
        if not call_limit > 0:
            raise ValueError(f"call limit must be > 0 seconds, got {call_limit}")
        sz = dataclasses.replace(sz, call_limit=call_limit)
    progs = offcatalog.select_programs(programs)
    threads = threads or _default_threads()
    repeat = repeat or sz.repeat
    peer_list, notes = build_peers(progs, peers, sz.call_limit)
    libs = [p.name for p in peer_list if not p.name.startswith("spfuse")]
    inputs = offcatalog.make_inputs(sz, [p.input for p in progs])

    bar = Progress(len(progs), progress)
    records, engines, lines = [], {}, {}
    try:
        for p in progs:
            bar.step(p.name)
            inp = inputs[p.input]
            records += harness.run_case(inp, p.kernel, sz, threads, repeat, peer_list=peer_list, check_budget=False)
            ops = p.kernel.operands(inp, sz)
            for i, s in enumerate(p.spellings):
                try:
                    line = execution_line(s.program or p.program, s.adapt(ops))
                except Exception as e:
                    line = f"explain failed: {harness._short(e)}"
                lines[(p.name, i)], engines[(p.name, i)] = line, engine_of(line)
            bar.advance()
    finally:
        bar.close()
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None

    by: dict = {}
    for r in records:
        by.setdefault((r.kernel, r.threads), {})[r.peer] = r
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"spfuse {spfuse.__version__} bench --suite offcatalog --size {size}: {len(progs)} programs, threads {threads}, "
      f"median of up to {repeat} rounds (case budget {sz.case_budget:g} s), interleaved, each timed call after an "
      f"untimed one; call budget {sz.call_budget:g} s, spfuse calls stopped after {sz.call_limit:g} s")
    w(report.machine_line())
    if load_before is not None:
        w("load average (1/5/15 min): before " + " ".join(f"{x:.2f}" for x in load_before) + ", after "
          + " ".join(f"{x:.2f}" for x in load_after) + "  (shared machine: other processes use the cores)")
    w("peers: " + "; ".join(f"{p.name} {p.version} ({p.threads_note})" for p in peer_list
                            if not p.name.startswith("spfuse~")))
    for note in notes:
        w(f"note: {note}")
    w("inputs: " + "; ".join(i.describe() for i in inputs.values()))
    w("cells: median time; peer cells add peer/spfuse (>1: spfuse faster); (1) = over the call budget, the single "
      "checked call at the largest thread count stands in for the median; >T = stopped at the call limit T (a lower "
      "bound); ratio = best peer / spfuse")

    peer_summary = []
    head = ["program", "kind", "spfuse"] + libs + ["best peer", "ratio", "target", "spfuse ran as"]
    for n in threads:
        rows, summ = _peer_rows(progs, by, n, libs, engines)
        peer_summary += summ
        target = TARGETS.get(n, TARGETS[1])
        w()
        w(f"== off-catalogue vs best peer, {n} thread{'s' if n > 1 else ''} (target: ratio >= {target:g} "
          f"in every cell, geomean >= {GEOMEAN_TARGET:g}) ==")
        w(report._grid(head, rows))
        ratios = [s["ratio"] for s in summ if s["ratio"]]
        gm = _geomean(ratios)
        behind = sum(1 for s in summ if s["meets_target"] is False)
        w(f"geomean best peer / spfuse: {_ratio_text(gm)} over {len(ratios)} programs "
          f"({'pass' if gm and gm >= GEOMEAN_TARGET else 'FAIL'}); below {target:g}x: {behind} of {len(ratios)}; "
          f"spfuse faster: {sum(1 for x in ratios if x > 1)} of {len(ratios)}")

    cliff_rows, cliff_summary = _cliff_rows(progs, by, threads, engines)
    w()
    w(f"== no cliff: every spelling within {CLIFF_LIMIT:g}x of the fastest spelling in spfuse ==")
    head = ["program", "spelling", *(c for n in threads for c in (f"{n}t", f"{n}t /best")), "ran as"]
    w(report._grid(head, cliff_rows))
    fails = [s["program"] for s in cliff_summary if any(v is False for v in s["within_limit"].values())]
    w(f"programs with a cliff (> {CLIFF_LIMIT:g}x): {len(fails)} of {len(cliff_summary)}"
      + (f": {', '.join(fails)}" if fails else ""))

    w()
    generic = sorted({k[0] for k, e in engines.items() if e == "generic interpreter" and k[1] == 0})
    spell_generic = sum(1 for e in engines.values() if e == "generic interpreter")
    w(f"how spfuse ran them (explain()'s execution line): as written, {len(generic)} of {len(progs)} programs on the "
      f"generic interpreter; {spell_generic} of {len(engines)} spellings")
    for p in progs:
        for i, s in enumerate(p.spellings):
            w(f"  {p.name} [{s.label}]: {s.program or p.program}")
            w(f"      {lines[(p.name, i)]}")

    bad = [r for r in records if r.status in ("MISMATCH", "error", "unsupported", "skip")]
    if bad:
        w()
        w("not timed:")
        for r in dict.fromkeys(f"  {r.kernel} {r.peer}: {r.status}: {r.note}" for r in bad):
            w(r)
    elapsed = time.perf_counter() - t0
    w()
    w(f"wall time {elapsed:.1f} s")
    res = {"meta": {"suite": "offcatalog", "size": size, "threads": threads, "repeat": repeat,
                    "call_budget": sz.call_budget, "call_limit": sz.call_limit, "case_budget": sz.case_budget,
                    "load_before": load_before, "load_after": load_after, "wall_seconds": elapsed,
                    "peers": {p.name: p.version for p in peer_list if not p.name.startswith("spfuse~")},
                    "notes": notes, "inputs": {k: i.describe() for k, i in inputs.items()},
                    "spfuse": spfuse.config_info() if hasattr(spfuse, "config_info") else {}},
           "programs": [{"name": p.name, "kind": p.kind, "input": p.input, "program": p.program,
                         "peers": {lib: impl.how for lib, impl in p.peers.items()},
                         "spellings": [{"peer": spelling_peer(i), "label": s.label, "program": s.program or p.program,
                                        "execution": lines[(p.name, i)]} for i, s in enumerate(p.spellings)]}
                        for p in progs],
           "records": [r.as_dict() for r in records], "peer_summary": peer_summary, "cliff_summary": cliff_summary}
    if json_path:
        import json
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
        w(f"JSON written to {json_path}")
    return res
