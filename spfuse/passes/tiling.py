"""Mixed sparse-dense tiling (Scorch Algorithm 2).

Only a *dense* loop that is not a parent of a sparse loop is tiled: tiling a
loop above a compressed level would re-walk that level once per tile.  The
tile keeps one row of every dense operand the loop streams, and the output
row, in the L1 data cache.
"""
from __future__ import annotations

from spfuse.ir.tree import paths_to_computes

__all__ = ["choose_tiles", "L1_BYTES", "MIN_TILED_EXTENT"]

L1_BYTES = 32 * 1024       # typical L1d; wheels must not assume the build machine's
# Shorter loops run whole.  Measured (``spfuse bench --tiling``, BENCHMARKS.md
# "Tiling"): on the 2-core EPYC VM the untiled SpMM row-axpy (one double
# accumulator over the whole row) was as fast as or faster than every tile
# for K = 64 .. 131072 -- the 256 tile this formula gives was 1.15-1.4x
# slower from K = 1024 up -- so tiling starts beyond the measured range.
MIN_TILED_EXTENT = 1 << 18


def choose_tiles(tree, ops, itemsize: int = 8) -> dict[int, dict[str, int]]:
    """Tile sizes per op and index (empty when nothing is worth tiling).

    A tile of ``t`` elements of each of the ``n`` dense accesses indexed by
    the loop, with several rows of the streamed operand in flight (prefetch),
    must fit in L1: ``t = L1 / (8 · n · itemsize)``, rounded down to a power
    of two -- 256 doubles for SpMM; its template kernel takes the tile as an argument.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> from spfuse.planner import plan_program
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (10**5, 10**5))
    >>> prog = parse_program("C[i,k] = A[i,j] * B[j,k]")
    >>> plan_program(prog, {"A": A, "B": TensorInfo.dense("B", (10**5, 1 << 18))}).tiles
    {0: {'k': 256}}
    >>> plan_program(prog, {"A": A, "B": TensorInfo.dense("B", (10**5, 4096))}).tiles  # measured: untiled is faster
    {}
    """
    paths = paths_to_computes(tree)
    tiles: dict[int, dict[str, int]] = {}
    for op in ops:
        path = paths.get(op.id, ())
        for depth, loop in enumerate(path):
            ix = loop.bound(op.id)
            if not loop.mask.is_true or any(not lp.mask.is_true for lp in path[depth + 1:]):
                continue  # sparse, or a parent of a sparse loop
            if loop.extent is None or loop.extent < MIN_TILED_EXTENT:
                continue
            streams = 1 + sum(1 for r in op.refs if ix in r.indices)
            t = L1_BYTES // (8 * streams * itemsize)
            t = 1 << (t.bit_length() - 1)
            if t < loop.extent:
                tiles.setdefault(op.id, {})[ix] = t
    return tiles
