"""Fiber-wise block mode of the loop-tree executor, and whole-result scatters.

A block loop that is a dense range, or has one compressed driver and locates
only dense levels, is evaluated a fiber at a time (``flush_fiber``): operands
are used in place, scalars are broadcast, and ``x += a*b`` runs fused.  Its
results must be bitwise those of 2 threads, and those of per-element
interpretation to rounding (dot leaves add in 8 chains).

A result scattered into with no output loop above its sparse level (``Aᵀx``,
a CSC SpMV, column sums, ``AᵀX``) is stored dense by the formats pass, and
lowering obeys it: no coordinate list is emitted and sorted.
"""
import numpy as np
import pytest
import scipy.sparse as sp
from executor_spy import executor_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_looptree import both_threads, rand_csr

import spfuse
from spfuse import api as spfuse_api
from spfuse.api import _info, _parse
from spfuse.passes.formats import DENSE_SCATTER_MAX
from spfuse.planner import plan_program
from spfuse.runtime import looptree as looptree_runtime
from spfuse.runtime.looptree import LoopTreeBuilder, const, run, unary, where
from spfuse.tensor import as_tensor


def _plan(text, **ops):
    tensors = {k: as_tensor(v, name=k) for k, v in ops.items()}
    return plan_program(_parse(text), {k: _info(k, t) for k, t in tensors.items()})


# ------------------------------------------------------------ fiber blocks --

@pytest.mark.parametrize("expr", ["a1", "a0*a1", "a0*a1*a2", "a1*a2*a0", "a0*a0*a1", "a1/a0",
                                  "relu(a1 - a0)", "where(a0, a1, a2)", "a0*2.0*a1 + 1.0"])
def test_dense_block_broadcasts_scalars(expr):
    """A scalar broadcast into a block is never overwritten by the row its
    product is written to (a regression: ``x[i]*A[i,j]*B[i,j]``)."""
    rng = np.random.default_rng(0)
    x, D1, D2 = rng.standard_normal(3), rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    x[1] = 0.0
    b = LoopTreeBuilder()
    i, j = b.var("i", 3), b.var("j", 5)
    a0, a1, a2 = b.access(x, (i,)), b.access(D1, (i, j)), b.access(D2, (i, j))
    env = {"a0": a0, "a1": a1, "a2": a2, "relu": lambda e: unary("relu", e), "where": where}
    out = b.buffer((3, 5), "out")
    with b.loop(i):
        with b.loop(j):
            b.statement(out[i, j], "sum", eval(expr, env))
    got = both_threads(b.build())["out"]
    X = np.broadcast_to(x[:, None], (3, 5))
    with np.errstate(divide="ignore", invalid="ignore"):
        ref = {"a1": D1, "a0*a1": X * D1, "a0*a1*a2": X * D1 * D2, "a1*a2*a0": D1 * D2 * X,
               "a0*a0*a1": X * X * D1, "a1/a0": np.where(D1 == 0, 0.0, D1 / X),
               "relu(a1 - a0)": np.maximum(D1 - X, 0), "where(a0, a1, a2)": np.where(X != 0, D1, D2),
               "a0*2.0*a1 + 1.0": X * 2.0 * D1 + 1.0}[expr]
    np.testing.assert_allclose(got, ref, rtol=1e-15, atol=0)


def test_fiber_block_gathers_scatters_and_patterns():
    """One compressed driver, a dense level located by its coordinates
    (gathered), a scatter target and a pattern output, rows longer than a block."""
    rng = np.random.default_rng(1)
    A = rand_csr(40, 700, 0.6, rng)            # rows of ~420 entries: several blocks each
    x, w = rng.standard_normal(700), rng.standard_normal(40)
    b = LoopTreeBuilder()
    i, j = b.var("i", 40), b.var("j", 700)
    a, xa, wa = b.access(A, (i, j)), b.access(x, (j,)), b.access(w, (i,))
    y, z = b.buffer((700,), "y"), b.buffer((40,), "z")
    pat = b.pattern_output(a, name="P")
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            b.statement(y[j], "sum", a * wa)                # scatter-axpy
            b.statement(z[i], "sum", a * xa)                # gather-dot
            b.statement(pat, "assign", unary("exp", a * xa) * wa)   # element-wise map on the pattern
    got = both_threads(b.build())
    D = A.toarray()
    np.testing.assert_allclose(got["y"], D.T @ w, rtol=1e-12)
    np.testing.assert_allclose(got["z"], D @ x, rtol=1e-12)
    rows = np.repeat(np.arange(40), np.diff(A.indptr))
    np.testing.assert_allclose(got["P"], np.exp(A.data * x[A.indices]) * w[rows], rtol=1e-12)


def test_constant_statement_in_block():
    b = LoopTreeBuilder()
    i = b.var("i", 300)
    out = b.buffer((300,), "out")
    with b.loop(i):
        b.statement(out[i], "assign", const(2.5))
    np.testing.assert_array_equal(both_threads(b.build())["out"], np.full(300, 2.5))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 30), n=st.integers(0, 600), density=st.floats(0, 1),
       seed=st.integers(0, 2**31 - 1), op=st.sampled_from(["sum", "max", "min", "assign"]))
def test_fiber_block_hypothesis(m, n, density, seed, op):
    """Random CSR (empty rows, zero-size dims, long rows) through a fiber loop
    with gathered, broadcast and in-place operands: bitwise equal to the
    per-element interpreter and to 2 threads."""
    rng = np.random.default_rng(seed)
    A = rand_csr(m, n, density, rng)
    x, w = rng.standard_normal(n), rng.standard_normal(m)
    b = LoopTreeBuilder()
    i, j = b.var("i", m), b.var("j", n)
    a, xa, wa = b.access(A, (i, j)), b.access(x, (j,)), b.access(w, (i,))
    z = b.buffer((m,), "z", init=0.0)
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            b.statement(z[i], op, (a - wa) * xa)
    got = both_threads(b.build())["z"]
    D = A.toarray()
    for r in range(m):
        cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
        vals = (D[r, cols] - w[r]) * x[cols]
        if len(vals) == 0:
            expect = 0.0
        elif op == "sum":
            expect = np.sum(vals)
        elif op == "max":
            expect = max(0.0, vals.max())
        elif op == "min":
            expect = min(0.0, vals.min())
        else:
            expect = vals[-1]
        np.testing.assert_allclose(got[r], expect, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------ whole-result scatter --

def test_formats_pass_stores_a_whole_result_scatter_dense():
    A = sp.random_array((50, 40), density=0.1, format="csr", rng=0)
    p = _plan("y[j] = A[i,j] * x[i]", A=A, x=np.ones(50))
    d = p.formats["y"]
    assert d.format_name == "dense" and d.workspace is None
    assert "the dense workspace is the result" in d.reason
    # a row-wise scatter (SpGEMM) keeps its per-row workspace and CSR result
    p = _plan("C[i,k] = A[i,j] * B[j,k]", A=A, B=A.T.tocsr())
    assert p.formats["C"].format_name == "csr" and p.formats["C"].workspace


def test_formats_pass_keeps_a_huge_scatter_sparse():
    n = int(DENSE_SCATTER_MAX ** 0.5) + 10
    A = sp.random_array((n, n), density=2 / n, format="csr", rng=0)
    p = _plan("C[j,k] = A[i,j] * A[i,k]", A=A)
    assert p.formats["C"].format_name != "dense"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_scatter_programs_match_numpy(dtype, index):
    rng = np.random.default_rng(3)
    A = sp.random_array((60, 45), density=0.15, format="csr", rng=rng, dtype=dtype)
    A.indices, A.indptr = A.indices.astype(index), A.indptr.astype(index)
    A.data[:3] = 0.0  # explicit zeros stay stored
    D = A.toarray()
    x, u = rng.random(60).astype(dtype), rng.random(45).astype(dtype)
    X = rng.random((60, 7)).astype(dtype)
    tol = dict(rtol=1e-5 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(spfuse.evaluate("y[j] = A[i,j]*x[i]", A=A, x=x), D.T @ x, **tol)
    np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j]*u[j]", A=A.tocsc(), u=u), D @ u, **tol)
    np.testing.assert_allclose(spfuse.evaluate("c[j] = A[i,j]", A=A), D.sum(axis=0), **tol)
    Y = spfuse.evaluate("Y[j,k] = A[i,j]*X[i,k]", A=A, X=X)
    assert isinstance(Y, np.ndarray)   # numpy in, dense result out, as A.T @ X gives
    np.testing.assert_allclose(Y, D.T @ X, **tol)
    for nt in (1, 2):
        np.testing.assert_array_equal(spfuse.evaluate("y[j] = A[i,j]*x[i]", A=A, x=x, num_threads=nt),
                                      spfuse.evaluate("y[j] = A[i,j]*x[i]", A=A, x=x, num_threads=1))


def test_scatter_with_empty_and_zero_size_operands():
    A = sp.csr_array((0, 5))
    np.testing.assert_array_equal(spfuse.evaluate("y[j] = A[i,j]*x[i]", A=A, x=np.ones(0)), np.zeros(5))
    A = sp.csr_array((4, 3))
    np.testing.assert_array_equal(spfuse.evaluate("c[j] = A[i,j]", A=A), np.zeros(3))


# ------------------------------------------------------------------ sweeps --

def _sweep_plan(A, x, w, W, op, with_global, rows_only=False):
    """for i: reset T; for j ∈ A_i: T op= A*x[j] - W[i,j]*w[i]; z[j] += A*w[i];
    y[i] = relu(T + w[i]) / (w[i] + 2); optionally s += T*w[i] (a global accumulator)."""
    m, n = A.shape
    b = LoopTreeBuilder()
    i, j = b.var("i", m), b.var("j", n)
    a, xa, Wa, wa = b.access(A, (i, j)), b.access(x, (j,)), b.access(W, (i, j)), b.access(w, (i,))
    T = b.buffer((), "T", private=True)
    y, z, s = b.buffer((m,), "y"), b.buffer((n,), "z"), b.buffer((), "s")
    with b.loop(i):
        b.reset(T, -1.5 if op in ("max", "min") else 0.0)
        if not rows_only:
            with b.loop(j, intersect=[a]):
                b.statement(T, op, a * xa - Wa * wa)
                b.statement(z[j], "sum", a * wa)
        b.statement(y[i], "assign", unary("relu", T + wa) / (wa + 2.0))
        if with_global:
            b.statement(s, "sum", T * wa)
    return b.build()


def _sweep_oracle(A, x, w, W, op, rows_only):
    D = A.toarray()
    T = np.full(A.shape[0], -1.5 if op in ("max", "min") else 0.0)
    for r in range(A.shape[0] if not rows_only else 0):
        cols = A.indices[A.indptr[r]:A.indptr[r + 1]]
        for v in D[r, cols] * x[cols] - W[r, cols] * w[r]:
            T[r] = T[r] + v if op == "sum" else v if op == "assign" else \
                (max(T[r], v) if op == "max" else min(T[r], v))
    return T, np.maximum(T + w, 0) / (w + 2.0)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 1200), n=st.integers(1, 700), density=st.sampled_from([0.0, 0.002, 0.02, 0.9]),
       seed=st.integers(0, 2**31 - 1), op=st.sampled_from(["sum", "max", "min", "assign"]),
       with_global=st.booleans(), rows_only=st.booleans())
def test_sweep_is_the_row_by_row_walk(m, n, density, seed, op, with_global, rows_only):
    """Row batches (up to 512 rows or 512 positions; long rows split across
    chunks), row temporaries as vectors, a dense operand located per row, a
    scatter and a global accumulator: bitwise the per-element walk, and the
    same with 2 threads; values against a Python oracle."""
    rng = np.random.default_rng(seed)
    A = rand_csr(m, n, density, rng)
    x, w, W = rng.standard_normal(n), rng.standard_normal(m), rng.standard_normal((m, n))
    got = both_threads(_sweep_plan(A, x, w, W, op, with_global, rows_only))
    T, y = _sweep_oracle(A, x, w, W, op, rows_only)
    np.testing.assert_allclose(got["y"], y, rtol=1e-12, atol=1e-12)
    if with_global:
        np.testing.assert_allclose(got["s"], np.sum(T * w), rtol=1e-9, atol=1e-9)


def test_sweep_rows_longer_than_a_batch():
    rng = np.random.default_rng(7)
    A = rand_csr(5, 3000, 0.5, rng)           # ~1500 entries a row: three chunks each
    A[2, :] = 0.0
    A.eliminate_zeros()                        # and an empty row
    x, w, W = rng.standard_normal(3000), rng.standard_normal(5), rng.standard_normal((5, 3000))
    got = both_threads(_sweep_plan(A, x, w, W, "sum", True))
    T, y = _sweep_oracle(A, x, w, W, "sum", False)
    np.testing.assert_allclose(got["y"], y, rtol=1e-10)
    np.testing.assert_allclose(got["z"], A.toarray().T @ w, rtol=1e-10)
    np.testing.assert_allclose(got["s"], np.sum(T * w), rtol=1e-10)


def test_programs_through_sweeps_match_numpy():
    rng = np.random.default_rng(5)
    A = sp.random_array((700, 600), density=0.02, format="csr", rng=rng)
    A.data = rng.standard_normal(A.nnz)
    D = A.toarray()
    x, b = rng.standard_normal(600), rng.standard_normal(700)
    np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j]*x[j] + b[i]", A=A, x=x, b=b), D @ x + b,
                               rtol=1e-12)
    np.testing.assert_allclose(spfuse.evaluate("y[i] = relu(A[i,j]*x[j]) * b[i]", A=A, x=x, b=b),
                               np.maximum(D @ x, 0) * b, rtol=1e-12)
    np.testing.assert_allclose(spfuse.evaluate("m[i] = max(j, A[i,j])", A=A), D.max(axis=1), rtol=0)
    np.testing.assert_allclose(spfuse.evaluate("s = b[i]*A[i,j]*x[j]", A=A, x=x, b=b), b @ D @ x,
                               rtol=1e-10)


# ------------------------------------------------------- lowering reuse --

@pytest.mark.parametrize("text,fmt", [
    ("S[i,j] = x[i]*A[i,j]*u[j]", "csr"),      # a pattern output sized by each call's nnz
    ("y[j] = A[i,j]*x[i]", "csc"),              # an operand converted to the loop order
    ("y[i] = A[i,j]*u[j] + x[i]", "csr"),
    ("m[i] = max(j, A[i,j]) + c", "csr"),      # a 0-d operand: baked into the plan, not reused
])
def test_lowering_is_reused_with_each_calls_arrays(text, fmt):
    """The second and later calls of a signature rebind the cached lowering
    to their own arrays: every call's answer is its own."""
    k = spfuse.compile(text)
    rng = np.random.default_rng(11)
    for call in range(4):
        A = sp.random_array((30, 20), density=0.1 + 0.1 * call, format=fmt, rng=rng)
        x, u, c = rng.standard_normal(30), rng.standard_normal(20), np.float64(call)
        ops = {"A": A, "x": x, "u": u, "c": c}
        ops = {n: v for n, v in ops.items() if f"{n}[" in text or (n == "c" and " c" in text)}
        D = A.toarray()
        got = k(**ops)
        ref = {"S[i,j] = x[i]*A[i,j]*u[j]": lambda D, x, u, c: x[:, None] * D * u[None, :],
               "y[j] = A[i,j]*x[i]": lambda D, x, u, c: D.T @ x,
               "y[i] = A[i,j]*u[j] + x[i]": lambda D, x, u, c: D @ u + x,
               "m[i] = max(j, A[i,j]) + c": lambda D, x, u, c: D.max(axis=1) + c}[text](D, x, u, c)
        got = got.toarray() if sp.issparse(got) else got
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


def test_cached_lowering_keeps_no_operand_alive():
    import gc
    import weakref
    k = spfuse.compile("y[i] = A[i,j]*u[j] + x[i]")
    refs = []
    for seed in range(3):   # the first call lowers and caches, the later ones rebind
        A = sp.random_array((40, 30), density=0.2, format="csr", rng=seed)
        refs.append(weakref.ref(A.data))
        k(A=A, u=np.ones(30), x=np.ones(40))
        del A
    gc.collect()
    assert all(r() is None for r in refs)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 60), n=st.integers(1, 300), K=st.integers(1, 70),
       density=st.sampled_from([0.0, 0.01, 0.1, 0.9]), seed=st.integers(0, 2**31 - 1))
def test_sweep_over_a_fixed_fiber(m, n, K, density, seed):
    """A sweep whose fiber is fixed outside it (for i: for k: for j ∈ B_i:
    T[j] += C[i,k]*D[k,j], the order SDDMM-like programs get): the (k, j)
    pairs are listed k-major, bitwise the per-element walk; values against numpy."""
    rng = np.random.default_rng(seed)
    B = rand_csr(m, n, density, rng)
    C, D = rng.standard_normal((m, K)), rng.standard_normal((K, n))
    b = LoopTreeBuilder()
    i, k, j = b.var("i", m), b.var("k", K), b.var("j", n)
    bb, cc, dd = b.access(B, (i, j)), b.access(C, (i, k)), b.access(D, (k, j))
    T = b.buffer((n,), "T", private=True)
    out = b.pattern_output(bb, name="out")
    with b.loop(i):
        with b.loop(j, intersect=[bb]):
            b.statement(T[j], "assign", const(0.0))
        with b.loop(k):
            with b.loop(j, intersect=[bb]):
                b.statement(T[j], "sum", cc * dd)
        with b.loop(j, intersect=[bb]):
            b.statement(out, "assign", bb * unary("exp", T[j]))
    got = both_threads(b.build())["out"]
    rows = np.repeat(np.arange(m), np.diff(B.indptr))
    ref = B.data * np.exp(np.einsum("pk,kp->p", C[rows], D[:, B.indices]))
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-12)


def _sweep_kinds(plan):
    from spfuse._kernels import _looptree as X
    keep = {f: X._i64(getattr(plan, f)) for f in X._INT_FIELDS}
    keep["loop_fiber"] = X._fiber_loops(keep)
    return X._sweep_loops(keep, [bool(x) for x in plan.buf_private])


def _sweeps(plan):
    """(row sweeps, position temporaries) of ``plan``."""
    sweep, _, _, postemp, _ = _sweep_kinds(plan)
    return int((sweep == 1).sum()), int(postemp.sum())


def _fiber_sweeps(plan):
    """Fiber loops swept on their own (not under a row sweep)."""
    return int((_sweep_kinds(plan)[0] == 2).sum())


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(1, 200), K=st.integers(0, 70),
       density=st.sampled_from([0.0, 0.02, 0.2, 1.0]), seed=st.integers(0, 2**31 - 1),
       outer=st.booleans())
def test_sweep_with_a_dot_per_position(m, n, K, density, seed, outer):
    """for i: for j ∈ B_i: T = 0; for k: T += C[i,k]*Dt[j,k]; out = B*exp(T)
    (SDDMM in i, j, k order): a sweep over the rows whose fiber positions
    each take one dense dot into a position temporary.  With ``outer`` the
    tree sits under a loop over h and reads E[h,i,k] (a factor row located
    through a level bound outside the sweep); values against numpy."""
    rng = np.random.default_rng(seed)
    B = rand_csr(m, n, density, rng)
    H = 2 if outer else 1
    E, Dt = rng.standard_normal((H, m, K)), rng.standard_normal((n, K))
    b = LoopTreeBuilder()
    h, i, j, k = b.var("h", H), b.var("i", m), b.var("j", n), b.var("k", K)
    bb, ee, dd = b.access(B, (i, j)), b.access(E, (h, i, k)), b.access(Dt, (j, k))
    T = b.buffer((), "T", private=True)
    pat = b.pattern_output(bb, name="pat")   # summed over h
    with b.loop(h):
        with b.loop(i):
            with b.loop(j, intersect=[bb]):
                b.reset(T, 0.0)
                with b.loop(k):
                    b.statement(T[()], "sum", ee * dd)
                b.statement(pat, "sum", bb * unary("exp", T[()]))
    plan = b.build()
    assert _sweeps(plan) == (1, 1)
    got = both_threads(plan)["pat"]
    rows = np.repeat(np.arange(m), np.diff(B.indptr))
    ref = sum(B.data * np.exp(np.einsum("pk,pk->p", E[g][rows], Dt[B.indices])) for g in range(H))
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(1, 120), K=st.integers(0, 20), J=st.integers(0, 20),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_sweep_with_dot_and_axpy_per_position(m, n, K, J, density, seed):
    """GNN-2 with a separate Yt (for i: for h ∈ A_i: T1 = 0; for k: T1 +=
    X[i,k]*Y[h,k]; T0 = A*T1; for j: Z[i,j] += T0*Yt[h,j]) and the transposed
    SpMM (for i: for j ∈ A_i: for k: C[j,k] += A[i,j]*X[i,k], a scatter by
    the fiber's coordinate): sweeps with a dot and an axpy per position,
    the assigned T0 a position temporary.  Values against numpy."""
    rng = np.random.default_rng(seed)
    A = rand_csr(m, n, density, rng)
    X, Y, Yt = rng.standard_normal((m, K)), rng.standard_normal((n, K)), rng.standard_normal((n, J))
    b = LoopTreeBuilder()
    i, h, k, j = b.var("i", m), b.var("h", n), b.var("k", K), b.var("j", J)
    aa, xx, yy, tt = b.access(A, (i, h)), b.access(X, (i, k)), b.access(Y, (h, k)), b.access(Yt, (h, j))
    T1, T0 = b.buffer((), "T1", private=True), b.buffer((), "T0", private=True)
    Z = b.buffer((m, J), "Z")
    with b.loop(i):
        with b.loop(h, intersect=[aa]):
            b.reset(T1, 0.0)
            with b.loop(k):
                b.statement(T1[()], "sum", xx * yy)
            b.statement(T0[()], "assign", aa * T1[()])
            with b.loop(j):
                b.statement(Z[i, j], "sum", T0[()] * tt)
    plan = b.build()
    assert _sweeps(plan) == (1, 2)
    Ad = A.toarray()
    np.testing.assert_allclose(both_threads(plan)["Z"], (Ad * (X @ Y.T)) @ Yt, rtol=1e-10, atol=1e-10)

    b = LoopTreeBuilder()
    i, jj, k = b.var("i", m), b.var("j", n), b.var("k", K)
    aa, xx = b.access(A, (i, jj)), b.access(X, (i, k))
    Cb = b.buffer((n, K), "C")
    with b.loop(i):
        with b.loop(jj, intersect=[aa]):
            with b.loop(k):
                b.statement(Cb[jj, k], "sum", aa * xx)
    plan = b.build()
    assert _sweeps(plan) == (1, 0)
    np.testing.assert_allclose(both_threads(plan)["C"], Ad.T @ X, rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 40), n=st.integers(1, 120), K=st.integers(0, 20),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), seed=st.integers(0, 2**31 - 1),
       act=st.sampled_from(["relu", "tanh"]))
def test_fiber_sweep_under_a_row_loop_with_a_row_vector(m, n, K, density, seed, act):
    """relu(A·B) (for i: T = 0; for j ∈ A_i: for k: T[k] += A[i,j]*B[j,k];
    for k: C[i,k] = relu(T[k])): the row temporary T is a vector, so rows
    are not batched; the fiber loop over j is swept on its own, an axpy per
    position.  Values against numpy; 1 and 2 threads bitwise."""
    rng = np.random.default_rng(seed)
    A = rand_csr(m, n, density, rng)
    B = rng.standard_normal((n, K))
    b = LoopTreeBuilder()
    i, j, k, k2 = b.var("i", m), b.var("j", n), b.var("k", K), b.var("k2", K)
    aa, bb = b.access(A, (i, j)), b.access(B, (j, k))
    T = b.buffer((K,), "T", private=True)
    C = b.buffer((m, K), "C")
    with b.loop(i):
        b.reset(T, 0.0)
        with b.loop(j, intersect=[aa]):
            with b.loop(k):
                b.statement(T[k], "sum", aa * bb)
        with b.loop(k2):
            b.statement(C[i, k2], "assign", unary(act, T[k2]))
    plan = b.build()
    assert _sweeps(plan) == (0, 0) and _fiber_sweeps(plan) == 1
    got = both_threads(plan)["C"]
    ref = getattr(np, act)(A.toarray() @ B) if act == "tanh" else np.maximum(A.toarray() @ B, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-12)


def test_tensor_vector_products_sweep_a_gather_dot_per_position():
    """TTV over a CSF tensor, as the planner spells it (``A[i,j] =
    X[i,j,k]*c[k]`` into a row workspace, and the 4-D ``A[i,j] =
    X[i,j,k,l]*d[l]*c[k]`` through a position temporary): the loop over the
    fiber above the last level is swept, one gather-dot per position; values
    against numpy, 1 and 2 threads bitwise."""
    rng = np.random.default_rng(4)
    for shape in ((7, 6, 9), (5, 4, 6, 7), (3, 0, 4), (6, 5, 8, 9)):
        dense = rng.standard_normal(shape) * (rng.random(shape) < 0.3)
        dense[0] = 0.0          # an empty slice
        X = spfuse.Tensor.from_numpy(dense, format="csf")
        vecs = [rng.standard_normal(s) for s in shape[2:]]
        names = "kl"[:len(vecs)]
        text = f"A[i,j] = X[i,j,{','.join(names)}] * " + " * ".join(f"{n}v[{n}]" for n in names)
        ops = {f"{n}v": v for n, v in zip(names, vecs, strict=True)}
        plans: list = []

        def capture(plan, plans=plans, real=looptree_runtime.run, **k):
            plans.append(plan)
            return real(plan, **k)

        with pytest.MonkeyPatch.context() as mp:
            # the generic executor, not the catalogue's TTV template
            mp.setattr(spfuse_api, "_template", lambda plan: None)
            mp.setattr(spfuse_api, "_dispatch_cache", {})
            mp.setattr(looptree_runtime, "run", capture)
            got = spfuse.evaluate(text, X=X, num_threads=1, **ops)
            again = spfuse.evaluate(text, X=X, num_threads=2, **ops)
        if X.nnz:
            sweep, leaf = _sweep_kinds(plans[0])[:2]
            assert 2 in sweep and 3 in leaf, (shape, plans[0].describe())  # a fiber sweep, gather-dot leaf
        got, again = (g.toarray() if hasattr(g, "toarray") else g for g in (got, again))
        np.testing.assert_array_equal(got, again)
        want = dense
        for v in reversed(vecs):
            want = want @ v
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 30), n=st.integers(1, 40), p=st.integers(1, 30),
       density=st.sampled_from([0.0, 0.1, 0.4, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_masked_product_sweeps_a_merge_per_position(m, n, p, density, seed):
    """Masked SpGEMM by dot products (for i: for k ∈ M_i: T = 0; for j ∈
    A_i ∩ Bt_k: T += A[i,j]*Bt[k,j]; C = M*T on M's pattern): a row sweep
    whose fiber positions each merge two sparse fibers.  Values against
    numpy, 1 and 2 threads and the per-element walk bitwise."""
    rng = np.random.default_rng(seed)
    M, A, Bt = rand_csr(m, p, density, rng), rand_csr(m, n, density, rng), rand_csr(p, n, density, rng)
    b = LoopTreeBuilder()
    i, k, j = b.var("i", m), b.var("k", p), b.var("j", n)
    mm, aa, bb = b.access(M, (i, k)), b.access(A, (i, j)), b.access(Bt, (k, j))
    T = b.buffer((), "T", private=True)
    out = b.pattern_output(mm, name="C")
    with b.loop(i):
        with b.loop(k, intersect=[mm]):
            b.reset(T, 0.0)
            with b.loop(j, intersect=[aa, bb]):
                b.statement(T[()], "sum", aa * bb)
            b.statement(out, "assign", mm * T[()])
    plan = b.build()
    assert _sweeps(plan) == (1, 1) and 4 in _sweep_kinds(plan)[1]
    got = both_threads(plan)["C"]
    np.testing.assert_array_equal(got, run(plan, num_threads=1, blocks=False)["C"])
    rows = np.repeat(np.arange(m), np.diff(M.indptr))
    want = M.data * (A.toarray() @ Bt.toarray().T)[rows, M.indices]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_position_temporary_read_after_its_fiber_loop_is_no_sweep():
    """T is reset per position but read once more after the fiber loop (its
    last position's value): not a position temporary, so no sweep -- and
    the answer is the element walk's."""
    rng = np.random.default_rng(1)
    B = rand_csr(6, 9, 0.4, rng)
    C, Dt = rng.standard_normal((6, 5)), rng.standard_normal((9, 5))
    b = LoopTreeBuilder()
    i, j, k = b.var("i", 6), b.var("j", 9), b.var("k", 5)
    bb, cc, dd = b.access(B, (i, j)), b.access(C, (i, k)), b.access(Dt, (j, k))
    T = b.buffer((), "T", private=True)
    y = b.buffer((6,), "y")
    with b.loop(i):
        b.reset(T, 0.0)
        with b.loop(j, intersect=[bb]):
            b.reset(T, 0.0)
            with b.loop(k):
                b.statement(T[()], "sum", cc * dd)
        b.statement(y[i], "assign", T[()])
    plan = b.build()
    assert _sweeps(plan) == (0, 0) and _fiber_sweeps(plan) == 0
    got = both_threads(plan)["y"]
    ref = np.zeros(6)
    for r in range(6):
        js = B.indices[B.indptr[r]:B.indptr[r + 1]]
        ref[r] = C[r] @ Dt[js[-1]] if len(js) else 0.0
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_sddmm_like_programs_through_fixed_fiber_sweeps():
    rng = np.random.default_rng(9)
    B = sp.random_array((300, 200), density=0.03, format="csr", rng=rng)
    C, D, e = rng.standard_normal((300, 16)), rng.standard_normal((16, 200)), rng.standard_normal(200)
    Bd = B.toarray()
    got = spfuse.evaluate("A[i,j] = B[i,j] * exp(C[i,k] * D[k,j])", B=B, C=C, D=D)
    np.testing.assert_allclose(got.toarray(), Bd * np.exp(C @ D), rtol=1e-12)
    got = spfuse.evaluate("A[i,j] = B[i,j] * (C[i,k] * D[k,j] + e[j])", B=B, C=C, D=D, e=e)
    np.testing.assert_allclose(got.toarray(), Bd * (C @ D + e), rtol=1e-12, atol=1e-14)


# ------------------------------------------------------ storage orders --

def test_planner_reads_an_operand_in_the_other_storage_order_when_much_cheaper():
    """A[i,j]·B[k,j]: in storage order a merge per (i, k) pair; with A read as
    CSC, Gustavson over k.  The plan says so, the call converts a copy (the
    caller's A is untouched), and the answer is numpy's."""
    A = sp.random_array((3000, 3000), density=0.002, format="csr", rng=0)
    B = sp.random_array((3000, 3000), density=0.002, format="csr", rng=1)
    k = spfuse.compile("C[i,k] = A[i,j] * B[k,j]")
    assert "read as csc" in k.explain(A=A, B=B)
    before = (A.indptr.copy(), A.indices.copy(), A.data.copy())
    C = k(A=A, B=B)
    np.testing.assert_allclose(C.toarray(), (A @ B.T).toarray(), rtol=1e-12)
    for a, b in zip(before, (A.indptr, A.indices, A.data), strict=True):
        np.testing.assert_array_equal(a, b)


def test_converted_operands_are_scanned_before_conversion():
    A = sp.random_array((3000, 3000), density=0.002, format="csr", rng=0)
    B = sp.random_array((3000, 3000), density=0.002, format="csr", rng=1)
    bad = A.copy()
    bad.indices[5] = 10**6   # out of range: worded, never read by a conversion
    with pytest.raises(ValueError, match="ndices|range"):
        spfuse.evaluate("C[i,k] = A[i,j] * B[k,j]", A=bad, B=B)


def test_a_load_operand_equal_to_an_op_code_is_not_an_op():
    """Regression: the fused x += a*b check read the last byte-code word,
    which is a load's operand when the statement ends with a load (here the
    12th buffer reference, 12 = the multiply code)."""
    from spfuse.testing import densify, random_operands, random_program
    prog, shapes = random_program(np.random.default_rng(290981), max_extent=4, n_statements=(1, 3))
    ops = random_operands(0, shapes, density=0.3, canonical=False, empty_rows=0.2)
    got = spfuse.evaluate(prog.text, fusion="none", num_threads=1, **ops)
    np.testing.assert_allclose(densify(got["R1"]), 0.982751804898607, rtol=1e-12)


def test_a_0d_temporary_crossing_groups():
    """Regression: a 0-d temporary handed from one group to the next became 1-d."""
    from spfuse.testing import dense_reference, densify, random_operands, random_program
    prog, shapes = random_program(np.random.default_rng(2903), max_extent=4, n_statements=(1, 3))
    ops = random_operands(2903, shapes, density=1.0, canonical=True, empty_rows=0.2)
    ref = dense_reference(prog, ops)
    got = spfuse.evaluate(prog.text, fusion="auto", num_threads=1, **ops)
    for k in ref:
        np.testing.assert_allclose(densify(got[k]), ref[k], rtol=1e-9, atol=1e-9)


# ------------------------------------------------- max/min over a pattern --

@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), density=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
       seed=st.integers(0, 2**31 - 1), op=st.sampled_from(["max", "min"]),
       axis=st.sampled_from(["j", "i"]), sign=st.sampled_from([-1.0, 1.0]), nan=st.booleans())
def test_max_min_visit_only_stored_entries_and_count_the_zeros(m, n, density, seed, op, axis, sign, nan):
    """max/min over one index iterates the stored entries and lets one
    implicit zero take part when a row is not full: numpy's answer, with
    full rows (no zero), empty rows, all-negative values and NaN."""
    rng = np.random.default_rng(seed)
    D = sign * rng.random((m, n)) * (rng.random((m, n)) < density)
    if m > 1:
        D[0, :] = sign * (rng.random(n) + 0.5)      # a full row: its implicit zeros are none
    if nan and D.any():
        D[np.unravel_index(np.flatnonzero(D)[0], D.shape)] = np.nan
    A = sp.csr_array(D)
    out = "y[i]" if axis == "j" else "y[j]"
    got = spfuse.evaluate(f"{out} = {op}({axis}, A[i,j])", A=A)
    ref = getattr(np, op)(A.toarray(), axis=1 if axis == "j" else 0)
    np.testing.assert_array_equal(got, ref)


def test_row_max_is_planned_over_the_pattern():
    A = sp.random_array((500, 400), density=0.01, format="csr", rng=0)
    text = spfuse.compile("y[i] = max(j, A[i,j])").explain(A=A)
    assert "for j < 400 (∈ A_j)" in text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from([(7, 6, 9), (1, 1, 1), (4, 0, 3), (9, 12, 5), (3, 4, 5, 6)]),
       density=st.sampled_from([0.0, 0.2, 0.7]), scaled=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_middle_mode_products_sweep_a_scatter_per_position(shape, density, scaled, seed):
    """A vector on a middle mode of a CSF tensor (``A[i,k] = X[i,j,k] *
    c[j]``): the loop over j is swept and the fiber below each position is
    scattered into A's row (the scatter-axpy leaf); values against numpy,
    1 and 2 threads bitwise, the per-element walk to rounding."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal(shape) * (rng.random(shape) < density)
    if shape[0] > 2:
        dense[1] = 0.0          # an empty slice
    X = spfuse.Tensor.from_numpy(dense, format="csf")
    c = rng.standard_normal(shape[1])
    rest = "k" if len(shape) == 3 else "k,l"
    text = f"A[i,{rest}] = X[i,j,{rest}] * c[j]" + (" * 1.5" if scaled else "")
    with executor_plans() as plans:
        got = spfuse.evaluate(text, X=X, c=c, num_threads=1)
        again = spfuse.evaluate(text, X=X, c=c, num_threads=2)
    got, again = (g.todense() if hasattr(g, "todense") else np.asarray(g) for g in (got, again))
    np.testing.assert_array_equal(got, again)
    want = np.einsum("ij...,j->i...", dense, c) * (1.5 if scaled else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if len(shape) == 3 and X.nnz and plans and not scaled:   # (a * x * 1.5 is no two-factor leaf)
        sweep, leaf = _sweep_kinds(plans[0])[:2]
        assert 2 in sweep and 5 in leaf, plans[0].describe()   # a fiber sweep, scatter-axpy leaf
    for plan in plans:
        walk = looptree_runtime.run(plan, num_threads=1, blocks=False)
        fast = looptree_runtime.run(plan, num_threads=1)
        for key in fast:
            a, b = fast[key], walk[key]
            np.testing.assert_allclose(getattr(a, "values", a), getattr(b, "values", b), rtol=1e-12, atol=1e-12)
