"""Element-wise tails of SpMM and SpMV run in the kernel as each row is stored
(``spfuse.lowering.epilogues``), against numpy on densified operands and,
bit for bit, against the same program run group by group."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import example, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering.groups import split_groups


def _kernels(program, fusion="auto", **ops):
    return [g.kernel for g in split_groups(spfuse.compile(program, fusion=fusion).plans(**ops)[fusion])]


def _matrix(rng, m, n, density=0.2, dtype=np.float64, index=np.int32):
    a = sp.random_array((m, n), density=density, format="csr", random_state=rng, dtype=dtype)
    a.indices, a.indptr = a.indices.astype(index), a.indptr.astype(index)
    return a


CASES = [
    ("Y[i,k] = relu(A[i,j] * X[j,k])", lambda P, o: np.maximum(P, 0)),
    ("Y[i,k] = relu(A[i,j] * X[j,k] + b[k])", lambda P, o: np.maximum(P + o["b"], 0)),
    ("Y[i,k] = (A[i,j] * X[j,k] - R[i,k]) / r[i]",
     lambda P, o: np.where(P - o["R"] == 0, 0, (P - o["R"]) / o["r"][:, None])),
    ("Y[i,k] = sqrt(abs(A[i,j] * X[j,k])) * r[i] + 2 * b[k]",
     lambda P, o: np.sqrt(np.abs(P)) * o["r"][:, None] + 2 * o["b"]),
    ("Y[i,k] = s * (A[i,j] * X[j,k]) - b[k] - 1.5", lambda P, o: o["s"] * P - o["b"] - 1.5),
    ("Y[i,k] = -(A[i,j] * X[j,k]) * R[i,k]", lambda P, o: -P * o["R"]),
    # relu's gradient: the product where a mask is non-zero (NaN counts as non-zero, as in numpy)
    ("Y[i,k] = where(relu(R[i,k]), A[i,j] * X[j,k], 0.0)", lambda P, o: np.where(np.maximum(o["R"], 0) != 0, P, 0.0)),
    ("Y[i,k] = where(A[i,j] * X[j,k], b[k], r[i])", lambda P, o: np.where(P != 0, o["b"], o["r"][:, None])),
]


@pytest.mark.parametrize("program,oracle", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(40, 30), (0, 5), (6, 0), (50, 1)])
def test_tails_run_in_the_kernel(program, oracle, dtype, index, shape, rng):
    m, n = shape
    A = _matrix(rng, m, n, dtype=dtype, index=index)
    K = 5
    ops = {"A": A, "X": rng.standard_normal((n, K)).astype(dtype), "b": rng.standard_normal(K).astype(dtype),
           "r": (rng.standard_normal(m) + 3).astype(dtype), "R": rng.standard_normal((m, K)).astype(dtype),
           "s": np.array(0.75, dtype)}
    ops = {k: v for k, v in ops.items() if f"{k}[" in program or (k == "s" and "s *" in program)}
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v.data.copy()) for k, v in ops.items()}
    if m > 2 and n > 2:   # (an empty or tiny reduction is planned otherwise)
        assert _kernels(program, **ops) == ["spmm+epilogue"]
    got = spfuse.evaluate(program, **ops)
    assert got.dtype == dtype and got.shape == (m, K)
    dense = {k: (v.toarray() if sp.issparse(v) else v).astype(np.float64) for k, v in ops.items()}
    P = dense["A"] @ dense["X"]
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, oracle(P, dense), **tol)
    # float64: the arithmetic of the statements run one by one, bit for bit
    # (float32: theirs may round a temporary to float32 where the tail keeps float64)
    apart = spfuse.evaluate(program, fusion="none", **ops)
    if dtype == np.float64:
        np.testing.assert_array_equal(got, apart)
    np.testing.assert_allclose(got, apart, rtol=2e-7, atol=1e-7)
    np.testing.assert_array_equal(got, spfuse.evaluate(program, num_threads=2, **ops))   # any team
    for k, v in ops.items():   # inputs untouched
        np.testing.assert_array_equal(before[k], v if isinstance(v, np.ndarray) else v.data)


SPMV_CASES = [
    ("y[i] = 2.5 * A[i,j] * x[j]", lambda p, o: 2.5 * p),
    ("y[i] = relu(A[i,j] * x[j]) * r[i]", lambda p, o: np.maximum(p, 0) * o["r"]),
    ("y[i] = abs(A[i,j] * x[j] - r[i]) / s", lambda p, o: np.abs(p - o["r"]) / o["s"]),
    ("Y[i,k] = s * A[i,j] * X[j,k]", None),
]


@pytest.mark.parametrize("program,oracle", SPMV_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m,n", [(700, 300), (0, 5), (6, 0)])
def test_spmv_tails_and_scaled_products(program, oracle, dtype, m, n, rng):
    """SpMV's tails run over segments of rows (700 rows: several segments
    of 256); a product scaled by a 0-d operand or a constant takes the
    factor in its kernel."""
    A = _matrix(rng, m, n, density=0.05, dtype=dtype)
    ops = {"A": A, "x": rng.standard_normal(n).astype(dtype), "r": rng.standard_normal(m).astype(dtype),
           "s": np.array(1.25, dtype), "X": rng.standard_normal((n, 3)).astype(dtype)}
    ops = {k: v for k, v in ops.items() if f"{k}[" in program or (k == "s" and " s" in program)}
    if m > 2 and n > 2:
        assert _kernels(program, **ops)[0] in ("spmv+epilogue", "spmm+epilogue")
    got = spfuse.evaluate(program, **ops)
    assert got.dtype == dtype
    dense = {k: (v.toarray() if sp.issparse(v) else v).astype(np.float64) for k, v in ops.items()}
    if oracle is None:
        want = dense["s"] * (dense["A"] @ dense["X"])
    else:
        want = oracle(dense["A"] @ dense["x"], dense)
    np.testing.assert_allclose(got, want, **(dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}))
    apart = spfuse.evaluate(program, fusion="none", **ops)
    if dtype == np.float64:
        np.testing.assert_array_equal(got, apart)
    np.testing.assert_array_equal(got, spfuse.evaluate(program, num_threads=2, **ops))


def test_what_stays_apart(rng):
    A = _matrix(rng, 30, 20)
    X, b = rng.standard_normal((20, 4)), rng.standard_normal(4)
    # exp is the executor's formula, not the kernel's: numpy's group
    assert "spmm+epilogue" not in _kernels("Y[i,k] = exp(A[i,j] * X[j,k])", A=A, X=X)
    # the product read elsewhere too: a temporary the tail does not own
    program = "T[i,k] = A[i,j] * X[j,k]; Y[i,k] = relu(T[i,k]); Z[i,k] = T[i,k] * 2"
    assert "spmm+epilogue" not in _kernels(program, A=A, X=X)
    got = spfuse.evaluate(program, A=A, X=X)
    np.testing.assert_allclose(got["Y"], np.maximum(A @ X, 0))
    # the library approach fuses nothing
    assert "spmm+epilogue" not in _kernels("Y[i,k] = relu(A[i,j] * X[j,k] + b[k])", fusion="none", A=A, X=X, b=b)


def test_mixed_value_types_run_apart(rng):
    """float32 SpMM operands with a float64 bias: the result is float64, as the groups give it."""
    A = _matrix(rng, 30, 20, dtype=np.float32)
    X, b = rng.standard_normal((20, 4)).astype(np.float32), rng.standard_normal(4)
    program = "Y[i,k] = relu(A[i,j] * X[j,k] + b[k])"
    got = spfuse.evaluate(program, A=A, X=X, b=b)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, spfuse.evaluate(program, fusion="none", A=A, X=X, b=b))


def test_bad_index_is_found(rng):
    A = _matrix(rng, 30, 20)
    A.indices[-1] = 20
    X, b = rng.standard_normal((20, 4)), rng.standard_normal(4)
    with pytest.raises(ValueError, match="A"):
        spfuse.evaluate("Y[i,k] = relu(A[i,j] * X[j,k] + b[k])", A=A, X=X, b=b)


def test_explain_shows_the_tail(rng):
    A = _matrix(rng, 30, 20)
    text = spfuse.compile("Y[i,k] = relu(A[i,j] * X[j,k] + b[k])").explain(A=A, X=np.ones((20, 3)), b=np.ones(3))
    assert "spmm+epilogue" in text and "in the kernel, as each row is stored" in text


_TAIL_OPS = ["relu", "abs", "neg", "sqrt", "+b", "-R", "*r", "/r", "*2", "+1", "where"]


@settings(max_examples=80, deadline=None)
@given(m=st.integers(0, 14), n=st.integers(0, 9), k=st.integers(1, 20), density=st.floats(0.0, 1.0),
       tail=st.lists(st.sampled_from(_TAIL_OPS), min_size=1, max_size=4), f32=st.booleans(),
       vector=st.booleans(), nt=st.sampled_from([1, 2]), seed=st.integers(0, 2**16),
       head=st.sampled_from(["spmm", "gemm", "scaled gemm", "alone"]))
@example(m=1, n=2, k=1, density=1.0, tail=["*r"], f32=False, vector=False, nt=1, seed=0, head="spmm")  # fused whole
@example(m=3, n=2, k=4, density=1.0, tail=["relu"], f32=False, vector=False, nt=1, seed=1, head="scaled gemm")
def test_random_tails(m, n, k, density, tail, f32, vector, nt, seed, head):
    """Random chains of element-wise operations after an SpMM or an SpMV, a
    dense product (scaled by a 0-d operand or not), or alone over a dense
    operand large enough to run as a program of its own (operands along
    rows, columns or whole, constants; empty shapes and rows): numpy's
    values, and the group-by-group run's bits."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    if head == "alone":   # past ROWS_MIN_ELEMENTS
        m, k = (70000, 1) if vector else (700, 100)
    A = _matrix(rng, m, n, density=density, dtype=dtype)
    ops = {"A": A if head == "spmm" else A.toarray(), "X": rng.standard_normal((n, k)).astype(dtype),
           "b": rng.standard_normal(k).astype(dtype), "R": rng.standard_normal((m, k)).astype(dtype),
           "r": (rng.random(m) + 0.5).astype(dtype), "T": rng.standard_normal((m, k)).astype(dtype)}
    if vector:   # y[i]: the tail's operands along the rows only
        ops.update(X=ops["X"][:, 0].copy(), b=ops["r"], R=rng.standard_normal(m).astype(dtype),
                   T=ops["T"][:, 0].copy())
    expr, want = "A[i,j] * X[j,k]", A.toarray().astype(np.float64) @ ops["X"].astype(np.float64)
    if head == "scaled gemm":
        ops["s"] = np.asarray(1.5, dtype)
        expr, want = "A[i,j] * X[j,k] * s", 1.5 * want
    elif head == "alone":
        expr, want = "T[i,k]", ops["T"].astype(np.float64)
    rows = ops["r"] if vector else ops["r"][:, None]
    with np.errstate(all="ignore"):
        for t in tail:
            if t in ("relu", "abs", "neg", "sqrt"):
                expr = f"{t}({expr})"
                want = {"relu": lambda x: np.where(x > 0, x, 0.0), "abs": np.abs, "neg": np.negative,
                        "sqrt": np.sqrt}[t](want)
            elif t == "+b":
                expr, want = f"({expr}) + b[k]", want + ops["b"]
            elif t == "-R":
                expr, want = f"({expr}) - R[i,k]", want - ops["R"]
            elif t == "*r":
                expr, want = f"({expr}) * r[i]", want * rows
            elif t == "/r":
                expr, want = f"({expr}) / r[i]", np.where(want == 0, 0.0, want / rows)
            elif t == "*2":
                expr, want = f"2 * ({expr})", 2 * want
            elif t == "where":
                mask = np.maximum(ops["R"], 0)
                expr, want = f"where(relu(R[i,k]), {expr}, -1.5)", np.where(mask != 0, want, -1.5)
            else:
                expr, want = f"({expr}) + 1", want + 1
    if vector:
        for old, new in (("X[j,k]", "X[j]"), ("b[k]", "b[i]"), ("R[i,k]", "R[i]"), ("T[i,k]", "T[i]")):
            expr = expr.replace(old, new)
    program = f"Y[i] = {expr}" if vector else f"Y[i,k] = {expr}"
    used = {name: v for name, v in ops.items() if f"{name}[" in program or (name == "s" and "* s" in program)}
    got = spfuse.evaluate(program, num_threads=nt, **used)
    np.testing.assert_allclose(got, want, **(dict(rtol=1e-3, atol=1e-3) if f32 else dict(rtol=1e-10, atol=1e-10)),
                               equal_nan=True)
    apart = spfuse.evaluate(program, fusion="none", **used)
    # the same bits as the groups run apart when the tail runs in the kernel;
    # a plan whose every reduction is tiny is fused whole instead (the
    # product distributed over the sum: last-bit differences)
    in_kernel = any(k.endswith("+epilogue") for k in _kernels(program, **used))
    if f32 or not in_kernel:
        np.testing.assert_allclose(got, apart, rtol=1e-6 if f32 else 1e-12, atol=1e-6 if f32 else 1e-12,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(got, apart)


@pytest.mark.parametrize("code,kinds,refs,n_regs", [
    ([1, 1, 0, 2], [0, 0], [0, 1], 2),     # r1 = r0 + r1: the destination is a later argument
    ([1, 2, 0, 2], [0, 1], [0, 0], 2),     # destination register 2 of 2
    ([5, 1, 0, 1], [0], [3], 2),           # argument register 3 of 2
    ([1, 1, 1, 2], [0, 1], [0, 0], 2),     # arguments past the table
    ([1, 1, 0], [0], [0], 2),              # a partial instruction
])
def test_malformed_programs_are_refused(code, kinds, refs, n_regs):
    from spfuse._kernels import _csr_kernels as csr
    A = sp.csr_array(np.eye(3))
    program = (np.array(code, np.int64), np.array(kinds, np.int64), np.array(refs, np.int64),
               np.zeros(len(kinds)), n_regs, 0)
    out = np.full((3, 2), 7.0)
    with pytest.raises(ValueError, match="epilogue"):
        csr.spmm(A.indptr, A.indices, A.data, np.ones((3, 2)), out, 1, 0, False, program)
    assert (out == 7.0).all()


GEMM_CASES = [
    ("Z[i,j] = relu(X[i,h] * W[h,j] + b[j])", lambda P, o: np.maximum(P + o["b"], 0)),
    ("Z[i,j] = (X[i,h] * W[h,j] - R[i,j]) / r[i]",
     lambda P, o: np.where(P - o["R"] == 0, 0, (P - o["R"]) / o["r"][:, None])),
    ("Z[i,j] = 2 * abs(X[h,i] * W[h,j]) + 1", lambda P, o: 2 * np.abs(P) + 1),
    ("Z[i,j] = where(relu(R[i,j]), X[i,h] * W[h,j], 0.0)", lambda P, o: np.where(o["R"] > 0, P, 0.0)),
]


@pytest.mark.parametrize("head", ["A[i,j] * X[j,k]", "D[i,j] * X[j,k]"])
def test_where_in_the_kernel_takes_nan_as_true(head, rng):
    # numpy's where(c, a, b) picks a where c != 0: NaN included, 0.0 and -0.0 not
    A = _matrix(rng, 40, 30)
    D, X = A.toarray(), rng.standard_normal((30, 6))
    R = rng.standard_normal((40, 6))
    R[::3] = 0.0
    R[1::5, 2] = np.nan
    R[2, :] = -0.0
    program = f"Y[i,k] = where(R[i,k], {head}, 2.5)"
    ops = {"A": A, "X": X, "R": R} if head.startswith("A") else {"D": D, "X": X, "R": R}
    assert _kernels(program, **ops) == ["spmm+epilogue" if head.startswith("A") else "gemm+epilogue"]
    for nt in (1, 2):
        np.testing.assert_allclose(spfuse.evaluate(program, num_threads=nt, **ops), np.where(R != 0, D @ X, 2.5),
                                   rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(out_swapped=st.booleans(), x_swapped=st.booleans(), w_swapped=st.booleans(),
       x_fortran=st.booleans(), w_fortran=st.booleans(), f32=st.booleans(),
       tail=st.sampled_from(["none", "relu", "where", "bias"]), shape=st.tuples(*[st.integers(0, 9)] * 3),
       nt=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_dense_products_in_any_index_and_memory_order(out_swapped, x_swapped, w_swapped, x_fortran, w_fortran,
                                                      f32, tail, shape, nt, seed):
    """``Z = X·W`` written with each factor and the result in either index
    order, the factors C- or Fortran-ordered, with or without a tail: BLAS
    with swapped factors and flipped flags, numpy's values."""
    rng = np.random.default_rng(seed)
    m, h, n = shape
    dtype = np.float32 if f32 else np.float64
    X = rng.standard_normal((h, m) if x_swapped else (m, h)).astype(dtype)
    W = rng.standard_normal((n, h) if w_swapped else (h, n)).astype(dtype)
    X = np.asfortranarray(X) if x_fortran else X
    W = np.asfortranarray(W) if w_fortran else W
    R = rng.standard_normal((n, m) if out_swapped else (m, n)).astype(dtype)
    R[R < 0.3] = 0.0
    b = rng.standard_normal(n).astype(dtype)
    prod = f"X[{'h,i' if x_swapped else 'i,h'}] * W[{'j,h' if w_swapped else 'h,j'}]"
    out = "Z[j,i]" if out_swapped else "Z[i,j]"
    r = "R[j,i]" if out_swapped else "R[i,j]"
    expr = {"none": prod, "relu": f"relu({prod})", "where": f"where({r}, {prod}, -1.0)", "bias": f"{prod} + b[j]"}[tail]
    ops = {"X": X, "W": W, **({"R": R} if tail == "where" else {}), **({"b": b} if tail == "bias" else {})}
    got = spfuse.evaluate(f"{out} = {expr}", num_threads=nt, **ops)
    P = (X.T if x_swapped else X).astype(np.float64) @ (W.T if w_swapped else W).astype(np.float64)   # (i, j)
    want = {"none": P, "relu": np.maximum(P, 0), "bias": P + b,
            "where": np.where((R.T if out_swapped else R) != 0, P, -1.0)}[tail]
    want = want.T if out_swapped else want
    assert got.shape == want.shape and got.dtype == dtype
    np.testing.assert_allclose(got, want, **(dict(rtol=1e-4, atol=1e-4) if f32 else dict(rtol=1e-12, atol=1e-12)))


def test_a_product_stored_the_other_way_round_swaps_its_factors(rng):
    # Z[j,i] = op(X)·op(W) read transposed is op(W)ᵀ·op(X)ᵀ: BLAS writes it
    # in place (no copy into its order), and the tail runs on its rows
    X, W, R = rng.standard_normal((30, 7)), rng.standard_normal((7, 20)), rng.standard_normal((20, 30))
    program = "Z[j,i] = where(relu(R[j,i]), X[i,h] * W[h,j], 0.0)"
    assert _kernels(program, X=X, W=W, R=R) == ["gemm+epilogue"]
    np.testing.assert_allclose(spfuse.evaluate(program, X=X, W=W, R=R), np.where(R > 0, (X @ W).T, 0.0),
                               rtol=1e-12, atol=1e-12)
    plain = spfuse.evaluate("Z[j,i] = X[i,h] * W[h,j]", X=X, W=W)
    assert plain.flags.c_contiguous and np.allclose(plain, (X @ W).T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("program,oracle", GEMM_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m,h,n", [(700, 16, 24), (5, 0, 3), (0, 4, 3), (300, 300, 300)])
def test_gemm_tails_run_on_its_row_blocks(program, oracle, dtype, m, h, n, rng):
    X = rng.standard_normal((h, m) if "X[h,i]" in program else (m, h)).astype(dtype)
    ops = {"X": X, "W": rng.standard_normal((h, n)).astype(dtype), "b": rng.standard_normal(n).astype(dtype),
           "R": rng.standard_normal((m, n)).astype(dtype), "r": (rng.random(m) + 0.5).astype(dtype)}
    used = {k: v for k, v in ops.items() if f"{k}[" in program}
    assert _kernels(program, **used) == ["gemm+epilogue"]
    got = [spfuse.evaluate(program, num_threads=t, **used) for t in (1, 2)]
    assert got[0].dtype == dtype and got[0].tobytes() == got[1].tobytes()
    P = (X.T if "X[h,i]" in program else X).astype(np.float64) @ ops["W"].astype(np.float64)
    np.testing.assert_allclose(got[0], oracle(P, ops), **(dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else
                                                          dict(rtol=1e-10, atol=1e-10)))
    if dtype == np.float64:
        np.testing.assert_array_equal(got[0], spfuse.evaluate(program, fusion="none", **used))


def test_a_flat_gcn_layer_finishes_in_gemm(rng):
    # relu(b + A·X·W): the chain runs (A·X)·W, so the bias and relu go with the gemm
    A = _matrix(rng, 400, 300, density=0.02)
    ops = {"A": A, "X": rng.standard_normal((300, 16)), "W": rng.standard_normal((16, 16)),
           "b": rng.standard_normal(16)}
    flat = "Z[i,j] = relu(b[j] + A[i,k] * X[k,h] * W[h,j])"
    assert _kernels(flat, **ops) == ["spmm", "gemm+epilogue"]
    got = spfuse.evaluate(flat, **ops)
    np.testing.assert_array_equal(got, spfuse.evaluate(flat, fusion="none", **ops))
    np.testing.assert_allclose(got, np.maximum(A.toarray() @ ops["X"] @ ops["W"] + ops["b"], 0), rtol=1e-10)


def test_gemm_with_mixed_value_types_runs_apart(rng):
    X, W = rng.standard_normal((50, 8)).astype(np.float32), rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal(6)   # float64: the result is float64
    got = spfuse.evaluate("Z[i,j] = relu(X[i,h] * W[h,j] + b[j])", X=X, W=W, b=b)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.maximum(X.astype(np.float64) @ W + b, 0), rtol=1e-6, atol=1e-6)


ROWS_CASES = [
    ("Y[i,h] = relu(T[i,h] * 2 - b[h]) + sqrt(abs(T[i,h])) / r[i]",
     lambda o: np.maximum(o["T"] * 2 - o["b"], 0) + np.sqrt(np.abs(o["T"])) / o["r"][:, None]),
    ("Y[i,h] = (T[i,h] - R[i,h]) / r[i]",
     lambda o: np.where(o["T"] - o["R"] == 0, 0, (o["T"] - o["R"]) / o["r"][:, None])),
    ("y[i] = (r[i] - 3) / s[i] + r[i] * s[i]", lambda o: (o["r"] - 3) / o["s"] + o["r"] * o["s"]),
]


@pytest.mark.parametrize("program,oracle", ROWS_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_element_wise_programs_of_their_own_run_in_one_parallel_pass(program, oracle, dtype, rng):
    from spfuse.lowering.epilogues import ROWS_MIN_ELEMENTS
    m = ROWS_MIN_ELEMENTS + 7 if program.startswith("y[i]") else 700
    ops = {"T": rng.standard_normal((m, 100)), "R": rng.standard_normal((m, 100)), "b": rng.standard_normal(100),
           "r": rng.random(m) + 0.5, "s": rng.random(m) + 0.5}
    ops = {k: v.astype(dtype) for k, v in ops.items() if f"{k}[" in program}
    ops["T" if "T[" in program else "r"].reshape(-1)[:3] = 0.0   # (0 / x, sqrt(0), relu(-0))
    assert _kernels(program, **ops) == ["rows+epilogue"]
    got = [spfuse.evaluate(program, num_threads=t, **ops) for t in (1, 2)]
    assert got[0].tobytes() == got[1].tobytes()
    np.testing.assert_array_equal(got[0], spfuse.evaluate(program, fusion="none", **ops))
    want = oracle({k: v.astype(np.float64) for k, v in ops.items()})
    np.testing.assert_allclose(got[0], want, **(dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else
                                                dict(rtol=1e-12, atol=1e-12)))


def test_small_element_wise_programs_stay_numpy_passes(rng):
    ops = {"T": rng.standard_normal((30, 20)), "r": rng.random(30) + 0.5}
    assert _kernels("Y[i,h] = T[i,h] / r[i]", **ops) == ["generic"]


def test_an_attention_layer_divides_in_one_parallel_pass(rng):
    # the pattern program's SpMM rows and row sums, then Y = T / s[i] over the rows
    A = _matrix(rng, 3000, 3000, density=0.003)
    ops = {"B": A, "Q": rng.standard_normal((3000, 8)), "K": rng.standard_normal((3000, 8)),
           "V": rng.standard_normal((3000, 64))}
    program = ("S[i,j] = B[i,j] * Q[i,k] * K[j,k]; E[i,j] = B[i,j] * exp(S[i,j]); "
               "Y[i,h] = E[i,j] * V[j,h] / sum(j, E[i,j])")
    assert _kernels(program, **ops)[-1] == "rows+epilogue"
    got = spfuse.evaluate(program, **ops)
    S = A.toarray() * (ops["Q"] @ ops["K"].T)
    E = A.toarray() * np.exp(S)
    sums = E.sum(1)
    want = np.where(sums[:, None] == 0, 0, (E @ ops["V"]) / np.where(sums == 0, 1, sums)[:, None])
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("program", ["Z[A,b] = X[a,A] * Y[a,b] * s", "Z[A,b] = relu(X[a,A] * Y[a,b] * s + c[b])"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 3, 4)])
def test_a_scaled_gemm_keeps_its_scale(program, shape, rng):
    # (a gemm scaled by its route runs as before; its scale was once dropped
    # on the way into the epilogue: einsum('aA,ab,', x, y, 0.0) gave x*y)
    a, A, b = shape
    ops = {"X": rng.standard_normal((a, A)), "Y": rng.standard_normal((a, b)), "c": rng.standard_normal(b)}
    used = {k: v for k, v in ops.items() if f"{k}[" in program}
    for s in (0.0, 2.5):
        want = s * (ops["X"].T @ ops["Y"])
        if "relu" in program:
            want = np.maximum(want + ops["c"], 0)
        np.testing.assert_allclose(spfuse.evaluate(program, s=np.float64(s), **used), want, rtol=1e-12, atol=1e-12)


def test_one_kernel_reads_each_calls_operands_through_its_encoded_tail(rng):
    """A tail's opcodes are encoded once per program; its operands' addresses
    and 0-d values are each call's own (the shared arrays are read-only)."""
    from spfuse.lowering.epilogues import _static_encoding
    A = sp.random_array((300, 200), density=0.05, format="csr", rng=rng)
    X = rng.standard_normal((200, 8))
    k = spfuse.compile("Y[i,k] = relu(s * (A[i,j] * X[j,k]) + b[k])", A=A, X=X, b=np.zeros(8), s=np.float64(1.0))
    for _ in range(3):
        b, s = rng.standard_normal(8), np.float64(rng.standard_normal())
        np.testing.assert_allclose(k(A=A, X=X, b=b, s=s), np.maximum(s * (A @ X) + b, 0), rtol=1e-12, atol=1e-12)
    assert _static_encoding.cache_info().currsize > 0
    (code, kinds, refs, consts, _, _), slots = _static_encoding(((("relu", 0, (("register", 0, 1.0),)),), 0, 1),
                                                                1.0, False)
    assert slots == ()
    assert not any(a.flags.writeable for a in (code, kinds, refs, consts))
