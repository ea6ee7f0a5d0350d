"""``Kernel.explain(picture=...)``: the plan drawn with matplotlib (the ``plot`` extra).

Three panels side by side: the index trees before fusion, the fused tree
after memory optimisation (loops show their iteration space -- the level
primitive that runs them: a dense range or a co-iteration of the named
sparse levels -- and ``[parallel]``), and a table of the temporaries (shape
before → after dimension reduction, format) with the kernel that executes
the plan.  Every label is the same text the textual report prints, and the
SVG keeps it as ``<text>`` (``svg.fonttype = "none"``), so a test, a search
or a screen reader finds the nodes in the file.

Only ``matplotlib.figure`` is used (no pyplot state, no display needed).
"""
from __future__ import annotations

import os
from typing import Any

from spfuse.ir.tree import Loop, Root

__all__ = ["draw_plan", "tree_layout"]

_LOOP_COLOUR = "#dbe9f6"
_SPARSE_LOOP_COLOUR = "#fde2c8"
_LEAF_COLOUR = "#e3f1df"


def tree_layout(root: Root) -> list[tuple[Any, float, int, int | None]]:
    """Nodes of an index tree with positions: ``(node, x, depth, parent_index)``.

    Leaves take successive x positions; a loop sits above the middle of its
    children (a tidy layered drawing).  The root itself is not drawn.

    >>> from spfuse.ir.masks import TRUE
    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> from spfuse.ir.tree import Compute
    >>> op = UnitOp(0, "y", ("i",), "*", (Ref("A", ("i", "j")), Ref("x", ("j",))), "sum", ("j",))
    >>> t = Root((Loop("i", 3, TRUE, frozenset({(0, "i")}), (Compute(op),)),))
    >>> [(type(n).__name__, x, d, p) for n, x, d, p in tree_layout(t)]
    [('Loop', 0.0, 0, None), ('Compute', 0.0, 1, 0)]
    """
    placed: list[tuple[Any, float, int, int | None]] = []
    next_leaf = [0.0]

    def place(node, depth: int, parent: int | None) -> float:
        me = len(placed)
        placed.append((node, 0.0, depth, parent))
        children = getattr(node, "children", ()) if isinstance(node, Loop) else ()
        if children:
            xs = [place(c, depth + 1, me) for c in children]
            x = (xs[0] + xs[-1]) / 2
        else:
            x = next_leaf[0]
            next_leaf[0] += 1.0
        placed[me] = (node, x, depth, parent)
        return x

    for child in root.children:
        place(child, 0, None)
    return placed


def _draw_tree(ax: Any, root: Root, title: str) -> None:
    nodes = tree_layout(root)
    ax.set_title(title, fontsize=10)
    ax.axis("off")
    if not nodes:
        ax.text(0.5, 0.5, "(empty)", ha="center")
        return
    width = max(x for _, x, _, _ in nodes) + 1
    depth = max(d for _, _, d, _ in nodes) + 1
    for _, x, d, parent in nodes:
        if parent is not None:
            _, px, pd, _ = nodes[parent]
            ax.plot([px, x], [-pd, -d], color="#777777", linewidth=0.8, zorder=1)
    for node, x, d, _ in nodes:
        if isinstance(node, Loop):
            colour = _LOOP_COLOUR if node.mask.is_true else _SPARSE_LOOP_COLOUR
        else:
            colour = _LEAF_COLOUR
        ax.text(x, -d, node.render(), ha="center", va="center", fontsize=7, zorder=2,
                bbox={"boxstyle": "round,pad=0.3", "facecolor": colour, "edgecolor": "#555555"})
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-depth + 0.4, 0.6)


def _temporaries_text(plan: Any, execution: str | None) -> str:
    lines = ["temporaries (before → after dimension reduction):"]
    if plan.temporaries:
        for t in plan.temporaries.values():
            reset = f", reset in loop {t.reset_under}" if t.reset_under else ""
            lines.append(f"  {t.shape_text}  format {t.format}{reset}")
    else:
        lines.append("  none")
    lines.append("")
    if plan.formats:
        lines.append("result formats:")
        lines.extend(f"  {d.name}: {d.format_name}" for d in plan.formats.values())
    if execution:
        lines.append("")
        lines.append("kernel:")
        words, line = execution.split(), "  "
        for w in words:  # wrap: matplotlib does not
            if len(line) + len(w) > 48:
                lines.append(line)
                line = "    "
            line += w + " "
        lines.append(line)
    return "\n".join(lines)


def draw_plan(plan: Any, path: str | os.PathLike[str], execution: str | None = None) -> str:
    """Draw ``plan`` (a :class:`~spfuse.planner.Plan`) to ``path``; the format follows the suffix.

    Returns ``path`` as a string.  Raises ``ImportError`` with the install
    hint when matplotlib is missing.

    >>> import os, tempfile, spfuse
    >>> from spfuse.api import describe_execution
    >>> plan = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr").plans()["auto"]
    >>> out = draw_plan(plan, os.path.join(tempfile.mkdtemp(), "plan.svg"), describe_execution(plan))
    >>> "for j &lt; ? (∈ A_j)" in open(out, encoding="utf-8").read()
    True
    """
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - the plot extra is installed in CI
        raise ImportError("explain(picture=...) needs matplotlib: pip install 'spfuse[plot]'") from None
    trees = [(plan.unfused, "index trees before fusion"), (plan.tree, "after fusion and memory optimisation")]
    widths = [max(2.0, len(tree_layout(t)) * 0.9) for t, _ in trees] + [4.5]
    depth = max((max((d for _, _, d, _ in tree_layout(t)), default=0) for t, _ in trees), default=0)
    with matplotlib.rc_context({"svg.fonttype": "none", "font.family": "DejaVu Sans"}):
        fig = Figure(figsize=(sum(widths) * 1.1, 1.6 + 0.9 * (depth + 1)))
        axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": widths})
        for ax, (tree, title) in zip(axes[:2], trees, strict=True):
            _draw_tree(ax, tree, title)
        axes[2].axis("off")
        axes[2].set_title("temporaries and kernel", fontsize=10)
        axes[2].text(0.0, 1.0, _temporaries_text(plan, execution), va="top", ha="left", fontsize=7,
                     family="DejaVu Sans Mono", transform=axes[2].transAxes)
        fig.suptitle(plan.program.text.strip().replace("\n", "; "), fontsize=11)
        fig.savefig(os.fspath(path), bbox_inches="tight")
    return os.fspath(path)
