"""The communication cost model: bytes each worker receives, predicted without executing.

The model walks the graph a planned call builds (no task runs) with a
predicted size for every key:

* operand blocks: sparse ones from their block metadata (stored entries ×
  value + index bytes, plus the row pointer), dense ones from their chunk
  shape;
* the gather strategy's per-block column sets (8 bytes per *distinct*
  column a block touches) and the rows they fetch (touched rows × row bytes);
* block results and partials: dense ones from their shape; sparse ones from
  an upper bound on their stored entries -- the pattern of the sparse
  operand sharing the result's indices (SDDMM), else stored entries of the
  row block × the mean row length of the other sparse operand (SpGEMM),
  capped by the dense size;
* anything else (identity, pick): the size of its input.

Placement follows Dask's locality rule: operand blocks sit where they were
put (``placement``, e.g. ``client.who_has`` after ``persist``) or, if not
given, row block ``b`` on worker ``b mod W`` and broadcast operands on
worker 0; a task runs on the worker holding most of its input bytes (ties:
lower worker); each input not there is moved once per worker -- a
broadcast factor's chunks too, since every block task reads them all.

That is the placement a call made with a current ``distributed`` client
pins its tasks to (:mod:`spfuse.dask.placement`; strictly with
:meth:`~spfuse.dask.DaskKernel.pinned`), and then the bytes are exact.
Without pins (``pin=False``) Dask's own placement decides, at run time: a
task goes to the holder of one of its inputs with the least
``occupancy + missing bytes / bandwidth``, where occupancy comes from the
durations Dask measured for earlier tasks of the same name prefix and the
bandwidth is its running estimate; work stealing then moves queued tasks,
and the active memory manager drops replicas every few seconds.  None of
that is known before running; told where Dask ran each task
(``predict_bytes(..., tasks_on=)``), the model gives the measured bytes.

:func:`project` turns a prediction into a runtime estimate for ``W``
workers from bandwidth, latency and per-task scheduler cost.

>>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
>>> A = sp.random_array((400, 400), density=0.01, format="csr", rng=0)
>>> k = sfd.compile("C[i,k] = A[i,j] * B[j,k]")
>>> c = k.cost(nworkers=2, A=sfd.from_scipy(A, chunks=(100,) * 4), B=np.ones((400, 8)))
>>> 0 <= c.per_worker[1] - 400 * 8 * 8 < 2048  # B broadcast to worker 1 once (+ the plan)
True
>>> c.per_worker[0] == 2 * 100 * 8 * 8  # worker 1's result blocks join worker 0's
True
"""
from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spfuse.dask.blocks import run_cell
from spfuse.dask.combine import add_partials
from spfuse.dask.gather import distinct_columns, run_gathered, take_rows
from spfuse.dask.partition import block_info
from spfuse.errors import UnsupportedError

__all__ = ["CommCost", "Network", "FactorChoice", "choose_factors", "cost", "predict_bytes", "project",
           "measured_transfers", "transfer_marks", "placement_of"]

_SPARSE_ENTRY = 12  # a float64 value + an int32 coordinate
_INDPTR = 4
_OVERHEAD = 64


@dataclass
class CommCost:
    """Predicted traffic of one planned call.

    ``per_worker[w]``: bytes worker ``w`` receives; ``transfers[w]``: how
    many keys it receives; ``tasks``: tasks in the graph; ``strategy``.
    """

    strategy: str
    nworkers: int
    per_worker: dict = field(default_factory=dict)
    transfers: dict = field(default_factory=dict)
    tasks: int = 0
    moved: list = field(default_factory=list, repr=False)  # (key, to worker, bytes)
    placed: dict = field(default_factory=dict, repr=False)  # task key -> worker it runs on

    @property
    def total(self) -> int:
        """Bytes moved between workers in all.

        >>> CommCost("reduce", 2, {0: 5, 1: 7}).total
        12
        """
        return int(sum(self.per_worker.values()))


@dataclass(frozen=True)
class Network:
    """What moving data and scheduling tasks cost: the parameters of :func:`project`.

    ``bandwidth`` (bytes/s a worker receives), ``latency`` (seconds per
    transfer), ``task_overhead`` (seconds of the one scheduler per task).

    >>> c = CommCost("reduce", 2, {0: 0, 1: 1_250_000}, {0: 0, 1: 2}, tasks=10)
    >>> round(Network().seconds(c) * 1e3, 3)  # 1 ms receiving + 2 latencies + 10 tasks
    3.1
    """

    bandwidth: float = 1.25e9
    latency: float = 50e-6
    task_overhead: float = 200e-6

    def seconds(self, c: CommCost) -> float:
        """Predicted communication + scheduling seconds of ``c`` (no compute): the
        busiest worker's receive time plus the scheduler's time for every task."""
        busiest = max((c.per_worker[w] / self.bandwidth + c.transfers.get(w, 0) * self.latency
                       for w in c.per_worker), default=0.0)
        return busiest + c.tasks * self.task_overhead


@dataclass(frozen=True)
class FactorChoice:
    """Why a dense factor is broadcast or partitioned.

    ``broadcast`` / ``partition``: ``(bytes moved in all, predicted seconds)``
    of the cheapest plan with this factor broadcast / partitioned (``None``:
    not allowed -- over the memory cap, or no plan applies).
    """

    name: str
    nbytes: int
    choice: str
    broadcast: tuple | None
    partition: tuple | None
    reason: str

    def __str__(self) -> str:
        def fmt(x):
            return "n/a" if x is None else f"{x[0] / 2**20:.2f} MiB, {x[1] * 1e3:.2f} ms"
        return (f"{self.name} ({self.nbytes / 2**20:.2f} MiB): {self.choice} -- broadcast {fmt(self.broadcast)}; "
                f"partition {fmt(self.partition)} ({self.reason})")


def choose_factors(kernel: Any, operands: Mapping, candidates: list, nworkers: int, network: Network) -> tuple:
    """Which of the ``candidates`` (chunked dense factors under the memory cap) to broadcast.

    Every combination (greedy flips past three factors) is planned and
    predicted by :func:`predict_bytes` on ``nworkers`` workers, with the
    strategy ``kernel`` would choose for it; the cheapest by
    :meth:`Network.seconds` wins (ties: fewer bytes, then more broadcast).
    Returns ``(names to broadcast, FactorChoice per candidate)``.

    >>> import numpy as np, scipy.sparse as sp, dask.array as da, spfuse.dask as sfd
    >>> A = sfd.from_scipy(sp.random_array((400, 400), density=0.05, format="csr", rng=0), chunks=(100,) * 4)
    >>> k = sfd.compile("C[i,k] = A[i,j] * B[j,k]")
    >>> ops = dict(A=A, B=da.ones((400, 8), chunks=(100, 8)))
    >>> chosen, why = choose_factors(k, ops, ["B"], 4, Network())
    >>> chosen, why[0].choice  # every row block touches every block of B: ship B once per worker
    ({'B'}, 'broadcast')
    """
    import itertools
    seen: dict = {}

    def predicted(broadcast: frozenset):
        if broadcast not in seen:
            try:
                lay = kernel._plan(operands, broadcast)
                c = predict_bytes(kernel, lay, kernel.choose_strategy(lay, nworkers), None, nworkers)
                seen[broadcast] = (c.total, network.seconds(c))
            except UnsupportedError:
                seen[broadcast] = None
        return seen[broadcast]

    names = list(candidates)
    if len(names) <= 3:
        combos = [frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)]
    else:  # greedy: start from all broadcast, partition one factor at a time while it pays
        current = frozenset(names)
        for n in names:
            flip = current - {n}
            a, b = predicted(current), predicted(flip)
            if b is not None and (a is None or b[1] < a[1]):
                current = flip
        combos = list(seen)
    scored = [(c, predicted(c)) for c in combos]
    scored = [(c, p) for c, p in scored if p is not None]
    if not scored:  # the model does not apply (several results): broadcast what fits
        return set(names), tuple(FactorChoice(n, int(operands[n].nbytes), "broadcast", None, None,
                                              "no cost model for this program") for n in names)
    best = min(scored, key=lambda cp: (cp[1][1], cp[1][0], -len(cp[0])))[0]
    choices = []
    for n in names:
        bc = [p for c, p in scored if n in c]
        pa = [p for c, p in scored if n not in c]
        b = min(bc, key=lambda p: p[1], default=None)
        q = min(pa, key=lambda p: p[1], default=None)
        choice = "broadcast" if n in best else "partition"
        nbytes = int(operands[n].nbytes)
        choices.append(FactorChoice(n, nbytes, choice, b, q, f"cheaper on {nworkers} worker(s)"))
    return set(best), tuple(choices)


def _func_of(task: Any):
    """The callable of a graph value (legacy tuple or Task), unwrapped from partials."""
    func = task[0] if isinstance(task, tuple) and task and callable(task[0]) else getattr(task, "func", None)
    while isinstance(func, functools.partial):
        func = func.func
    return func


def _deps(graph: Mapping, key) -> set:
    from dask.core import get_dependencies
    return set(get_dependencies(graph, key))


class _Sizes:
    """Predicted bytes of every key of a planned call's graph."""

    def __init__(self, kernel: Any, lay: Any, graph: Mapping, metas: Mapping):
        self.lay, self.graph, self.metas = lay, graph, metas
        self.kernel = kernel
        self.sizes: dict = {}
        self.operand_of: dict = {}
        for o in lay.operands:
            info = block_info(o.array) if o.sparse else None
            for idx in np.ndindex(*o.array.numblocks):
                key = (o.array.name,) + idx
                shape = tuple(c[i] for c, i in zip(o.array.chunks, idx, strict=True))
                if o.sparse and info.nbytes:  # what Dask's sizeof counts: what a transfer is logged as
                    self.sizes[key] = info.nbytes[idx[0]]
                elif o.sparse:
                    self.sizes[key] = info.nnz[idx[0]] * _SPARSE_ENTRY + (shape[0] + 1) * _INDPTR + _OVERHEAD
                else:
                    self.sizes[key] = int(np.prod(shape)) * o.array.dtype.itemsize
                self.operand_of[key] = (o, idx)
        self.rows_touched: dict = {}

    def of(self, key) -> int:
        if key in self.sizes:
            return self.sizes[key]
        task = self.graph[key]
        func = _func_of(task)
        deps = sorted(_deps(self.graph, key), key=str)
        if func is None:  # a literal (the plan, or None for a skipped block)
            size = 0 if task is None else len(pickle.dumps(task))
        elif func is distinct_columns:
            size = 8 * self._distinct(deps) + _OVERHEAD
        elif func is take_rows:
            size = self._rows(key, deps)
        elif func in (run_cell, run_gathered):
            size = self._block_result(key, deps)
        elif func is add_partials:
            parts = [self.of(d) for d in deps]
            size = min(self._cap(key), sum(parts)) if parts else 0
        else:
            size = max((self.of(d) for d in deps), default=0)
        self.sizes[key] = size
        return size

    def _sparse_operand(self, deps):
        for d in deps:
            if d in self.operand_of and self.operand_of[d][0].sparse:
                return self.operand_of[d]
        return None

    def _distinct(self, deps) -> int:
        o, idx = self._sparse_operand(deps)
        info = block_info(o.array)
        return sum(len(c) for c in info.columns[idx[0]])

    def _rows(self, key, deps) -> int:
        """Touched rows of one operand block: |distinct columns of the sparse block ∩ this block| rows."""
        okey = next(d for d in deps if d in self.operand_of)
        o, idx = self.operand_of[okey]
        ukey = next(d for d in deps if d not in self.operand_of)
        xo, xidx = self._sparse_operand(_deps(self.graph, ukey))
        axis = self.graph[key][3] if isinstance(self.graph[key], tuple) else 0
        d = o.dims[axis]
        lo, hi = self.lay.block_range(d, idx[axis])
        cols = block_info(xo.array).columns[xidx[0]][next(a for a, dd in enumerate(xo.dims) if dd == d) - 1]
        n = int(np.count_nonzero((cols >= lo) & (cols < hi)))
        block = self.sizes[okey]
        return int(block * n / max(hi - lo, 1)) + _OVERHEAD

    def _cap(self, key) -> int:
        """Dense size of the result block a key belongs to."""
        meta = next(iter(self.metas.values()))
        shape = self._result_shape
        rows, other = self._result_rows(key), int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if isinstance(meta, np.ndarray):
            return rows * other * meta.dtype.itemsize
        return rows * other * _SPARSE_ENTRY + (rows + 1) * _INDPTR

    @functools.cached_property
    def _result_shape(self) -> tuple:
        from spfuse.frontend.check import result_shapes
        shapes = result_shapes(self.kernel.program, {o.name: o.array.shape for o in self.lay.operands})
        return shapes[self.kernel.program.results[0]]

    def _result_rows(self, key) -> int:
        """Rows of the result block ``key`` computes (a cell, a partial or a sum)."""
        rl = next(iter(self.lay.classification.results.values()))
        shape = self._result_shape
        if not shape:
            return 1
        d = rl.out_dims[0]
        if d is None:
            return shape[0]
        b = key[1 + self.lay.grid.index(d)] if key[0].startswith("spfuse-block") else key[1]
        lo, hi = self.lay.block_range(d, b)
        return hi - lo

    def _block_result(self, key, deps) -> int:
        meta = next(iter(self.metas.values()))
        shape = self._result_shape
        rows = self._result_rows(key)
        other = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        if isinstance(meta, np.ndarray):
            return rows * other * meta.dtype.itemsize
        sparse = [self.operand_of[d] for d in deps if d in self.operand_of and self.operand_of[d][0].sparse]
        if not sparse:
            return rows * other * _SPARSE_ENTRY
        target = set(self.kernel.program.statements[-1].target.indices)
        o, idx = sparse[0]
        nnz = block_info(o.array).nnz[idx[0]]
        if len(sparse) > 1 and set(o.dims) != target:
            b, bidx = sparse[1]
            binfo = block_info(b.array)
            nnz *= binfo.nnz[bidx[0]] / max(b.array.chunks[0][bidx[0]], 1)
        return int(min(nnz, rows * other) * _SPARSE_ENTRY + (rows + 1) * _INDPTR + _OVERHEAD)


#: Workers holding at least ``1 - _TIE`` of the most input bytes any worker
#: holds are equally good places for a task (the less loaded one wins).
_TIE = 0.1
_WORK = (run_cell, run_gathered, add_partials, take_rows, distinct_columns)


def _default_placement(lay: Any, nworkers: int) -> dict:
    """Row block ``b`` of a partitioned operand on worker ``b mod W``; broadcast ones on worker 0."""
    where = {}
    for o in lay.operands:
        for idx in np.ndindex(*o.array.numblocks):
            where[(o.array.name,) + idx] = idx[0] % nworkers if o.array.numblocks and o.array.numblocks[0] > 1 \
                else 0
    return where


def predict_bytes(kernel: Any, lay: Any, strategy: str, placement: Mapping | None = None,
                  nworkers: int = 2, finalize: bool = True, built: tuple | None = None,
                  tasks_on: Mapping | None = None) -> CommCost:
    """Simulate the graph of ``kernel`` on layout ``lay`` with ``strategy`` (no task runs).

    >>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
    >>> k = sfd.compile("y[i] = A[i,j] * x[j]")
    >>> lay = k.layout(A=sfd.from_scipy(sp.csr_array(np.eye(4)), chunks=2), x=np.ones(4))
    >>> c = predict_bytes(k, lay, "reduce", finalize=False)
    >>> c.per_worker[0], c.per_worker[1] - 4 * 8 < 2048  # worker 1 fetches x (and the plan) once
    (0, True)

    ``placement``: key -> worker index (or a set of them: replicas) of the
    operand blocks (default: see the module docstring).  ``finalize``: count the move of the result
    blocks to the one worker that joins them (what ``compute()`` does; not
    ``persist()``).  ``built``: the ``(results, metas)`` of ``kernel._build``
    when the graph is already built (its keys then get ``CommCost.placed``).
    ``tasks_on``: task key -> worker index for tasks whose worker is known
    (where Dask ran them, from its task stream): those are not placed by the
    rule below, so the bytes of a run are predicted from its real placement.
    Programs with one result only.

    A task is placed on the worker holding most of its input bytes; workers
    within :data:`_TIE` of the most are equally good, and the one with the
    least work placed so far (input bytes of block, gather and combine
    tasks) takes it -- Dask balances by occupancy the same way, and
    :meth:`~spfuse.dask.DaskKernel.pinned` makes the placement binding.
    """
    if len(lay.classification.results) != 1:
        raise UnsupportedError("the communication cost model handles programs with one result")
    results, metas = built if built is not None else kernel._build(lay, strategy)
    arrays = list(results.values()) if isinstance(results, dict) else [results]
    graph = {}
    for a in arrays:
        graph.update(dict(a.__dask_graph__()))
    sizes = _Sizes(kernel, lay, graph, metas)
    where = dict(_default_placement(lay, nworkers))
    if placement:
        where.update({k: v for k, v in placement.items() if k in where})
    out = CommCost(strategy, nworkers, {w: 0 for w in range(nworkers)}, {w: 0 for w in range(nworkers)})
    # a placement may name several workers: replicas Dask keeps after earlier transfers
    held = {k: set(w) if isinstance(w, (set, frozenset, tuple, list)) else {w} for k, w in where.items()}
    out.placed.update({k: min(h) for k, h in held.items()})
    order = _topological(graph, set(where))
    # a key that most tasks read (a broadcast factor, the plan) ends up on every
    # worker anyway: it does not decide where a task runs
    dependents: dict = {}
    for key in order:
        for d in _deps(graph, key):
            dependents[d] = dependents.get(d, 0) + 1
    ncells = sum(1 for k in order if _func_of(graph[k]) in (run_cell, run_gathered))
    shared = max(2, ncells // 2) - 1
    load = np.zeros(nworkers)
    for key in order:
        task = graph[key]
        deps = [d for d in _deps(graph, key)]
        if _func_of(task) is None and not deps:
            if key not in where:
                # a literal: travels with the task message to the worker that first needs it
                held[key] = set()
            continue
        out.tasks += 1
        by_worker = np.zeros(nworkers)
        local = [d for d in deps if dependents.get(d, 0) <= shared] or deps
        for d in local:
            for w in held.get(d, ()):
                by_worker[w] += sizes.of(d)
        near = np.flatnonzero(by_worker >= by_worker.max() * (1 - _TIE))
        w = int(near[np.argmin(load[near])]) if not tasks_on or key not in tasks_on else int(tasks_on[key])
        if _func_of(task) in _WORK:
            load[w] += sum(sizes.of(d) for d in local)
        out.placed[key] = w
        for d in deps:
            h = held.setdefault(d, set())
            if h and w not in h:
                out.per_worker[w] += sizes.of(d)
                out.transfers[w] += 1
                out.moved.append((d, w, sizes.of(d)))
            h.add(w)
        held[key] = {w}
    if finalize:  # compute() joins the result blocks in one task on one worker
        outputs = [k for a in arrays for k in _flat_keys(a)]
        by_worker = np.zeros(nworkers)
        for k in outputs:
            for w in held.get(k, ()):
                by_worker[w] += sizes.of(k)
        w = int(np.argmax(by_worker))
        for k in outputs:
            if w not in held.get(k, {w}):
                out.per_worker[w] += sizes.of(k)
                out.transfers[w] += 1
                out.moved.append((k, w, sizes.of(k)))
        out.tasks += 1
    return out


def _flat_keys(arr: Any) -> list:
    from dask.core import flatten
    return list(flatten(arr.__dask_keys__()))


def _topological(graph: Mapping, leaves: set) -> list:
    order, seen = [], set()

    def visit(k):
        stack = [(k, False)]
        while stack:
            key, done = stack.pop()
            if done:
                order.append(key)
                continue
            if key in seen:
                continue
            seen.add(key)
            stack.append((key, True))
            if key in leaves:
                continue
            for d in _deps(graph, key):
                if d in graph and d not in seen:
                    stack.append((d, False))
    for k in sorted(graph, key=str):
        visit(k)
    return [k for k in order if k not in leaves]


def cost(program: Any, /, *, nworkers: int | None = None, placement: Mapping | None = None,
         strategy: str | None = None, finalize: bool = True, **operands: Any) -> CommCost:
    """Predicted bytes each of ``nworkers`` workers receives for ``program`` on ``operands``.

    ``program`` is a program text or a :class:`~spfuse.dask.DaskKernel`;
    ``finalize``: include joining the result on one worker (``compute()``).
    With a current ``distributed`` client, ``nworkers`` and ``placement``
    default to its workers and where they hold the operands: the bytes a
    call made now moves (see :meth:`~spfuse.dask.DaskKernel.cost`); without
    one, 2 workers.  Nothing executes (sparse dask arrays not built by
    spfuse get their block metadata computed once).

    >>> import numpy as np, scipy.sparse as sp, spfuse.dask as sfd
    >>> A = sfd.from_scipy(sp.random_array((100, 100), density=0.05, format="csr", rng=0), chunks=(50, 50))
    >>> c = sfd.cost("y[i] = A[i,j] * x[j]", A=A, x=np.ones(100))
    >>> c.strategy, c.per_worker[0]  # worker 0 receives block 1's 50 results
    ('reduce', 400)
    """
    from spfuse.dask.kernel import DaskKernel
    kernel = program if isinstance(program, DaskKernel) else DaskKernel(program)
    return kernel.cost(nworkers=nworkers, placement=placement, finalize=finalize, strategy=strategy, **operands)


def project(bytes_per_worker: float, tasks: int, compute_seconds: float, *, workers: int = 64,
            bandwidth: float = Network.bandwidth, latency: float = Network.latency,
            transfers_per_worker: float = 0.0, task_overhead: float = Network.task_overhead) -> float:
    """Projected seconds of one call on ``workers`` nodes (weak scaling: fixed work per node).

    ``compute_seconds``: one node's kernel time on its share; then the
    receive time ``bytes / bandwidth + transfers × latency`` of the busiest
    node, plus the scheduler's per-task cost (the scheduler is one process:
    ``tasks × task_overhead`` in all, overlapped with nothing).

    >>> round(project(1.25e9, 64, 1.0, workers=64, task_overhead=0.0), 3)
    2.0
    """
    return compute_seconds + bytes_per_worker / bandwidth + transfers_per_worker * latency + tasks * task_overhead


def measured_transfers(client: Any, since: Mapping | None = None) -> dict:
    """Bytes each worker of ``client``'s cluster received from other workers (sizes
    as Dask's ``sizeof`` counts them), from every worker's ``transfer_incoming_log``.

    ``since``: what :func:`transfer_marks` returned before a computation --
    then only the transfers logged after it count.  (The log keeps the last
    ``distributed.admin.low-level-log-length`` transfers, 1000, so
    differences of totals go wrong on a busy cluster; its time stamps are
    shifted by the estimated scheduler delay, so a time cut is unreliable.)

    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster, set_as_default=False) as client:
    ...     list(measured_transfers(client, since=transfer_marks(client)).values())
    [0]
    """
    def incoming(dask_worker, since=since) -> int:
        log = list(dask_worker.transfer_incoming_log)
        mark = (since or {}).get(dask_worker.address)
        if mark is not None:
            after = [k for k, e in enumerate(log) if _mark_of(e) == mark]
            log = log[after[-1] + 1:] if after else log
        return int(sum(e["total"] for e in log))
    return client.run(incoming)


def _mark_of(entry: Mapping) -> tuple:
    return entry["start"], entry["stop"], entry["total"], entry["who"]


def transfer_marks(client: Any) -> dict:
    """Each worker's last logged transfer: pass as ``since`` to :func:`measured_transfers`.

    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster, set_as_default=False) as client:
    ...     list(transfer_marks(client).values())
    [None]
    """
    def last(dask_worker):
        log = dask_worker.transfer_incoming_log
        return _mark_of(log[-1]) if log else None
    return client.run(last)


def placement_of(client: Any, arrays: Any, addrs: Any = None) -> dict:
    """Block key -> indices (in sorted address order) of the workers holding it, for
    the blocks of ``arrays`` that ``client``'s cluster holds (``persist``-ed ones).

    >>> import dask.array as da
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster, set_as_default=False) as client:
    ...     x = client.persist(da.ones(4, chunks=2))
    ...     _ = client.gather(client.futures_of(x))
    ...     sorted(placement_of(client, [x]))  == sorted(x.__dask_keys__()), placement_of(client, [da.ones(2)])
    (True, {})
    """
    futures = client.futures_of(arrays)
    if not futures:
        return {}
    # ``addrs``: the workers' sorted addresses when the caller has them (one scheduler round trip less)
    addrs = list(addrs) if addrs is not None else sorted(client.scheduler_info(n_workers=-1)["workers"])
    return {k: frozenset(addrs.index(w) for w in ws) for k, ws in client.who_has(futures).items() if ws}
