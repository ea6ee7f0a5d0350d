"""One index tree per unit operation (ReACT 4.1.1)."""
from __future__ import annotations

from collections.abc import Mapping

from spfuse.ir.masks import TRUE, Mask
from spfuse.ir.tree import Compute, Loop, Root

__all__ = ["build_trees", "op_extents"]


def op_extents(op, shapes: Mapping[str, tuple]) -> dict[str, int | None]:
    """Extent of every index of ``op`` read off the shapes of its operands."""
    ext: dict[str, int | None] = {}
    refs = list(op.refs) + [type(op.refs[0])(op.out, op.out_indices)] if op.refs else []
    for ref in refs:
        shape = shapes.get(ref.name)
        if shape is None:
            continue
        for ix, n in zip(ref.indices, shape, strict=True):
            if ext.get(ix) is None:
                ext[ix] = n
    for ix in op.indices:
        ext.setdefault(ix, None)
    return ext


def build_trees(ops, orders: Mapping[int, tuple[str, ...]], masks: Mapping[int, Mapping[str, Mask]],
                shapes: Mapping[str, tuple]) -> Root:
    """A root whose children are one perfectly nested loop chain per op, in program order.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> from spfuse.ir.tree import loop_shape
    >>> op = UnitOp(0, "y", ("i",), "*", (Ref("A", ("i", "j")), Ref("x", ("j",))), "sum", ("j",))
    >>> loop_shape(build_trees([op], {0: ("i", "j")}, {0: {}}, {"A": (2, 3)}))
    [('i', [('j', ['y'])])]
    """
    trees = []
    for op in ops:
        ext = op_extents(op, shapes)
        node: Compute | Loop = Compute(op)
        for ix in reversed(orders[op.id]):
            node = Loop(ix, ext[ix], masks[op.id].get(ix, TRUE), frozenset({(op.id, ix)}), (node,))
        trees.append(node)
    return Root(tuple(trees))
