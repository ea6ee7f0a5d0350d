"""Run the suite: check every peer against spfuse, then time them interleaved.

For one (input, kernel) *case*:

1. every peer ``prepare``\\ s its operands (untimed); a kernel it cannot
   express is ``n/a``, a :class:`~spfuse.bench.peers.Skip` is ``skip``;
   a spfuse peer other than plain ``spfuse`` (those run on the generic
   executor) whose plan would store temporaries or emit result coordinates
   over the size's memory budget, or is estimated to run over its time
   budget (:mod:`spfuse.bench.budget`), is ``skip`` too, with the figure;
2. every peer runs once and its result is compared with spfuse's (``auto``)
   result — a disagreement is recorded as ``MISMATCH`` and the peer is not
   timed; a call slower than the size's budget is not timed either;
3. for each thread count: ``repeat`` rounds in which every remaining peer
   is called twice in turn, the second call timed (interleaved, so drifts of
   clock and load hit all alike, in an order rotating from round to round;
   back to back, so each timed call finds its own operands as warm as in a
   user's loop -- timing a single call would favour whichever peer follows
   one that just read the same scipy arrays);
   each pair starts once the previous peer's thread pool has stopped
   spinning (:func:`settle_threads`); the median of ``time.perf_counter``
   deltas is reported.

>>> from spfuse.bench import suite
>>> size = suite.SIZES["tiny"]
>>> inp = suite.synthetic_inputs(size)[0]
>>> recs = run_case(inp, suite.KERNELS_BY_NAME["SpMV"], size, [1], repeat=1, peer_names=["scipy"])
>>> sorted({r.peer for r in recs})
['scipy', 'spfuse']
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import spfuse
from spfuse.bench import budget, compare
from spfuse.bench import peers as peers_mod
from spfuse.bench.suite import BenchKernel, Input, Size

__all__ = ["Record", "run_case", "planning_times", "nbytes_moved", "memory_ceiling", "settle_threads"]


@dataclasses.dataclass
class Record:
    """One peer on one case at one thread count."""

    input: str
    section: str
    kernel: str
    peer: str
    threads: int
    status: str                       #: ok, n/a, skip, slow, MISMATCH, error, unsupported
    median: float | None = None    #: seconds
    times: list = dataclasses.field(default_factory=list)
    ratio: float | None = None     #: peer time / spfuse time (>1: spfuse faster)
    gbps: float | None = None      #: achieved bandwidth (SpMV, SpMM only)
    note: str = ""
    first_call: float | None = None  #: seconds of the checked first call (also for ``slow`` peers)

    def as_dict(self) -> dict:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def nbytes_moved(kernel: str, operands: dict) -> int | None:
    """Compulsory bytes of SpMV (indptr+indices+data+x+y) and SpMM (A+B+C); None otherwise."""
    if kernel not in ("SpMV", "SpMM"):
        return None
    a = operands["A"]
    sparse_bytes = a.indptr.nbytes + a.indices.nbytes + a.data.nbytes
    dense = operands["x"] if kernel == "SpMV" else operands["B"]
    out = a.shape[0] * (1 if kernel == "SpMV" else dense.shape[1]) * 8
    return sparse_bytes + dense.nbytes + out


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:120]


def _call(f: Callable, state: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = f(state)
    return out, time.perf_counter() - t0


#: Longest wait for other pools to sleep before a peer's pair of calls: OpenBLAS
#: spins ~0.1 s after a multi-threaded call (103 ms measured here after numpy's
#: ``x @ x`` and ``X @ W``); a 20 ms wait left spfuse's 2-thread calls after
#: a numpy or scipy peer timed on one core (quadratic form 2.4 ms, 1.3 ms at rest).
SETTLE_MAX_S = 0.15


def settle_threads(max_wait: float = SETTLE_MAX_S) -> float:
    """Wait (at most ``max_wait`` s) until no other thread of this process
    runs; return the seconds waited.

    A thread pool busy-waits after its call (libgomp, torch's and
    GraphBLAS's OpenMP: ~3.5 ms measured here; OpenBLAS ~0.1 s).
    In an interleaved round, the previous peer's spinning pool would take a
    core from the next peer's calls, and a short 2-thread call would be timed
    on one core.  Each peer's pair of calls starts once the others' pools
    sleep, as in a user's loop over one library; the cost of following
    another library's call is the subject of ``spfuse.bench.after_blas``.
    Returns at once where threads cannot be counted (not Linux).

    >>> 0.0 <= settle_threads(0.001) < 1.0
    True
    """
    import threading

    from spfuse._kernels import _config
    me = [threading.get_native_id()]
    t0 = time.perf_counter()
    waited = 0.0
    while waited < max_wait and _config.runnable_threads(me, 1) > 0:
        time.sleep(0.0002)
        waited = time.perf_counter() - t0
    return waited


def _memory_available() -> int | None:
    """Bytes the machine can hand out now (``MemAvailable``), or None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextlib.contextmanager
def memory_ceiling(headroom: float = 0.8):
    """Run the block under an address-space ceiling: this process's mapped
    size now plus ``headroom`` of the memory the machine has available.

    A peer's first call runs under it, so a call that wants more fails with
    ``MemoryError`` -- an ``error`` entry in the table -- instead of the
    kernel's OOM killer ending the whole run (pydata sparse's SpTTM-SpTTM at
    ``--size medium`` took the process to 16 GiB, then asked for 5.8 GiB
    more: very likely what killed a full medium run at 24 GiB).  Nothing changes where
    ``resource`` or ``/proc`` is missing, or a tighter limit is already set.

    >>> import numpy as np
    >>> with memory_ceiling():
    ...     _ = np.ones(1000)
    """
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError, IndexError):
        yield
        return
    available = _memory_available()
    if available is None:
        yield
        return
    ceiling = mapped + int(headroom * available)
    if hard != resource.RLIM_INFINITY:
        ceiling = min(ceiling, hard)
    if soft != resource.RLIM_INFINITY and soft <= ceiling:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _threads_for(peer: peers_mod.Peer, n: int):
    with peer.threads(n), (peers_mod.blas_limits(n) if peer.threads is not peers_mod.blas_limits
                           else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def _all_threads_for(peers: list, n: int):
    """Every peer's thread setting at ``n`` at once (each distinct setter
    entered once, BLAS pools included).

    The timed rounds run inside it: entering a setting per call (threadpoolctl
    scans every loaded library) evicts the caches before each timed call,
    which charged a few hundred microseconds of cold-cache Python to every
    peer's call -- most to the longest call paths -- where a user calling in
    a loop pays nothing of the kind."""
    with contextlib.ExitStack() as stack:
        for setter in dict.fromkeys([peers_mod.blas_limits, *(p.threads for p in peers)]):
            stack.enter_context(setter(n))
        yield


def run_case(inp: Input, kernel: BenchKernel, size: Size, thread_counts: list[int], repeat: int,
             peer_names: list[str] | None = None, peer_list: list | None = None,
             tick: Callable[[], None] = lambda: None, known_slow: set | None = None,
             check_budget: bool = True) -> list[Record]:
    """Check and time every peer on one input and kernel; one :class:`Record` per peer and thread count.

    ``known_slow`` (a set of ``(peer, kernel)``, updated here) lets a run skip
    a peer that was over budget for the same kernel on an earlier input.
    ``check_budget``: skip spfuse strategies whose plan is over the size's
    memory or time budget (see :func:`spfuse.bench.budget.skip_reason`).
    """
    known_slow = set() if known_slow is None else known_slow
    if peer_list is None:
        peer_list, _ = peers_mod.available_peers(peer_names)
    operands = kernel.operands(inp, size)
    ctx = peers_mod.Context(kernel.program, size.max_dense_bytes)
    base = dict(input=inp.name, section=inp.section, kernel=kernel.name)
    status: dict[str, tuple[str, str]] = {}
    states: dict[str, Any] = {}
    first: dict[str, float] = {}
    reference = None
    for peer in peer_list:
        impl = peer.impls.get(kernel.name)
        if impl is None:
            status[peer.name] = ("n/a", "cannot express this kernel")
            continue
        if (peer.name, kernel.name) in known_slow and peer.name != "spfuse":
            status[peer.name] = ("slow", "over budget on an earlier input")
            continue
        if check_budget and peer.is_spfuse and peer.name != "spfuse":
            # every spfuse strategy but plain auto runs on the generic executor
            why = budget.skip_reason(kernel.program, operands, peer.fusion or "auto", size.max_dense_bytes,
                                     size.call_budget, first.get("spfuse"), generic=True)
            if why:
                status[peer.name] = ("skip", why)
                continue
        try:
            # (a peer asking for more memory than the machine has fails here, not the run)
            with memory_ceiling():
                state = impl.prepare(operands, ctx)
                with _threads_for(peer, max(thread_counts)):
                    raw, dt = _call(impl.run, state)
                    if size.call_budget < dt < 4 * size.call_budget:  # maybe a one-off JIT compile: look again
                        raw, dt = _call(impl.run, state)
                    elif peer.name == "spfuse" and dt < size.call_budget / 10:
                        # auto's call is the reference of the other strategies' time budgets: not the
                        # first call, which also plans and warms the caches
                        dt = min(dt, _call(impl.run, state)[1])
                result = impl.finish(raw)
        except peers_mod.Skip as e:
            status[peer.name] = ("skip", str(e))
            continue
        except spfuse.UnsupportedError as e:
            status[peer.name] = ("unsupported", _short(e))
            continue
        except Exception as e:  # a failing peer is a table entry, not a crash
            status[peer.name] = ("error", _short(e))
            continue
        if reference is None:
            reference = result
            if peer.name != "spfuse":
                note = f"checked against {peer.name} (spfuse failed)"
                status.setdefault(peer.name, ("ok", note))
        else:
            try:
                ok, why = compare.agree(result, reference)
            except Exception as e:
                ok, why = False, _short(e)
            if not ok:
                status[peer.name] = ("MISMATCH", why)
                continue
        states[peer.name] = (impl, state)
        first[peer.name] = dt
        if dt > size.call_budget:
            status[peer.name] = ("slow", f"one call took {dt:.2f} s > budget {size.call_budget:g} s")
            known_slow.add((peer.name, kernel.name))
            states.pop(peer.name)
    nbytes = nbytes_moved(kernel.name, operands)
    records = []
    by_name = {p.name: p for p in peer_list}
    for n in thread_counts:
        timed = {name: [] for name in states}
        rounds = repeat
        if states:  # all peers of one round together: at most case_budget seconds of rounds
            per_round = 2 * sum(first[name] for name in states)
            rounds = max(1, min(repeat, int(size.case_budget / max(per_round, 1e-9))))
        with _all_threads_for([by_name[name] for name in states], n):
            order = list(states.items())
            for r in range(rounds):
                # each round starts one peer later: following another library's
                # large call slows the next calls of any library for a while
                # (cause not pinned down: SpMV 20000 rows, 0.40 -> 0.54 ms for
                # scipy and 0.52 -> 0.66 for spfuse after a 40 MB array was
                # made and freed, the warming call in between), so no peer is
                # always the one timed after the previous round's slowest
                for name, (impl, state) in order[r % len(order):] + order[:r % len(order)]:
                    settle_threads()
                    impl.run(state)  # warms this peer's own operands and code
                    timed[name].append(_call(impl.run, state)[1])
                tick()
        spf = statistics.median(timed["spfuse"]) if timed.get("spfuse") else None
        for peer in peer_list:
            st, note = status.get(peer.name, ("ok", ""))
            rec = Record(**base, peer=peer.name, threads=n, status=st, note=note, first_call=first.get(peer.name))
            if peer.name in timed:
                rec.times = timed[peer.name]
                rec.median = statistics.median(rec.times)
                if rounds < repeat:
                    rec.note = (rec.note + "; " if rec.note else "") + f"{rounds} rounds (time budget)"
                if spf:
                    rec.ratio = rec.median / spf
                if nbytes:
                    rec.gbps = nbytes / rec.median / 1e9
            records.append(rec)
    return records


def planning_times(kernels: list[BenchKernel], size: Size, repeat: int = 5) -> list[dict]:
    """Uncached planning (``clear_cache()`` then a first call) and cached call overhead per kernel.

    Both are measured on a tiny input (the ``tiny`` size's first matrix or
    tensor), so the cached figure is almost pure dispatch overhead; planning
    is the difference of the two (best of ``repeat``, as the machine may be busy).
    """
    from spfuse.bench import suite
    tiny = suite.SIZES["tiny"]
    inputs = {i.kind: i for i in suite.synthetic_inputs(tiny)}
    out = []
    for k in kernels:
        ops = k.operands(inputs[k.kind], tiny)
        firsts, cached = [], []
        try:
            for _ in range(repeat):
                spfuse.clear_cache()
                kern = spfuse.compile(k.program)
                firsts.append(_call(lambda o, kern=kern: kern(**o), ops)[1])
                cached.append(min(_call(lambda o, kern=kern: kern(**o), ops)[1] for _ in range(3)))
        except Exception as e:
            out.append({"kernel": k.name, "error": _short(e)})
            continue
        f, c = min(firsts), min(cached)
        out.append({"kernel": k.name, "first_call": f, "cached_call": c, "planning": max(f - c, 0.0)})
    return out
