"""The fusion study: ``fusion="auto"`` against ``"max"`` and ``"none"`` on every kernel.

Issue 6 asks that ``auto`` be never more than 10% slower than the better of
``max`` and ``none``, and asymptotically faster where the seeds say so:
GNN-1 vs ``max``, SDDMM and GNN-2 vs ``none``, SDDMM-SpMM vs ``max`` (by 10x
or more at the medium size).  This runs the three spfuse strategies through
the bench harness (same operands, result check, interleaved rounds, median;
plans over the memory or time budget are skipped with the estimate, see
:mod:`spfuse.bench.budget`), prints one table per thread count with the
measured ratios next to the cost model's (``explain()``'s iteration
estimates and ReACT labels), and one summary line per kernel.

``auto`` and ``none`` plans run on the same kernels: a ``none`` plan runs
each operation as its own group, on the template kernels, BLAS, numpy or
pattern programs ``auto``'s groups use.  A ``max`` plan does too where each
statement is one product of two factors (SpMV, SpMM, SpGEMM: the same loop
nest in every strategy); a whole fused statement with a workspace or a
longer chain runs on the generic loop-tree executor, so a measured ratio
against ``max`` there mixes the fusion decision with the engine; the
cost-model columns isolate the decision.

>>> import io
>>> buf = io.StringIO()
>>> res = run_fusion_study("tiny", kernels="SpMV,GNN-1", threads=[1], repeat=1, out=buf, progress=False)
>>> [(s["kernel"], s["pair"]) for s in res["summary"]]
[('SpMV', None), ('GNN-1', 'vs max')]
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import TextIO

import spfuse
from spfuse.bench import harness, report, suite
from spfuse.bench import peers as peers_mod

__all__ = ["SEEDED", "run_fusion_study", "within", "cost_models"]

#: (kernel, strategy auto must beat asymptotically, minimum ratio at medium size or None)
SEEDED = {("GNN-1", "max"): None, ("SDDMM", "none"): None, ("GNN-2", "none"): None,
          ("SDDMM-SpMM", "max"): 10.0}

GEN = "spfuse[auto,generic]"
STRATEGIES = ("spfuse", "spfuse[max]", "spfuse[none]", GEN)


def within(auto: float | None, others: list[float | None], tol: float = 0.10) -> bool | None:
    """Is ``auto`` at most ``tol`` slower than the best of the measured ``others``? None: nothing to compare.

    >>> within(1.05, [1.0, 3.0]), within(1.2, [1.0, None]), within(1.0, [None, None])
    (True, False, None)
    """
    got = [t for t in others if t is not None]
    if auto is None or not got:
        return None
    return auto <= (1.0 + tol) * min(got)


def cost_models(program: str, operands: dict) -> dict:
    """Per strategy: ``estimate`` (iterations), ``cost`` text, ReACT ``label`` vs auto, and ``engine``."""
    from spfuse.api import describe_execution
    from spfuse.errors import UnsupportedError
    from spfuse.explain import classify
    plans = spfuse.compile(program).plans(**operands)
    auto = plans.get("auto")
    out = {}
    for m, p in plans.items():
        if isinstance(p, UnsupportedError) or isinstance(p, Exception):
            out[m] = {"estimate": None, "cost": f"unsupported: {str(p).splitlines()[0][:80]}", "label": "n/a",
                      "engine": "-"}
            continue
        label = classify(p.report, auto.report) if hasattr(auto, "report") else "n/a"
        ex = describe_execution(p)
        engine = "template " + ex.split("'")[1] if ex.startswith("template") else "generic executor"
        out[m] = {"estimate": p.report.estimate, "cost": p.report.cost_text, "label": label, "engine": engine}
    return out


def generic_auto_peer() -> peers_mod.Peer:
    """``spfuse[auto,generic]``: auto's plan run by the generic loop-tree executor (no template kernel).

    Isolates the fusion *decision* from the engine: ``max`` plans of whole
    fused statements run on the generic executor.  Operands are validated and converted
    once in ``prepare`` (the other strategies do it per call: O(nnz), small
    next to a generic-executor run).
    """
    from spfuse import api, binding
    from spfuse.planner import plan_program

    def prepare(o, ctx):
        program = api._parse(ctx.program)
        tensors, _ = binding.bind_operands(program, o)  # every operand scanned (no deferral)
        infos = {n: api._info(n, t) for n, t in tensors.items()}
        return plan_program(program, infos, "auto"), tensors

    def run(state):
        plan, tensors = state
        raw = api._execute_generic(plan, tensors, spfuse.get_num_threads())
        return raw[plan.results[0]]

    impl = peers_mod.Impl(prepare, run, how="auto's plan on the generic executor")
    return peers_mod.Peer("spfuse[auto,generic]", spfuse.__version__, {k.name: impl for k in suite.KERNELS},
                          threads=spfuse.threads, threads_note="OpenMP prange, spfuse.threads(n)", is_spfuse=True,
                          fusion="auto")


def _times(g: dict) -> tuple[dict, set]:
    """Per strategy: the median, or for a ``slow`` one its single checked call (flagged), else None."""
    t, single = {}, set()
    for p in STRATEGIES:
        r = g.get(p)
        if r is not None and r.status == "ok":
            t[p] = r.median
        elif r is not None and r.status == "slow" and r.first_call:
            t[p] = r.first_call
            single.add(p)
        else:
            t[p] = None
    return t, single


def _ratio(a, b) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt_ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g}x"


def run_fusion_study(size: str = "small", kernels: str | None = None, threads: list[int] | None = None,
                     repeat: int | None = None, out: TextIO = sys.stdout, progress: bool = True,
                     json_path: str | None = None, call_budget: float | None = None) -> dict:
    """Run auto/max/none on every kernel and synthetic input of ``size``; print tables and the summary.

    ``call_budget`` overrides the size's (a strategy whose checked call takes
    longer is not timed further; its single call is reported, marked ``(1)``).
    Returns ``{"records": [...], "models": {...}, "summary": [...]}``.
    """
    from spfuse.bench.runner import Progress, _default_threads
    t0 = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    sz = suite.SIZES[size]
    if call_budget is not None:
        import dataclasses
        sz = dataclasses.replace(sz, call_budget=call_budget)
    ks = suite.select_kernels(kernels)
    threads = threads or _default_threads()
    repeat = repeat or sz.repeat
    peer_list = [p for p in peers_mod.all_peers() if p.name in STRATEGIES] + [generic_auto_peer()]
    inputs = suite.synthetic_inputs(sz)
    cases = [(i, k) for i in inputs for k in ks if k.kind == i.kind]
    bar = Progress(len(cases), progress)
    records, models, known_slow = [], {}, set()
    try:
        for inp, k in cases:
            bar.step(f"{inp.name}/{k.name}")
            records += harness.run_case(inp, k, sz, threads, repeat, peer_list=peer_list, known_slow=known_slow)
            try:
                models[(inp.name, k.name)] = cost_models(k.program, k.operands(inp, sz))
            except Exception as e:  # a planning failure is a table entry
                models[(inp.name, k.name)] = {"error": str(e)}
            bar.advance()
    finally:
        bar.close()

    by = {}
    for r in records:
        by.setdefault((r.input, r.kernel, r.threads), {})[r.peer] = r
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"spfuse {spfuse.__version__} fusion study --size {size}: auto vs max vs none, {len(cases)} cases, "
      f"threads {threads}, median of {repeat} rounds, interleaved, each timed call after an untimed one; "
      f"call budget {sz.call_budget:g} s, "
      f"temporaries budget {sz.max_dense_bytes / 2**30:g} GiB")
    w(report.machine_line(load))
    w("cells: median time; max/auto and none/auto = measured ratio (>1: auto faster); auto/best = auto time over "
      "the better of max and none (pass: <= 1.10); est = the same ratio of the cost model's iteration estimates; "
      "label = ReACT class vs auto (AS asymptotically slower, CS constant slower, 1 same); "
      "(1) = over the call budget: the single checked call (at the largest thread count) stands in for the median; "
      "auto gen = auto's plan on the generic executor (max's fused statements run there): gen/best isolates the "
      "fusion decision from the template kernels")
    notes = []
    for n in threads:
        w()
        w(f"== {n} thread{'s' if n > 1 else ''} ==")
        head = ["input", "kernel", "auto", "max", "none", "max/auto", "none/auto", "auto/best", "<=10%",
                "auto gen", "gen/best", "<=10% gen", "est max/auto", "est none/auto", "label max", "label none"]
        rows = []
        for inp, k in cases:
            g = by.get((inp.name, k.name, n), {})
            mdl = models.get((inp.name, k.name), {})
            t, single = _times(g)
            cell = {p: (report.fmt_time(t[p]) + ("(1)" if p in single else "") if t[p] is not None
                        else (g[p].status if p in g else "-")) for p in STRATEGIES}
            for p in STRATEGIES:
                if p in g and g[p].status != "ok" and g[p].note:
                    notes.append(f"{inp.name}/{k.name} {p}: {g[p].status}: {g[p].note}")
            best = [t["spfuse[max]"], t["spfuse[none]"]]
            ok = within(t["spfuse"], best)
            est = {m: (mdl.get(m) or {}).get("estimate") for m in ("auto", "max", "none")}
            rows.append([inp.name, k.name, cell["spfuse"], cell["spfuse[max]"], cell["spfuse[none]"],
                         _fmt_ratio(_ratio(t["spfuse[max]"], t["spfuse"])),
                         _fmt_ratio(_ratio(t["spfuse[none]"], t["spfuse"])),
                         _fmt_ratio(_ratio(t["spfuse"], min([b for b in best if b is not None], default=None))),
                         {True: "pass", False: "FAIL", None: "-"}[ok], cell[GEN],
                         _fmt_ratio(_ratio(t[GEN], min([b for b in best if b is not None], default=None))),
                         {True: "pass", False: "FAIL", None: "-"}[within(t[GEN], best)],
                         _fmt_ratio(_ratio(est["max"], est["auto"])), _fmt_ratio(_ratio(est["none"], est["auto"])),
                         (mdl.get("max") or {}).get("label", "-"), (mdl.get("none") or {}).get("label", "-")])
        w(report._grid(head, rows))
    if notes:
        w()
        w("not timed:")
        for note in dict.fromkeys(notes):
            w(f"  {note}")

    summary = _summary(cases, by, models, threads, size)
    w()
    w("summary per kernel (all inputs and thread counts of this run):")
    head = ["kernel", "worst auto/best", "<=10% slower than the better", "same engine: worst", "<=10%",
            "seeded pair", "min measured ratio", "est ratio", "label", ">=10x / asymptotic",
            "engines auto | max | none"]
    w(report._grid(head, [[s["kernel"], _fmt_ratio(s["worst"]), s["within_10pct"],
                           _fmt_ratio(s["generic_worst"]), s["generic_within_10pct"], s["pair"] or "-",
                           _fmt_ratio(s["pair_measured"]), _fmt_ratio(s["pair_est"]), s["pair_label"] or "-",
                           s["pair_verdict"], s["engines"]] for s in summary]))
    elapsed = time.perf_counter() - t0
    w()
    w(f"wall time {elapsed:.1f} s")
    res = {"records": [r.as_dict() for r in records],
           "models": {f"{i}/{k}": m for (i, k), m in models.items()}, "summary": summary}
    if json_path:
        import json
        with open(json_path, "w") as f:
            json.dump({"size": size, "threads": threads, "repeat": repeat, "wall_seconds": elapsed, **res}, f,
                      indent=1, default=str)
        w(f"JSON written to {json_path}")
    return res


def _summary(cases, by, models, threads, size) -> list[dict]:
    out = []
    for k in dict.fromkeys(k.name for _, k in cases):
        worst, verdicts, measured, ests, labels, engines = None, [], [], [], [], ""
        gworst, gverdicts = None, []
        pair = next(((kk, m) for (kk, m) in SEEDED if kk == k), None)
        for inp, kk in cases:
            if kk.name != k:
                continue
            mdl = models.get((inp.name, k), {})
            if not engines and "auto" in mdl:
                engines = " | ".join(mdl.get(m, {}).get("engine", "-") for m in ("auto", "max", "none"))
            for n in threads:
                g = by.get((inp.name, k, n), {})
                t, _ = _times(g)
                okg = within(t[GEN], [t["spfuse[max]"], t["spfuse[none]"]])
                if okg is not None:
                    gverdicts.append(okg)
                    bestg = min(b for b in (t["spfuse[max]"], t["spfuse[none]"]) if b is not None)
                    gworst = max(gworst or 0.0, t[GEN] / bestg)
                ok = within(t["spfuse"], [t["spfuse[max]"], t["spfuse[none]"]])
                if ok is not None:
                    verdicts.append(ok)
                    best = min(b for b in (t["spfuse[max]"], t["spfuse[none]"]) if b is not None)
                    worst = max(worst or 0.0, t["spfuse"] / best)
                if pair:
                    measured.append(_ratio(t["spfuse[" + pair[1] + "]"], t["spfuse"]))
            if pair:
                m = mdl.get(pair[1]) or {}
                ests.append(_ratio(m.get("estimate"), (mdl.get("auto") or {}).get("estimate")))
                labels.append(m.get("label"))
        got = [x for x in measured if x is not None]
        pm = min(got) if got else None
        pe = min([x for x in ests if x is not None], default=None)
        verdict = "n/a"
        if pair:
            need = SEEDED[pair] if size in ("medium", "large") else None
            asym = all(lb == "AS" for lb in labels if lb) and any(labels)
            if pm is None:
                verdict = f"not measured (skipped); cost model {'AS' if asym else 'not AS'}"
            elif need is not None:
                verdict = ("pass" if pm >= need else "FAIL") + f" (>= {need:g}x needed)" + \
                          ("" if asym else "; cost model not AS")
            else:
                verdict = ("pass" if pm > 1.0 and asym else "FAIL") + " (faster, cost model AS)"
        out.append({"kernel": k, "worst": worst,
                    "within_10pct": "-" if not verdicts else ("pass" if all(verdicts) else "FAIL"),
                    "generic_worst": gworst,
                    "generic_within_10pct": "-" if not gverdicts else ("pass" if all(gverdicts) else "FAIL"),
                    "pair": f"vs {pair[1]}" if pair else None, "pair_measured": pm, "pair_est": pe,
                    "pair_label": "/".join(dict.fromkeys(lb for lb in labels if lb)) or None,
                    "pair_verdict": verdict, "engines": engines})
    return out


def main(argv=None) -> int:
    """``python -m spfuse.bench.fusion [--size S] [--kernels K] [--threads 1,2] [--repeat R] [--json F]
    [--call-budget S]``."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m spfuse.bench.fusion", description=run_fusion_study.__doc__)
    p.add_argument("--size", default="small", choices=list(suite.SIZES))
    p.add_argument("--kernels")
    p.add_argument("--threads")
    p.add_argument("--repeat", type=int)
    p.add_argument("--json")
    p.add_argument("--call-budget", type=float)
    a = p.parse_args(argv)
    run_fusion_study(a.size, a.kernels, [int(t) for t in a.threads.split(",")] if a.threads else None, a.repeat,
                     json_path=a.json, call_budget=a.call_budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
