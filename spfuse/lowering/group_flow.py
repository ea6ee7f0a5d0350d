"""Which group makes each temporary and which groups read it: the data flow
the passes merging groups (:mod:`.summed_spmms`, :mod:`.epilogues`) check."""
from __future__ import annotations

__all__ = ["producers_and_readers"]


def producers_and_readers(groups) -> tuple[dict[str, int], dict[str, set[int]]]:
    """``(producer, readers)``: per name, the position of the group that
    outputs it, and the positions of the groups whose operations read it.

    >>> from types import SimpleNamespace as G
    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> a = G(outputs=("T",), ops=(UnitOp(0, "T", ("i",), None, (Ref("x", ("i",)),)),))
    >>> b = G(outputs=("y",), ops=(UnitOp(1, "y", ("i",), "*", (Ref("T", ("i",)), Ref("x", ("i",)))),))
    >>> producers_and_readers([a, b])
    ({'T': 0, 'y': 1}, {'x': {0, 1}, 'T': {1}})
    """
    producer = {out: n for n, g in enumerate(groups) for out in g.outputs}
    readers: dict[str, set[int]] = {}
    for n, g in enumerate(groups):
        for op in g.ops:
            for a in op.refs:
                readers.setdefault(a.name, set()).add(n)
    return producer, readers
