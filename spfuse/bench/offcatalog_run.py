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
from typing import TextIO

import spfuse
from spfuse.bench import harness, offcatalog, report
from spfuse.bench import peers as peers_mod

__all__ = ["run_offcatalog", "render", "peer_summary", "cliff_summary", "build_peers", "execution_line",
           "engine_of", "spelling_peer", "main", "CLIFF_LIMIT", "TARGETS", "GEOMEAN_TARGET"]

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


def _library_peer(name: str, programs: list) -> peers_mod.Peer | None:
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


def build_peers(programs: list, libraries: list | None = None,
                call_limit: float | None = None) -> tuple[list, list[str]]:
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


def _stopped_after(rec: dict | None) -> float | None:
    """The call limit a record's call was stopped at (None: not stopped)."""
    if rec is None or rec["status"] != "skip" or not rec["note"].startswith(offcatalog.CallTimeout.PREFIX):
        return None
    return float(rec["note"].split()[2])


def _measure(rec: dict | None) -> tuple[float | None, str]:
    """``(seconds, how)`` of a record (a dict of :meth:`Record.as_dict`).

    ``how`` is ``median``; ``single`` (over the call budget: the checked
    call); ``bound`` (stopped at the call limit: a lower bound); or, with
    no time, the status to print.

    >>> _measure({"status": "slow", "median": None, "first_call": 2.5, "note": ""})
    (2.5, 'single')
    >>> _measure({"status": "skip", "median": None, "first_call": None, "note": "stopped after 30 s (call limit)"})
    (30.0, 'bound')
    """
    if rec is None:
        return None, "-"
    if rec["status"] == "ok" and rec["median"] is not None:
        return rec["median"], "median"
    if rec["status"] == "slow" and rec["first_call"]:
        return rec["first_call"], "single"
    stopped = _stopped_after(rec)
    if stopped is not None:
        return stopped, "bound"
    return None, "MISMATCH!" if rec["status"] == "MISMATCH" else rec["status"]


def _fmt(m: tuple) -> str:
    t, how = m
    if t is None:
        return how
    return (">" if how == "bound" else "") + report.fmt_time(t) + ("(1)" if how == "single" else "")


def _ratio(num: tuple, den: tuple) -> tuple[float | None, str]:
    """``num / den`` of two measures and its side: ``""`` exact, ``">"`` a lower, ``"<"`` an upper bound.

    >>> _ratio((2.0, "median"), (1.0, "median")), _ratio((30.0, "bound"), (1.0, "median"))
    ((2.0, ''), (30.0, '>'))
    >>> _ratio((1.0, "median"), (30.0, "bound")), _ratio((30.0, "bound"), (30.0, "bound"))
    ((0.03333333333333333, '<'), (None, ''))
    """
    (a, ha), (b, hb) = num, den
    if a is None or b is None or not b or (ha == "bound" and hb == "bound"):
        return None, ""
    return a / b, ">" if ha == "bound" else "<" if hb == "bound" else ""


def _ratio_text(r: tuple) -> str:
    return "-" if r[0] is None else f"{r[1]}{r[0]:.3g}x"


def _at_least(r: tuple, limit: float) -> bool | None:
    """Is the ratio ``r`` >= ``limit``? None when a bound leaves it open."""
    x, side = r
    if x is None or (side == "<" and x >= limit) or (side == ">" and x < limit):
        return None
    return x >= limit


def _geomean(xs: list) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _verdict(ok: bool | None, yes: str = "pass", no: str = "FAIL") -> str:
    return {True: yes, False: no, None: "-"}[ok]


def _index(res: dict) -> dict:
    by: dict = {}
    for r in res["records"]:
        by.setdefault((r["kernel"], r["threads"]), {})[r["peer"]] = r
    return by


def _libraries(res: dict) -> list[str]:
    peers = {r["peer"] for r in res["records"]}
    return [lib for lib in offcatalog.LIBRARIES if lib in peers]


def peer_summary(res: dict) -> list[dict]:
    """Per program and thread count: spfuse, the best peer, ``best peer / spfuse`` and the issue's target."""
    by, libs, out = _index(res), _libraries(res), []
    for n in res["meta"]["threads"]:
        target = TARGETS.get(n, TARGETS[1])
        for p in res["programs"]:
            g = by.get((p["name"], n), {})
            spf = _measure(g.get("spfuse"))
            timed = [(lib, _measure(g.get(lib))) for lib in libs if lib in p["peers"]]
            timed = [(lib, m) for lib, m in timed if m[0] is not None]
            best_name, best = min(timed, key=lambda x: x[1][0]) if timed else (None, (None, "-"))
            ratio = _ratio(best, spf)
            out.append({"program": p["name"], "kind": p["kind"], "threads": n, "spfuse": spf[0], "spfuse_how": spf[1],
                        "peers": {lib: {"time": m[0], "how": m[1]} for lib, m in timed}, "best_peer": best_name,
                        "best_peer_time": best[0], "ratio": ratio[0], "ratio_side": ratio[1], "target": target,
                        "meets_target": _at_least(ratio, target)})
    return out


def cliff_summary(res: dict) -> list[dict]:
    """Per program and thread count: each spelling over the fastest, the worst, and ``<= CLIFF_LIMIT``."""
    by, out = _index(res), []
    for p in res["programs"]:
        for n in res["meta"]["threads"]:
            g = by.get((p["name"], n), {})
            ms = [_measure(g.get(s["peer"])) for s in p["spellings"]]
            got = [m for m in ms if m[0] is not None]
            best = min(got, key=lambda m: (m[0], m[1] == "bound")) if got else (None, "-")
            ratios = [_ratio(m, best) for m in ms]
            known = [r for r in ratios if r[0] is not None]
            worst = max(known, key=lambda r: r[0]) if known else (None, "")
            if any(_at_least(r, CLIFF_LIMIT * (1 + 1e-12)) for r in known):
                ok = False
            elif known and len(known) == len(ratios) and all(side == "" for _, side in known):
                ok = True
            else:
                ok = None
            out.append({"program": p["name"], "threads": n, "spellings": [s["label"] for s in p["spellings"]],
                        "times": [m[0] for m in ms], "hows": [m[1] for m in ms],
                        "over_best": [r[0] for r in ratios], "sides": [r[1] for r in ratios],
                        "worst_over_best": worst[0], "worst_side": worst[1], "within_limit": ok})
    return out


def render(res: dict, out: TextIO | None = None) -> None:
    """Print the tables of a run (the dict :func:`run_offcatalog` returns, or its JSON) to ``out`` (stdout)."""
    out = out or sys.stdout
    w = lambda s="": print(s, file=out)  # noqa: E731
    meta, programs = res["meta"], res["programs"]
    threads, libs = meta["threads"], _libraries(res)
    w(f"spfuse {meta.get('spfuse_version', '?')} bench --suite offcatalog --size {meta['size']}: {len(programs)} "
      f"programs, threads {threads}, median of up to {meta['repeat']} rounds (case budget {meta['case_budget']:g} s), "
      f"interleaved, each timed call after an untimed one; call budget {meta['call_budget']:g} s, spfuse calls "
      f"stopped after {meta['call_limit']:g} s")
    if meta.get("machine"):
        w(meta["machine"])
    if meta.get("load_before"):
        w("load average (1/5/15 min): before " + " ".join(f"{x:.2f}" for x in meta["load_before"]) + ", after "
          + " ".join(f"{x:.2f}" for x in meta["load_after"]) + "  (shared machine: other processes use the cores)")
    notes = meta.get("peer_threads", {})
    w("peers: " + "; ".join(f"{name} {version}" + (f" ({notes[name]})" if name in notes else "")
                            for name, version in meta["peers"].items()))
    for note in meta.get("notes", []):
        w(f"note: {note}")
    w("inputs: " + "; ".join(meta["inputs"].values()))
    w("cells: median time; peer cells add peer/spfuse (>1: spfuse faster); (1) = over the call budget: the single "
      "checked call, at the largest thread count, stands in for the median at every thread count; >T = stopped at "
      "the call limit T (a lower bound; ratios against it read <x or >x); ratio = best peer / spfuse")

    engines = {(p["name"], i): engine_of(s["execution"]) for p in programs for i, s in enumerate(p["spellings"])}
    summ, by = peer_summary(res), _index(res)
    for n in threads:
        target = TARGETS.get(n, TARGETS[1])
        rows, cells = [], [s for s in summ if s["threads"] == n]
        for s, p in zip(cells, programs, strict=True):
            spf = (s["spfuse"], s["spfuse_how"])
            row = [p["name"], p["kind"], _fmt(spf)]
            for lib in libs:
                if lib not in p["peers"]:
                    row.append("")
                    continue
                m = _measure(by.get((p["name"], n), {}).get(lib))
                r = _ratio(m, spf)
                row.append(_fmt(m) + (f" {r[1]}{r[0]:.2g}x" if r[0] is not None else ""))
            row += [s["best_peer"] or "-", _ratio_text((s["ratio"], s["ratio_side"])),
                    _verdict(s["meets_target"], "ok", "BEHIND"), engines.get((p["name"], 0), "-")]
            rows.append(row)
        w()
        w(f"== off-catalogue vs best peer, {n} thread{'s' if n > 1 else ''} (target: ratio >= {target:g} "
          f"in every cell, geomean >= {GEOMEAN_TARGET:g}) ==")
        w(report._grid(["program", "kind", "spfuse", *libs, "best peer", "ratio", "target", "spfuse ran as"], rows))
        ratios = [s["ratio"] for s in cells if s["ratio"]]
        bounds = sum(1 for s in cells if s["ratio"] and s["ratio_side"])
        gm = _geomean(ratios)
        missing = [s["program"] for s in cells if not s["ratio"]]
        w(f"geomean best peer / spfuse: {'-' if gm is None else ('<=' if bounds else '') + f'{gm:.3g}x'} over "
          f"{len(ratios)} programs "
          f"({_verdict(None if gm is None or (bounds and gm >= GEOMEAN_TARGET) else gm >= GEOMEAN_TARGET)})"
          + (f", {bounds} of them upper bounds (spfuse stopped at the call limit)" if bounds else "")
          + f"; below {target:g}x: {sum(1 for s in cells if s['meets_target'] is False)}; spfuse faster: "
          f"{sum(1 for s in cells if s['ratio'] and s['ratio'] > 1 and s['ratio_side'] != '<')}"
          + (f"; no ratio: {', '.join(missing)}" if missing else ""))

    cl = cliff_summary(res)
    rows, fails = [], []
    for p in programs:
        per = {c["threads"]: c for c in cl if c["program"] == p["name"]}
        for i, s in enumerate(p["spellings"]):
            row = [p["name"] if i == 0 else "", s["label"]]
            for n in threads:
                c = per[n]
                row += [_fmt((c["times"][i], c["hows"][i])), _ratio_text((c["over_best"][i], c["sides"][i]))]
            rows.append(row + [engines.get((p["name"], i), "-")])
        verdicts = [cell for n in threads for cell in
                    (_ratio_text((per[n]["worst_over_best"], per[n]["worst_side"])), _verdict(per[n]["within_limit"]))]
        rows.append(["", "  worst/best", *verdicts, ""])
        if any(per[n]["within_limit"] is False for n in threads):
            fails.append(p["name"])
    w()
    w(f"== no cliff: every spelling within {CLIFF_LIMIT:g}x of the fastest spelling in spfuse ==")
    w(report._grid(["program", "spelling", *(c for n in threads for c in (f"{n}t", f"{n}t /best")), "ran as"], rows))
    w(f"programs with a cliff (> {CLIFF_LIMIT:g}x): {len(fails)} of {len(programs)}"
      + (f": {', '.join(fails)}" if fails else ""))

    w()
    generic = [p["name"] for p in programs if engines[(p["name"], 0)] == "generic interpreter"]
    w(f"how spfuse ran them (explain()'s execution line): as written, {len(generic)} of {len(programs)} programs on "
      f"the generic interpreter; {sum(1 for e in engines.values() if e == 'generic interpreter')} of {len(engines)} "
      "spellings")
    for p in programs:
        for s in p["spellings"]:
            w(f"  {p['name']} [{s['label']}]: {s['program']}")
            w(f"      {s['execution']}")
    bad = [r for r in res["records"] if r["status"] in ("MISMATCH", "error", "unsupported", "skip")]
    if bad:
        w()
        w("not timed:")
        for line in dict.fromkeys(f"  {r['kernel']} {r['peer']}: {r['status']}: {r['note']}" for r in bad):
            w(line)
    w()
    w(f"wall time {meta['wall_seconds']:.1f} s")


def run_offcatalog(size: str = "small", programs: str | None = None, threads: list[int] | None = None,
                   repeat: int | None = None, out: TextIO = sys.stdout, progress: bool = True,
                   json_path: str | None = None, call_budget: float | None = None,
                   peers: list[str] | None = None, call_limit: float | None = None) -> dict:
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
    inputs = offcatalog.make_inputs(sz, [p.input for p in progs])

    bar = Progress(len(progs), progress)
    records, lines = [], {}
    try:
        for p in progs:
            bar.step(p.name)
            inp = inputs[p.input]
            records += harness.run_case(inp, p.kernel, sz, threads, repeat, peer_list=peer_list, check_budget=False)
            ops = p.kernel.operands(inp, sz)
            for i, s in enumerate(p.spellings):
                try:
                    lines[(p.name, i)] = execution_line(s.program or p.program, s.adapt(ops))
                except Exception as e:  # an operand change that fails is a table entry
                    lines[(p.name, i)] = f"explain failed: {harness._short(e)}"
            bar.advance()
    finally:
        bar.close()
    shown = [p for p in peer_list if not p.name.startswith("spfuse~")]
    res = {"meta": {"suite": "offcatalog", "size": size, "threads": threads, "repeat": repeat,
                    "call_budget": sz.call_budget, "call_limit": sz.call_limit, "case_budget": sz.case_budget,
                    "load_before": load_before, "load_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
                    "wall_seconds": time.perf_counter() - t0, "spfuse_version": spfuse.__version__,
                    "machine": report.machine_line(), "peers": {p.name: p.version for p in shown},
                    "peer_threads": {p.name: p.threads_note for p in shown}, "notes": notes,
                    "inputs": {k: i.describe() for k, i in inputs.items()},
                    "spfuse": spfuse.config_info() if hasattr(spfuse, "config_info") else {}},
           "programs": [{"name": p.name, "kind": p.kind, "input": p.input, "program": p.program,
                         "peers": {lib: impl.how for lib, impl in p.peers.items()},
                         "spellings": [{"peer": spelling_peer(i), "label": s.label, "program": s.program or p.program,
                                        "execution": lines[(p.name, i)]} for i, s in enumerate(p.spellings)]}
                        for p in progs],
           "records": [r.as_dict() for r in records]}
    res["peer_summary"], res["cliff_summary"] = peer_summary(res), cliff_summary(res)
    render(res, out)
    if json_path:
        import json
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(f"JSON written to {json_path}", file=out)
    return res


def main(argv=None) -> int:
    """``python -m spfuse.bench.offcatalog_run FILE.json``: print the tables of a saved run again."""
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m spfuse.bench.offcatalog_run", description=main.__doc__)
    ap.add_argument("json", help="a file written by spfuse bench --suite offcatalog --json FILE")
    with open(ap.parse_args(argv).json) as f:
        render(json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
