"""Many Python threads at once: one compiled kernel, the shared plan cache, and
per-thread ``spfuse.threads(n)`` settings.

The kernels release the GIL, so calls from different Python threads really
overlap (each may also start its own OpenMP team).  Every call gets its own
inputs and is checked against the numpy oracle; a barrier makes the threads
start together so the calls interleave.
"""
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse._kernels import _config
from spfuse.testing import dense_reference, random_sparse

OPENMP = bool(_config.openmp_enabled())

N_THREADS = 8
ROUNDS = 12

PROGRAMS = {
    "SpMV": ("y[i] = A[i,j] * x[j]", "A"),
    "SDDMM": ("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", "B"),
    "SpGEMM": ("C[i,k] = A[i,j] * B[j,k]", "A"),
    "generic-max": ("y[i] = max(j, A[i,j])", "A"),
    "TTV": ("A[i,j] = X[i,j,k] * c[k]", "X"),
}


def _densify(r):
    if sp.issparse(r):
        return r.toarray()
    if isinstance(r, spfuse.Tensor):
        return r.todense()
    return np.asarray(r)


def _inputs(name, rng, n=None):
    n = n or int(rng.integers(20, 60))
    m = int(rng.integers(15, 50))
    if name == "SpMV":
        return {"A": random_sparse(rng, (n, m), 0.2, "csr"), "x": rng.standard_normal(m)}
    if name == "SDDMM":
        return {"B": random_sparse(rng, (n, m), 0.2, "csr"), "C": rng.standard_normal((n, 8)),
                "D": rng.standard_normal((8, m))}
    if name == "SpGEMM":
        return {"A": random_sparse(rng, (n, m), 0.1, "csr"), "B": random_sparse(rng, (m, 30), 0.1, "csr")}
    if name == "generic-max":
        return {"A": random_sparse(rng, (n, m), 0.3, "csr", canonical=False)}
    nnz = int(rng.integers(0, 200))
    coords = np.stack([rng.integers(0, s, nnz) for s in (n, m, 7)])
    return {"X": spfuse.Tensor.from_coo(coords, rng.standard_normal(nnz), (n, m, 7)),
            "c": rng.standard_normal(7)}


def _oracle(text, ops):
    plain = {k: (v.todense() if isinstance(v, spfuse.Tensor) else v) for k, v in ops.items()}
    return dense_reference(text, plain)


def _run_threads(target, n=N_THREADS):
    """Run ``target(tid, barrier)`` in ``n`` threads; re-raise the first failure."""
    barrier = threading.Barrier(n)
    errors = []

    def wrap(tid):
        try:
            target(tid, barrier)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((tid, exc))
            barrier.abort()

    threads = [threading.Thread(target=wrap, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    real = [(t, e) for t, e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0][1]
    assert not errors, errors


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_compiled_kernel_from_eight_threads(name):
    text, sparse_name = PROGRAMS[name]
    kernel = spfuse.compile(text, **{sparse_name: "csr" if name != "TTV" else "csf"})
    # inputs and oracles built up front (in the main thread) so the threads only call the kernel
    work = []
    for tid in range(N_THREADS):
        rng = np.random.default_rng([7, tid])
        rounds = []
        for _ in range(ROUNDS):
            ops = _inputs(name, rng)
            rounds.append((ops, _oracle(text, ops)))
        work.append(rounds)

    def body(tid, barrier):
        barrier.wait()
        for r, (ops, ref) in enumerate(work[tid]):
            got = kernel(**ops)
            np.testing.assert_allclose(_densify(got), ref, rtol=1e-10, atol=1e-12,
                                       err_msg=f"thread {tid} round {r}")

    _run_threads(body)


def test_evaluate_with_shared_plan_cache_from_eight_threads():
    """Different programs and shapes from every thread: the plan cache is filled and
    read concurrently (including evictions when it overflows) and every result is right."""
    spfuse.clear_cache()
    names = sorted(PROGRAMS)
    work = []
    for tid in range(N_THREADS):
        rng = np.random.default_rng([11, tid])
        rounds = []
        for r in range(ROUNDS):
            name = names[(tid + r) % len(names)]
            text = PROGRAMS[name][0]
            # few distinct shapes, so threads both miss and hit on the same keys
            ops = _inputs(name, rng, n=20 + 5 * (r % 3))
            fusion = ("auto", "none", "max")[(tid + r) % 3]
            rounds.append((text, ops, fusion, _oracle(text, ops)))
        work.append(rounds)

    def body(tid, barrier):
        barrier.wait()
        for text, ops, fusion, ref in work[tid]:
            try:
                got = spfuse.evaluate(text, fusion=fusion, **ops)
            except spfuse.UnsupportedError:
                assert fusion == "max"
                continue
            np.testing.assert_allclose(_densify(got), ref, rtol=1e-10, atol=1e-12,
                                       err_msg=f"thread {tid} {text} {fusion}")

    _run_threads(body)
    assert spfuse.cache_info()["plans"] >= 1


def test_threads_context_managers_are_per_python_thread():
    """``with spfuse.threads(n)`` in one Python thread does not leak into another,
    and results are identical whatever the count."""
    rng = np.random.default_rng(3)
    A = random_sparse(rng, (300, 200), 0.05, "csr")
    x = rng.standard_normal(200)
    ref = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x, num_threads=1)
    seen = {}

    def body(tid, barrier):
        want = 1 + tid % 2
        expected = want if OPENMP else 1
        with spfuse.threads(want):
            barrier.wait()          # every thread is inside its own `with` now
            for _ in range(20):
                assert spfuse.get_num_threads() == expected
                got = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
                np.testing.assert_array_equal(got, ref)
                got = spfuse.evaluate("y[i] = max(j, A[i,j])", A=A)
                np.testing.assert_allclose(got, A.toarray().max(axis=1))
            seen[tid] = spfuse.get_num_threads()
        assert spfuse.get_num_threads() == default

    default = spfuse.get_num_threads()
    _run_threads(body)
    assert seen == {t: (1 + t % 2 if OPENMP else 1) for t in range(N_THREADS)}
    assert spfuse.get_num_threads() == default


def test_nested_threads_settings_restore_in_each_thread():
    def body(tid, barrier):
        before = spfuse.get_num_threads()
        with spfuse.threads(1):
            barrier.wait()
            with spfuse.threads(2):
                pass
            assert spfuse.get_num_threads() == 1
        assert spfuse.get_num_threads() == before

    _run_threads(body)


def test_kernel_inputs_shared_between_threads_are_not_mutated():
    """The same (non-canonical) scipy operand read by eight threads at once: each canonicalises
    its own copy and the caller's arrays stay untouched."""
    rng = np.random.default_rng(5)
    A = random_sparse(rng, (80, 60), 0.2, "csr", canonical=False)
    x = rng.standard_normal(60)
    snapshot = [a.copy() for a in (A.data, A.indices, A.indptr)]
    ref = dense_reference("y[i] = A[i,j] * x[j]", {"A": A, "x": x})
    kernel = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")

    def body(tid, barrier):
        barrier.wait()
        for _ in range(30):
            np.testing.assert_allclose(kernel(A=A, x=x), ref, rtol=1e-12, atol=1e-12)

    _run_threads(body)
    for before, after in zip(snapshot, (A.data, A.indices, A.indptr), strict=True):
        np.testing.assert_array_equal(before, after)


def test_plan_cache_evictions_under_contention(monkeypatch):
    """A tiny plan cache (monkeypatched) evicts all the time while eight threads plan
    distinct shapes: no KeyError/RuntimeError from the dict, every result right."""
    import spfuse.api as api
    monkeypatch.setattr(api, "_MAX_CACHED", 3)
    spfuse.clear_cache()
    text = "y[i] = A[i,j] * x[j]"
    work = []
    for tid in range(N_THREADS):
        rng = np.random.default_rng([13, tid])
        rounds = []
        for r in range(25):
            ops = {"A": random_sparse(rng, (5 + (tid * 25 + r) % 17, 4 + r % 5), 0.4, "csr"),
                   "x": None}
            ops["x"] = rng.standard_normal(ops["A"].shape[1])
            rounds.append((ops, dense_reference(text, ops)))
        work.append(rounds)

    def body(tid, barrier):
        barrier.wait()
        for ops, ref in work[tid]:
            np.testing.assert_allclose(spfuse.evaluate(text, **ops), ref, rtol=1e-12, atol=1e-12)

    _run_threads(body)
    assert spfuse.cache_info()["plans"] <= 3 + N_THREADS
    spfuse.clear_cache()
