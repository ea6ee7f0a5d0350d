"""``spfuse bench --suite dask``: spfuse.dask on LocalClusters of worker processes.

Four studies, each on ``LocalCluster(processes=True, threads_per_worker=1)``
with a ``memory_limit`` per worker, spfuse running one thread per task:

* **weak scaling** 1 -> 2 workers: the rows per worker stay fixed (twice the
  rows on two workers) for SpMM (dense factor row-partitioned, ``auto``
  strategy), SDDMM-SpMM (factors partitioned along the contracted index)
  and MTTKRP (tensor slabs along mode 0, small factors broadcast);
  efficiency = t(1 worker) / t(2 workers); each time is the median of
  ``repeat`` runs of ``persist`` + wait on operands already persisted,
  called as in normal use (the cluster's client current: tasks pinned);
* **memory**: every worker's peak resident set (``ru_maxrss``) after the
  scaling runs, and for the largest block task of each kernel the peak of
  numpy allocations (``tracemalloc``, which numpy reports to) while the
  block kernel runs in this process, against its input block plus the
  factor rows it reads;
* **communication**: bytes the cost model predicts (placement of the
  persisted operands read from the scheduler) against the bytes the
  workers' ``transfer_incoming_log`` records, per strategy, in normal use
  (a plain call on the current client: every task pinned where the model
  places it) and with Dask placing them (no pins);
* **peers**: the Dask route a user has today -- ``dask.array`` of pydata
  ``sparse.COO`` chunks with ``@`` (SpMM) and ``B * (C @ D)`` (SDDMM: no
  sampled product, so each block materialises its dense ``C @ D`` rows) --
  against spfuse.dask on the same 2-worker cluster, interleaved;

and a **projection** to 64 nodes from the cost model (weak scaling,
round-robin placement, results left distributed as ``persist`` leaves
them): one node's measured kernel time plus the busiest node's receive
time at ``bandwidth`` with ``latency`` per transfer, plus the scheduler's
per-task cost (optional plot).  The model's graph is built at 1/8 of the
rows per node (a 64-node matrix at full size would not fit the client) and
its bytes are scaled by 8: exact for partitioned operands, an
overestimate for broadcast ones of fixed size.

>>> rows = weak_scaling_inputs("SpMM", 1, 200, seed=0)
>>> sorted(rows[1]), rows[1]["A"].chunks[0]
(['A', 'B'], (100, 100))
"""
from __future__ import annotations

import functools
import gc
import logging
import os
import statistics
import sys
import time
import tracemalloc
from typing import TextIO

import numpy as np

from spfuse.bench import report, suite

__all__ = ["KERNELS", "SIZES", "weak_scaling_inputs", "run_dask_suite"]

KERNELS = {
    "SpMM": "C[i,k] = A[i,j] * B[j,k]",
    "SDDMM-SpMM": "A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]",
    "MTTKRP": "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]",
    "SDDMM": "A[i,j] = B[i,j] * (C[i,k] * D[k,j])",
}

#: rows per worker (and SDDMM's peer-comparison size) per --size
SIZES = {"small": dict(rows=40_000, peer_rows=8_000), "medium": dict(rows=200_000, peer_rows=16_000),
         "large": dict(rows=800_000, peer_rows=32_000)}

_BLOCKS_PER_WORKER = 2
_ROW_NNZ = 16
_RANK = 32


def weak_scaling_inputs(kernel: str, nworkers: int, rows_per_worker: int, seed: int = 0) -> tuple:
    """``(program, operands)`` for ``kernel`` on ``nworkers`` workers' worth of rows (dask arrays)."""
    import dask.array as da

    import spfuse.dask as sfd
    n = nworkers * rows_per_worker
    nblocks = nworkers * _BLOCKS_PER_WORKER
    rows = (n // nblocks,) * (nblocks - 1) + (n - (n // nblocks) * (nblocks - 1),)
    rng = np.random.default_rng(seed)
    if kernel == "MTTKRP":
        nnz = n * _ROW_NNZ
        X = suite.random_tensor((n, 256, 256), nnz, seed)
        return KERNELS[kernel], dict(X=sfd.from_tensor(X, chunks=rows), C=rng.random((256, _RANK)),
                                     D=rng.random((256, _RANK)))
    A = suite.powerlaw_matrix(n, n, _ROW_NNZ, seed)
    dA = sfd.from_scipy(A, chunks=rows)
    if kernel == "SpMM":
        return KERNELS[kernel], dict(A=dA, B=da.from_array(rng.random((n, _RANK)), chunks=(rows, _RANK)))
    if kernel == "SDDMM-SpMM":
        part = lambda k: da.from_array(rng.random((n, k)), chunks=(rows, k))  # noqa: E731
        return KERNELS[kernel], dict(B=dA, C=part(16), D=part(16), E=part(_RANK))
    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")


def _cluster(nworkers: int, memory_limit: str):
    import distributed
    cluster = distributed.LocalCluster(n_workers=nworkers, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit=memory_limit,
                                       silence_logs=logging.ERROR)
    return cluster, distributed.Client(cluster, set_as_default=False)


def _persist(client, operands: dict) -> dict:
    """Operands persisted on the cluster (block metadata carried over)."""
    import dask.array as da
    import distributed

    import spfuse.dask as sfd
    out = {}
    for name, v in operands.items():
        if isinstance(v, da.Array):
            p = client.persist(v)
            info = sfd.block_info(v, compute=False)
            if info is not None:
                sfd.partition._remember(p.name, info)
            out[name] = p
        else:
            out[name] = v
    with client.as_current():
        distributed.wait([v for v in out.values() if isinstance(v, da.Array)])
    return out


def _sort_seconds(_: int) -> float:
    rng = np.random.default_rng(0)
    x = rng.random(2_000_000)
    t = time.perf_counter()
    for _ in range(5):
        np.sort(x)
    return time.perf_counter() - t


def machine_efficiency() -> float:
    """What this machine gives two processes right now: one process's time on
    a fixed numpy loop over the slower of two running at once (1.0 = two free
    cores).  Weak-scaling efficiencies are bounded by it on a shared machine.

    >>> 0 < machine_efficiency() < 2
    True
    """
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        one = min(pool.map(_sort_seconds, [0, 1]))
    with ctx.Pool(2) as pool:
        two = max(pool.map(_sort_seconds, [0, 1]))
    return one / two


def _scheduler_tasks(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def _run_once(client, make) -> float:
    """Seconds to persist ``make()`` on the cluster; its keys are forgotten
    again before returning (the next run has the same keys)."""
    import distributed
    baseline = _scheduler_tasks(client)
    result = make()
    t0 = time.perf_counter()
    fut = client.persist(result)
    with client.as_current():
        distributed.wait(fut)
    t = time.perf_counter() - t0
    del fut, result
    deadline = time.perf_counter() + 30
    while _scheduler_tasks(client) > baseline and time.perf_counter() < deadline:
        time.sleep(0.02)
    return t


def _block_cpu(dask_worker=None) -> float:
    from spfuse.dask.blocks import block_cpu_seconds
    return block_cpu_seconds()


def _worker_cpu(dask_worker=None) -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _median_run(client, make, repeat: int) -> dict:
    """Median over ``repeat`` runs (after a warm-up: imports, plan caches on the
    workers) of the wall time and of what a loaded machine does not distort
    much: CPU seconds of all worker processes, tasks, bytes moved between workers."""
    import distributed

    import spfuse.dask as sfd
    _run_once(client, make)
    runs, spread = [], []
    addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
    for _ in range(repeat):
        cpu0, marks = sum(client.run(_worker_cpu).values()), sfd.transfer_marks(client)
        block0 = sum(client.run(_block_cpu).values())
        with distributed.get_task_stream(client) as stream:
            seconds = _run_once(client, make)
        runs.append(dict(seconds=seconds, worker_cpu=sum(client.run(_worker_cpu).values()) - cpu0,
                         block_cpu=sum(client.run(_block_cpu).values()) - block0,
                         moved=sum(sfd.measured_transfers(client, since=marks).values())))
        blocks = [r["worker"] for r in stream.data if str(r["key"][0]).startswith("spfuse-block")]
        spread.append(tuple(blocks.count(a) for a in addrs))
    # block tasks per worker over all timed runs: does Dask use every worker?
    return {**{k: statistics.median(r[k] for r in runs) for k in runs[0]},
            "blocks_per_worker": "/".join(str(sum(c)) for c in zip(*spread, strict=True))}


def _peak_rss(client) -> dict:
    def rss(dask_worker=None) -> int:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return client.run(rss)


def _task_memory(program: str, operands: dict) -> dict:
    """Peak numpy allocations of the largest block task, run here, against its inputs."""
    import spfuse.dask as sfd
    from spfuse.dask.blocks import run_cell
    from spfuse.dask.gather import run_gathered
    k = sfd.compile(program)
    lay = k.layout(**operands)
    strategy = k.choose_strategy(lay)
    arrays, _ = k._build(lay, strategy)
    graph = dict(arrays.__dask_graph__())
    from dask.core import get_dependencies
    from dask.local import get_sync
    from dask.sizeof import sizeof
    cells = [key for key, v in graph.items() if isinstance(v, tuple) and v and v[0] in (run_cell, run_gathered)]
    best = None
    for key in cells:
        deps = get_dependencies(graph, key)
        inputs = get_sync(graph, sorted(deps, key=str))
        vals = dict(zip(sorted(deps, key=str), inputs, strict=True))
        size = sum(sizeof(v) for d, v in vals.items() if not str(d).startswith("spfuse-plan"))
        if best is None or size > best[1]:
            best = (key, size, vals)
    key, size, vals = best
    task = graph[key]
    def resolve(a):  # a key's value; a nested list of chunk keys element-wise
        if isinstance(a, list):
            return [resolve(x) for x in a]
        return vals.get(a, a) if not isinstance(a, dict) else a
    args = [resolve(a) for a in task[1:]]
    gc.collect()
    tracemalloc.start()
    task[0](*args)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dict(strategy=strategy, inputs=size, peak=peak, ratio=peak / max(size, 1))


def _weak_scaling(kernels, rows: int, repeat: int, memory_limit: str, out: TextIO) -> list[dict]:
    import spfuse.dask as sfd
    results = []
    for nworkers in (1, 2):
        cluster, client = _cluster(nworkers, memory_limit)
        try:
            for kernel in kernels:
                program, ops = weak_scaling_inputs(kernel, nworkers, rows)
                ops = _persist(client, ops)
                k = sfd.compile(program, nworkers=nworkers)
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")  # before the runs
                with client.as_current():  # as a user calls it: the client is current, the tasks are pinned
                    run = _median_run(client, functools.partial(k, **ops), repeat)
                t = run["seconds"]
                lay = k.layout(**ops)
                strategy = k.choose_strategy(lay)
                if lay.factors:
                    strategy += " (" + ", ".join(f"{f.name} {f.choice}" for f in lay.factors) + ")"
                arr = k(**ops)
                given = {key for o in lay.operands for key in o.array.__dask_graph__()}
                tasks = len(set(arr.__dask_graph__()) - given)  # the call's own tasks
                results.append(dict(study="weak", kernel=kernel, workers=nworkers, rows=rows * nworkers,
                                    seconds=t, worker_cpu=run["worker_cpu"], block_cpu=run["block_cpu"],
                                    moved=run["moved"], tasks=tasks,
                                    blocks_per_worker=run["blocks_per_worker"],
                                    load=load,
                                    strategy=strategy))
                print(f"  weak scaling {kernel} on {nworkers} worker(s): {report.fmt_time(t)}, workers' CPU "
                      f"{report.fmt_time(run['worker_cpu'])} (block tasks {report.fmt_time(run['block_cpu'])}), "
                      f"{tasks} tasks, {run['moved'] / 2**20:.1f} MiB moved",
                      file=out)
            rss = _peak_rss(client)
            for w, (_addr, b) in enumerate(sorted(rss.items())):
                results.append(dict(study="rss", workers=nworkers, worker=w, peak_rss=b))
        finally:
            client.close()
            cluster.close()
    return results


def _forget(client, persisted: dict) -> None:
    """Release persisted operands and wait until the scheduler has forgotten them
    (with them, the replicas earlier runs left on other workers)."""
    import dask.array as da
    futures = client.futures_of([v for v in persisted.values() if isinstance(v, da.Array)])
    keys = {f.key for f in futures}
    del futures
    persisted.clear()
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and client.run_on_scheduler(
            lambda dask_scheduler, keys=keys: any(k in dask_scheduler.tasks for k in keys)):
        time.sleep(0.02)


def _communication(kernels, rows: int, memory_limit: str, out: TextIO) -> list[dict]:
    """Predicted vs measured bytes: in normal use (a plain call on the current
    client, whose tasks are pinned where the model places them, computed with
    Dask's graph optimisation; predicted by ``DaskKernel.cost`` on the same
    client), and left to Dask's own placement (no pins).

    Each measurement starts from freshly persisted operands and predicts from
    where they are then (:func:`~spfuse.dask.placement_of`): a run leaves
    replicas of what it moved, which the next run would not move again.  For
    Dask's placement the task stream says where each task ran; ``elsewhere``
    counts the tasks Dask ran on another worker than the model placed them.
    ``auto`` is the plan a plain call makes (dense factors broadcast or
    partitioned by the cost model); ``reduce``/``gather`` partition every
    chunked dense factor (``broadcast_bytes=0``).
    """
    import distributed

    import spfuse.dask as sfd
    from spfuse.dask.cost import placement_of, predict_bytes
    from spfuse.errors import UnsupportedError
    cluster, client = _cluster(2, memory_limit)
    addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
    rows_out = []

    def moved(graph, **compute_kw) -> tuple:
        t0 = sfd.transfer_marks(client)
        with distributed.get_task_stream(client) as stream:
            client.compute(graph, **compute_kw).result()
        ran = {r["key"]: addrs.index(r["worker"]) for r in stream.data}
        return sum(sfd.measured_transfers(client, since=t0).values()), ran

    try:
        for kernel in kernels:
            program, ops = weak_scaling_inputs(kernel, 2, rows)
            for strategy in ("auto", "reduce", "gather"):
                kw = dict(strategy=strategy) if strategy == "auto" else dict(strategy=strategy, broadcast_bytes=0)
                k = sfd.compile(program, nworkers=2, **kw)
                lay = k.layout(**ops)
                persisted = _persist(client, {o.name: o.array for o in lay.operands})
                try:
                    with client.as_current():  # normal use: a plain call, then compute() as Dask optimises it
                        graph, predicted = k(**persisted), k.cost(**persisted)
                except UnsupportedError as exc:  # gather does not apply to this kernel
                    rows_out.append(dict(study="comm", kernel=kernel, strategy=strategy, note=str(exc)[:60]))
                    _forget(client, persisted)
                    continue
                measured, _ = moved(graph)
                _forget(client, persisted)
                persisted = _persist(client, {o.name: o.array for o in lay.operands})
                lay = k.layout(**persisted)
                used = k.choose_strategy(lay)
                built = k._build(lay, used)
                before = placement_of(client, [o.array for o in lay.operands])
                free_predicted = predict_bytes(k, lay, used, before, 2, built=built)
                free, ran = moved(built[0], optimize_graph=False)  # unpinned; same keys as the prediction's
                elsewhere = [key for key, w in ran.items() if key in free_predicted.placed
                             and free_predicted.placed[key] != w]
                # the same model told where Dask ran each task: what is left is the byte accounting
                given = predict_bytes(k, lay, used, before, 2, built=built, tasks_on=ran).total
                _forget(client, persisted)
                rows_out.append(dict(study="comm", kernel=kernel, strategy=used if strategy != "auto" else
                                     f"auto: {used}" + "".join(f", {f.name} {f.choice}" for f in lay.factors),
                                     predicted=predicted.total, measured=measured,
                                     error=(predicted.total - measured) / max(measured, 1),
                                     free_predicted=free_predicted.total, unpinned=free,
                                     unpinned_error=(free_predicted.total - free) / max(free, 1),
                                     tasks=len([key for key in ran if key in free_predicted.placed]),
                                     elsewhere=len(elsewhere), given=given,
                                     given_error=(given - free) / max(free, 1)))
                print(f"  communication {kernel} {strategy}: predicted {predicted.total} B, measured {measured} B "
                      f"in normal use (pinned); predicted {free_predicted.total} B, measured {free} B placed by Dask "
                      f"({len(elsewhere)} task(s) not where the model put them; {given} B predicted from where "
                      "Dask ran them)", file=out)
    finally:
        client.close()
        cluster.close()
    return rows_out


def _peers(rows: int, repeat: int, memory_limit: str, out: TextIO) -> list[dict]:
    """spfuse.dask vs dask.array of pydata sparse.COO chunks, SpMM and SDDMM, interleaved."""
    import dask.array as da
    import sparse

    import spfuse
    import spfuse.dask as sfd
    n = rows
    nblocks = 2 * _BLOCKS_PER_WORKER
    chunk = -(-n // nblocks)
    A = suite.powerlaw_matrix(n, n, _ROW_NNZ, 1)
    rng = np.random.default_rng(1)
    B = rng.random((n, _RANK))
    C, D = rng.random((n, 16)), rng.random((16, n))
    cluster, client = _cluster(2, memory_limit)
    found = []
    try:
        dA = sfd.from_scipy(A, chunks=(chunk,) * (nblocks - 1) + (n - chunk * (nblocks - 1),))
        dAs = da.from_array(sparse.COO.from_scipy_sparse(A), chunks=(chunk, n), asarray=False)
        cases = {
            "SpMM": (lambda: sfd.evaluate(KERNELS["SpMM"], A=dA, B=B),
                     lambda: dAs @ da.from_array(B, chunks=(n, _RANK)),
                     lambda r: np.asarray(r)),
            "SDDMM": (lambda: sfd.evaluate(KERNELS["SDDMM"], B=dA, C=C, D=D),
                      lambda: dAs * (da.from_array(C, chunks=(chunk, 16)) @ da.from_array(D, chunks=(16, n))),
                      lambda r: r.to_scipy_sparse().tocsr()),
        }
        for name, (ours, theirs, to_scipy) in cases.items():
            got = client.compute(ours()).result()
            ref = to_scipy(client.compute(theirs()).result())
            single = spfuse.evaluate(KERNELS[name], **(dict(A=A, B=B) if name == "SpMM" else dict(B=A, C=C, D=D)))
            dense = lambda x: x.toarray() if hasattr(x, "toarray") else np.asarray(x)  # noqa: E731
            agree = bool(np.allclose(dense(got), dense(single)) and np.allclose(dense(ref), dense(single)))
            _run_once(client, ours)
            _run_once(client, theirs)
            t_ours, t_theirs = [], []
            for _ in range(repeat):  # interleaved
                t_ours.append(_run_once(client, ours))
                t_theirs.append(_run_once(client, theirs))
            a, b = statistics.median(t_ours), statistics.median(t_theirs)
            found.append(dict(study="peers", kernel=name, rows=n, spfuse=a, dask_sparse=b, ratio=b / a,
                              agree=agree))
            print(f"  {name}: spfuse.dask {report.fmt_time(a)}, dask+sparse {report.fmt_time(b)}", file=out)
    finally:
        client.close()
        cluster.close()
    return found


def _projection(kernels, rows: int, weak: list[dict], memory_limit: str = "2GiB", workers=(1, 2, 4, 8, 16, 32, 64),
                bandwidth=1.25e9, latency=50e-6, task_overhead=200e-6) -> list[dict]:
    """Weak-scaling runtime projected from the cost model (round-robin placement, no execution)."""
    from dask.utils import parse_bytes

    import spfuse.dask as sfd
    from spfuse.dask.cost import Network, project
    cap = parse_bytes(memory_limit) // 4  # spfuse.dask's default broadcast cap on such workers
    found = []
    small = max(rows // 8, 2000)  # the model's structure per worker; bytes scale with rows
    for kernel in kernels:
        t1 = next(r["seconds"] for r in weak if r["study"] == "weak" and r["kernel"] == kernel and r["workers"] == 1)
        for w in workers:
            program, ops = weak_scaling_inputs(kernel, w, small)
            scale = rows / small
            # broadcast-or-partition decided as at full size: memory cap and bandwidth scaled like the bytes
            k = sfd.compile(program, broadcast_bytes=int(cap / scale), nworkers=w,
                            network=Network(bandwidth / scale, latency, task_overhead))
            c = k.cost(nworkers=w, finalize=False, **ops)  # results stay distributed
            busiest = max(c.per_worker.values()) * scale
            transfers = max(c.transfers.values())
            t = project(busiest, c.tasks, t1, workers=w, bandwidth=bandwidth, latency=latency,
                        transfers_per_worker=transfers, task_overhead=task_overhead)
            found.append(dict(study="projection", kernel=kernel, workers=w, bytes_busiest=busiest, tasks=c.tasks,
                              seconds=t, efficiency=t1 / t, strategy=c.strategy))
    return found


def _plot(path: str, projection: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for kernel in dict.fromkeys(r["kernel"] for r in projection):
        rs = [r for r in projection if r["kernel"] == kernel]
        ax.plot([r["workers"] for r in rs], [r["efficiency"] for r in rs], marker="o", label=kernel)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("nodes (weak scaling: fixed rows per node)")
    ax.set_ylabel("projected efficiency t(1) / t(N)")
    ax.set_title("spfuse.dask: cost-model projection")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_dask_suite(size: str = "small", repeat: int | None = None, kernels: str | None = None,
                   json_path: str | None = None, plot_path: str | None = None,
                   memory_limit: str = "2GiB", out: TextIO | None = None) -> list[dict]:
    """Run the four studies and the projection; print tables; return every row.

    Starts its own LocalClusters (a few minutes for ``size="small"``)::

        python -m spfuse bench --suite dask --size small --plot projection.png
    """
    out = out or sys.stdout
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    names = [k.strip() for k in kernels.split(",")] if kernels else ["SpMM", "SDDMM-SpMM", "MTTKRP"]
    unknown = [k for k in names if k not in KERNELS or k == "SDDMM"]
    if unknown:
        raise ValueError(f"unknown dask-suite kernel(s) {', '.join(unknown)}; choose from SpMM, SDDMM-SpMM, MTTKRP")
    repeat = repeat or 5
    rows, peer_rows = SIZES[size]["rows"], SIZES[size]["peer_rows"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(report.machine_line(load), file=out)
    print(f"spfuse.dask suite: {rows} rows per worker, {_ROW_NNZ} stored entries per row (power law), "
          f"memory_limit={memory_limit} per worker, {repeat} timed runs (median)", file=out)
    baseline = machine_efficiency()
    print(f"  machine: two processes get {baseline:.0%} of two free cores now (numpy sort loop)", file=out)
    weak = _weak_scaling(names, rows, repeat, memory_limit, out)
    weak.append(dict(study="machine", efficiency=baseline))
    comm = _communication([k for k in names if k != "MTTKRP"] + (["MTTKRP"] if "MTTKRP" in names else []),
                          rows // 4, memory_limit, out)
    memory = []
    for kernel in names:
        program, ops = weak_scaling_inputs(kernel, 1, rows)
        memory.append(dict(study="task-memory", kernel=kernel, **_task_memory(program, ops)))
    peers = _peers(peer_rows, repeat, memory_limit, out)
    projection = _projection(names, rows, weak, memory_limit)
    rows_all = weak + comm + memory + peers + projection
    print(format_tables(rows_all), file=out)
    if json_path:
        import json
        with open(json_path, "w") as f:
            json.dump(dict(command="spfuse bench --suite dask", size=size, rows=rows_all), f, indent=1, default=float)
    if plot_path:
        _plot(plot_path, projection)
        print(f"wrote {plot_path}", file=out)
    return rows_all


def format_tables(rows: list[dict]) -> str:
    """The text tables of a suite run.

    >>> print(format_tables([dict(study="peers", kernel="SDDMM", rows=10, spfuse=1.0, dask_sparse=3.0,
    ...                           ratio=3.0, agree=True)]))  # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
    spfuse.dask vs dask.array of pydata sparse chunks (2 workers; ratio > 1: spfuse faster)
    kernel  rows  spfuse.dask  dask+sparse  ratio  agree
    ------  ----  -----------  -----------  -----  -----
    SDDMM   10    1s           3s           3.00x  yes
    """
    out = []
    weak = [r for r in rows if r["study"] == "weak"]
    if weak:
        table = []
        for kernel in dict.fromkeys(r["kernel"] for r in weak):
            t = {r["workers"]: r for r in weak if r["kernel"] == kernel}
            if 1 in t and 2 in t:
                cpu = [t[w].get("worker_cpu") for w in (1, 2)]
                block = [t[w].get("block_cpu") for w in (1, 2)]
                table.append([kernel, str(t[1]["rows"]), report.fmt_time(t[1]["seconds"]), str(t[2]["rows"]),
                              report.fmt_time(t[2]["seconds"]), f"{t[1]['seconds'] / t[2]['seconds']:.0%}",
                              f"{t[1].get('load', float('nan')):.1f}/{t[2].get('load', float('nan')):.1f}",
                              *[report.fmt_time(c) if c else "n/a" for c in cpu],
                              f"{2 * cpu[0] / cpu[1]:.0%}" if cpu[0] and cpu[1] else "n/a",
                              *[report.fmt_time(c) if c else "n/a" for c in block],
                              f"{2 * block[0] / block[1]:.0%}" if block[0] and block[1] else "n/a",
                              f"{t[1].get('tasks', '?')}/{t[2].get('tasks', '?')}",
                              t[2].get("blocks_per_worker", "?"),
                              f"{t[2].get('moved', 0) / 2**20:.1f} MiB", t[2]["strategy"]])
        base = next((r["efficiency"] for r in rows if r["study"] == "machine"), None)
        note = f"; this machine gave two processes {base:.0%} on a numpy loop in the same run" if base else ""
        out += ["", f"weak scaling (efficiency = t1 / t2; target >= 80%{note}); load 1/2 = 1-min load average",
                "before the 1- and 2-worker runs;",
                "CPU = all worker processes' CPU seconds per call (with Dask's own background work, which grows",
                "with the call's wall time); CPU efficiency = 2 x CPU@1 / CPU@2;",
                "block = the block tasks' thread CPU only (spfuse's work); block eff. = 2 x block@1 / block@2",
                "blocks@2 = block tasks each worker ran over the timed runs; moved@2 = median bytes between workers",
                "per call (a warm-up call ran first: chunks a worker fetched stay there as replicas)",
                report._grid(["kernel", "rows@1", "t@1", "rows@2", "t@2", "efficiency", "load 1/2", "CPU@1", "CPU@2",
                              "CPU eff.", "block@1", "block@2", "block eff.", "tasks 1/2", "blocks@2", "moved@2",
                              "strategy"], table)]
    rss = [r for r in rows if r["study"] == "rss"]
    if rss:
        out += ["", "peak resident set per worker process (after the weak-scaling runs)",
                report._grid(["workers", "worker", "peak RSS"],
                             [[str(r["workers"]), str(r["worker"]), f"{r['peak_rss'] / 2**20:.0f} MiB"] for r in rss])]
    mem = [r for r in rows if r["study"] == "task-memory"]
    if mem:
        out += ["", "largest block task: peak numpy allocations vs its inputs (target <= 2x)",
                report._grid(["kernel", "strategy", "inputs", "peak", "peak/inputs"],
                             [[r["kernel"], r["strategy"], f"{r['inputs'] / 2**20:.1f} MiB",
                               f"{r['peak'] / 2**20:.1f} MiB", f"{r['ratio']:.2f}"] for r in mem])]
    comm = [r for r in rows if r["study"] == "comm"]
    if comm:
        out += ["", "communication on 2 workers: predicted (cost model) vs measured (transfer logs); target 15%;",
                "normal use = a plain call on the current client (tasks pinned where the model places them),",
                "computed with Dask's optimisation; by Dask = no pins, Dask's occupancy-driven placement",
                "(fresh operands for each; elsewhere = tasks Dask ran on another worker than the model placed them;",
                "given Dask's = the model told where Dask ran each task, from the task stream)",
                report._grid(["kernel", "strategy", "predicted", "measured normal use", "error", "predicted",
                              "measured by Dask", "error", "elsewhere", "given Dask's", "error"],
                             [[r["kernel"], r["strategy"],
                               f"{r['predicted'] / 2**20:.2f} MiB" if "predicted" in r else "n/a",
                               f"{r['measured'] / 2**20:.2f} MiB" if "measured" in r else "n/a",
                               f"{r['error']:+.1%}" if "error" in r else r.get("note", ""),
                               f"{r['free_predicted'] / 2**20:.2f} MiB" if "free_predicted" in r else "",
                               f"{r['unpinned'] / 2**20:.2f} MiB" if "unpinned" in r else "",
                               f"{r['unpinned_error']:+.0%}" if "unpinned_error" in r else "",
                               f"{r['elsewhere']}/{r['tasks']}" if "tasks" in r else "",
                               f"{r['given'] / 2**20:.2f} MiB" if "given" in r else "",
                               f"{r['given_error']:+.1%}" if "given_error" in r else ""] for r in comm])]
    peers = [r for r in rows if r["study"] == "peers"]
    if peers:
        out += ["", "spfuse.dask vs dask.array of pydata sparse chunks (2 workers; ratio > 1: spfuse faster)",
                report._grid(["kernel", "rows", "spfuse.dask", "dask+sparse", "ratio", "agree"],
                             [[r["kernel"], str(r["rows"]), report.fmt_time(r["spfuse"]),
                               report.fmt_time(r["dask_sparse"]), f"{r['ratio']:.2f}x",
                               "yes" if r["agree"] else "NO"] for r in peers])]
    proj = [r for r in rows if r["study"] == "projection"]
    if proj:
        out += ["", "projection (cost model, 1.25 GB/s, 50 us per transfer, 200 us per task at the scheduler)",
                report._grid(["kernel", "nodes", "busiest node receives", "tasks", "projected t", "efficiency"],
                             [[r["kernel"], str(r["workers"]), f"{r['bytes_busiest'] / 2**20:.1f} MiB", str(r["tasks"]),
                               report.fmt_time(r["seconds"]), f"{r['efficiency']:.0%}"] for r in proj])]
    return "\n".join(out)
