"""``spfuse.dask.compile`` / ``evaluate``: a program as a Dask graph of fused block kernels.

Planning happens once, on the client:

1. every operand is brought into the graph -- sparse dask arrays as they
   are (row blocks), dense dask arrays rechunked to match along partitioned
   indices (a broadcast one keeps its chunks: each block task reads them all
   and :func:`spfuse.dask.blocks.joined` joins them once per worker), numpy arrays and
   scipy matrices wrapped (one chunk when broadcast, row blocks when
   partitioned);
2. :mod:`spfuse.dask.classify` decides which indices are distributed,
   contracted-and-distributed or local;
3. one task per *cell* of the block grid runs the single-node kernel
   (:func:`spfuse.dask.blocks.run_cell`); cells whose share of an
   annihilating sparse operand is empty are not emitted (the block pairs
   that do not touch);
4. results partitioned like their rows are assembled from the cells'
   outputs; results summed over a partitioned index are tree-reduced with
   :func:`dask.array.reduction` (``concatenate=False``) and spfuse's own
   combine (:func:`spfuse.dask.combine.add_partials`).

Dask's ``einsum``/``tensordot``/``matmul`` are never used: on sparse chunks
they concatenate along the contracted index.

>>> import numpy as np, scipy.sparse as sp, spfuse, spfuse.dask
>>> A = sp.random_array((40, 30), density=0.2, format="csr", rng=0)
>>> x = np.arange(30.0)
>>> y = spfuse.dask.evaluate("y[i] = A[i,j] * x[j]", A=spfuse.dask.from_scipy(A, chunks=3), x=x)
>>> y.chunks[0] == spfuse.dask.from_scipy(A, chunks=3).chunks[0], bool(np.allclose(y.compute(scheduler="sync"), A @ x))
(True, True)
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.highlevelgraph import HighLevelGraph

import spfuse
from spfuse.dask import classify as C
from spfuse.dask import placement as P
from spfuse.dask.blocks import CellRunner, CellSlices, pick, run_cell
from spfuse.dask.combine import add_partials
from spfuse.dask.gather import distinct_columns, gather_spec, run_gathered, take_rows
from spfuse.dask.partition import block_info, from_scipy, from_tensor, with_meta
from spfuse.errors import OperandTypeError, ProgramError, UnsupportedError
from spfuse.frontend.ast import iter_accesses
from spfuse.frontend.check import result_shapes
from spfuse.frontend.parser import parse_program
from spfuse.tensor import Tensor

__all__ = ["DaskKernel", "compile", "evaluate", "Layout", "STRATEGIES"]

#: How a sum over a partitioned index is computed: ``"reduce"`` (one partial
#: per touching block pair, tree-summed), ``"gather"`` (each row block fetches
#: the rows of the other operands it touches; no partials), ``"auto"`` (the
#: communication cost model picks).
STRATEGIES = ("auto", "reduce", "gather")

#: The memory cap on broadcasting a dense factor when no cluster is known (with
#: one, a quarter of the smallest worker's ``memory_limit``): a chunked dense
#: dask factor over the cap always partitions the indices it is chunked
#: along; under it, the communication cost model chooses
#: (:func:`spfuse.dask.cost.choose_factors`).
BROADCAST_BYTES = 64 * 2**20


def _is_sparse_block(obj: Any) -> bool:
    return sp.issparse(obj) or isinstance(obj, Tensor) and not obj.format.is_dense


def _is_sparse_array(arr: da.Array) -> bool:
    """Sparse chunks: by its meta, or by block metadata spfuse holds (a persisted
    array of Tensor slabs comes back from Dask with a numpy meta)."""
    return _is_sparse_block(arr._meta) or block_info(arr, compute=False) is not None


@dataclass(frozen=True)
class OperandLayout:
    """How one operand enters the graph: the dask array, its dimension per
    axis, and which axes are blocked by that dimension (the others are cut
    inside the task)."""

    name: str
    array: Any
    sparse: bool
    dims: tuple
    blocked: tuple


@dataclass(frozen=True)
class Layout:
    """The client-side plan of one call: operands, dimensions and their
    boundaries, the classification, and the cells emitted."""

    operands: tuple
    bounds: Mapping[Any, np.ndarray]
    classification: C.Classification
    cells: tuple
    grid: tuple  # the dimensions, in cell-coordinate order
    factors: tuple = ()  # a FactorChoice per chunked dense factor: broadcast or partition, and why
    nworkers: int = 1  # the workers the choices were made for
    broadcast_cap: int = BROADCAST_BYTES  # bytes: larger dense factors are never broadcast

    def block_range(self, dim, block: int) -> tuple[int, int]:
        """The coordinate range ``[lo, hi)`` of ``block`` of dimension ``dim``.

        >>> import numpy as np
        >>> Layout((), {"d": np.array([0, 3, 7])}, None, (), ("d",)).block_range("d", 1)
        (3, 7)
        """
        b = self.bounds[dim]
        return int(b[block]), int(b[block + 1])


def _bounds_of(chunks: tuple) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(chunks))).astype(np.int64)


class DaskKernel:
    """A program planned for Dask: call it with operands to get lazy dask arrays.

    Each dense dask factor chunked along an index is either broadcast (one
    chunk, shipped once per worker) or partitions that index; the
    communication cost model picks the cheaper for ``nworkers`` workers
    (default: the current ``distributed`` client's, else 1) on ``network``
    (:class:`spfuse.dask.cost.Network`); ``broadcast_bytes`` is the memory
    cap -- a larger factor is never broadcast (default: a quarter of the
    smallest worker's ``memory_limit``, else :data:`BROADCAST_BYTES`; 0:
    every chunked dense factor partitions); ``strategy``: see
    :data:`STRATEGIES`; ``split_every``: fan-in of the reduction tree; ``prune``: skip cells
    whose share of an annihilating sparse operand is empty (needs each
    sparse operand's block metadata, see :func:`spfuse.dask.block_info`).

    ``pin``: run each task on the worker the communication cost model places
    it on, so a call moves the bytes :meth:`cost` predicts (see
    :mod:`spfuse.dask.placement`).  ``None`` (default): pin when a
    ``distributed`` client is current at call time (loose pins: a task whose
    worker has left runs elsewhere); ``False``: Dask places every task;
    ``True``: pin, and fail without a current client.

    >>> import spfuse.dask
    >>> spfuse.dask.compile("y[i] = A[i,j] * x[j]")
    <spfuse.dask.DaskKernel 'y[i] = A[i,j] * x[j]' fusion='auto'>
    """

    def __init__(self, program: str, *, fusion: str = "auto", out_format: str | None = None,
                 num_threads: int | None = 1, split_every: int = 4, prune: bool = True,
                 strategy: str = "auto", broadcast_bytes: int | None = None, nworkers: int | None = None,
                 network: Any = None, pin: bool | None = None):
        from spfuse.dask.cost import Network
        if pin not in (None, True, False):
            raise ValueError(f"pin must be None, True or False, got {pin!r}")
        if nworkers is not None and (not isinstance(nworkers, int) or nworkers < 1):
            raise ValueError(f"nworkers must be an int >= 1, got {nworkers!r}")
        if broadcast_bytes is not None and (not isinstance(broadcast_bytes, int) or broadcast_bytes < 0):
            raise ValueError(f"broadcast_bytes must be an int >= 0 or None, got {broadcast_bytes!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
        if not isinstance(program, str):
            raise TypeError(f"program must be a str, got {type(program).__name__}")
        if not isinstance(split_every, int) or split_every < 2:
            raise ValueError(f"split_every must be an int >= 2, got {split_every!r}")
        self.text = program
        self.program = parse_program(program)
        self.kernel = spfuse.compile(program, fusion=fusion, out_format=out_format, num_threads=num_threads)
        self.split_every = split_every
        self.prune = prune
        self.strategy = strategy
        self.broadcast_bytes = broadcast_bytes
        self.nworkers = nworkers
        self.network = network or Network()
        self.pin = pin
        # Dask estimates a task's duration from earlier tasks of the same name prefix: one per program
        digest = hashlib.sha1(program.encode()).hexdigest()[:6]
        self._prefix = "".join("ghijklmnopqrstuv"[int(c, 16)] for c in digest)
        self._decisions: dict = {}  # broadcast-or-partition decisions already made
        self._meta_cache: dict = {}  # result metas per operand kinds

    def __repr__(self) -> str:
        return f"<spfuse.dask.DaskKernel {self.text!r} fusion={self.kernel.fusion!r}>"

    # -- planning ---------------------------------------------------------------------------
    def layout(self, **operands: Any) -> Layout:
        """The client-side plan for these operands (no task runs, except a
        one-off metadata pass for sparse dask arrays spfuse did not build).

        >>> import numpy as np, scipy.sparse as sp, spfuse.dask
        >>> A = spfuse.dask.from_scipy(sp.csr_array(np.eye(4)), chunks=2)
        >>> lay = spfuse.dask.compile("y[i] = A[i,j] * x[j]").layout(A=A, x=np.ones(4))
        >>> len(lay.cells), [(o.name, o.sparse) for o in lay.operands]
        (2, [('A', True), ('x', False)])
        """
        program = self.program
        missing = [n for n in program.inputs if n not in operands]
        extra = sorted(set(operands) - set(program.inputs))
        if missing or extra:
            raise ProgramError(f"the program reads {', '.join(program.inputs)}; "
                               + (f"missing {', '.join(missing)}" if missing else f"unused {', '.join(extra)}"))
        shapes = {}
        for name in program.inputs:
            obj = operands[name]
            if not (isinstance(obj, (da.Array, np.ndarray, Tensor)) or sp.issparse(obj)):
                raise OperandTypeError(f"operand {name!r}: expected a dask array, numpy array, scipy.sparse "
                                       f"matrix or spfuse.Tensor, got {type(obj).__name__}")
            if isinstance(obj, da.Array) and any(np.isnan(c) for cs in obj.chunks for c in cs):
                raise ValueError(f"operand {name!r} has unknown chunk sizes; call compute_chunk_sizes() first")
            shapes[name] = tuple(obj.shape)
        result_shapes(program, shapes)  # shape/arity checks with spfuse's messages
        nworkers, cap = self._resources()
        chunked = [n for n in program.inputs if isinstance(operands[n], da.Array)
                   and not _is_sparse_array(operands[n]) and any(len(c) > 1 for c in operands[n].chunks)]
        over = [n for n in chunked if operands[n].nbytes > cap]
        under = [n for n in chunked if n not in over]
        # a factor whose chunked axes all follow a sparse operand's row blocks has no choice to make
        # (compared between all partitioning and all broadcast: factors chunked along one index decide together)
        everyone = self._partition_dims(operands, frozenset())
        no_one = self._partition_dims(operands, frozenset(under))
        candidates = [n for n in under if everyone[n] != no_one[n]]
        choices: tuple = ()
        broadcast = set(under) - set(candidates)
        if candidates:
            # the decision depends on the dask operands (names are content tokens), the others'
            # shapes and the cluster: one planned call's decision serves the next ones
            key = (nworkers, cap, self.network, tuple(
                (n, o.name, o.chunks) if isinstance(o, da.Array) else (n, type(o).__name__, tuple(o.shape))
                for n, o in sorted(operands.items())))
            if key not in self._decisions:
                from spfuse.dask.cost import choose_factors
                if len(self._decisions) >= 64:
                    self._decisions.pop(next(iter(self._decisions)))
                self._decisions[key] = choose_factors(self, operands, candidates, nworkers, self.network)
            chosen, choices = self._decisions[key]
            broadcast |= chosen
        from spfuse.dask.cost import FactorChoice
        choices += tuple(FactorChoice(n, int(operands[n].nbytes), "partition", None, None,
                                      f"over the broadcast memory cap of {cap} B") for n in over)
        lay = self._plan(operands, frozenset(broadcast))
        return dataclasses.replace(lay, factors=choices, nworkers=nworkers, broadcast_cap=cap)

    def _resources(self) -> tuple[int, int]:
        """``(workers, broadcast cap in bytes)``: as given, else from the current ``distributed`` client."""
        nworkers, cap = self.nworkers, self.broadcast_bytes
        if nworkers is None or cap is None:
            client = _current_client()
            workers = client.scheduler_info(n_workers=-1)["workers"] if client is not None else {}
            if nworkers is None:
                nworkers = max(len(workers), 1)
            if cap is None:
                limits = [w.get("memory_limit") or 0 for w in workers.values()]
                cap = min(limits) // 4 if limits and all(limits) else BROADCAST_BYTES
        return nworkers, cap

    def _plan(self, operands: Mapping[str, Any], broadcast: frozenset) -> Layout:
        """The layout with the chunked dense factors in ``broadcast`` broadcast and the others partitioning."""
        program = self.program
        dims = self._partition_dims(operands, broadcast)
        ops = tuple(self._conform(name, operands[name], dims[name]) for name in program.inputs)
        cls = C.classify(program, {o.name: o.dims for o in ops})
        bounds = {d: _bounds_of(d[2]) for o in ops for d in o.dims if d is not None}
        grid = tuple(bounds)
        cells = self._cells(ops, cls, bounds, grid)
        return Layout(ops, bounds, cls, cells, grid)

    def explain(self, **operands: Any) -> str:
        """What a call on these operands will do: partitions, strategy, cells, and each dense
        factor's broadcast-or-partition choice with the cost model's numbers.

        >>> import numpy as np, scipy.sparse as sp, dask.array as da, spfuse.dask as sfd
        >>> A = sfd.from_scipy(sp.random_array((400, 400), density=0.05, format="csr", rng=0), chunks=(100,) * 4)
        >>> print(sfd.compile("C[i,k] = A[i,j] * B[j,k]", nworkers=4).explain(
        ...     A=A, B=da.ones((400, 8), chunks=(100, 8))))  # doctest: +ELLIPSIS
        spfuse.dask plan for 'C[i,k] = A[i,j] * B[j,k]' on 4 worker(s), strategy reduce, 4 cell task(s)
          A: sparse, row blocks (100, 100, 100, 100)
          B: dense, broadcast
          B (0.02 MiB): broadcast -- broadcast 0.09 MiB, ... ms; partition 0.23 MiB, ... ms (cheaper on 4 worker(s))
        """
        lay = self.layout(**operands)
        lines = [f"spfuse.dask plan for {self.text!r} on {lay.nworkers} worker(s), strategy "
                 f"{self.choose_strategy(lay)}, {len(lay.cells)} cell task(s)"]
        for o in lay.operands:
            parts = [f"axis {a} in blocks {d[2]}" for a, d in enumerate(o.dims) if d is not None]
            if o.sparse and o.dims and o.dims[0] is not None:
                parts[0] = f"row blocks {o.dims[0][2]}"
            lines.append(f"  {o.name}: {'sparse' if o.sparse else 'dense'}, {', '.join(parts) or 'broadcast'}")
        lines += [f"  {f}" for f in lay.factors]
        return "\n".join(lines)

    def _partition_dims(self, operands: Mapping[str, Any], broadcast: frozenset) -> dict[str, list]:
        """The dimension label of every input axis (``None``: not partitioned).

        Axes joined by an index in some statement (through temporaries too)
        form one class; a class is a dimension when one of its axes is
        chunked.  Sparse row blocks are authoritative (two must agree); a
        class with only dense chunked axes takes the first one's chunks."""
        parent: dict = {}

        def find(node):
            while parent.setdefault(node, node) != node:
                node = parent[node]
            return node

        for stmt in self.program.statements:
            groups: dict[str, list] = {}
            for acc in [*iter_accesses(stmt.value), stmt.target]:
                for axis, idx in enumerate(acc.indices):
                    groups.setdefault(idx, []).append((acc.name, axis))
            for nodes in groups.values():
                for node in nodes[1:]:
                    parent[find(node)] = find(nodes[0])
        sources: dict = {}
        for name in self.program.inputs:
            obj = operands[name]
            if not isinstance(obj, da.Array):
                continue
            sparse = _is_sparse_array(obj)
            if not sparse and name in broadcast:
                continue  # a broadcast factor is not a partition of its indices
            for axis, cs in enumerate(obj.chunks):
                if len(cs) > 1:
                    rank = 0 if sparse and axis == 0 else 1
                    sources.setdefault(find((name, axis)), []).append((rank, name, tuple(cs)))
        labels = {}
        for k, (root, found) in enumerate(sources.items()):
            found.sort(key=lambda f: f[0])
            sparse_chunks = {cs for rank, _, cs in found if rank == 0}
            if len(sparse_chunks) > 1:
                names = ", ".join(n for rank, n, _ in found if rank == 0)
                raise ValueError(f"sparse operands {names} are joined by an index but have different row "
                                 "chunks; build them with the same chunks")
            labels[root] = ("dim", k, found[0][2])
        return {name: [labels.get(find((name, axis))) for axis in range(len(operands[name].shape))]
                for name in self.program.inputs}

    def _conform(self, name: str, obj: Any, dims: list) -> OperandLayout:
        """``obj`` as a dask array whose partitioned axes follow their dimension."""
        if isinstance(obj, da.Array):
            sparse = _is_sparse_array(obj)
            info = block_info(obj, compute=False) if sparse else None
            if info is not None and info.meta is not None and not _is_sparse_block(obj._meta):
                # a copy: the caller's array is not touched
                obj = with_meta(da.Array(obj.dask, obj.name, obj.chunks, meta=obj._meta), info.meta)
            if sparse and obj.ndim and any(len(c) > 1 for c in obj.chunks[1:]):
                raise ValueError(f"sparse operand {name!r} must be chunked along axis 0 only (row blocks), "
                                 f"got chunks {obj.chunks}; use {name}.rechunk({{1: -1}})")
            arr = obj
            if not sparse:
                # an axis no dimension partitions keeps its chunks: every task reads all of
                # them (each worker fetches the ones it lacks once) and joins them itself
                target = tuple(d[2] if d is not None else cs for d, cs in zip(dims, obj.chunks, strict=True))
                if target != obj.chunks:
                    arr = obj.rechunk(target)
        elif sp.issparse(obj) or (isinstance(obj, Tensor) and not obj.format.is_dense):
            sparse = True
            rows = dims[0][2] if dims and dims[0] is not None else (obj.shape[0],) if obj.ndim else ()
            arr = (from_scipy(obj, chunks=rows) if sp.issparse(obj) else from_tensor(obj, chunks=rows))
        else:
            sparse = False
            dense = obj.todense() if isinstance(obj, Tensor) else np.asarray(obj)
            chunks = tuple(d[2] if d is not None else -1 for d in dims)
            # the chunking is part of the name: the same array cut two ways must not share block keys
            arr = da.from_array(dense, chunks=chunks,
                                name=f"spfuse-dense-{name}-{dask.base.tokenize(dense, chunks)}")
        blocked = tuple(d is not None and len(cs) == len(d[2]) for d, cs in zip(dims, arr.chunks, strict=True))
        return OperandLayout(name, arr, sparse, tuple(dims), blocked)

    def _cells(self, ops, cls: C.Classification, bounds, grid) -> tuple:
        """The cells of the block grid that some result needs, minus pruned ones."""
        used: set = set()
        for lay in cls.results.values():
            used.update(d for d in lay.out_dims if d is not None)
            used.update(lay.contracted_dims)
        ranges = [range(len(bounds[d]) - 1) if d in used else range(1) for d in grid]
        cells = list(itertools.product(*ranges))
        if not (self.prune and len(cls.results) == 1):
            return tuple(cells)
        (rname, lay), = cls.results.items()
        if not lay.contracted_dims:
            return tuple(cells)
        stmt = C.statement_of(self.program, rname)
        killers = [o for o in ops if o.sparse and C.annihilated_by(stmt.value, o.name)]
        if not killers:
            return tuple(cells)
        empty = [self._empty_shares(o, bounds, grid) for o in killers]
        keep = [c for c in cells if not any(e(c) for e in empty)]
        # every output block keeps at least one cell (its zero result has the right shape)
        out_pos = [grid.index(d) for d in lay.out_dims if d is not None]
        have = {tuple(c[p] for p in out_pos) for c in keep}
        for c in cells:
            key = tuple(c[p] for p in out_pos)
            if key not in have:
                keep.append(c)
                have.add(key)
        return tuple(sorted(keep))

    @staticmethod
    def _empty_shares(o: OperandLayout, bounds, grid):
        """A predicate: does a cell get no stored entry of sparse operand ``o``?"""
        info = block_info(o.array)
        nb0 = len(o.array.chunks[0]) if o.array.ndim else 1
        touched = {}
        for axis, (d, blk) in enumerate(zip(o.dims, o.blocked, strict=True)):
            if d is not None and not blk:
                if axis == 0:
                    return lambda cell: False  # rows cut in-task: no per-block metadata for the cut
                touched[axis] = [info.touched(b, axis, bounds[d]) for b in range(nb0)]

        def empty(cell) -> bool:
            b0 = cell[grid.index(o.dims[0])] if o.dims and o.dims[0] is not None else 0
            if info.nnz[b0] == 0:
                return True
            return any(not touched[axis][b0][cell[grid.index(o.dims[axis])]] for axis in touched)
        return empty

    # -- graph --------------------------------------------------------------------------------
    def __call__(self, **operands: Any):
        """The program's result(s) as lazy dask arrays (a dict when several)."""
        lay = self.layout(**operands)
        strategy = self.choose_strategy(lay)
        client = self._pin_client()
        if client is not None and len(lay.classification.results) == 1:  # the model covers one result
            return self._pinned_build(client, lay, strategy, strict=False)[0]
        return self._build(lay, strategy)[0]

    def _pin_client(self) -> Any:
        """The client whose workers a call pins its tasks to (``None``: no pins)."""
        if self.pin is False:
            return None
        client = _current_client(synchronous=True)
        if client is None and self.pin:
            raise ValueError("pin=True needs a current synchronous distributed client (distributed.Client(...), "
                             "or inside client.as_current())")
        return client

    def cost(self, *, nworkers: int | None = None, placement: Mapping | None = None, finalize: bool = True,
             strategy: str | None = None, **operands: Any):
        """The communication cost model's prediction for a call (see :func:`spfuse.dask.cost`).

        With a current ``distributed`` client, ``nworkers`` (default) is its
        worker count and ``placement`` (default) where its workers hold the
        operands' blocks: the bytes a call made now moves (its tasks are
        pinned where this prediction places them).  Without one: 2 workers,
        row block ``b`` on worker ``b mod 2``.  ``strategy``: predict this one
        instead of the one a call would choose.

        >>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
        >>> A = sfd.from_scipy(sp.csr_array(np.eye(8)), chunks=2)
        >>> sfd.compile("y[i] = A[i,j] * x[j]").cost(A=A, x=np.ones(8)).per_worker[0]  # y's second half
        32
        """
        from spfuse.dask.cost import placement_of, predict_bytes
        lay = self.layout(**operands)
        client = _current_client(synchronous=True) if self.pin is not False else None
        if client is not None:
            addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
            nworkers = nworkers or len(addrs)
            if placement is None:
                placement = placement_of(client, [o.array for o in lay.operands], addrs)
        return predict_bytes(self, lay, strategy or self.choose_strategy(lay), placement, nworkers or 2, finalize)

    def pinned(self, client: Any, **operands: Any) -> tuple:
        """The call's result(s) with every task pinned to the worker the cost model
        places it on, and that prediction (a :class:`~spfuse.dask.cost.CommCost`).

        Dask places a task by worker occupancy as well as data and steals work
        from busy workers, so which bytes move varies from run to run;
        pinned (``workers=`` annotations, ``allow_other_workers=False``; the
        scheduler does not steal restricted tasks) the moves are the ones
        predicted.  Operand blocks already on the cluster (``persist``) are
        read where ``client.who_has`` says they are.  A plain call on a
        current client pins the same way but loosely (see ``pin``); this one
        is strict: a task whose worker has left waits for it.  The results
        keep their pins through Dask's graph optimisation
        (:class:`~spfuse.dask.placement.PlacedArray`).

        >>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
        >>> from distributed import Client, LocalCluster
        >>> A = sfd.from_scipy(sp.random_array((40, 40), density=0.2, format="csr", rng=0), chunks=4)
        >>> with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \\
        ...         Client(cluster, set_as_default=False) as client:
        ...     y, predicted = sfd.compile("y[i] = A[i,j] * x[j]").pinned(client, A=A, x=np.ones(40))
        ...     bool(np.allclose(client.compute(y).result(), A.compute() @ np.ones(40)))
        True
        """
        lay = self.layout(**operands)
        return self._pinned_build(client, lay, self.choose_strategy(lay), strict=True)

    def _pinned_build(self, client: Any, lay: Layout, strategy: str, strict: bool) -> tuple:
        """The results of ``lay`` pinned where the cost model places each task on
        ``client``'s workers, and that prediction."""
        from spfuse.dask.cost import placement_of, predict_bytes
        built = self._build(lay, strategy)
        addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
        placement = placement_of(client, [o.array for o in lay.operands], addrs)
        predicted = predict_bytes(self, lay, strategy, placement, len(addrs), built=built)
        where = {key: addrs[w] for key, w in predicted.placed.items()}
        result = built[0]
        if isinstance(result, dict):
            return {r: P.pin(a, where, strict=strict) for r, a in result.items()}, predicted
        return P.pin(result, where, strict=strict), predicted

    def _build(self, lay: Layout, strategy: str):
        """The result arrays of ``lay`` under ``strategy``, and the results' metas."""
        metas = self._metas(lay)
        results = tuple(lay.classification.results)
        runner = CellRunner(self.kernel, tuple(o.name for o in lay.operands), results,
                            tuple(metas[r] for r in results))
        token = dask.base.tokenize(runner, [(o.array.name, o.dims) for o in lay.operands], lay.cells, strategy)
        runner_key = f"spfuse-plan-{token}"
        cell_name = f"spfuse-block-{self._prefix}-{token}"
        layer: dict = {runner_key: runner}
        if strategy == "gather":
            lay = self._gather_cells(lay, layer, runner_key, cell_name, token)
        else:
            for cell in lay.cells:
                keys, cuts = self._cell_inputs(lay, cell)
                layer[(cell_name,) + cell] = (run_cell, runner_key, CellSlices(tuple(cuts))) + tuple(keys)
        graph = HighLevelGraph.from_collections(cell_name, layer, dependencies=[o.array for o in lay.operands])
        shapes = result_shapes(self.program, {o.name: o.array.shape for o in lay.operands})
        out = {r: self._assemble(r, graph, cell_name, lay, metas[r], shapes[r], len(results) > 1)
               for r in results}
        return (out[results[0]] if len(results) == 1 else out), metas

    def choose_strategy(self, lay: Layout, nworkers: int | None = None) -> str:
        """``"reduce"`` (partials + tree sum) or ``"gather"`` (fetch touched rows) for this call.

        ``strategy="auto"`` asks the communication cost model which is faster
        on ``nworkers`` workers (default: the ones ``lay`` was planned for, at
        least 2 -- on one nothing moves) by :meth:`~spfuse.dask.cost.Network.seconds`:
        the busiest worker's receive time plus the scheduler's time per task
        (ties: fewer bytes); gather needs the shape
        :func:`~spfuse.dask.gather.gather_spec` accepts.

        >>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
        >>> k = sfd.compile("y[i] = A[i,j] * x[j]")
        >>> k.choose_strategy(k.layout(A=sfd.from_scipy(sp.csr_array(np.eye(4)), chunks=2), x=np.ones(4)))
        'reduce'
        """
        spec = gather_spec(lay)
        if self.strategy == "gather" and spec is None:
            raise UnsupportedError("strategy='gather' needs one result summed over one partitioned index that "
                                   "one sparse operand carries on a non-leading axis")
        if self.strategy != "auto" or spec is None:
            return self.strategy if spec is not None else "reduce"
        from spfuse.dask.cost import predict_bytes
        w = max(nworkers or lay.nworkers, 2)
        predicted = {s: predict_bytes(self, lay, s, None, w) for s in ("reduce", "gather")}
        return min(predicted, key=lambda s: (self.network.seconds(predicted[s]), predicted[s].total))

    @staticmethod
    def _cell_inputs(lay: Layout, cell: tuple, skip_dim=None):
        """The block key of every operand for ``cell``, and the cuts its task applies.

        An operand chunked along an axis that no dimension partitions (a
        broadcast factor given in chunks) is passed as the nested list of all
        its chunk keys along such axes (:func:`spfuse.dask.blocks.joined`
        assembles it in the task): Dask then moves each chunk to a worker at
        most once, and nothing merges the chunks and ships the merge again."""
        keys, cuts = [], []
        for o in lay.operands:
            blk, cut = [], []
            for axis, (d, blocked) in enumerate(zip(o.dims, o.blocked, strict=True)):
                b = cell[lay.grid.index(d)] if d is not None else 0
                if blocked:
                    blk.append([b])
                else:
                    blk.append(range(o.array.numblocks[axis]) if d is None else [0])
                    if d is not None and d != skip_dim:
                        cut.append((axis,) + lay.block_range(d, b))
            keys.append(_chunk_keys(o.array.name, blk))
            cuts.append(tuple(cut))
        return keys, cuts

    def touched_blocks(self, lay: Layout) -> dict:
        """For the gather strategy: per sparse block of the defining operand, the
        blocks of the contracted dimension it touches (from block metadata).

        >>> import numpy as np, scipy.sparse as sp, dask.array as da, spfuse.dask as sfd
        >>> k = sfd.compile("y[i] = A[i,j] * x[j]", broadcast_bytes=0)
        >>> lay = k.layout(A=sfd.from_scipy(sp.csr_array(np.eye(4)), chunks=2), x=da.ones(4, chunks=2))
        >>> {b: t.tolist() for b, t in k.touched_blocks(lay).items()}
        {0: [0], 1: [1]}
        """
        d, xname, axis, _ = gather_spec(lay)
        x = next(o for o in lay.operands if o.name == xname)
        info = block_info(x.array)
        nb = len(x.array.chunks[0])
        return {b: np.flatnonzero(info.touched(b, axis, lay.bounds[d])) for b in range(nb)}

    def _gather_cells(self, lay: Layout, layer: dict, runner_key: str, cell_name: str, token: str) -> Layout:
        """Emit the gather strategy's tasks; returns the layout the results are assembled from."""
        d, xname, xaxis, others = gather_spec(lay)
        x = next(o for o in lay.operands if o.name == xname)
        touched = self.touched_blocks(lay)
        dpos = lay.grid.index(d)
        cells = sorted({c[:dpos] + (0,) + c[dpos + 1:] for c in lay.cells})
        for cell in cells:
            keys, cuts = self._cell_inputs(lay, cell, skip_dim=d)
            xkey = keys[[o.name for o in lay.operands].index(xname)]
            ukey = (f"spfuse-cols-{token}",) + xkey[1:]
            layer.setdefault(ukey, (distinct_columns, xkey, xaxis))
            xb = xkey[1] if x.dims[0] is not None else 0
            blocks = touched[xb].tolist() or [0]
            args, gathered = [], []
            for o, key in zip(lay.operands, keys, strict=True):
                if o.name == xname:
                    args.append(key)
                    gathered.append((xaxis, 0))
                elif o.name in others:
                    oaxis = others[o.name]
                    for c in blocks:
                        okey = key[:1 + oaxis] + (c,) + key[2 + oaxis:]
                        pkey = (f"spfuse-rows-{token}",) + okey + xkey[1:]
                        layer[pkey] = (take_rows, okey, ukey, oaxis, lay.block_range(d, c)[0])
                        args.append(pkey)
                    gathered.append((oaxis, len(blocks)))
                else:
                    args.append(key)
                    gathered.append(None)
            layer[(cell_name,) + cell] = (run_gathered, runner_key, CellSlices(tuple(cuts)), tuple(gathered),
                                          ukey) + tuple(args)
        results = {n: dataclasses.replace(r, contracted_dims=()) for n, r in lay.classification.results.items()}
        return dataclasses.replace(lay, cells=tuple(cells),
                                   classification=dataclasses.replace(lay.classification, results=results))

    def _metas(self, lay: Layout) -> dict:
        """Each result's meta (the kind every block is returned in).

        The single-node engine's result kind can depend on the data (a tiny
        N-d problem may come back as a Tensor where a large one comes back
        dense), so one kind is fixed here, on the client: the kernel runs
        once on 1-extent operands with every entry stored; a scipy result
        stays scipy (scipy in, scipy out); a Tensor result whose planned
        format ends in a dense level (rows of a dense matrix, as MTTKRP's)
        becomes numpy; anything else keeps the kind the kernel gave."""
        kinds = tuple((o.name, type(o.array._meta).__name__, str(o.array.dtype), o.array.ndim,
                       getattr(o.array._meta, "format", None)) for o in lay.operands)
        if kinds not in self._meta_cache:
            self._meta_cache[kinds] = self._compute_metas(lay)
        return self._meta_cache[kinds]

    def _compute_metas(self, lay: Layout) -> dict:
        tiny = {}
        for o in lay.operands:
            meta = o.array._meta
            shape = (1,) * o.array.ndim
            if isinstance(meta, Tensor):
                tiny[o.name] = Tensor.from_coo(np.zeros((len(shape), 1), np.int64), np.ones(1, meta.dtype),
                                               shape, format=meta.format)
            elif sp.issparse(meta):
                tiny[o.name] = type(meta)(np.ones(shape, dtype=meta.dtype))
            else:
                tiny[o.name] = np.ones(shape, dtype=meta.dtype)
        out = self.kernel(**tiny)
        if len(lay.classification.results) == 1:
            out = {self.program.results[0]: out}
        plan = self.kernel.plans(**tiny)[self.kernel.fusion]
        metas = {}
        for r, v in out.items():
            decision = plan.formats.get(r) if hasattr(plan, "formats") else None
            if isinstance(v, Tensor) and decision is not None and decision.levels[-1:] == ("dense",):
                v = v.todense()
            if isinstance(v, Tensor):
                metas[r] = Tensor.from_coo(np.zeros((v.ndim, 0), np.int64), np.zeros(0, v.dtype),
                                           (0,) * v.ndim, format=v.format)
            elif sp.issparse(v):
                metas[r] = type(v)((0, 0), dtype=v.dtype)
            else:
                v = np.asarray(v)
                metas[r] = np.empty((0,) * v.ndim, dtype=v.dtype)
        return metas

    def _assemble(self, rname: str, graph, cell_name: str, lay: Layout, meta, shape, multi: bool):
        """The dask array of one result: blocks picked from the cells, or partials reduced."""
        rl = lay.classification.results[rname]
        out_axes = [(lay.grid.index(d) if d is not None else None) for d in rl.out_dims]
        con_axes = [lay.grid.index(d) for d in rl.contracted_dims]
        chunks = tuple(d[2] if d is not None else (s,) for d, s in zip(rl.out_dims, shape, strict=True))
        name = f"spfuse-{rname}-{cell_name.rsplit('-', 1)[1]}"
        ncon = [len(lay.bounds[d]) - 1 for d in rl.contracted_dims]
        extra = (np.empty((0,) * (len(shape) + len(con_axes)), dtype=meta.dtype),) if con_axes else ()
        layer = {}
        for cell in lay.cells:
            if any(cell[p] != 0 for p in range(len(lay.grid))
                   if p not in out_axes and p not in con_axes):
                continue  # a dimension this result does not use: block 0 stands for all
            okey = tuple(cell[p] if p is not None else 0 for p in out_axes)
            ckey = tuple(cell[p] for p in con_axes)
            src = (cell_name,) + cell
            layer[(name,) + okey + ckey] = (pick, src, rname) if multi else (_identity, src)
        if con_axes:  # cells not emitted hold no contribution
            for okey in itertools.product(*[range(len(c)) for c in chunks]):
                for ckey in itertools.product(*[range(n) for n in ncon]):
                    layer.setdefault((name,) + okey + ckey, None)
        # declared dependency on the cell layer: culling keeps the cells this result reads
        g = HighLevelGraph({**graph.layers, name: layer}, {**graph.dependencies, name: {cell_name}})
        if not con_axes:
            return with_meta(da.Array(g, name, chunks, meta=meta), meta)
        partials = da.Array(g, name, chunks + tuple((1,) * n for n in ncon), meta=extra[0])
        axes = tuple(range(len(shape), len(shape) + len(con_axes)))
        total = da.reduction(partials, _identity, add_partials, axis=axes, keepdims=False,
                            combine=add_partials, concatenate=False, split_every=self.split_every,
                            dtype=meta.dtype, meta=meta, name=f"spfuse-sum-{rname}")
        return with_meta(total, meta)


def _current_client(synchronous: bool = False) -> Any:
    """The current ``distributed`` client, or ``None`` (no client, or no distributed);
    ``synchronous``: ``None`` for an asynchronous one too (its queries return awaitables)."""
    try:
        from distributed import default_client
        client = default_client()
    except (ImportError, ValueError):
        return None
    return None if synchronous and client.asynchronous else client


def _chunk_keys(name: str, per_axis: list) -> Any:
    """The key of the one chunk ``per_axis`` (chunk indices per axis) selects;
    when it selects several, their keys as a nested list one level per axis
    (what :func:`numpy.block` joins).

    >>> _chunk_keys("x", [[1], [0]]), _chunk_keys("x", [range(2), [0]])
    (('x', 1, 0), [[('x', 0, 0)], [('x', 1, 0)]])
    """
    def nest(prefix: tuple) -> Any:
        if len(prefix) == len(per_axis):
            return (name,) + prefix
        return [nest(prefix + (c,)) for c in per_axis[len(prefix)]]
    if all(len(c) == 1 for c in per_axis):
        return (name,) + tuple(c[0] for c in per_axis)
    return nest(())


def _identity(block: Any, axis: Any = None, keepdims: Any = None) -> Any:
    return block


def compile(program: str, /, *, fusion: str = "auto", out_format: str | None = None,
            num_threads: int | None = 1, split_every: int = 4, prune: bool = True,
            strategy: str = "auto", broadcast_bytes: int | None = None, nworkers: int | None = None,
            network: Any = None, pin: bool | None = None) -> DaskKernel:
    """Plan ``program`` for Dask once; call the result with operands.

    ``num_threads`` is the spfuse thread count *per task* (default 1: one
    Dask worker thread per core is the parallelism).

    >>> import numpy as np, scipy.sparse as sp, spfuse.dask
    >>> k = spfuse.dask.compile("C[i,k] = A[i,j] * B[j,k]")
    >>> A = spfuse.dask.from_scipy(sp.csr_array(np.eye(4)), chunks=2)
    >>> k(A=A, B=np.ones((4, 2))).compute(scheduler="sync")
    array([[1., 1.],
           [1., 1.],
           [1., 1.],
           [1., 1.]])
    """
    return DaskKernel(program, fusion=fusion, out_format=out_format, num_threads=num_threads,
                      split_every=split_every, prune=prune, strategy=strategy, broadcast_bytes=broadcast_bytes,
                      nworkers=nworkers, network=network, pin=pin)


def evaluate(program: str, /, *, fusion: str = "auto", out_format: str | None = None,
             num_threads: int | None = 1, split_every: int = 4, prune: bool = True, strategy: str = "auto",
             broadcast_bytes: int | None = None, nworkers: int | None = None, network: Any = None,
             pin: bool | None = None, **operands: Any):
    """Evaluate ``program`` on dask (and numpy/scipy) operands; returns lazy dask array(s).

    Sparse matrices are dask arrays of CSR row blocks
    (:func:`spfuse.dask.from_scipy`, or ``dask.array.from_array(A,
    chunks=(rows, n), asarray=False)``); N-d sparse tensors are dask arrays
    of :class:`spfuse.Tensor` slabs along mode 0 (:func:`spfuse.dask.from_tensor`).
    numpy operands and one-chunk dask arrays are broadcast (shipped once per
    worker); a dense dask array chunked along an axis is broadcast or
    partitions that index, whichever the cost model predicts cheaper (see
    :class:`DaskKernel` for ``nworkers``, ``network``, ``broadcast_bytes``, ``pin``).

    >>> import numpy as np, scipy.sparse as sp, spfuse.dask
    >>> A = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]))
    >>> y = spfuse.dask.evaluate("y[j] = A[i,j] * x[i]", A=spfuse.dask.from_scipy(A, chunks=(1, 2)),
    ...                          x=np.ones(3))
    >>> y.compute(scheduler="sync")
    array([4., 2.])
    """
    return compile(program, fusion=fusion, out_format=out_format, num_threads=num_threads,
                   split_every=split_every, prune=prune, strategy=strategy,
                   broadcast_bytes=broadcast_bytes, nworkers=nworkers, network=network, pin=pin)(**operands)
