"""End-to-end: every kernel and random programs through the Cython executor,
checked against numpy on densified operands (spfuse.testing.dense_reference)."""
import hashlib

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kernels import KERNELS, operands

import spfuse
from spfuse.tensor import Tensor
from spfuse.testing import dense_reference, programs, random_operands, random_program


def densify(x):
    if sp.issparse(x):
        return x.toarray()
    return np.asarray(x)


def plain(ops):
    return {k: (np.asarray(v) if isinstance(v, Tensor) else v) for k, v in ops.items()}


def check(text, ops, fusion="auto", rtol=1e-10, **kw):
    ref = dense_reference(text, plain(ops))
    got = spfuse.evaluate(text, fusion=fusion, **ops, **kw)
    if isinstance(ref, dict):
        assert set(got) == set(ref)
        for k in ref:
            np.testing.assert_allclose(densify(got[k]), ref[k], rtol=rtol, atol=rtol)
    else:
        np.testing.assert_allclose(densify(got), ref, rtol=rtol, atol=rtol)
    return got


@pytest.mark.parametrize("fusion", ["auto", "none", "max"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_table_matches_numpy(name, fusion, rng):
    check(KERNELS[name], operands(name, rng), fusion)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_table_float32(name, rng):
    ops = operands(name, rng, dtype=np.float32)
    got = check(KERNELS[name], ops, rtol=1e-5)
    assert np.asarray(densify(got)).dtype == np.float32


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_one_and_two_threads_bit_identical(name, rng, monkeypatch):
    import spfuse.lowering.templates as templates
    monkeypatch.setattr(templates, "PARALLEL_MIN_WORK", 0)  # really use 2 threads on small inputs
    ops = operands(name, rng, n=40)
    one = spfuse.evaluate(KERNELS[name], num_threads=1, **ops)
    two = spfuse.evaluate(KERNELS[name], num_threads=2, **ops)
    assert np.array_equal(densify(one), densify(two))


def test_results_keep_caller_flavour(rng):
    B = sp.random(10, 8, density=0.3, format="csr", random_state=1)  # spmatrix
    C, D = rng.random((10, 3)), rng.random((3, 8))
    out = spfuse.evaluate(KERNELS["SDDMM"], B=B, C=C, D=D)
    assert isinstance(out, sp.csr_matrix)
    out = spfuse.evaluate(KERNELS["SDDMM"], B=sp.csr_array(B), C=C, D=D)
    assert isinstance(out, sp.csr_array)
    assert isinstance(spfuse.evaluate("y[i] = A[i,j] * x[j]", A=np.ones((2, 2)), x=np.ones(2)), np.ndarray)


def test_out_format_forced(rng):
    ops = operands("SpGEMM", rng)
    ref = dense_reference(KERNELS["SpGEMM"], ops)
    for fmt, kind in [("csr", sp.csr_array), ("csc", sp.csc_array), ("coo", sp.coo_array)]:
        out = spfuse.evaluate(KERNELS["SpGEMM"], out_format=fmt, **ops)
        assert isinstance(out, kind)
        np.testing.assert_allclose(out.toarray(), ref)
    assert isinstance(spfuse.evaluate(KERNELS["SpGEMM"], out_format="dense", **ops), np.ndarray)


def test_inputs_never_mutated(rng):
    B = spfuse.testing.random_sparse(rng, (12, 9), 0.4, "csr", canonical=False)
    C, D = rng.random((12, 4)), rng.random((4, 9))

    def digest():
        return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes()
                                       for a in (B.data, B.indices, B.indptr, C, D))).hexdigest()

    before = digest()
    check(KERNELS["SDDMM"], {"B": B, "C": C, "D": D})
    assert digest() == before


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0), (4, 3)])
def test_empty_and_zero_size(shape, rng):
    A = sp.csr_array(shape)
    x = rng.random(shape[1])
    check("y[i] = A[i,j] * x[j]", {"A": A, "x": x})
    C, D = rng.random((shape[0], 2)), rng.random((2, shape[1]))
    check(KERNELS["SDDMM"], {"B": A, "C": C, "D": D})
    check(KERNELS["SpGEMM"], {"A": A, "B": sp.csr_array((shape[1], 3))})


def test_multi_statement_returns_unconsumed_results(rng):
    A = sp.random_array((6, 5), density=0.5, format="csr", rng=rng)
    x = rng.random(5)
    out = check("y[i] = A[i,j] * x[j]; s = y[i] * y[i]; z[i] = relu(y[i] - 0.5)", {"A": A, "x": x})
    assert list(out) == ["s", "z"]


def test_unary_where_max_min(rng):
    A = sp.random_array((7, 6), density=0.4, format="csr", rng=rng)
    D = rng.random((7, 6)) - 0.5
    check("B[i,j] = where(A[i,j], exp(D[i,j]), sigmoid(D[i,j]))", {"A": A, "D": D})
    check("m[i] = max(j, A[i,j] - 0.2)", {"A": A})
    check("m[i] = min(j, D[i,j] * A[i,j])", {"A": A, "D": D})
    check("c[i,j] = tanh(A[i,j]) + abs(D[i,j]) / (sqrt(abs(D[i,j])) + 1)", {"A": A, "D": D})


def test_einsum_semantics(rng):
    A = sp.random_array((5, 5), density=0.5, format="csr", rng=rng)
    x = rng.random(5)
    Ad = A.toarray()
    for subs, args, dargs in [("ij,j->i", (A, x), (Ad, x)), ("ij,j", (A, x), (Ad, x)), ("ii->i", (A,), (Ad,)),
                              ("ii", (A,), (Ad,)), ("ij,ij->", (A, A), (Ad, Ad)), ("ij->ji", (A,), (Ad,)),
                              ("ij,jk->ik", (A, A), (Ad, Ad))]:
        np.testing.assert_allclose(densify(spfuse.einsum(subs, *args)), np.einsum(subs, *dargs), err_msg=subs)


def test_compile_runs_and_explains(rng):
    k = spfuse.compile(KERNELS["SDDMM"], B="csr")
    ops = operands("SDDMM", rng)
    np.testing.assert_allclose(k(**ops).toarray(), dense_reference(KERNELS["SDDMM"], ops))
    report = k.explain(**ops)
    for needle in ("unit operations", "index tree after fusion", "reset T0", "parallel: inside each kernel",
                   "dead-value", "O(K·nnz(B))"):
        assert needle in report


def test_plan_cache_hits(rng):
    spfuse.clear_cache()
    ops = operands("SpMV", rng)
    spfuse.evaluate(KERNELS["SpMV"], **ops)
    spfuse.evaluate(KERNELS["SpMV"], **ops)
    assert spfuse.cache_info()["plans"] == 1


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(max_extent=4, n_statements=(1, 3)), st.integers(0, 2**31 - 1),
       st.sampled_from(["auto", "none", "max"]), st.sampled_from([1, 2]), st.booleans(),
       st.sampled_from([0.0, 0.3, 1.0]))
# a sparse vector intersected under a 3-d tensor's fibers (the sweeps' sparse∩sparse dot leaf)
@example(random_program(np.random.default_rng(1757), max_extent=4, n_statements=(1, 3)), 0, "max", 1, False, 1.0)
def test_random_programs_match_numpy(prog_shapes, seed, fusion, threads, canonical, density):
    program, shapes = prog_shapes
    ops = random_operands(seed, shapes, density=density, canonical=canonical, empty_rows=0.2)
    ref = dense_reference(program, ops)
    got = spfuse.evaluate(program.text, fusion=fusion, num_threads=threads, **ops)
    if isinstance(ref, dict):
        for k in ref:
            np.testing.assert_allclose(densify(got[k]), ref[k], rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_allclose(densify(got), ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_table_uses_a_template_kernel(name, rng):
    from spfuse.api import describe_execution
    k = spfuse.compile(KERNELS[name])
    plan = k.plans(**operands(name, rng))["auto"]
    assert describe_execution(plan).startswith("template kernel"), describe_execution(plan)


@pytest.mark.parametrize("threads", [1, 2])
def test_generic_executor_threads_bit_identical(threads, rng, monkeypatch):
    import spfuse.lowering.templates as templates
    monkeypatch.setattr(templates, "PARALLEL_MIN_WORK", 0)
    for name in sorted(KERNELS):
        ops = operands(name, rng, n=30)
        one = densify(spfuse.evaluate(KERNELS[name], fusion="none", num_threads=1, **ops))
        many = densify(spfuse.evaluate(KERNELS[name], fusion="none", num_threads=threads, **ops))
        assert np.array_equal(one, many), name


def test_template_and_generic_executor_agree(rng):
    # the generic loop-tree path (fusion="none") is the in-engine oracle of the templates
    for name in sorted(KERNELS):
        ops = operands(name, rng, n=20)
        a = densify(spfuse.evaluate(KERNELS[name], **ops))
        b = densify(spfuse.evaluate(KERNELS[name], fusion="none", **ops))
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("text, want", [
    # every op writes row i: blocks of rows
    ("y[i] = max(j, X[i,j] + Z[i,j])", "parallel: i: blocks of iterations over the threads"),
    # i is summed away: fixed blocks whose partial sums are added in block order
    ("y[j] = sum(i, X[i,j] * Z[i,j])", "parallel: i: fixed reduction blocks over the threads"),
])
def test_explain_reports_how_the_executor_runs_the_loops_over_threads(text, want, rng):
    """explain()'s parallel line is the runtime's own decision for the
    generic executor (not a planner guess): row blocks or reduction blocks
    (or serial with the reason: test_looptree's union); without operands it
    says where it is decided."""
    ops = {"X": rng.random((6, 5)), "Z": rng.random((6, 5))}
    k = spfuse.compile(text)
    assert "generic loop-tree executor" in k.explain(**ops)
    line = next(ln for ln in k.explain(**ops).splitlines() if ln.startswith("parallel:"))
    assert want in line
    assert "pass them to explain()" in next(ln for ln in k.explain().splitlines() if ln.startswith("parallel:"))
