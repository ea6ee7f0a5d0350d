"""What keeps a backward pass near its forward's cost (issue 15's backward
target): the adjoint programs' statements reach the same fast paths as
forward programs.

Every program is checked against numpy on densified operands (so a faster
path that changes the numbers fails here) and checked to take the path it
is written for (so the test exercises it)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.api import _cached_plan, _info
from spfuse.lowering.groups import _subplan, split_groups
from spfuse.tensor import Tensor, as_tensor
from spfuse.testing import dense_reference, random_sparse

try:   # the gradient oracle: torch's dense autograd
    from test_autodiff import check_gradients
except pytest.skip.Exception:
    check_gradients = None


def _csf(rng, shape, density):
    dense = np.where(rng.random(shape) < density, rng.uniform(0.1, 1.0, shape), 0.0)
    return Tensor.from_numpy(dense, "csf")


def _on_fibres(B, extent, rng):
    """A (compressed, compressed, dense) tensor on B's (i,j) fibres, as a
    TTM of B makes it (the cotangent of SpTTM-SpTTM lives there)."""
    return spfuse.evaluate("G[i,j,m] = B[i,j,k] * C[k,m]", B=B, C=rng.random((B.shape[2], extent)))


def _plan(text, **ops):
    from spfuse.frontend.parser import parse_program
    tensors = {n: as_tensor(v, name=n) for n, v in ops.items()}
    return _cached_plan(parse_program(text), {n: _info(n, t) for n, t in tensors.items()}, "auto")


# -- a temporary crossing from a generic group to a later one is stored dense

CROSSING = "T[k,l] = sum(i, j, sum(m, G[i,j,m] * D[l,m]) * B[i,j,k])"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(1, 6), j=st.integers(1, 6), k=st.integers(1, 7), m=st.integers(1, 5), l=st.integers(1, 5),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 16))
def test_a_crossing_temporary_under_a_sparse_mask_matches_numpy(i, j, k, m, l, density, seed):
    rng = np.random.default_rng(seed)
    B = _csf(rng, (i, j, k), density)
    G, D = _on_fibres(B, m, rng), rng.random((l, m))
    got = spfuse.evaluate(CROSSING, G=G, D=D, B=B)
    np.testing.assert_allclose(np.asarray(got), dense_reference(CROSSING, {"G": G.todense(), "D": D,
                                                                             "B": B.todense()}), atol=1e-12)


def test_a_crossing_temporary_is_stored_dense_by_the_group_making_it():
    rng = np.random.default_rng(0)
    B = _csf(rng, (6, 5, 8), 0.3)
    G, D = _on_fibres(B, 4, rng), rng.random((3, 4))
    plan = _plan(CROSSING, G=G, D=D, B=B)
    groups = split_groups(plan)
    assert [g.kernel for g in groups] == ["generic", "gemm"]   # (the case this test is about)
    crossing = groups[0].outputs[0]
    assert crossing not in plan.results
    assert all(lv == "dense" for lv in _subplan(plan, groups[0]).formats[crossing].levels)


# -- gemm reads a transposed operand as stored

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m, k, n", [(3, 5, 4), (1, 7, 1), (4, 0, 2), (0, 3, 2)])
def test_gemm_with_transposed_operands_matches_numpy(dtype, trans_a, trans_b, m, k, n):
    from spfuse._kernels import _dense_kernels
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    A = rng.random((k, m) if trans_a else (m, k)).astype(dtype)
    B = rng.random((n, k) if trans_b else (k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    _dense_kernels.gemm(A, B, out, None, trans_a=trans_a, trans_b=trans_b)
    want = (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m, k, n", [(3, 5000, 7), (32, 20011, 32), (1, 4097, 300)])
def test_deep_gemm_cut_along_the_summed_extent(dtype, trans_a, trans_b, m, k, n):
    """A product too narrow to cut along out and deep in ``k`` (a weight
    gradient ``Xᵀ·G``) runs in blocks of ``k`` into partials (BLAS held to
    one thread): numpy's product, the same bits on one thread and on two."""
    from spfuse._kernels import _dense_kernels
    from spfuse.runtime.blas_pool import hold_blas_once
    hold_blas_once()
    rng = np.random.default_rng(m + k + n)
    A = rng.random((k, m) if trans_a else (m, k)).astype(dtype)
    B = rng.random((n, k) if trans_b else (k, n)).astype(dtype)
    outs = []
    for nt in (1, 2):
        out = np.full((m, n), np.nan, dtype)
        _dense_kernels.gemm(A, B, out, nt, trans_a=trans_a, trans_b=trans_b)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    want = (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
    np.testing.assert_allclose(outs[0], want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_gemm_refuses_mismatched_shapes():
    from spfuse._kernels import _dense_kernels
    with pytest.raises(ValueError, match="shapes"):
        _dense_kernels.gemm(np.ones((3, 4)), np.ones((3, 2)), np.empty((3, 2)))


@pytest.mark.parametrize("text, want", [
    ("T[l,m] = sum(f, G[f,m] * A[f,l])", lambda G, A: A.T @ G),
    ("T[m,l] = sum(f, G[f,m] * A[f,l])", lambda G, A: G.T @ A),
    ("T[i,l] = sum(f, G[i,f] * A[f,l])", lambda G, A: G[:, :40] @ A[:40]),
])
def test_gemm_groups_do_not_copy_a_factor_read_transposed(text, want, monkeypatch):
    rng = np.random.default_rng(1)
    G, A = rng.random((50, 6)), rng.random((50, 7))
    if text.startswith("T[i,l]"):
        G = rng.random((6, 40))
        A = A[:40]
    copies = []
    real = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda a, *args, **kw: copies.append(a.shape) or real(a, *args, **kw))
    got = spfuse.evaluate(text, G=G, A=A)
    monkeypatch.undo()
    np.testing.assert_allclose(got, want(G, A), rtol=1e-12)
    assert not [s for s in copies if s in (G.shape[::-1], A.shape[::-1])]


# -- sums over the fibres sparse operands share run over one fibre index

def _dispatch(text, **ops):
    from spfuse.api import _Dispatch
    from spfuse.frontend.parser import parse_program
    tensors = {n: as_tensor(v, name=n) for n, v in ops.items()}
    return _Dispatch(parse_program(text), tensors, "auto", None), tensors


FIBRE_CASES = {
    # (program, operands: B csf (i,j,k); G on B's (i,j) fibres (ccd), g on them (dcsr); dense C, D, c)
    "spttm_grad_d": "T[l,m] = sum(i, j, G[i,j,m] * H[i,j,l])",
    "spttm_grad_c": "T[k,l] = sum(i, j, sum(m, G[i,j,m] * D[l,m]) * B[i,j,k])",
    "ttv_grad_c": "t[k] = sum(i, j, g[i,j] * B[i,j,k])",
    "column_sums": "t[k] = sum(i, j, B[i,j,k])",
    "outer_fibres_only": "t[k] = sum(i, j, B[i,j,k] * E[k,j])",   # j read densely: only i's level merged
    "scaled_ratio": "t[k] = sum(i, j, -relu(g[i,j]) / (1.0 + c[k]) * B[i,j,k])",
    "both_summed": "s = sum(i, j, m, G[i,j,m] * G[i,j,m])",
}


def _fibre_operands(rng, shape, density, extent):
    B = _csf(rng, shape, density)
    G = _on_fibres(B, extent, rng)
    H = _on_fibres(B, extent + 1, rng)
    g = spfuse.evaluate("g[i,j] = B[i,j,k] * c[k]", B=B, c=rng.random(shape[2]) + 0.5)
    return {"B": B, "G": G, "H": H, "g": g, "C": rng.random((shape[2], extent)), "D": rng.random((extent, extent)),
            "c": rng.random(shape[2]), "E": rng.random((shape[2], shape[1])),
            "F": rng.random((shape[2], shape[0]))}


@pytest.mark.parametrize("case", sorted(FIBRE_CASES))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(i=st.integers(1, 5), j=st.integers(1, 5), k=st.integers(1, 6), m=st.integers(1, 4),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 16))
def test_sums_over_shared_fibres_match_numpy(case, i, j, k, m, density, seed):
    from spfuse.frontend.parser import parse_program
    text = FIBRE_CASES[case]
    ops = _fibre_operands(np.random.default_rng(seed), (i, j, k), density, m)
    ops = {n: ops[n] for n in parse_program(text).inputs}
    got = spfuse.evaluate(text, **ops)
    want = dense_reference(text, {n: v.todense() if isinstance(v, Tensor) else v for n, v in ops.items()})
    np.testing.assert_allclose(np.asarray(got.todense() if isinstance(got, Tensor) else got), want, atol=1e-12)


@pytest.mark.parametrize("case", sorted(FIBRE_CASES))
def test_sums_over_shared_fibres_run_flattened(case):
    from spfuse.frontend.parser import parse_program
    text = FIBRE_CASES[case]
    ops = _fibre_operands(np.random.default_rng(3), (6, 5, 7), 0.3, 4)
    dispatch, tensors = _dispatch(text, **{n: ops[n] for n in parse_program(text).inputs})
    assert dispatch.fibres is not None
    flat = dispatch.fibres.operands(tensors)
    assert flat is not None and "sum(f," in dispatch.fibres.program.text
    for name in dispatch.fibres.sparse:   # the same arrays, one dense level over the fibres in front
        assert np.shares_memory(flat[name].values, tensors[name].values) and flat[name].format.levels[0] == "dense"


@pytest.mark.parametrize("text", [
    "T[i,l] = sum(j, G[i,j,m] * H[i,j,l])",           # i kept: not every fibre index is summed
    "t[k] = sum(i, j, g[i,j] * B[i,j,k] + c[k])",      # + c[k] is not zero off the fibres
    "t[k] = sum(i, j, exp(g[i,j]) * c[k])",            # exp(0) = 1 off the fibres
    "t[k] = sum(i, j, B[i,j,k] * F[k,i])",             # i read by a dense operand
    "T[k,l] = sum(i, j, max(m, G[i,j,m] * D[l,m]) * B[i,j,k]); U[k] = c[k]",   # two statements
])
def test_programs_not_over_shared_fibres_are_not_flattened(text):
    from spfuse.frontend.parser import parse_program
    ops = _fibre_operands(np.random.default_rng(4), (4, 3, 5), 0.5, 3)
    dispatch, _ = _dispatch(text, **{n: ops[n] for n in parse_program(text).inputs})
    assert dispatch.fibres is None


def test_operands_on_other_fibres_run_the_program_as_written():
    rng = np.random.default_rng(5)
    B = _csf(rng, (6, 5, 7), 0.3)
    other = _csf(rng, (6, 5, 7), 0.3)
    G = _on_fibres(other, 4, rng)
    text = FIBRE_CASES["spttm_grad_c"]
    ops = {"G": G, "D": rng.random((4, 4)), "B": B}
    dispatch, tensors = _dispatch(text, **ops)
    assert dispatch.fibres is not None and dispatch.fibres.operands(tensors) is None
    want = dense_reference(text, {"G": G.todense(), "D": ops["D"], "B": B.todense()})
    np.testing.assert_allclose(spfuse.evaluate(text, **ops), want, atol=1e-12)


# -- a negation all users of a shared sparse prefix carry is applied once, on the pattern

DIVISION = "A[i,j] = B[i,j] / (C[i,k] * D[k,j])"


def test_a_shared_negated_prefix_is_negated_on_its_pattern():
    from spfuse.autodiff import adjoint
    adj = adjoint(DIVISION, wrt=("C", "D"), sparse=("B",))
    lines = adj.text.splitlines()
    shared = [line for line in lines if line.startswith("grad_A_p")]
    assert len(shared) == 1 and "= -(" in shared[0]
    grads = [line for line in lines if line.startswith(("grad_C", "grad_D"))]
    assert len(grads) == 2 and not any("= -" in line or "neg(" in line for line in grads)


def test_contributions_of_mixed_sign_keep_their_own_sign():
    from spfuse.autodiff import adjoint
    # C's path through the denominator is negated, X's through the numerator is not
    text = adjoint("A[i,j] = B[i,j] * X[i,j] / (C[i,k] * D[k,j])", wrt=("C", "X"), sparse=("B",)).text
    assert "grad_C[i, k] = -sum(" in text


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), m=st.integers(1, 6), r=st.integers(1, 4), density=st.floats(0.0, 1.0),
       fmt=st.sampled_from(["csr", "csc", "dense"]), seed=st.integers(0, 2 ** 16))
def test_sddmm_division_gradients_match_torch(n, m, r, density, fmt, seed):
    if check_gradients is None:
        pytest.skip("needs torch (the gradient oracle)")
    rng = np.random.default_rng(seed)
    ops = {"B": random_sparse(rng, (n, m), density, fmt), "C": rng.uniform(0.5, 1.5, (n, r)),
           "D": rng.uniform(0.5, 1.5, (r, m))}
    check_gradients(DIVISION, ops, rng, wrt=("B", "C", "D"))


# -- a CSR operand the planner reads as CSC is converted through the remembered transposed pattern

def test_a_csr_operand_read_as_csc_is_converted_through_the_remembered_transpose():
    import scipy.sparse as sp

    from spfuse.lowering import transposes
    A = sp.random_array((3000, 3000), density=0.002, format="csr", rng=0)
    B = sp.random_array((3000, 3000), density=0.002, format="csr", rng=1)
    k = spfuse.compile("C[i,k] = A[i,j] * B[k,j]")
    assert "A is read as csc" in k.explain(A=A, B=B)   # (the case this test is about)
    transposes.clear()
    rng = np.random.default_rng(2)
    for _ in range(2):   # same pattern, new values: the remembered pattern, this call's values
        A.data = rng.standard_normal(A.nnz)
        np.testing.assert_allclose(k(A=A, B=B).toarray(), (A @ B.T).toarray(), rtol=1e-12, atol=1e-14)
    assert transposes.cache_size() == 1
    rows = np.diff(A.indptr)   # a pattern rewritten in place is never served a stale transpose
    A.indices[:] = np.concatenate([np.sort(rng.choice(3000, r, replace=False)) for r in rows]).astype(A.indices.dtype)
    np.testing.assert_allclose(k(A=A, B=B).toarray(), (A @ B.T).toarray(), rtol=1e-12, atol=1e-14)


# -- factors several gradients share, on a sparse input's pattern, are computed once

SHARED = {
    "SDDMM-SpMM": ("A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]", ("C", "D", "E"),
                   {"B": (7, 6), "C": (7, 3), "D": (6, 3), "E": (6, 2)}),
    "SDDMM-SpMM-GEMM": ("A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]", ("C", "D", "F", "W"),
                        {"B": (7, 6), "C": (7, 3), "D": (6, 3), "F": (6, 2), "W": (2, 4)}),
    "GNN-2": ("Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]", ("X", "Y"),
              {"A": (6, 6), "X": (6, 3), "Y": (3, 6)}),
}


@pytest.mark.parametrize("case", sorted(SHARED))
def test_a_product_gradients_share_on_a_pattern_is_one_statement(case):
    from spfuse.autodiff import adjoint
    text, wrt, shapes = SHARED[case]
    sparse = next(iter(shapes))
    lines = adjoint(text, wrt=wrt, sparse=(sparse,)).text.splitlines()
    shared = [line for line in lines if line.split("[")[0].endswith("_p")]
    assert len(shared) == 1 and f"* {sparse}[" in shared[0]   # on the sparse input's pattern
    name = shared[0].split("[")[0]
    readers = [line for line in lines if f"{name}[" in line.split("=", 1)[1]]
    assert len(readers) == 2   # two gradients, each one contraction with the shared values
    assert all(line.count("sum(") == 1 for line in readers if line.startswith(("grad_C", "grad_D", "grad_X")))


def test_factors_not_on_a_pattern_are_not_shared():
    from spfuse.autodiff import adjoint
    # the shared part grad_A[i,l]*E[j,l] keeps l for grad_E: not on B's pattern
    text = adjoint("A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]", wrt=("E",), sparse=("B",)).text
    assert "_p[" not in text
    # a dense B: no pattern to store the shared product on
    text = adjoint("A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]", wrt=("C", "D")).text
    assert "_p[" not in text


@pytest.mark.parametrize("case", sorted(SHARED))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(density=st.floats(0.0, 1.0), fmt=st.sampled_from(["csr", "csc", "dense"]), with_sparse=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_shared_products_give_torchs_gradients(case, density, fmt, with_sparse, seed):
    if check_gradients is None:
        pytest.skip("needs torch (the gradient oracle)")
    text, wrt, shapes = SHARED[case]
    rng = np.random.default_rng(seed)
    sparse = next(iter(shapes))
    ops = {n: random_sparse(rng, s, density, fmt) if n == sparse else rng.standard_normal(s)
           for n, s in shapes.items()}
    check_gradients(text, ops, rng, wrt=((sparse,) if with_sparse else ()) + wrt)


# -- a CSF read in another mode order when that makes the statement a template kernel's

MTTKRP_LAST = "g[k,r] = sum(i, j, G[i,r] * C[j,r] * X[i,j,k])"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(1, 6), j=st.integers(1, 6), k=st.integers(1, 6), r=st.integers(1, 4),
       density=st.floats(0.0, 1.0), order=st.permutations([0, 1, 2]), seed=st.integers(0, 2 ** 16))
def test_contractions_onto_any_stored_mode_match_numpy(i, j, k, r, density, order, seed):
    from spfuse.formats import Format
    rng = np.random.default_rng(seed)
    X = _csf(rng, (i, j, k), density).asformat(Format.csf(tuple(order)))
    G, C = rng.standard_normal((i, r)), rng.standard_normal((j, r))
    for _ in range(2):   # the second call reads X through the remembered reordering
        got = spfuse.evaluate(MTTKRP_LAST, G=G, C=C, X=X)
        np.testing.assert_allclose(got, np.einsum("ir,jr,ijk->kr", G, C, X.todense()), rtol=1e-10, atol=1e-12)


def test_a_contraction_onto_the_last_stored_mode_reads_the_tensor_as_stored():
    # (it was read reordered, a gather of X's values per call, 7.0 ms of a 14.7 ms
    # MTTKRP-GEMM backward; mttkrp_inner scatters into the last mode's rows: 3.8 ms)
    rng = np.random.default_rng(0)
    X = _csf(rng, (9, 8, 7), 0.2)
    ops = {"G": rng.standard_normal((9, 4)), "C": rng.standard_normal((8, 4)), "X": X}
    explained = spfuse.compile(MTTKRP_LAST).explain(**ops)
    assert "template kernel 'mttkrp_inner'" in explained and "X is read in mode order" not in explained
    before = (X.values.copy(), *(a.copy() for lv in X.levels for a in (lv.pos, lv.crd)))
    spfuse.evaluate(MTTKRP_LAST, **ops)
    after = (X.values, *(a for lv in X.levels for a in (lv.pos, lv.crd)))
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))   # the caller's X untouched


def test_the_remembered_reordering_follows_values_and_patterns():
    from spfuse.formats import Format
    from spfuse.lowering.transposes import clear, stored_as
    clear()
    rng = np.random.default_rng(1)
    fmt = Format(("compressed",) * 3, (2, 0, 1))
    X = _csf(rng, (5, 4, 6), 0.4)
    first = stored_as(X, fmt)
    np.testing.assert_array_equal(first.todense(), X.todense())
    Y = X.with_values(rng.standard_normal(X.nnz))   # same pattern, new values: the same reordering
    np.testing.assert_array_equal(stored_as(Y, fmt).todense(), Y.todense())
    Z = _csf(rng, (5, 4, 6), 0.4)                    # another pattern: reordered afresh
    np.testing.assert_array_equal(stored_as(Z, fmt).todense(), Z.todense())
    assert stored_as(X, X.format) is X


# -- a sum whose stored value would be a projection off a sparse input's leading modes is multiplied out

def test_mttkrps_adjoint_is_two_contractions_without_a_projected_temporary():
    from spfuse.autodiff import adjoint
    lines = adjoint("A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", wrt=("C", "D"), sparse=("X",)).text.splitlines()
    assert [line.split("[")[0] for line in lines] == ["grad_C", "grad_D"]
    # a sum over a matrix's trailing mode (a row of an SpMM) is not a projection: multiplied out as
    # a contraction chain (ordered by the planner, tests/test_adjoint_contractions.py), not hoisted
    lines = adjoint("Z[i,j] = A[i,k] * X[k,h] * W[h,j]", wrt=("W",), sparse=("A",)).text.splitlines()
    assert lines == ["grad_W[h, j] = sum(k, X[k, h] * sum(i, A_T[k, i] * grad_Z[i, j]))"]
    # not inside a selection's condition or a divisor: there a sum is not multiplied out
    text = adjoint("y[j] = where(D[k,j], E[j], F[j]) + E[j] / sum(k, D[k,j] * x[k])", wrt=("E", "F", "x"),
                   sparse=("D",)).text
    assert "where(D_T[j, k]" not in text and "where(D[k, j]" not in text


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(density=st.floats(0.0, 1.0), with_sparse=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_mttkrp_gradients_match_torch(density, with_sparse, seed):
    if check_gradients is None:
        pytest.skip("needs torch (the gradient oracle)")
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((5, 4, 6)) < density, rng.standard_normal((5, 4, 6)), 0.0)
    ops = {"X": Tensor.from_numpy(X, "csf"), "C": rng.standard_normal((4, 3)), "D": rng.standard_normal((6, 3))}
    check_gradients("A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", ops, rng, wrt=(("X",) if with_sparse else ()) + ("C", "D"))


# -- a contraction several gradients share is computed once, stored dense

def test_a_shared_contraction_is_one_statement():
    from spfuse.autodiff import adjoint
    lines = adjoint("A[i,j,m] = B[i,j,k] * C[k,l] * D[l,m]", wrt=("C", "D"), sparse=("B",)).text.splitlines()
    assert lines == ["grad_A_c[m, k] = sum(i, j, grad_A[i, j, m] * B[i, j, k])",
                     "grad_C[k, l] = sum(m, grad_A_c[m, k] * D[l, m])",
                     "grad_D[l, m] = sum(k, grad_A_c[m, k] * C[k, l])"]
    # two modes of B would be kept (a dense J x K x L): only the dense part is shared
    lines = adjoint("A[i,m] = B[i,k,l] * C[l,j] * D[k,j] * E[j,m]", wrt=("C", "D"), sparse=("B",)).text.splitlines()
    assert "grad_A_c[i, j] = sum(m, grad_A[i, m] * E[j, m])" in lines
    # SDDMM's C·D is read on B's pattern: never stored whole
    text = adjoint("A[i,j] = B[i,j] * (C[i,k] * D[k,j]) * X[i,j]", wrt=("X", "B"), sparse=("B",)).text
    assert "_c[" not in text


@pytest.mark.parametrize("text, shapes", [
    ("A[i,j,m] = B[i,j,k] * C[k,l] * D[l,m]", {"B": (4, 3, 5), "C": (5, 3), "D": (3, 2)}),
    ("A[i,m] = B[i,k,l] * C[l,j] * D[k,j] * E[j,m]", {"B": (4, 3, 5), "C": (5, 3), "D": (3, 3), "E": (3, 2)}),
])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(density=st.floats(0.0, 1.0), with_sparse=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_tensor_chain_gradients_match_torch(text, shapes, density, with_sparse, seed):
    if check_gradients is None:
        pytest.skip("needs torch (the gradient oracle)")
    rng = np.random.default_rng(seed)
    B = np.where(rng.random(shapes["B"]) < density, rng.standard_normal(shapes["B"]), 0.0)
    ops = {n: Tensor.from_numpy(B, "csf") if n == "B" else rng.standard_normal(s) for n, s in shapes.items()}
    dense = tuple(n for n in shapes if n != "B")
    check_gradients(text, ops, rng, wrt=(("B",) if with_sparse else ()) + dense)


def test_explain_shows_the_program_over_shared_fibres():
    rng = np.random.default_rng(6)
    ops = _fibre_operands(rng, (5, 4, 6), 0.4, 3)
    text = FIBRE_CASES["spttm_grad_d"]
    explained = spfuse.compile(text).explain(G=ops["G"], H=ops["H"])
    assert "over shared fibres, when G, H store the same fibres of their 2 leading levels" in explained
    assert "sum(f, G[f, m] * H[f, l])" in explained


def test_an_operand_the_planner_reads_in_another_order_is_flattened_as_stored():
    """The flattening follows the operands' own storage (a plan may convert one)."""
    from spfuse.formats import Format
    rng = np.random.default_rng(7)
    B = _csf(rng, (5, 4, 6), 0.4).asformat(Format.csf((1, 0, 2)))   # stored (j, i, k)
    G = spfuse.evaluate("G[i,j,m] = B[i,j,k] * C[k,m]", B=B, C=rng.random((6, 3)))
    for text in ("t[k] = sum(i, j, B[i,j,k])", "T[k,m] = sum(i, j, G[i,j,m] * B[i,j,k])"):
        ops = {"B": B, "G": G}
        ops = {n: ops[n] for n in ("B", "G") if f"{n}[" in text}
        want = dense_reference(text, {n: v.todense() for n, v in ops.items()})
        np.testing.assert_allclose(np.asarray(spfuse.evaluate(text, **ops)), want, atol=1e-12)
