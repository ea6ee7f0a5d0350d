"""Fused groups ending in a contraction fed by element-wise work
(spfuse/lowering/groups.py, ``_template_tail``): the element-wise head runs
on the generic executor, the contraction on its template (BLAS gemm, SpMM).

Checked against numpy on dense operands, for the route taken, and for the
cases that must stay fused (too little work, a head temporary restricted to
a pattern)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering.groups import split_groups

#: program, kernels of its groups, numpy oracle on dense operands (A n×m sparse, Q n×k, D n×m dense)
CASES = {
    # GCN's ReLU gradient summed against a dense temporary: generic where, then BLAS gemm
    "where_then_gemm": ("T[i,h] = where(Q[i,h], Q[i,h], 0.0); Y[j,h] = sum(i, T[i,h] * D[i,j])",
                        ("generic", "gemm"), lambda A, Q, D: D.T @ np.where(Q != 0, Q, 0.0)),
    # the autoencoder's grad_We shape: a sigmoid's derivative summed against a sparse input (a small
    # output: scattered by spmm_t; a large one is SpMM with Aᵀ)
    "sigmoid_then_spmm": ("T[i,h] = sigmoid(Q[i,h]) * (1.0 - sigmoid(Q[i,h])); Y[j,h] = sum(i, A[i,j] * T[i,h])",
                          ("generic", "spmm_t"),
                          lambda A, Q, D: A.T @ (1 / (1 + np.exp(-Q)) * (1 - 1 / (1 + np.exp(-Q))))),
}


def _operands(rng, n, m, k, density, dtype):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
    A.data = rng.standard_normal(A.nnz)
    Q = rng.standard_normal((n, k))
    Q[rng.random((n, k)) < 0.3] = 0.0
    ops = {"A": A.astype(dtype), "Q": Q.astype(dtype), "D": rng.standard_normal((n, m)).astype(dtype)}
    dense = {name: (v.toarray() if sp.issparse(v) else v).astype(np.float64) for name, v in ops.items()}
    return ops, dense


def _kernels(program, ops):
    kernel = spfuse.compile(program)
    plan = kernel.plans(**{n: ops[n] for n in kernel.program.inputs})["auto"]
    return tuple(g.kernel for g in split_groups(plan))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(sorted(CASES)), n=st.integers(1, 30), m=st.integers(1, 30), k=st.integers(1, 6),
       density=st.sampled_from([0.0, 0.2, 1.0]), dtype=st.sampled_from([np.float64, np.float32]),
       seed=st.integers(0, 2**16))
def test_split_tails_match_numpy(any_work, case, n, m, k, density, dtype, seed):
    program, _, oracle = CASES[case]
    ops, dense = _operands(np.random.default_rng(seed), n, m, k, density, dtype)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    got = np.asarray(spfuse.evaluate(program, **ops))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, oracle(**dense), rtol=tol, atol=tol)
    np.testing.assert_array_equal(got, spfuse.evaluate(program, **ops))  # a repeat call: the same bits


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_takes_its_route(any_work, case):
    program, kernels, oracle = CASES[case]
    ops, dense = _operands(np.random.default_rng(2), 12, 9, 3, 0.3, np.float64)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    assert _kernels(program, ops) == kernels
    np.testing.assert_allclose(spfuse.evaluate(program, **ops), oracle(**dense), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_little_work_stays_fused(case):
    program, _, oracle = CASES[case]
    ops, dense = _operands(np.random.default_rng(0), 8, 6, 3, 0.3, np.float64)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    assert _kernels(program, ops) == ("generic",)
    np.testing.assert_allclose(spfuse.evaluate(program, **ops), oracle(**dense), rtol=1e-12, atol=1e-12)


def test_gcn_gradient_of_the_first_layer_splits_at_size():
    """GCN's adjoint at 2000 nodes: grad_W1 ran fused on the generic executor
    (several ms); now the ReLU mask is generic and the product BLAS."""
    rng = np.random.default_rng(0)
    n, f, h = 3000, 32, 16
    A = sp.random_array((n, n), density=8 / n, format="csr", rng=rng)
    H, G, X = np.maximum(rng.standard_normal((n, h)), 0), rng.standard_normal((n, h)), rng.standard_normal((n, f))
    program = ("H_r[i,f] = sum(j, A[i,j] * X[j,f]); "
               "grad_W1[f,h] = sum(i, where(H[i,h], G[i,h], 0.0) * H_r[i,f])")
    kernel = spfuse.compile(program)
    plan = kernel.plans(A=A, X=X, H=H, G=G)["auto"]
    described = " | ".join(g.describe() for g in split_groups(plan))
    assert "BLAS gemm: grad_W1" in described, described
    np.testing.assert_allclose(kernel(A=A, X=X, H=H, G=G), (A @ X).T @ np.where(H != 0, G, 0.0), rtol=1e-10)


def test_pattern_restricted_temporary_is_not_computed_whole(any_work):
    """A softmax numerator lives on A's pattern: the group runs whole as one
    pattern program, the SpMM a dense-row leaf of it (its temporary is
    never made dense to feed a template)."""
    rng = np.random.default_rng(1)
    A = sp.random_array((20, 20), density=0.2, format="csr", rng=rng)
    V = rng.standard_normal((20, 4))
    program = "E[i,j] = A[i,j] * exp(A[i,j]); Y[i,h] = sum(j, E[i,j] * V[j,h])"
    got = spfuse.evaluate(program, A=A, V=V)
    Ad = A.toarray()
    np.testing.assert_allclose(got, (Ad * np.exp(Ad)) @ V, rtol=1e-12)
    plan = spfuse.compile(program).plans(A=A, V=V)["auto"]
    assert [g.kernel for g in split_groups(plan)] == ["pattern"]
