"""Index trees (ReACT 4.1.1): loops as index nodes, statements as leaves.

Nodes are frozen dataclasses; passes build new trees instead of mutating.
A :class:`Loop` may *bind* the same loop to indices of several operations
after fusion: ``binds`` holds ``(op_id, index_name)`` pairs.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from spfuse.ir.masks import TRUE, Mask  # noqa: F401  (TRUE: used by the doctests)
from spfuse.ir.ops import UnitOp

__all__ = ["Compute", "Reset", "Loop", "Root", "Node", "render", "iter_nodes",
           "paths_to_computes", "loop_shape"]


@dataclass(frozen=True)
class Compute:
    """A compute node: one unit operation (the statement inside the loops)."""

    op: UnitOp

    def render(self) -> str:
        return f"S{self.op.id}: {self.op}"


@dataclass(frozen=True)
class Reset:
    """Reset a (dimension-reduced) temporary before it is accumulated again."""

    tensor: str
    value: float
    dims: tuple[str, ...] = ()

    def render(self) -> str:
        ref = f"{self.tensor}[{','.join(self.dims)}]" if self.dims else self.tensor
        return f"reset {ref} = {self.value:g}"


@dataclass(frozen=True)
class Loop:
    """An index node: one loop over ``index`` restricted to ``mask``."""

    index: str
    extent: int | None
    mask: Mask
    binds: frozenset
    children: tuple

    def render(self) -> str:
        space = "dense" if self.mask.is_true else f"∈ {self.mask}"
        ext = "?" if self.extent is None else self.extent
        return f"for {self.index} < {ext} ({space})"

    def bound(self, op_id: int) -> str | None:
        """The index name of op ``op_id`` this loop iterates, if any."""
        for o, ix in self.binds:
            if o == op_id:
                return ix
        return None


@dataclass(frozen=True)
class Root:
    """The program: an ordered list of top-level trees (after fusion, groups)."""

    children: tuple


Node = Compute | Reset | Loop


def render(root: Root) -> str:
    """ASCII drawing of an index tree.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> op = UnitOp(0, "y", ("i",), "*", (Ref("A", ("i", "j")), Ref("x", ("j",))), "sum", ("j",))
    >>> inner = Loop("j", 4, TRUE, frozenset({(0, "j")}), (Compute(op),))
    >>> t = Root((Loop("i", 3, TRUE, frozenset({(0, "i")}), (inner,)),))
    >>> print(render(t))
    root
    └── for i < 3 (dense)
        └── for j < 4 (dense)
            └── S0: y[i] = sum(j, A[i,j] * x[j])
    """
    lines = ["root"]

    def walk(nodes, prefix):
        for n, node in enumerate(nodes):
            last = n == len(nodes) - 1
            lines.append(prefix + ("└── " if last else "├── ") + node.render())
            if isinstance(node, Loop):
                walk(node.children, prefix + ("    " if last else "│   "))

    walk(root.children, "")
    return "\n".join(lines)


def iter_nodes(node) -> Iterator:
    """Pre-order walk over a node or root."""
    if not isinstance(node, Root):
        yield node
    for c in getattr(node, "children", ()):
        yield from iter_nodes(c)


def paths_to_computes(root: Root) -> dict[int, tuple[Loop, ...]]:
    """Map op id → the loops enclosing its compute node, outermost first."""
    out: dict[int, tuple[Loop, ...]] = {}

    def walk(nodes, path):
        for node in nodes:
            if isinstance(node, Compute):
                out[node.op.id] = path
            elif isinstance(node, Loop):
                walk(node.children, path + (node,))

    walk(root.children, ())
    return out


def loop_shape(node) -> object:
    """Structure of a tree with names only, for structural tests:
    loops become ``(index, [children])``, computes their output name, resets
    ``"reset T"``.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> op = UnitOp(0, "y", ("i",), None, (Ref("x", ("i",)),))
    >>> loop_shape(Root((Loop("i", 3, TRUE, frozenset(), (Compute(op),)),)))
    [('i', ['y'])]
    """
    if isinstance(node, Root):
        return [loop_shape(c) for c in node.children]
    if isinstance(node, Loop):
        return (node.index, [loop_shape(c) for c in node.children])
    if isinstance(node, Compute):
        return node.op.out
    return f"reset {node.tensor}"


def with_children(loop: Loop, children) -> Loop:
    return replace(loop, children=tuple(children))
