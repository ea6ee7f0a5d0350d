"""Memory optimisation of temporaries (ReACT 4.4).

*Dimension reduction* (Algorithm 3): a temporary's dimensions bound by the
loops common to the paths of its definition and all its uses are dropped
(a generalised scalar replacement); a reset node at the start of the last
common loop re-initialises the smaller buffer when it is accumulated into
or only partly written.  *Sparsification*: a kept dimension whose every
reference iterates the same sparse mask is stored compressed, sharing that
pattern (SDDMM's ``T[j]`` becomes one value per stored entry of B's row).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from spfuse.ir.masks import TRUE, Mask
from spfuse.ir.tree import Loop, Reset, Root, paths_to_computes

__all__ = ["Temporary", "reduce_dimensions", "full_temporaries", "RESET_VALUE"]

RESET_VALUE = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), None: 0.0}


@dataclass(frozen=True)
class Temporary:
    """How a temporary is stored.

    ``dims``: its indices in the program (e.g. ``("i", "j")``);
    ``kept``: the ones still stored after dimension reduction;
    ``masks``: per kept dim, the shared sparse mask (compressed) or ``true``;
    ``reset_under``: index of the loop whose body starts with the reset.
    """

    name: str
    op_id: int
    dims: tuple[str, ...]
    kept: tuple[str, ...]
    masks: tuple[Mask, ...]
    extents: tuple[int | None, ...]
    reset_under: str | None = None

    @property
    def format(self) -> str:
        if not self.kept:
            return "scalar"
        return "(" + ",".join("dense" if m.is_true else f"compressed∈{m}" for m in self.masks) + ")"

    @property
    def shape_text(self) -> str:
        full = "×".join("?" if e is None else str(e) for e in self.extents) or "scalar"
        kept = "×".join("?" if e is None else str(e)
                        for d, e in zip(self.dims, self.extents, strict=True) if d in self.kept) or "scalar"
        return f"{self.name}[{','.join(self.dims)}] {full} → {self.name}[{','.join(self.kept)}] {kept}"


def full_temporaries(ops, temps: set[str], extents: Mapping[str, tuple]) -> dict[str, Temporary]:
    """Temporaries stored whole and dense (the library approach)."""
    out = {}
    for op in ops:
        if op.out in temps:
            out[op.out] = Temporary(op.out, op.id, op.out_indices, op.out_indices,
                                    (TRUE,) * len(op.out_indices), tuple(extents.get(op.out, ())))
    return out


def _common_prefix(paths):
    prefix = []
    for nodes in zip(*paths, strict=False):  # paths differ in length: the prefix is as long as the shortest
        if all(n is nodes[0] for n in nodes):
            prefix.append(nodes[0])
        else:
            break
    return prefix


def reduce_dimensions(root: Root, ops, temps: set[str], extents: Mapping[str, tuple]):
    """Algorithm 3 plus sparsification. Returns ``(new_root, {name: Temporary})``."""
    paths = paths_to_computes(root)
    users: dict[str, list] = {}
    for op in ops:
        for r in op.refs:
            if r.name in temps:
                users.setdefault(r.name, []).append(op)
    result: dict[str, Temporary] = {}
    resets: dict[int, list[Reset]] = {}  # id(loop) -> resets to prepend
    for op in ops:
        if op.out not in temps:
            continue
        uses = users.get(op.out, [])
        common = _common_prefix([paths[op.id]] + [paths[u.id] for u in uses])
        eliminated = {loop.bound(op.id) for loop in common} & set(op.out_indices)
        kept = tuple(ix for ix in op.out_indices if ix not in eliminated)
        masks = []
        for ix in kept:
            def_loop = next(lp for lp in paths[op.id] if lp.bound(op.id) == ix)
            mask = def_loop.mask
            d = op.out_indices.index(ix)
            for u in uses:
                for r in u.refs:
                    if r.name == op.out:
                        use_loop = next((lp for lp in paths[u.id] if lp.bound(u.id) == r.indices[d]), None)
                        if use_loop is None or use_loop.mask != mask:
                            mask = TRUE
            masks.append(mask)
        below = paths[op.id][len(common):]
        # Accumulated, or written only on a sparse subset: the reused buffer
        # must be cleared (lowering clears only the stored positions).
        partial = any(not lp.mask.is_true for lp in below)
        needs_reset = bool(common) and (op.reduction is not None or partial)
        last = common[-1] if common else None
        if needs_reset:
            resets.setdefault(id(last), []).append(Reset(op.out, RESET_VALUE[op.reduction], kept))
        result[op.out] = Temporary(op.out, op.id, op.out_indices, kept, tuple(masks),
                                   tuple(extents.get(op.out, ())),
                                   last.index if needs_reset and last is not None else None)

    def rebuild(node):
        if isinstance(node, Loop):
            kids = tuple(rebuild(c) for c in node.children)
            return replace(node, children=tuple(resets.get(id(node), [])) + kids)
        return node

    return Root(tuple(rebuild(c) for c in root.children)), result
