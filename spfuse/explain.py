"""``Kernel.explain()``: a readable account of what a plan does and why.

Shape of the report (like opt_einsum's ``PathInfo``): a header with the
program and its cost, then one section per stage -- unit operations, index
trees before and after fusion (masks on every loop), temporaries, parallel
loops, the redundancy table comparing ``none``, ``max`` and ``auto``, and
how each fused group is executed.
"""
from __future__ import annotations

from collections.abc import Mapping

from spfuse.errors import UnsupportedError
from spfuse.ir.tree import render
from spfuse.passes.mask_drivers import MaskDrivers
from spfuse.passes.redundancy import KINDS, dominated

__all__ = ["explain_plans", "classify"]


def classify(mode_report, auto_report) -> str:
    """ReACT Table 2 label of a mode relative to auto: ``1``, ``CS`` or ``AS``.

    ``AS`` (asymptotically slower): some cost term of the mode is not bounded
    by a term of auto's; ``CS`` (slower by a constant): same asymptotic cost
    but with redundancies; ``1``: neither.
    """
    for term in mode_report.terms:
        if not any(dominated(term, t) for t in auto_report.terms):
            return "AS"
    if any(mode_report.present[k] for k in KINDS):
        return "CS"
    return "1"


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.3g}"


def _transposed_text(transposed) -> str:
    return "; transposes " + ", ".join(f"{n} (mode order {tuple(a)} → {tuple(b)})" for n, a, b in transposed)


def _order_lines(p) -> list[str]:
    """The chosen loop order of each op with its cost, and the runner-up."""
    choices = getattr(p, "order_choices", None) or {}
    if not choices:
        return ["loop order per operation:"] + [f"  S{op.id}: {', '.join(p.orders[op.id])}" for op in p.ops]
    from spfuse.passes.cost_model import active_constants
    lines = ["loop order per operation (cost = computation + workspace + transposition;",
             f"  constants {active_constants().source}):"]
    for op in p.ops:
        c = choices.get(op.id)
        if c is None:
            lines.append(f"  S{op.id}: {', '.join(p.orders[op.id])}")
            continue
        b = c.best
        lines.append(f"  S{op.id}: {', '.join(b.order):12} {b.text()}"
                     + (_transposed_text(b.transposed) if b.transposed else ""))
        if c.runner_up is not None:
            r = c.runner_up
            why = "" if c.runner_up_admissible else " (outside the mode-order graph)"
            lines.append(f"      runner-up {', '.join(r.order)}{why}: {r.text()}"
                         + (_transposed_text(r.transposed) if r.transposed else ""))
        lines.extend(f"      storage order: {note}" for note in c.cycle)
    return lines


def explain_plans(plans: Mapping[str, object], chosen: str, execution: str | None = None,
                  parallel: str | None = None) -> str:
    """Render the report for ``plans[chosen]``, comparing it with the other
    strategies in ``plans`` (values are ``Plan`` or ``UnsupportedError``)."""
    p = plans[chosen]
    lines = []
    lines.append(f"spfuse plan  (fusion={chosen!r}, planned in {p.planning_seconds * 1e3:.2f} ms)")
    lines.append("program:")
    lines.extend("  " + s for s in p.program.text.strip().splitlines())
    ins = ", ".join(f"{n}: {i.format_name} {'×'.join('?' if s is None else str(s) for s in i.shape)}"
                    + (f" nnz={i.nnz}" if i.nnz is not None else "")
                    + (f" (stores {i.pattern}'s pattern)" if i.pattern else "") for n, i in p.inputs.items())
    lines.append(f"operands: {ins}")
    lines.append(f"estimated cost: {p.report.cost_text}  ≈ {_num(p.report.estimate)} iterations")
    lines.append("")
    lines.append("unit operations:")
    lines.extend(f"  S{op.id}: {op}" for op in p.ops)
    lines.append("")
    lines.extend(_order_lines(p))
    lines.append("")
    lines.append("index trees before fusion (loops show their iteration masks):")
    lines.extend("  " + ln for ln in render(p.unfused).splitlines())
    lines.append("")
    lines.append("index tree after fusion and memory optimisation:")
    lines.extend("  " + ln for ln in render(p.tree).splitlines())
    lines.append("")
    sparse_loops = MaskDrivers.of(p).describe()
    if sparse_loops:
        lines.append("sparse loops (the accesses that iterate each mask" +
                     (", exactly: masks propagated):" if p.propagated else "):"))
        lines.extend("  " + ln for ln in sparse_loops)
        lines.append("")
    if p.temporaries:
        lines.append("temporaries (before → after dimension reduction):")
        for t in p.temporaries.values():
            reset = f", reset in loop {t.reset_under}" if t.reset_under else ""
            lines.append(f"  {t.shape_text}  format {t.format}{reset}")
    else:
        lines.append("temporaries: none")
    if parallel:
        lines.append(f"parallel: {parallel}")
    if execution:
        lines.append(f"execution: {execution}")
    if p.formats:
        lines.append("result formats (inferred):")
        for d in p.formats.values():
            ws = f"; {d.workspace}" if d.workspace else ""
            lines.append(f"  {d.name}: {d.format_name} ({d.reason}{ws})")
    tiles = [f"S{o}: {ix} in tiles of {t}" for o, d in p.tiles.items() for ix, t in d.items()]
    lines.append("tiling: " + ("; ".join(tiles) if tiles else
                               "none (no long dense loop outside every sparse loop)"))
    for note in p.notes:
        lines.append(f"note: {note}")
    for decision in getattr(p, "decisions", ()):
        lines.append(f"decision: {decision}")
    lines.append("")
    lines.append("redundancies (ReACT): present in each strategy?")
    names = [m for m in ("none", "max", "auto") if m in plans]
    header = f"  {'':15}" + "".join(f"{m:>16}" for m in names)
    lines.append(header)
    auto = plans.get("auto")
    for kind in KINDS:
        row = f"  {kind:15}"
        for m in names:
            q = plans[m]
            cell = "unsupported" if isinstance(q, UnsupportedError) else ("yes" if q.report.present[kind] else "no")
            row += f"{cell:>16}"
        lines.append(row)
    row = f"  {'vs auto':15}"
    for m in names:
        q = plans[m]
        comparable = not isinstance(q, UnsupportedError) and hasattr(auto, "report")
        label = classify(q.report, auto.report) if comparable else "n/a"
        row += f"{label:>16}"
    lines.append(row)
    lines.append("  cost:")
    for m in names:
        q = plans[m]
        if isinstance(q, UnsupportedError):
            lines.append(f"    {m:5} unsupported: {str(q).splitlines()[0]}")
        else:
            lines.append(f"    {m:5} {q.report.cost_text}  ≈ {_num(q.report.estimate)}")
    details = [f"    {m}: {why}" for m in names if not isinstance(plans[m], UnsupportedError)
               for kind in KINDS for why in plans[m].report.present[kind]]
    if details:
        lines.append("  why:")
        lines.extend(details)
    return "\n".join(lines)
