"""fusion="max" and "none" run on the kernels auto's groups use wherever
their loop nests are the kernels' own: a statement that is one product of
two factors is the same loop nest in every strategy, so the strategy
comparison (``spfuse bench --suite fusion``, ``Kernel.compare``) times the
strategies, not the executors.  A maximal-fusion statement with a workspace,
or a longer chain, keeps its own fused loop nest on the loop-tree executor."""
import numpy as np
import pytest
import scipy.sparse as sp

import spfuse


def _execution(kernel, **operands) -> str:
    return next(line for line in kernel.explain(**operands).splitlines() if line.startswith("execution"))


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random_array((60, 50), density=0.1, format="csr", rng=rng)
    B = sp.random_array((50, 40), density=0.1, format="csr", rng=rng)
    return {"A": A, "B": B, "x": rng.standard_normal(50), "b": rng.standard_normal(60),
            "X": rng.standard_normal((50, 6)), "W": rng.standard_normal((6, 3)),
            "C": rng.standard_normal((60, 4)), "D": rng.standard_normal((50, 4))}


#: one statement, one product of two factors: (program, its operands, the kernel every strategy runs)
TWO_FACTORS = {
    "spmv": ("y[i] = A[i,j] * x[j]", ("A", "x"), "spmv"),
    "spmm": ("Y[i,k] = A[i,j] * X[j,k]", ("A", "X"), "spmm"),
    "spgemm": ("Z[i,k] = A[i,j] * B[j,k]", ("A", "B"), "spgemm"),
}


@pytest.mark.parametrize("case", sorted(TWO_FACTORS))
def test_a_two_factor_statement_runs_on_the_same_kernel_in_every_strategy(case):
    program, names, kernel = TWO_FACTORS[case]
    ops = {n: v for n, v in _operands().items() if n in names}
    results = {}
    for fusion in ("auto", "max", "none"):
        k = spfuse.compile(program, fusion=fusion, **ops)
        assert f"'{kernel}'" in _execution(k, **ops), (fusion, _execution(k, **ops))
        results[fusion] = k(**ops)
    dense = {n: v.toarray() if sp.issparse(v) else v for n, v in ops.items()}
    want = np.einsum({"spmv": "ij,j->i", "spmm": "ij,jk->ik", "spgemm": "ij,jk->ik"}[case], *dense.values())
    for fusion, got in results.items():
        got = got.toarray() if sp.issparse(got) else got
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=fusion)
        np.testing.assert_array_equal(got, results["auto"].toarray() if sp.issparse(results["auto"])
                                      else results["auto"], err_msg=fusion)   # one kernel: the same bits


def test_max_statements_one_after_another_each_run_on_a_kernel():
    ops = {n: v for n, v in _operands().items() if n in ("A", "x")}
    ops["A"] = sp.random_array((50, 50), density=0.1, format="csr", rng=1)
    k = spfuse.compile("y[i] = A[i,j] * x[j]; z[i] = A[i,j] * y[j]", fusion="max", **ops)
    assert "'spmv → spmv'" in _execution(k, **ops)
    A = ops["A"].toarray()
    np.testing.assert_allclose(k(**ops), A @ (A @ ops["x"]), rtol=1e-12)   # (the last statement: the result)


@pytest.mark.parametrize("program, names", [
    ("y[i] = A[i,j] * x[j] + b[i]", ("A", "x", "b")),          # a workspace (TACO's scalar)
    ("Z[i,h] = A[i,j] * X[j,f] * W[f,h]", ("A", "X", "W")),    # a chain: max's nest costs nnz·F·H
    ("S[i,j] = A[i,j] * C[i,k] * D[j,k]", ("A", "C", "D")),    # B distributed over the k-sum
])
def test_a_maximally_fused_nest_stays_on_the_loop_tree_executor(program, names):
    ops = {n: v for n, v in _operands().items() if n in names}
    k = spfuse.compile(program, fusion="max", **ops)
    assert "generic loop-tree executor" in _execution(k, **ops)
    auto = spfuse.evaluate(program, **ops)
    got = k(**ops)
    np.testing.assert_allclose(got.toarray() if sp.issparse(got) else got,
                               auto.toarray() if sp.issparse(auto) else auto, rtol=1e-10, atol=1e-12)
