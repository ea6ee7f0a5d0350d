"""Complex operands end to end: spfuse.evaluate / compile / einsum against numpy on densified operands."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.complex_values import combine_parts, complex_parts
from spfuse.errors import UnsupportedError
from spfuse.testing import dense_reference, densify, random_program, random_sparse

sparse = pytest.importorskip("sparse")


def _complex(rng, shape, fmt="dense", density=0.4, dtype=np.complex128, empty_rows=0.0, canonical=True):
    """A random complex operand: real and imaginary parts over one random pattern."""
    re = random_sparse(rng, shape, density, "dense" if fmt != "dense" else "dense", empty_rows=empty_rows)
    im = np.where(re != 0, rng.uniform(-1, 1, re.shape), 0.0)
    dense = (re + 1j * im).astype(dtype)
    if fmt == "dense" or dense.ndim == 0:
        return dense
    if fmt in ("csr", "csc"):
        m = (sp.csr_array if fmt == "csr" else sp.csc_array)(dense)
        if not canonical:  # duplicates and unsorted indices, as random_sparse makes them
            m = sp.coo_array(dense)
            half = m.data / 2
            m = sp.coo_array((np.concatenate([half, half]), (np.concatenate([m.row, m.row]),
                                                              np.concatenate([m.col, m.col]))), shape=m.shape)
            m = m.tocsr() if fmt == "csr" else m.tocsc()
            m.has_canonical_format = False
        return m
    if fmt == "coo":
        return sp.coo_array(dense)
    if fmt == "pydata.COO":
        return sparse.COO.from_numpy(dense)
    if fmt == "pydata.GCXS":
        return sparse.GCXS.from_numpy(dense)
    raise ValueError(fmt)


def _close(got, want, rtol=1e-10):
    got_dense = densify(got)
    assert np.shape(got_dense) == np.shape(want)
    np.testing.assert_allclose(got_dense, want, rtol=rtol, atol=rtol)


# -- evaluate: the catalogue kernels with complex operands ----------------------------------------------------

KERNELS = [
    ("SpMV", "y[i] = A[i,j] * x[j]", {"A": ((7, 5), "csr"), "x": ((5,), "dense")}),
    ("SpMM", "C[i,k] = A[i,j] * B[j,k]", {"A": ((7, 5), "csr"), "B": ((5, 3), "dense")}),
    ("SpMM-csc", "C[i,k] = A[i,j] * B[j,k]", {"A": ((7, 5), "csc"), "B": ((5, 3), "dense")}),
    ("SDDMM", "A[i,j] = B[i,j] * (C[i,k] * D[k,j])", {"B": ((6, 5), "csr"), "C": ((6, 3), "dense"),
                                                       "D": ((3, 5), "dense")}),
    ("SDDMM-div", "A[i,j] = B[i,j] / (C[i,k] * D[k,j])", {"B": ((6, 5), "csr"), "C": ((6, 3), "dense"),
                                                           "D": ((3, 5), "dense")}),
    ("SpGEMM", "C[i,k] = A[i,j] * B[j,k]", {"A": ((6, 5), "csr"), "B": ((5, 4), "csr")}),
    ("SpAdd", "A[i,j] = B1[i,j] + B2[i,j] - B3[i,j]", {"B1": ((5, 4), "csr"), "B2": ((5, 4), "csr"),
                                                       "B3": ((5, 4), "coo")}),
    ("GNN-1", "Z[i,j] = A[i,k] * X[k,h] * W[h,j]", {"A": ((6, 6), "csr"), "X": ((6, 4), "dense"),
                                                    "W": ((4, 3), "dense")}),
    ("TTV", "A[i,j] = X[i,j,k] * c[k]", {"X": ((4, 3, 5), "coo"), "c": ((5,), "dense")}),
    ("MTTKRP", "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", {"X": ((4, 3, 5), "coo"), "C": ((3, 2), "dense"),
                                                        "D": ((5, 2), "dense")}),
    ("row-sums", "y[i] = A[i,j]", {"A": ((6, 4), "csr")}),
    ("scalar", "y[i] = s * A[i,j] * x[j] + x[i]", {"A": ((4, 4), "csr"), "x": ((4,), "dense"), "s": ((), "dense")}),
]


@pytest.mark.parametrize("name, text, spec", KERNELS, ids=[k[0] for k in KERNELS])
def test_catalogue_kernels_with_complex_operands(name, text, spec, rng):
    full = name == "SDDMM-div"  # dense factors without zeros: no stored B[i,j] is divided by 0
    ops = {n: _complex(rng, shape, fmt, density=1.0 if full and fmt == "dense" else 0.4,
                       empty_rows=0.0 if full and fmt == "dense" else 0.3)
           for n, (shape, fmt) in spec.items()}
    got = spfuse.evaluate(text, **ops)
    want = dense_reference(text, ops)
    _close(got, want)
    assert np.result_type(got) == np.complex128


def test_results_come_back_in_the_callers_world(rng):
    A = _complex(rng, (5, 5), "csr")
    for flavour in (sp.csr_array, sp.csr_matrix, sp.csc_array, sp.csc_matrix):
        got = spfuse.evaluate("C[i,j] = A[i,j] * B[i,j]", A=flavour(A), B=flavour(A))
        # the same world and flavour (the planner may store the result by rows or by columns)
        assert isinstance(got, sp.sparray) == issubclass(flavour, sp.sparray) and got.dtype == np.complex128
        _close(got, densify(A) ** 2)
    for kind in ("pydata.COO", "pydata.GCXS"):
        P = _complex(rng, (5, 4), kind)
        got = spfuse.einsum("ij,ij->ij", P, P)
        assert type(got) is type(P) and got.dtype == np.complex128
        _close(got, densify(P) ** 2)
    assert isinstance(spfuse.einsum("ij,j->i", A, np.ones(5)), np.ndarray)


def test_mixed_real_and_complex_operands(rng):
    A = random_sparse(rng, (6, 5), 0.4, "csr")             # real sparse
    x = _complex(rng, (5,), "dense", dtype=np.complex64)   # complex64 dense
    got = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
    assert got.dtype == np.result_type(A.dtype, x.dtype) == np.complex128
    np.testing.assert_allclose(got, A @ x, rtol=1e-6)


def test_complex64_result_rounds_a_float64_computation(rng):
    A = _complex(rng, (6, 5), "csr", dtype=np.complex64)
    x = _complex(rng, (5,), "dense", dtype=np.complex64)
    got = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
    assert got.dtype == np.complex64
    exact = A.astype(np.complex128) @ x.astype(np.complex128)
    np.testing.assert_array_equal(got, exact.astype(np.complex64))


def test_abs_of_a_complex_value_is_real(rng):
    x = _complex(rng, (6,), "dense")
    got = spfuse.evaluate("y[i] = abs(x[i])", x=x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.abs(x), rtol=1e-14)


def test_complex_python_scalar_operand(rng):
    x = _complex(rng, (6,), "dense")
    np.testing.assert_allclose(spfuse.evaluate("y[i] = s * x[i]", x=x, s=2 - 3j), (2 - 3j) * x, rtol=1e-14)


def test_division_by_a_complex_dense_operand(rng):
    x, y = _complex(rng, (6,), "dense", density=1.0), _complex(rng, (6,), "dense", density=1.0)
    np.testing.assert_allclose(spfuse.evaluate("z[i] = x[i] / y[i]", x=x, y=y), x / y, rtol=1e-13)


def test_several_results_and_temporaries(rng):
    A, B = _complex(rng, (4, 3), "csr"), _complex(rng, (4, 3), "dense")
    x = _complex(rng, (3,), "dense")
    text = "T[i,j] = A[i,j] - B[i,j]\ny[i] = T[i,j] * x[j]\nn = abs(T[i,j]) * abs(T[i,j])"
    got = spfuse.evaluate(text, A=A, B=B, x=x)
    T = densify(A) - B
    np.testing.assert_allclose(got["y"], T @ x, rtol=1e-12)
    assert got["n"].dtype == np.float64
    np.testing.assert_allclose(got["n"], (np.abs(T) ** 2).sum(), rtol=1e-12)


@pytest.mark.parametrize("fn", ["exp", "log", "relu", "sigmoid", "tanh", "sqrt"])
def test_nonlinear_functions_refused_with_function_and_dtype(fn, rng):
    x = _complex(rng, (4,), "dense", dtype=np.complex64)
    with pytest.raises(UnsupportedError, match=rf"{fn}\(\) of a complex64 value is not supported"):
        spfuse.evaluate(f"y[i] = {fn}(x[i])", x=x)


def test_max_and_where_condition_refused(rng):
    x = _complex(rng, (4,), "dense")
    with pytest.raises(UnsupportedError, match=r"max\(\) reduction of a complex128 value"):
        spfuse.evaluate("y = max(i, x[i])", x=x)
    with pytest.raises(UnsupportedError, match=r"where\(\) condition of a complex128 value"):
        spfuse.evaluate("y[i] = where(x[i], 1, 0)", x=x)


def test_where_with_a_real_condition_and_complex_branches(rng):
    x, m = _complex(rng, (6,), "dense"), rng.random(6) < 0.5
    np.testing.assert_allclose(spfuse.evaluate("y[i] = where(m[i], x[i], 0)", x=x, m=m.astype(float)),
                               np.where(m, x, 0))


def test_long_double_refused_by_evaluate():
    x = np.ones(3, np.clongdouble)
    with pytest.raises(UnsupportedError, match="long double.*lower-precision"):
        spfuse.evaluate("y[i] = x[i] * x[i]", x=x)
    with pytest.raises(TypeError, match="longdouble|float128"):
        spfuse.evaluate("y[i] = x[i] * x[i]", x=np.ones(3, np.longdouble))


def test_csf_output_refused_and_nd_sparse_result_is_a_coo_array(rng):
    X = _complex(rng, (3, 4, 5), "coo")
    with pytest.raises(UnsupportedError, match="real values"):
        spfuse.evaluate("Y[i,j,k] = X[i,j,k] * X[i,j,k]", X=X, out_format="csf")
    got = spfuse.evaluate("Y[i,j,k] = X[i,j,k] * X[i,j,k]", X=X)
    assert isinstance(got, sp.coo_array) and got.dtype == np.complex128
    _close(got, densify(X) ** 2)


def test_out_formats(rng):
    A = _complex(rng, (5, 4), "csr")
    for fmt, kind in (("csr", "csr"), ("csc", "csc"), ("coo", "coo")):
        got = spfuse.evaluate("C[i,j] = A[i,j] * A[i,j]", A=A, out_format=fmt)
        assert got.format == kind and got.dtype == np.complex128
        _close(got, densify(A) ** 2)
    got = spfuse.evaluate("C[i,j] = A[i,j] * A[i,j]", A=A, out_format="dense")
    assert isinstance(got, np.ndarray)
    _close(got, densify(A) ** 2)


def test_compile_with_declared_formats(rng):
    k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    A, x = _complex(rng, (5, 4), "csr"), _complex(rng, (4,), "dense")
    np.testing.assert_allclose(k(A=A, x=x), densify(A) @ x, rtol=1e-12)


def test_parts_share_the_callers_index_arrays(rng):
    A = _complex(rng, (6, 5), "csr")
    re, im = complex_parts(A, "A")
    assert re.levels[1].crd is im.levels[1].crd and re.levels[1].pos is im.levels[1].pos
    assert np.shares_memory(re.levels[1].crd, A.indices) and np.shares_memory(re.levels[1].pos, A.indptr)
    np.testing.assert_array_equal(re.todense() + 1j * im.todense(), A.toarray())


def test_noncanonical_complex_input_is_canonicalised_on_a_copy(rng):
    A = _complex(rng, (6, 5), "csr", canonical=False)
    data, indices = A.data.copy(), A.indices.copy()
    x = _complex(rng, (5,), "dense")
    np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x), A.toarray() @ x, rtol=1e-12)
    np.testing.assert_array_equal(A.data, data)  # inputs never mutated
    np.testing.assert_array_equal(A.indices, indices)


def test_combine_parts_with_different_patterns():
    re = sp.csr_array(np.array([[1.0, 0.0], [0.0, 0.0]]))
    im = sp.csr_array(np.array([[0.0, 2.0], [0.0, 0.0]]))
    got = combine_parts(re, im, np.dtype(np.complex64))
    assert got.dtype == np.complex64 and got.format == "csr"
    np.testing.assert_array_equal(got.toarray(), [[1, 2j], [0, 0]])


# -- property tests ---------------------------------------------------------------------------------------------

FORMATS = ("dense", "csr", "csc", "coo")


@st.composite
def complex_einsums(draw):
    """Random einsums over 1-3 operands with zero-size dims, each operand complex64/complex128/float64/int32
    in a random format."""
    labels = "abcd"
    extent = {c: draw(st.sampled_from([0, 1, 2, 3, 4])) for c in labels}
    terms = ["".join(draw(st.lists(st.sampled_from(labels), min_size=0, max_size=3, unique=True)))
             for _ in range(draw(st.integers(1, 3)))]
    used = sorted({c for t in terms for c in t})
    out = "".join(draw(st.permutations(used))[: draw(st.integers(0, len(used)))])
    dtypes = [draw(st.sampled_from([np.complex128, np.complex128, np.complex64, np.float64, np.int32]))
              for _ in terms]
    formats = [draw(st.sampled_from(FORMATS)) for _ in terms]
    return ",".join(terms) + "->" + out, [tuple(extent[c] for c in t) for t in terms], dtypes, formats, \
        draw(st.integers(0, 2 ** 32 - 1))


def _operand(rng, shape, dtype, fmt):
    if np.dtype(dtype).kind == "c":
        op = _complex(rng, shape, "dense", empty_rows=0.3, dtype=dtype)
    else:
        op = (random_sparse(rng, shape, 0.5, "dense", empty_rows=0.3) * 4).astype(dtype)
    if fmt == "dense" or op.ndim == 0 or (fmt in ("csr", "csc") and op.ndim != 2):
        return op, op
    given = {"csr": sp.csr_array, "csc": sp.csc_array, "coo": sp.coo_array}[fmt](op)
    return given, op


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(complex_einsums())
def test_random_complex_einsums_match_numpy(case):
    subscripts, shapes, dtypes, formats, seed = case
    rng = np.random.default_rng(seed)
    pairs = [_operand(rng, s, d, f) for s, d, f in zip(shapes, dtypes, formats, strict=True)]
    want = np.einsum(subscripts, *[p[1] for p in pairs])
    got = spfuse.einsum(subscripts, *[p[0] for p in pairs])
    assert np.result_type(got) == want.dtype
    tol = 1e-5 if want.dtype == np.complex64 else 1e-12
    np.testing.assert_allclose(densify(got), want, rtol=tol, atol=tol)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2 ** 32 - 1), st.booleans(), st.sampled_from(["dense", "csr", "csc", "coo"]))
def test_random_programs_with_complex_operands(seed, zero_size, fmt):
    """Random programs (products, sums, divisions, where, reductions, functions) over complex operands:
    numpy's complex answer, or an UnsupportedError that names a function of a complex value."""
    rng = np.random.default_rng(seed)
    program, shapes = random_program(rng, zero_size=zero_size, diagonal=False)
    ops = {}
    for n, (name, shape) in enumerate(shapes.items()):
        use = fmt if len(shape) == 2 or (fmt == "coo" and len(shape) >= 1) else "dense"
        ops[name] = _complex(rng, shape, use, empty_rows=0.3) if n % 3 != 2 else \
            random_sparse(rng, shape, 0.5, "dense")  # every third operand real
    try:
        got = spfuse.evaluate(program.text, **ops)
    except UnsupportedError as exc:
        assert " of a complex128 value is not supported" in str(exc)
        return
    except ValueError as exc:  # max/min over an empty index, as for real operands
        assert "has no identity" in str(exc)
        return
    want = dense_reference(program, ops)
    if not isinstance(want, dict):
        got, want = {0: got}, {0: want}
    for name in want:
        np.testing.assert_allclose(densify(got[name]), want[name], rtol=1e-9, atol=1e-9)


def test_long_product_chain_runs_the_split_program(rng):
    """Five complex factors: 32 terms would be too many; the pairwise split (16 products) runs instead."""
    ops = {n: _complex(rng, (4, 3), "csr" if n == "A" else "dense", density=0.8) for n in "ABCDE"}
    got = spfuse.evaluate("y[i,j] = A[i,j] * B[i,j] * C[i,j] * D[i,j] * E[i,j]", **ops)
    want = densify(ops["A"]) * ops["B"] * ops["C"] * ops["D"] * ops["E"]
    _close(got, want)
