"""Mark the parallel loop of each fused group (ReACT Algorithm 4).

The outermost loop of a group runs in parallel when it is not a reduction
for any operation below it: every operation then writes disjoint slices,
and dimension-reduced temporaries are thread-private.
"""
from __future__ import annotations

from dataclasses import replace

from spfuse.ir.tree import Loop, Root
from spfuse.passes.fusion import ops_under

__all__ = ["mark_parallel"]


def mark_parallel(root: Root) -> Root:
    """Flag the top-level loops whose index is an output index of every op under them.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> from spfuse.ir.masks import TRUE
    >>> from spfuse.ir.tree import Compute
    >>> op = UnitOp(0, "s", (), "*", (Ref("x", ("i",)), Ref("y", ("i",))), "sum", ("i",))
    >>> mark_parallel(Root((Loop("i", 9, TRUE, frozenset({(0, "i")}), (Compute(op),)),))).children[0].parallel
    False
    """
    out = []
    for node in root.children:
        if isinstance(node, Loop):
            ok = all(node.bound(op.id) in op.out_indices for op in ops_under(node))
            node = replace(node, parallel=ok)
        out.append(node)
    return Root(tuple(out))
