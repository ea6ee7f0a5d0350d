"""The shipped oracle and generators (spfuse.testing)."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings

from spfuse.frontend.ast import Reduce, Unary
from spfuse.frontend.canonical import to_text
from spfuse.frontend.check import check_program, result_shapes
from spfuse.frontend.parser import parse_program
from spfuse.testing import dense_reference, densify, programs, random_operands, random_program, random_sparse

# ``rng`` is the shared fixture of tests/conftest.py (seeded by SPFUSE_TEST_SEED)


# ---------------------------------------------------------------------------
# dense_reference semantics
# ---------------------------------------------------------------------------
# (program, input shapes in order of first use, numpy equivalent)
KERNELS = [
    ("y[i] = A[i,j] * x[j]", [(4, 5), (5,)], lambda A, x: A @ x),
    ("C[i,k] = A[i,j] * B[j,k]", [(4, 5), (5, 3)], lambda A, B: A @ B),
    ("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", [(4, 5), (4, 3), (3, 5)],
     lambda B, C, D: B * (C @ D)),
    ("A[i,j] = B[i,j] / (C[i,k] * D[k,j])", [(4, 5), (4, 3), (3, 5)],
     lambda B, C, D: B / (C @ D)),
    ("Z[i,j] = A[i,k] * X[k,h] * W[h,j]", [(4, 5), (5, 3), (3, 2)], lambda A, X, W: A @ X @ W),
    ("Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]", [(4, 2), (4, 3), (3, 2)],
     lambda A, X, Y: (A * (X @ Y)) @ Y.T),
    ("A[i,j] = X[i,j,k] * c[k]", [(3, 4, 2), (2,)], lambda X, c: np.einsum("ijk,k->ij", X, c)),
    ("A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", [(3, 4, 2), (4, 5), (2, 5)],
     lambda X, C, D: np.einsum("ijk,jr,kr->ir", X, C, D)),
    ("A[i,j] = B1[i,j] + B2[i,j] + B3[i,j]", [(4, 5)] * 3, lambda a, b, c: a + b + c),
    ("y[i] = max(j, A[i,j])", [(4, 5)], lambda A: A.max(axis=1)),
    ("y[j] = min(i, A[i,j] * 2)", [(4, 5)], lambda A: (2 * A).min(axis=0)),
    ("y[i] = relu(A[i,j] * x[j]) - sigmoid(z[i])", [(4, 5), (5,), (4,)],
     lambda A, x, z: np.maximum(A @ x, 0) - 1 / (1 + np.exp(-z))),
    ("y[i] = where(c[i] - 0.5, exp(a[i]), tanh(b[i]))", [(4,)] * 3,
     lambda c, a, b: np.where(c != 0.5, np.exp(a), np.tanh(b))),
    ("d[i] = A[i,i]", [(4, 4)], lambda A: np.diag(A).copy()),
    ("s = A[i,j] * A[i,j]", [(4, 5)], lambda A: (A * A).sum()),
    ("y[i] = 2 * x[i] + -1.5", [(5,)], lambda x: 2 * x - 1.5),
    ("B[j,i] = A[i,j]", [(4, 5)], lambda A: A.T),
    ("y[i,j] = x[i] * z[j]", [(4,), (3,)], lambda x, z: np.outer(x, z)),
    ("y[i,j] = x[i] * z[j] + s", [(4,), (3,), ()], lambda x, z, s: np.outer(x, z) + s),
    ("T[i,k] = A[i,j] * B[j,k]; y[i] = T[i,k] * T[i,k]", [(4, 5), (5, 3)],
     lambda A, B: ((A @ B) ** 2).sum(axis=1)),
]


@pytest.mark.parametrize("text,shapes,fn", KERNELS, ids=[t for t, _, _ in KERNELS])
def test_kernels_match_numpy(text, shapes, fn, rng):
    names = parse_program(text).inputs
    ops = {n: rng.standard_normal(s) for n, s in zip(names, shapes, strict=True)}
    got = dense_reference(text, ops)
    np.testing.assert_allclose(got, fn(*ops.values()), rtol=1e-12, atol=1e-12)


def test_division_convention():
    num = np.array([[0.0, 1.0, 0.0, -2.0, 0.0]])
    den = np.array([[0.0, 0.0, 3.0, 4.0, np.inf]])
    got = dense_reference("C[i,j] = A[i,j] / B[i,j]", {"A": num, "B": den})
    np.testing.assert_array_equal(got, [[0.0, np.inf, 0.0, -0.5, 0.0]])
    # the convention applies after broadcasting and to reduced denominators
    got = dense_reference("A[i,j] = B[i,j] / (C[i,k] * D[k,j])",
                          {"B": np.array([[0.0, 2.0]]), "C": np.zeros((1, 3)), "D": np.ones((3, 2))})
    np.testing.assert_array_equal(got, [[0.0, np.inf]])
    # nan numerators stay nan
    assert np.isnan(dense_reference("s = a / b", {"a": np.nan, "b": 0.0}))


def test_reductions_see_zeros_and_empty_extents():
    A = sp.csr_array(np.array([[-1.0, 0.0], [0.0, 0.0], [2.0, 3.0]]))
    np.testing.assert_array_equal(dense_reference("y[i] = max(j, A[i,j])", {"A": A}), [0, 0, 3])
    np.testing.assert_array_equal(dense_reference("y[i] = min(j, A[i,j])", {"A": A}), [-1, 0, 2])
    for op in ("sum", "max", "min"):
        got = dense_reference(f"y[i] = {op}(j, A[i,j])", {"A": np.zeros((3, 0))})
        np.testing.assert_array_equal(got, np.zeros(3))


def test_unary_functions(rng):
    x = rng.standard_normal(6)
    x[0] = 0
    ref = {"relu": np.maximum(x, 0), "sigmoid": 1 / (1 + np.exp(-x)), "tanh": np.tanh(x),
           "exp": np.exp(x), "abs": np.abs(x), "neg": -x}
    for fn, want in ref.items():
        np.testing.assert_allclose(dense_reference(f"y[i] = {fn}(x[i])", {"x": x}), want,
                                   rtol=1e-14)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(dense_reference("y[i] = log(x[i])", {"x": x}), np.log(x))
        np.testing.assert_array_equal(dense_reference("y[i] = sqrt(x[i])", {"x": x}), np.sqrt(x))


def test_explicit_sum_of_constant_body():
    # sum over k of a body that does not use k, with k bound by another use
    got = dense_reference("y[i] = sum(k, x[i]) * 1 + A[i,k]",
                          {"x": np.array([1.0, 2.0]), "A": np.ones((2, 3))})
    np.testing.assert_array_equal(got, [3.0 + 3.0, 6.0 + 3.0])


def test_results_and_scalars():
    ops = {"A": np.arange(6.0).reshape(2, 3)}
    s = dense_reference("s = A[i,j]", ops)
    assert isinstance(s, np.float64) and s == 15.0
    res = dense_reference("T[i] = A[i,j]\nu = T[i]\nv[j] = A[i,j] * 2", ops)
    assert list(res) == ["u", "v"]
    assert res["u"] == 15.0
    np.testing.assert_array_equal(res["v"], [6.0, 10.0, 14.0])
    assert res["v"].dtype == np.float64


def test_accepts_program_objects_and_unused_operands():
    p = parse_program("y[i] = A[i,j] * x[j]")
    got = dense_reference(p, {"A": np.eye(2), "x": [1, 2], "unused": np.zeros(3)})
    np.testing.assert_array_equal(got, [1.0, 2.0])


def test_errors_propagate():
    from spfuse.errors import ProgramError
    with pytest.raises(ProgramError, match="unknown operand 'x'"):
        dense_reference("y[i] = A[i,j] * x[j]", {"A": np.eye(2)})


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
@pytest.mark.parametrize("flavour", ["array", "matrix"])
def test_sparse_operands_densified(fmt, flavour, rng):
    A = random_sparse(rng, (6, 5), 0.4, fmt, canonical=False, flavour=flavour)
    x = rng.standard_normal(5)
    dense = A.toarray()
    np.testing.assert_allclose(dense_reference("y[i] = A[i,j] * x[j]", {"A": A, "x": x}),
                               dense @ x, rtol=1e-12)


def test_densify():
    m = sp.csr_matrix([[1, 0], [0, 2]])
    out = densify(m)
    assert type(out) is np.ndarray and out.dtype == np.float64
    assert densify(3).shape == ()
    assert densify(np.float32(2)).dtype == np.float64


# ---------------------------------------------------------------------------
# random operands
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_random_sparse_compressed(fmt, index_dtype, rng):
    seed = int(rng.integers(2**32))
    A = random_sparse(np.random.default_rng(seed), (20, 15), 0.3, fmt, index_dtype=index_dtype, empty_rows=0.3)
    assert A.format == fmt and A.shape == (20, 15)
    assert A.indices.dtype == index_dtype and A.indptr.dtype == index_dtype
    assert A.has_canonical_format
    assert isinstance(A, sp.sparray)
    dense = A.toarray()
    assert np.all((dense == 0) | (np.abs(dense) >= 0.1))
    assert (np.abs(dense).sum(axis=1) == 0).any()  # some empty rows

    N = random_sparse(np.random.default_rng(seed), (20, 15), 0.3, fmt, canonical=False,
                      index_dtype=index_dtype, empty_rows=0.3)
    assert N.indices.dtype == index_dtype
    np.testing.assert_allclose(N.toarray(), dense, rtol=1e-12)  # same values, same seed
    assert not N.has_canonical_format
    # duplicates and unsorted minor indices really are present
    n_major = N.shape[0] if fmt == "csr" else N.shape[1]
    dup = unsorted = False
    for r in range(n_major):
        idx = N.indices[N.indptr[r]:N.indptr[r + 1]]
        dup |= len(np.unique(idx)) < len(idx)
        unsorted |= bool(np.any(np.diff(idx) < 0))
    assert dup and unsorted
    assert N.nnz > A.nnz


def test_random_sparse_coo_and_nd(rng):
    C = random_sparse(rng, (10, 10), 0.5, "coo", canonical=False)
    assert C.nnz > np.count_nonzero(C.toarray())  # duplicates
    T = random_sparse(rng, (3, 4, 5), 0.3, "coo", index_dtype=np.int64)
    assert T.shape == (3, 4, 5) and T.coords[0].dtype == np.int64
    v = random_sparse(rng, (7,), 0.5, "coo")
    assert v.shape == (7,)
    with pytest.raises(ValueError, match="csr needs a 2-d shape"):
        random_sparse(rng, (3, 4, 5), 0.3, "csr")
    with pytest.raises(ValueError, match="unknown format"):
        random_sparse(rng, (3, 4), 0.3, "bsr")


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dense"])
def test_random_sparse_zero_size(shape, fmt, rng):
    A = random_sparse(rng, shape, 0.5, fmt, canonical=False)
    assert A.shape == shape
    assert densify(A).shape == shape


def test_random_sparse_matrix_flavour_and_dtype(rng):
    A = random_sparse(rng, (4, 4), 0.5, "csr", flavour="matrix", dtype=np.float32)
    assert isinstance(A, sp.spmatrix) and A.dtype == np.float32
    assert random_sparse(rng, (), 0.5, "csr").shape == ()


def test_random_operands(rng):
    shapes = {"A": (3, 4), "x": (4,), "s": (), "T": (2, 3, 4)}
    ops = random_operands(rng, shapes, formats=("csr", "coo"))
    assert ops["A"].format in ("csr", "coo")
    assert isinstance(ops["s"], np.ndarray)
    assert {n: densify(v).shape for n, v in ops.items()} == shapes


# ---------------------------------------------------------------------------
# random programs
# ---------------------------------------------------------------------------
def _nodes(e):
    yield e
    for f in ("left", "right", "arg", "body", "cond", "then", "other"):
        c = getattr(e, f, None)
        if c is not None:
            yield from _nodes(c)


def test_random_programs_are_valid_and_varied():
    seen = set()
    for seed in range(300):
        p, shapes = random_program(seed, zero_size=seed % 7 == 0)
        explicit = parse_program(to_text(p))
        extents = check_program(explicit, shapes)
        assert len(extents) == len(p.statements)
        assert set(p.inputs) == set(shapes)
        assert set(result_shapes(p, shapes)) == set(p.assigned)
        for st in explicit.statements:
            for e in _nodes(st.value):
                seen.add(type(e).__name__)
                if isinstance(e, Reduce):
                    seen.add(("implicit" if e.implicit else "explicit", e.op))
                if isinstance(e, Unary):
                    seen.add(e.fn)
                if hasattr(e, "op") and not isinstance(e, Reduce):
                    seen.add(e.op)
                if hasattr(e, "indices") and len(set(e.indices)) < len(e.indices):
                    seen.add("diagonal")
        if len(p.statements) > 1 and any(n in p.assigned for n in p.inputs + tuple(
                a for s in p.statements for a in [x.name for x in _nodes(s.value)
                                                  if hasattr(x, "indices")])):
            seen.add("chain")
    for feature in ["Binary", "Unary", "Where", "Literal", ("explicit", "max"),
                    ("explicit", "min"), ("explicit", "sum"), ("implicit", "sum"),
                    "+", "-", "*", "/", "relu", "exp", "log", "sqrt", "diagonal", "chain"]:
        assert feature in seen, feature


def test_random_program_is_reproducible_and_finite():
    a = random_program(np.random.default_rng(5), n_statements=3)
    b = random_program(5, n_statements=3)
    assert a[0] == b[0] and a[1] == b[1] and len(a[0].statements) == 3
    for seed in range(200):
        p, shapes = random_program(seed, max_depth=4)
        res = dense_reference(p, random_operands(seed, shapes, canonical=bool(seed % 2)))
        for v in (res.values() if isinstance(res, dict) else [res]):
            assert np.all(np.isfinite(v)), to_text(p)


@settings(max_examples=100, deadline=None)
@given(programs(zero_size=True))
def test_oracle_agrees_with_densified_inputs(ps):
    p, shapes = ps
    ops = random_operands(0, shapes, canonical=False)
    dense_ops = {n: densify(v) for n, v in ops.items()}
    a = dense_reference(p, ops)
    b = dense_reference(to_text(p), dense_ops)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
