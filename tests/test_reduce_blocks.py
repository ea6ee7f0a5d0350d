"""Reduction loops (``PAR_REDUCE``): a top-level loop whose iterations all
sum into one buffer (Aᵀx, column sums, a scalar) runs as fixed blocks, each
into its own partial copy, the copies added in block order.

The blocks depend on the machine and the data, never on the call's thread
count, so 1 and 2 threads must give bitwise the same result; every result
is checked against numpy on dense operands.
"""
import numpy as np
import pytest
import scipy.sparse as sp
from executor_spy import executor_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.runtime import looptree as lt

#: program, operands it reads, numpy oracle on dense operands
PROGRAMS = {
    # (abs keeps these on the executor: plain Aᵀx, column sums and xᵀAx run on kernels)
    "AT-x": ("y[j] = A[i,j] * abs(x[i])", lambda A, B, x, c: A.T @ abs(x)),
    "col-sums": ("y[j] = sum(i, abs(A[i,j]))", lambda A, B, x, c: abs(A).sum(axis=0)),
    "bias-AT-x": ("y[j] = A[i,j] * abs(x[i]) + c[j]", lambda A, B, x, c: A.T @ abs(x) + c),
    "inner": ("s = A[i,j] * B[i,j]", lambda A, B, x, c: (A * B).sum()),
    "quadratic": ("s = x[i] * abs(A[i,j]) * x[j]", lambda A, B, x, c: x @ abs(A) @ x),
    "AT-x-scaled": ("y[j] = 2.5 * A[i,j] * abs(x[i])", lambda A, B, x, c: 2.5 * (A.T @ abs(x))),
}


def _operands(n, density, fmt, seed):
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(2):
        A = sp.random_array((n, n), density=density, format="csr", rng=rng)
        A.data = rng.standard_normal(A.nnz)
        if n > 2:   # some empty rows
            A = sp.csr_array(A.multiply((np.arange(n) % 3 != 1)[:, None]))
        mats.append(A.asformat(fmt))
    return mats[0], mats[1], rng.standard_normal(n), rng.standard_normal(n)


def _evaluate(name, A, B, x, c, threads):
    program, _ = PROGRAMS[name]
    ops = {k: v for k, v in dict(A=A, B=B, x=x, c=c).items() if f"{k}[" in program}
    return np.asarray(spfuse.evaluate(program, **ops, num_threads=threads))


def _plans(name, A, B, x, c):
    """The executor plans a program runs."""
    with executor_plans() as plans:
        _evaluate(name, A, B, x, c, 1)
    return plans


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(PROGRAMS)), n=st.sampled_from([0, 1, 2, 7, 40, 130]),
       density=st.sampled_from([0.0, 0.05, 0.3]), fmt=st.sampled_from(["csr", "csc"]),
       blocks=st.sampled_from([1, 2, 3, 5, 8]), seed=st.integers(0, 2**16))
def test_reduction_blocks_match_numpy_on_any_thread_count(monkeypatch, name, n, density, fmt, blocks, seed):
    monkeypatch.setattr(lt, "reduce_blocks", lambda plan: blocks)
    A, B, x, c = _operands(n, density, fmt, seed)
    r1 = _evaluate(name, A, B, x, c, 1)
    r2 = _evaluate(name, A, B, x, c, 2)
    np.testing.assert_array_equal(r1, r2)
    ref = np.asarray(PROGRAMS[name][1](A.toarray(), B.toarray(), x, c)).reshape(r1.shape)
    np.testing.assert_allclose(r1, ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_reduction_loops_are_marked(name):
    A, B, x, c = _operands(60, 0.1, "csr", 1)
    text = "\n".join(p.describe() for p in _plans(name, A, B, x, c))
    assert "[parallel: reduction blocks]" in text
    assert "not split" not in text


def test_a_reduction_that_is_not_a_sum_stays_serial():
    A, _, _, _ = _operands(40, 0.2, "csr", 2)
    with executor_plans() as seen:   # (abs keeps it on the executor: plain column maxima have a kernel)
        y = spfuse.evaluate("y[j] = max(i, abs(A[i,j]))", A=A, num_threads=2)
    np.testing.assert_allclose(y, abs(A.toarray()).max(axis=0))
    assert seen and all(p.buf_reduce.max(initial=-1) < 0 for p in seen)


def test_block_count_follows_machine_and_work_not_threads():
    A, B, x, c = _operands(400, 0.05, "csr", 3)
    plan = _plans("AT-x", A, B, x, c)[0]
    cells = int(plan.buf_size[plan.buf_reduce >= 0].sum())
    work = sum(len(v) for v in plan.value_arrays)
    want = max(1, min(lt._CORES, lt.MAX_REDUCE_BLOCKS, work // (lt.REDUCE_WORK_PER_ELEMENT * cells)))
    assert lt.reduce_blocks(plan) == want
    # a plan without a reduction loop is never cut
    with executor_plans() as rows:
        spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
    assert all(lt.reduce_blocks(p) == 1 for p in rows)


@pytest.mark.parametrize("values", [[0.0, -0.0, 0.0], [-0.0, -0.0, -0.0], [1.0, -1.0, 0.0]])
def test_reduction_blocks_keep_the_sign_of_zero(monkeypatch, values):
    # partial copies start at -0.0, the identity of +, so a column that gets
    # only zeros keeps the sign the serial loop gives it
    A = sp.csr_array((np.array(values), np.array([0, 0, 2]), np.array([0, 1, 1, 2, 3])), shape=(4, 3))
    x = -np.ones(4)
    c = np.array([0.0, -0.0, -0.0])
    got = {}
    for R in (1, 3):
        monkeypatch.setattr(lt, "reduce_blocks", lambda plan, R=R: R)
        got[R] = [spfuse.evaluate(p, A=A, x=x, c=c, num_threads=2) if "c[" in p else
                  spfuse.evaluate(p, A=A, x=x, num_threads=2)
                  for p in ("y[j] = A[i,j] * x[i] + c[j]", "y[j] = A[i,j] * x[i]")]
    for a, b in zip(got[1], got[3], strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(np.signbit(a), np.signbit(b))
