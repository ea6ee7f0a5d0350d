"""Statements that copy a temporary whole (``T_saved[i,h] = T[i,h]``, as a
differentiated program's saving forward writes them).

Two places make them cheap:

* block mode of the loop-tree executor (``LoopTreeBuilder.block_ok``): a
  body statement may read what an earlier one wrote at the same element of
  the same iteration (``H[i,h] = relu(T[i,h]); S[i,h] = H[i,h]``); the
  blocked run must be bitwise the per-element walk, and a read anywhere
  else must keep the loop per element;
* group lowering (``spfuse.lowering.groups``): a result copying a temporary
  stored whole anyway, in a plan run group by group, is no loop at all.

Oracle: numpy on dense operands, and the per-element walk.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_looptree import both_threads

import spfuse
from spfuse.lowering.groups import copy_source, split_groups
from spfuse.runtime.looptree import LoopTreeBuilder, run, unary


def _two_statement_plan(D, second):
    """``H[i,j] = relu(D[i,j])`` then ``second(b, H, S, i, j)`` in one loop nest."""
    b = LoopTreeBuilder()
    n, m = D.shape
    i, j = b.var("i", n), b.var("j", m)
    d = b.access(D, (i, j))
    H, S = b.buffer((n, m), "H"), b.buffer((n, m), "S")
    with b.loop(i):
        with b.loop(j):
            second(b, d, H, S, i, j)
    return b.build()


def _inner_loop_line(plan) -> str:
    return next(line for line in plan.describe().splitlines() if line.strip().startswith("for j"))


def test_copy_after_write_runs_in_blocks():
    D = np.random.default_rng(0).standard_normal((40, 300))

    def body(b, d, H, S, i, j):
        b.statement(H[i, j], "assign", unary("relu", d))
        b.statement(S[i, j], "assign", H[i, j])

    plan = _two_statement_plan(D, body)
    assert "[block]" in _inner_loop_line(plan)
    got = both_threads(plan)
    np.testing.assert_array_equal(got["H"], np.maximum(D, 0))
    np.testing.assert_array_equal(got["S"], np.maximum(D, 0))
    blocked, walked = run(plan, num_threads=1), run(plan, num_threads=1, blocks=False)
    np.testing.assert_array_equal(blocked["S"], walked["S"])   # a copy: bitwise, not to rounding


def test_sum_reading_what_the_body_wrote_runs_in_blocks():
    """``Y[i] += H[i,j]`` after ``H[i,j] = ...``: the same element, read after it is written."""
    D = np.random.default_rng(1).standard_normal((30, 70))
    b = LoopTreeBuilder()
    i, j = b.var("i", 30), b.var("j", 70)
    d = b.access(D, (i, j))
    H, Y = b.buffer((30, 70), "H"), b.buffer((30,), "Y")
    with b.loop(i):
        with b.loop(j):
            b.statement(H[i, j], "assign", d * 2.0)
            b.statement(Y[i], "sum", H[i, j])
    plan = b.build()
    assert "[block]" in _inner_loop_line(plan)
    got = both_threads(plan)
    np.testing.assert_allclose(got["Y"], (2.0 * D).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("case", ["read_before_write", "written_element_fixed_in_loop", "other_element"])
def test_reads_elsewhere_stay_per_element(case):
    """Reads the blocked run would answer differently keep the loop per element."""
    D = np.random.default_rng(2).standard_normal((6, 9))
    b = LoopTreeBuilder()
    i, j = b.var("i", 6), b.var("j", 9)
    d = b.access(D, (i, j))
    S = b.buffer((6, 9), "S")
    if case == "read_before_write":      # S reads H's previous iteration's value
        H = b.buffer((6, 9), "H")
        with b.loop(i):
            with b.loop(j):
                b.statement(S[i, j], "assign", H[i, j])
                b.statement(H[i, j], "assign", d)
        want = np.zeros((6, 9))
    elif case == "written_element_fixed_in_loop":   # H[i] rewritten every j: S must see each value
        H = b.buffer((6,), "H")
        with b.loop(i):
            with b.loop(j):
                b.statement(H[i], "assign", d)
                b.statement(S[i, j], "assign", H[i])
        want = D
    else:   # H[j, i] written, H[i, j] read (a square transposed read)
        D = D[:6, :6]
        b = LoopTreeBuilder()
        i, j = b.var("i", 6), b.var("j", 6)
        d = b.access(np.ascontiguousarray(D), (i, j))
        H, S = b.buffer((6, 6), "H"), b.buffer((6, 6), "S")
        with b.loop(i):
            with b.loop(j):
                b.statement(H[j, i], "assign", d)
                b.statement(S[i, j], "assign", H[i, j])
        # S[i,j] sees H[i,j] = D[j,i] only where (j,i) was visited before (i,j): j < i, or i == j
        want = np.where(np.arange(6)[None, :] <= np.arange(6)[:, None], D.T, 0.0)
    plan = b.build()
    assert "[block]" not in _inner_loop_line(plan)
    np.testing.assert_array_equal(run(plan, num_threads=1)["S"], want)


# ------------------------------------------------------------ copy groups --

GCN_SAVING = ("H[i,h] = relu(A[i,j] * X[j,f] * W1[f,h]); Z[i,c] = A[i,j] * H[j,h] * W2[h,c]; "
              "H_saved[i,h] = H[i,h]")


def _gcn_operands(rng, n, f, h, c, density):
    A = sp.random_array((n, n), density=density, format="csr", rng=rng)
    A.data = rng.standard_normal(A.nnz)
    return {"A": A, "X": rng.standard_normal((n, f)), "W1": rng.standard_normal((f, h)),
            "W2": rng.standard_normal((h, c))}


def _groups(program, ops):
    kernel = spfuse.compile(program)
    return split_groups(kernel.plans(**{n: ops[n] for n in kernel.program.inputs})["auto"])


def test_saved_temporary_is_no_loop():
    ops = _gcn_operands(np.random.default_rng(3), 300, 8, 5, 3, 0.05)
    groups = _groups(GCN_SAVING, ops)
    copies = [g for g in groups if g.kernel == "copy"]
    assert [g.outputs for g in copies] == [("H_saved",)]
    assert all("H_saved" not in {op.out for op in g.ops} for g in groups if g.kernel != "copy")
    assert "no loop" in copies[0].describe()
    got = spfuse.evaluate(GCN_SAVING, **ops)
    A = ops["A"].toarray()
    H = np.maximum(A @ ops["X"] @ ops["W1"], 0)
    np.testing.assert_allclose(got["H_saved"], H, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["Z"], A @ H @ ops["W2"], rtol=1e-12, atol=1e-12)
    again = spfuse.evaluate(GCN_SAVING, **ops)
    assert not np.shares_memory(again["H_saved"], got["H_saved"])   # a fresh array per call
    np.testing.assert_array_equal(again["H_saved"], got["H_saved"])


def test_copies_of_one_source_and_of_a_result_are_separate_arrays():
    rng = np.random.default_rng(4)
    ops = _gcn_operands(rng, 200, 6, 4, 3, 0.05)
    program = GCN_SAVING + "; H_again[i,h] = H[i,h]; Z_saved[i,c] = Z[i,c]"
    assert sum(g.kernel == "copy" for g in _groups(program, ops)) == 2   # Z is consumed: Z_saved copies a temporary
    got = spfuse.evaluate(program, **ops)
    assert not np.shares_memory(got["H_saved"], got["H_again"])
    np.testing.assert_array_equal(got["H_saved"], got["H_again"])
    A = ops["A"].toarray()
    np.testing.assert_allclose(got["Z_saved"], A @ got["H_saved"] @ ops["W2"], rtol=1e-12, atol=1e-12)


def test_what_is_not_a_whole_copy():
    from spfuse.frontend.parser import parse_program
    from spfuse.ir.ops import TensorInfo
    from spfuse.planner import plan_program
    infos = {"X": TensorInfo.dense("X", (5, 5))}
    plan = plan_program(parse_program(
        "H[i,h] = relu(X[i,h]); S[h,i] = H[i,h]; T[i,h] = 2.0 * H[i,h]; U[i,h] = X[i,h]; Y[i] = sum(h, H[i,h])"),
        infos)
    assert [copy_source(plan, op) for op in plan.ops] == [None] * len(plan.ops)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), f=st.integers(1, 5), h=st.integers(1, 5), c=st.integers(1, 4),
       density=st.sampled_from([0.0, 0.1, 0.5]), seed=st.integers(0, 2**16))
def test_saving_programs_match_numpy(n, f, h, c, density, seed):
    ops = _gcn_operands(np.random.default_rng(seed), n, f, h, c, density)
    program = GCN_SAVING + "; s = sum(i, sum(h, H[i,h])); s_saved = s"
    got = spfuse.evaluate(program, **ops)
    A = ops["A"].toarray()
    H = np.maximum(A @ ops["X"] @ ops["W1"], 0)
    np.testing.assert_allclose(got["H_saved"], H, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got["Z"], A @ H @ ops["W2"], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got["s_saved"], H.sum(), rtol=1e-10, atol=1e-10)
