"""Format inference for results and temporaries (Scorch Algorithm 3).

Each dimension of a result is stored dense when its iteration mask is
``true`` and compressed when a sparse mask restricts it; the level order
follows the loop order of the statement that writes it.  A compressed result
written under a reduction loop that encloses its compressed level (SpGEMM's
``j`` around ``k``) is *scattered into*: a dense workspace over the
compressed index collects each row before it is compacted (the workspace
transformation, seed 004).  Temporaries keep the storage memory optimisation
chose (dense, or compressed sharing a mask).

A result scattered into with *no* output loop above its compressed level
(``y[j] = A[i,j]*x[i]``, a CSC SpMV, column sums, ``AᵀX``) would need a
workspace as large as the result itself: the workspace *is* the result, so
it is stored dense (when it fits :data:`DENSE_SCATTER_MAX` elements) instead
of emitting one coordinate per product and sorting them afterwards.  So is
a result scattered row by row (``A[i,k] = X[i,j,k]*c[j]``) that is no larger
than :data:`DENSE_FILL` times the stored entries of the sparse inputs: it
will be mostly full, and a dense array is smaller than the coordinate
stream.  Lowering stores every result the way this pass decides.
"""
from __future__ import annotations

from dataclasses import dataclass

from spfuse.ir.tree import paths_to_computes

__all__ = ["FormatDecision", "infer_formats", "NAMED", "DENSE_SCATTER_MAX"]

#: Largest result (elements) stored dense because it is scattered into.
DENSE_SCATTER_MAX = 1 << 25
#: A row-wise scattered result is stored dense up to this many elements per
#: stored input entry.
DENSE_FILL = 4

NAMED = {
    ("dense", "dense"): "dense", ("dense", "compressed"): "csr", ("compressed", "compressed"): "dcsr",
}


@dataclass(frozen=True)
class FormatDecision:
    """Storage chosen for one result: levels in loop order, and why."""

    name: str
    levels: tuple[str, ...]
    mode_order: tuple[int, ...]
    workspace: str | None
    reason: str

    @property
    def format_name(self) -> str:
        if all(lv == "dense" for lv in self.levels):
            return "dense"
        if len(self.levels) == 2:
            base = NAMED.get(self.levels, "/".join(self.levels))
            return base if self.mode_order == (0, 1) else {"csr": "csc", "dcsr": "dcsc"}.get(base, base)
        if all(lv == "compressed" for lv in self.levels):
            return "csf"
        return "(" + ",".join(self.levels) + ")"


def infer_formats(tree, ops, results, shapes=None, stored: int = 0) -> dict[str, FormatDecision]:
    """Decide the storage of every result of the planned ``tree``.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> csr = lambda n: TensorInfo(n, 2, ("dense", "compressed"), (0, 1), (5, 5))
    >>> p = plan_program(parse_program("C[i,k] = A[i,j] * B[j,k]"), {"A": csr("A"), "B": csr("B")})
    >>> d = p.formats["C"]; d.format_name, d.workspace
    ('csr', 'dense workspace over k per i (scattered under the reduction over j)')
    """
    paths = paths_to_computes(tree)
    out: dict[str, FormatDecision] = {}
    for op in ops:
        if op.out not in results:
            continue
        path = paths[op.id]
        by_index = {lp.bound(op.id): (depth, lp) for depth, lp in enumerate(path)}
        dims = sorted(range(len(op.out_indices)), key=lambda d: by_index[op.out_indices[d]][0])
        levels = tuple("dense" if by_index[op.out_indices[d]][1].mask.is_true else "compressed" for d in dims)
        workspace = None
        whole_scatter = row_scatter = False
        for d in dims:
            depth, loop = by_index[op.out_indices[d]]
            if loop.mask.is_true:
                continue
            scatter = [lp.bound(op.id) for lp in path[:depth] if lp.bound(op.id) in op.reduced]
            if scatter:
                outer = [op.out_indices[e] for e in dims if by_index[op.out_indices[e]][0] < depth]
                whole_scatter = whole_scatter or not outer
                row_scatter = True
                workspace = (f"dense workspace over {op.out_indices[d]}"
                             + (f" per {','.join(outer)}" if outer else "")
                             + f" (scattered under the reduction over {','.join(scatter)})")
        sparse = [op.out_indices[d] for d, lv in zip(dims, levels, strict=True) if lv == "compressed"]
        reason = ("every index iterates densely" if not sparse else
                  f"{', '.join(sparse)} iterate{'s' if len(sparse) == 1 else ''} a sparse mask")
        shape = (shapes or {}).get(op.out)
        if row_scatter and shape is not None and None not in shape and scattered_dense(
                _size(shape), whole_scatter, stored):
            levels, workspace = ("dense",) * len(levels), None
            reason = (f"scattered into as a whole under the reduction over "
                      f"{','.join(op.reduced)}: the dense workspace is the result" if whole_scatter else
                      f"scattered into row by row, and no larger than {DENSE_FILL}x the {stored} stored "
                      "input entries: stored dense")
        out[op.out] = FormatDecision(op.out, levels, tuple(dims), workspace, reason)
    return out


def scattered_dense(size: int, whole: bool, stored: int) -> bool:
    """Is a result of ``size`` elements, scattered into under a reduction,
    stored dense -- its dense workspace is the result?  When scattered as a
    whole (``whole``: no loop over its indices outside the reduction) or
    row by row while no larger than :data:`DENSE_FILL` times the ``stored``
    input entries; never past :data:`DENSE_SCATTER_MAX`.  The loop-order
    cost model asks the same question (a dense scatter pays no workspace).

    >>> scattered_dense(20000 * 32, True, 0), scattered_dense(10**6, False, 1000)
    (True, False)
    """
    return size <= DENSE_SCATTER_MAX and (whole or size <= DENSE_FILL * stored)


def _size(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n
