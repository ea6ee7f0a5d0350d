"""Thread counts: resolved on every call, visible to threadpoolctl, and kept
off cores that other threads of the process are spinning on."""
import importlib
import sys
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse._kernels import _config

# ``spfuse.threads`` the attribute is the context manager; the module:
spthreads = importlib.import_module("spfuse.threads")

try:  # in the `test` extra; the tests that need it skip without it
    import threadpoolctl
except ImportError:
    threadpoolctl = None
needs_threadpoolctl = pytest.mark.skipif(threadpoolctl is None, reason="threadpoolctl not installed")
needs_openmp = pytest.mark.skipif(not _config.openmp_enabled(), reason="serial build")


def _spmv_operands():
    A = sp.random(200, 150, density=0.05, format="csr", random_state=1)
    return A, np.arange(150, dtype=np.float64)


@needs_openmp
@needs_threadpoolctl
def test_threadpoolctl_openmp_limit_set_after_import_is_honoured(monkeypatch):
    """scikit-learn's rule: OpenMP's maximum is read per call, so a limit
    entered long after ``import spfuse`` applies to the next kernel call."""
    A, x = _spmv_operands()
    used = []
    resolve = spthreads.effective_num_threads

    def spy(num_threads=None):
        used.append(resolve(num_threads))
        return used[-1]

    monkeypatch.setattr(spthreads, "effective_num_threads", spy)
    # (a call with too little work for a team runs on one thread without
    # resolving the count: make this one worth a team, so the count is read)
    monkeypatch.setattr(spfuse.api, "PARALLEL_MIN_WORK", 0)
    spthreads.set_num_threads(None)
    default = spfuse.get_num_threads()
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert spfuse.get_num_threads() == 1
        assert spthreads.threads_for_call() == 1
        used.clear()
        y = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
        assert used and set(used) == {1}  # the call itself ran with one thread
    np.testing.assert_allclose(y, A @ x)
    assert spfuse.get_num_threads() == default
    # an explicit setting still wins over the OpenMP limit
    with threadpoolctl.threadpool_limits(1, user_api="openmp"), spfuse.threads(2):
        assert spfuse.get_num_threads() == 2


@needs_openmp
@needs_threadpoolctl
def test_threadpool_info_sees_the_openmp_runtime_the_kernels_use():
    """The pool threadpoolctl reports (and limits) is the one our kernels
    run on: limiting it through threadpoolctl shrinks the team we get."""
    pools = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "openmp"]
    assert pools, "threadpoolctl does not see spfuse's OpenMP runtime"
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert _config.openmp_max_threads() == 1


@needs_openmp
def test_team_thread_ids_are_the_caller_then_its_workers():
    ids = _config.team_thread_ids(2)
    assert ids[0] == threading.get_native_id()
    assert len(set(ids)) == len(ids) == _config.team_size(2)
    assert _config.team_thread_ids(2) == ids  # libgomp reuses the same pool


@pytest.mark.parametrize("busy, cores, want", [
    (0, 2, 2),    # nobody else running: the full team
    (-1, 2, 2),   # the OS cannot tell: the full team
    (1, 2, 1),    # a spinning BLAS worker on a 2-core machine: run alone
    (3, 2, 1),    # never below one thread
    (1, 8, 2),    # plenty of free cores: never above the request
    (5, 8, 2),
    (7, 8, 1),
])
@pytest.mark.parametrize("whole_machine", [False, True])
def test_threads_for_call_leaves_out_busy_cores(monkeypatch, busy, cores, want, whole_machine):
    monkeypatch.setattr(spthreads, "effective_num_threads", lambda n=None: 2)
    monkeypatch.setattr(spthreads, "_own_team", lambda n: [0, 0])
    monkeypatch.setattr(spthreads, "_whole", [whole_machine])
    monkeypatch.setattr(spthreads._config, "runnable_threads", lambda skip, stop_at=None: busy)
    # the same count, all of this process's or all of other processes'
    monkeypatch.setattr(spthreads._config, "running_elsewhere", lambda team, stop_at=None: (busy, 0))
    monkeypatch.setattr(spthreads, "_cores", [cores])
    assert spthreads.threads_for_call(2) == want
    if whole_machine:
        monkeypatch.setattr(spthreads._config, "running_elsewhere",
                            lambda team, stop_at=None: (0 if busy > 0 else busy, max(busy, -1)))
        assert spthreads.threads_for_call(2) == want
    monkeypatch.setenv("SPFUSE_ADAPTIVE_THREADS", "0")
    assert spthreads.threads_for_call(2) == 2


@pytest.mark.parametrize("busy,elsewhere,want", [(0, 1, 1), (1, 1, 1), (0, 0, 2), (-1, -1, 2), (0, -1, 2)])
def test_other_processes_running_leave_their_cores_out(monkeypatch, busy, elsewhere, want):
    """Another process on a core stalls a full team at every barrier: on a
    machine this process may use whole, the system's runnable threads count
    (-1: not known, the full team)."""
    monkeypatch.setattr(spthreads, "effective_num_threads", lambda n=None: 2)
    monkeypatch.setattr(spthreads, "_own_team", lambda n: [0, 0])
    monkeypatch.setattr(spthreads, "_whole", [True])
    monkeypatch.setattr(spthreads, "_cores", [2])
    monkeypatch.setattr(spthreads._config, "running_elsewhere", lambda team, stop_at=None: (busy, elsewhere))
    assert spthreads.threads_for_call(2) == want
    monkeypatch.setattr(spthreads, "_whole", [False])   # a container on a few of many cores: not counted
    monkeypatch.setattr(spthreads._config, "runnable_threads", lambda skip, stop_at=None: busy)
    assert spthreads.threads_for_call(2) == (1 if busy > 0 else 2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_running_elsewhere_reads_the_system(monkeypatch):
    busy, elsewhere = _config.running_elsewhere(_config.team_thread_ids(2))
    assert busy >= 0 and elsewhere >= 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_team_started_after_the_listing_is_listed_when_asked_about():
    # A Python thread's first parallel block starts a new libgomp pool.  Its
    # workers must be in the listing running_elsewhere reads, or they count
    # as another process's threads (the next call ran on half its team for
    # up to 0.5 s after the pool started).
    _config.running_elsewhere([threading.get_native_id()])   # a listing made now
    seen = {}

    def in_a_new_thread():
        team = _config.team_thread_ids(2)
        _config.running_elsewhere(team, 1)
        seen["team"], seen["listed"] = team, set(_config._listed_thread_ids())

    t = threading.Thread(target=in_a_new_thread)
    t.start()
    t.join()
    assert set(seen["team"]) <= seen["listed"]


def test_threads_for_call_of_one_thread_asks_nothing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a one-thread call must not scan the process's threads")

    monkeypatch.setattr(spthreads._config, "runnable_threads", fail)
    monkeypatch.setattr(spthreads._config, "running_elsewhere", fail)
    assert spthreads.threads_for_call(1) == 1


@needs_openmp
@needs_threadpoolctl
def test_a_spinning_openblas_pool_is_seen_as_busy():
    """OpenBLAS's workers busy-wait ~0.1 s after a threaded call; right after
    ``X @ W`` at least one foreign thread of this process is runnable."""
    blas = [p for p in threadpoolctl.threadpool_info()
            if p["internal_api"] == "openblas" and p.get("threading_layer") == "pthreads"]
    if not blas or blas[0]["num_threads"] < 2:
        pytest.skip("numpy's BLAS is not a multi-threaded pthreads OpenBLAS")
    team = _config.team_thread_ids(2)
    X = np.ones((4000, 64))
    W = np.ones((64, 64))
    seen = 0
    for _ in range(5):  # a few tries: a shared machine may deschedule the pool
        X @ W
        seen = max(seen, _config.runnable_threads(team))
        if seen:
            break
    assert seen >= 1


def _foreign_cpu_ticks(exclude) -> int:
    """CPU time (clock ticks) this process's threads outside ``exclude`` have used."""
    import os
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in exclude:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:   # (a thread that ended meanwhile)
            continue
        total += int(fields[11]) + int(fields[12])   # utime, stime
    return total


@needs_openmp
@needs_threadpoolctl
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_products_leave_scipys_blas_pool_asleep_and_its_setting_as_found():
    """spfuse's products hold scipy's OpenBLAS to one thread and run their
    blocks on spfuse's team: BLAS's own workers, which would busy-wait ~0.1 s
    after each threaded call, never run.  The user's setting is restored."""
    import os

    from spfuse._kernels import _dense_kernels
    from spfuse.runtime import blas_pool
    path = blas_pool.hold_blas_once()
    if path is None:
        pytest.skip("scipy's BLAS is not a pthreads OpenBLAS with LP64 symbols")
    if next(p for p in threadpoolctl.threadpool_info() if p["filepath"] == path)["num_threads"] < 2:
        pytest.skip("scipy's OpenBLAS runs on one thread here")
    A, B, out = np.ones((1500, 400)), np.ones((400, 300)), np.empty((1500, 300))
    exclude = {*_config.team_thread_ids(2), threading.get_native_id(), os.getpid()}

    def foreign_ticks_of_products():
        before = _foreign_cpu_ticks(exclude)
        for _ in range(10):
            _dense_kernels.gemm(A, B, out, 2)
        return _foreign_cpu_ticks(exclude) - before

    import time
    time.sleep(0.3)   # (a pool woken before this test has stopped spinning)
    held = foreign_ticks_of_products()
    _dense_kernels.hold_blas_to_one_thread(0, 0)   # control: BLAS on its own pool
    try:
        woken = foreign_ticks_of_products()
    finally:
        _dense_kernels.hold_blas_to_one_thread(*blas_pool._lp64_thread_symbols(path))
    assert held <= max(2, woken // 4), (held, woken)
    assert np.array_equal(out, A @ B)
    with threadpoolctl.threadpool_limits(limits=3, user_api="blas"):
        _dense_kernels.gemm(A, B, out, 2)
        assert next(p for p in threadpoolctl.threadpool_info() if p["filepath"] == path)["num_threads"] == 3
