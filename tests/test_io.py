"""File I/O: Matrix Market, FROSTT .tns, .mat, dispatch and built-in data."""
from __future__ import annotations

import gzip

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from spfuse import io
from spfuse.formats import Format
from spfuse.tensor import Tensor

FLOATS = [np.float32, np.float64]


def random_array(rng, shape, density=0.3, dtype=np.float64):
    a = rng.standard_normal(shape).astype(dtype)
    a[rng.random(shape) >= density] = 0
    return a


# --------------------------------------------------------------------------- .mtx
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["tensor-csr", "tensor-csc", "tensor-dense", "scipy-array",
                                  "scipy-matrix", "numpy"])
def test_mtx_roundtrip(tmp_path, rng, dtype, kind):
    a = random_array(rng, (7, 5), 0.4, dtype)
    obj = {"tensor-csr": lambda: Tensor.from_numpy(a, "csr"),
           "tensor-csc": lambda: Tensor.from_numpy(a, "csc"),
           "tensor-dense": lambda: Tensor.from_numpy(a),
           "scipy-array": lambda: sp.csr_array(a),
           "scipy-matrix": lambda: sp.coo_matrix(a),
           "numpy": lambda: a}[kind]()
    p = tmp_path / "m.mtx"
    io.write_mtx(p, obj)
    t = io.read_mtx(p)
    assert t.shape == a.shape and t.origin is None
    assert t.format.name == ("dense" if kind in ("tensor-dense", "numpy") else "csr")
    np.testing.assert_allclose(t.todense(), a, rtol=1e-6 if dtype == np.float32 else 1e-14)
    assert io.read(str(p)).shape == a.shape


def test_mtx_empty_and_zero_size(tmp_path):
    for shape in [(3, 4), (0, 5), (4, 0)]:
        p = tmp_path / f"e{shape[0]}_{shape[1]}.mtx"
        io.write_mtx(p, sp.csr_array(shape))
        t = io.read_mtx(p)
        assert t.shape == shape and t.nnz == 0


SYMMETRIC = """%%MatrixMarket matrix coordinate real symmetric
% a comment
3 3 4
1 1 2.0
2 1 -1.0
3 2 5.5
3 3 1.0
"""

PATTERN = """%%MatrixMarket matrix coordinate pattern general
2 3 2
1 3
2 1
"""


def test_mtx_symmetric_expands(tmp_path):
    p = tmp_path / "s.mtx"
    p.write_text(SYMMETRIC)
    t = io.read_mtx(p)
    expected = np.array([[2.0, -1.0, 0.0], [-1.0, 0.0, 5.5], [0.0, 5.5, 1.0]])
    np.testing.assert_array_equal(t.todense(), expected)
    assert t.nnz == 6


def test_mtx_pattern_and_gzip(tmp_path):
    p = tmp_path / "p.mtx.gz"
    with gzip.open(p, "wt") as f:
        f.write(PATTERN)
    t = io.read(p)
    np.testing.assert_array_equal(t.todense(), [[0, 0, 1.0], [1.0, 0, 0]])


def test_write_mtx_refuses_nd(tmp_path):
    with pytest.raises(ValueError, match="2-d"):
        io.write_mtx(tmp_path / "x.mtx", Tensor.from_numpy(np.zeros((2, 2, 2)), "csf"))
    with pytest.raises(ValueError, match="2-d"):
        io.write_mtx(tmp_path / "x.mtx", np.zeros(3))


# --------------------------------------------------------------------------- .tns
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(6,), (4, 5), (3, 4, 5), (2, 3, 2, 3)])
@pytest.mark.parametrize("suffix", [".tns", ".tns.gz"])
def test_tns_roundtrip(tmp_path, rng, shape, dtype, suffix):
    a = random_array(rng, shape, 0.4, dtype)
    a[(-1,) * len(shape)] = 0.0  # trailing extent empty: the header keeps the shape
    p = tmp_path / f"x{suffix}"
    io.write_tns(p, Tensor.from_numpy(a, Format.csf(tuple(reversed(range(len(shape)))))))
    t = io.read_tns(p)
    assert t.format == Format.csf(len(shape)) and t.shape == shape
    np.testing.assert_array_equal(t.todense(), a.astype(np.float64))  # %.17g is exact
    if suffix == ".tns.gz":
        with gzip.open(p, "rt") as f:
            assert f.readline().startswith("# shape:")
    assert io.read(p).shape == shape


def test_tns_from_numpy_scipy_and_dense_tensor(tmp_path, rng):
    a = random_array(rng, (4, 3))
    for i, obj in enumerate([a, sp.csr_array(a), Tensor.from_numpy(a), Tensor.from_numpy(a, "dcsc")]):
        p = tmp_path / f"y{i}.tns"
        io.write_tns(p, obj)
        np.testing.assert_array_equal(io.read_tns(p).todense(), a)
        lines = [ln for ln in p.read_text().splitlines() if not ln.startswith("#")]
        assert len(lines) == np.count_nonzero(a)  # dense fill is not written


def test_tns_shape_default_is_max_coordinate(tmp_path):
    p = tmp_path / "a.tns"
    p.write_text("# no shape header\n1 2 3 1.5\n\n2 1 1 -2\n   # indented comment\n2 2 3 4e-3  # trailing comment\n")
    t = io.read_tns(p)
    assert t.shape == (2, 2, 3) and t.nnz == 3
    assert t.todense()[0, 1, 2] == 1.5 and t.todense()[1, 1, 2] == 4e-3
    t2 = io.read_tns(p, shape=(5, 5, 5))
    assert t2.shape == (5, 5, 5)
    assert io.read_tns(p, format="dense").format.name == "dense"


def test_tns_duplicates_summed(tmp_path):
    p = tmp_path / "d.tns"
    p.write_text("1 1 1.0\n2 2 3.0\n1 1 2.5\n")
    t = io.read_tns(p)
    np.testing.assert_array_equal(t.todense(), [[3.5, 0], [0, 3.0]])


def test_tns_empty(tmp_path):
    p = tmp_path / "e.tns"
    io.write_tns(p, Tensor.from_numpy(np.zeros((2, 3, 4)), "csf"))
    t = io.read_tns(p)
    assert t.shape == (2, 3, 4) and t.nnz == 0
    q = tmp_path / "blank.tns"
    q.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="shape"):
        io.read_tns(q)
    assert io.read_tns(q, shape=(3, 3)).shape == (3, 3)
    with pytest.raises(ValueError, match="0-d"):
        io.write_tns(tmp_path / "s.tns", 3.0)


@pytest.mark.parametrize("text, line, fragment", [
    ("1 1 1.0\n2 2\n", 2, "expected 3 columns"),                           # too few columns
    ("# c\n\n1 1 1.0\n1 2 3 1.0\n", 4, "expected 3 columns"),              # too many, after comments
    ("1 1 1.0\n1 x 2.0\n", 2, "coordinate 2 is not an integer"),          # non-integer coordinate
    ("1 1 1.0\n1.5 1 2.0\n", 2, "coordinate 1 is not an integer"),        # fractional coordinate
    ("1 1 1.0\n\n0 1 2.0\n", 3, "1-based"),                                # coordinate 0
    ("1 1 1.0\n-3 1 2.0\n", 2, "1-based"),                                 # negative coordinate
    ("1 1 1.0\n2 2 abc\n", 2, "value is not a number"),                    # bad value
    ("5\n", 1, "at least 2 columns"),                                      # a lone number
])
def test_tns_malformed_lines_name_the_line(tmp_path, text, line, fragment):
    p = tmp_path / "bad.tns"
    p.write_text(text)
    with pytest.raises(ValueError, match=fragment) as info:
        io.read_tns(p)
    assert f"line {line}:" in str(info.value)
    assert str(p) in str(info.value)


def test_tns_coordinate_beyond_given_shape(tmp_path):
    p = tmp_path / "o.tns"
    p.write_text("# c\n1 1 1.0\n3 1 1.0\n")
    with pytest.raises(ValueError, match="line 3"):
        io.read_tns(p, shape=(2, 2))
    with pytest.raises(ValueError, match="line 2: expected 2 columns"):
        io.read_tns(p, shape=(2,))


def test_tns_gz_malformed(tmp_path):
    p = tmp_path / "bad.tns.gz"
    with gzip.open(p, "wt") as f:
        f.write("1 1 1.0\n1 1 1.0 9\n")
    with pytest.raises(ValueError, match="line 2"):
        io.read_tns(p)


# --------------------------------------------------------------------------- .mat, .npz, dispatch
def test_mat_suitesparse_problem_struct(tmp_path, rng):
    a = random_array(rng, (5, 6))
    p = tmp_path / "ss.mat"
    scipy.io.savemat(p, {"Problem": {"A": sp.csc_array(a), "name": "test/ss", "id": 7}})
    t = io.read(p)
    np.testing.assert_array_equal(t.todense(), a)
    assert t.origin is None
    q = tmp_path / "plain.mat"
    scipy.io.savemat(q, {"M": a, "label": "x"})
    np.testing.assert_array_equal(io.read_mat(q).todense(), a)
    r = tmp_path / "two.mat"
    scipy.io.savemat(r, {"M": a, "N": a})
    with pytest.raises(ValueError, match="key"):
        io.read_mat(r)
    np.testing.assert_array_equal(io.read_mat(r, key="N").todense(), a)


def test_npz_and_unknown_suffix(tmp_path, rng):
    a = random_array(rng, (3, 3))
    p = tmp_path / "m.npz"
    sp.save_npz(p, sp.csr_array(a))
    np.testing.assert_array_equal(io.read(p).todense(), a)
    with pytest.raises(ValueError, match="suffix"):
        io.read(tmp_path / "m.csv")


# --------------------------------------------------------------------------- built-ins
BUILTIN = {"karate": ((34, 34), 156), "GD97_b": ((47, 47), 264), "west0479": ((479, 479), 1910),
           "1138_bus": ((1138, 1138), 4054), "nations": ((14, 55, 14), 1992)}


def test_builtin_names():
    assert io.builtin_names() == sorted(BUILTIN)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_load_builtin(name):
    shape, nnz = BUILTIN[name]
    t = io.load_builtin(name)
    assert t.shape == shape and t.nnz == nnz
    assert t.format.name == ("csf" if len(shape) == 3 else "csr")
    if name in ("karate", "GD97_b", "1138_bus"):  # symmetric files are expanded
        d = t.todense()
        np.testing.assert_array_equal(d, d.T)


def test_load_builtin_unknown():
    with pytest.raises(ValueError, match="karate"):
        io.load_builtin("nope")


# --------------------------------------------------------------------------- real data (optional)
def test_shared_data_matches_scipy(shared_data):
    files = sorted((shared_data / "matrices").glob("*.mtx"))[:6] + sorted((shared_data / "tensors").glob("*.tns"))
    assert files
    for f in files:
        t = io.read(f)
        if f.suffix == ".mtx":
            ref = sp.csr_array(scipy.io.mmread(f))
            ref.sum_duplicates()
            assert t.shape == ref.shape and t.nnz == ref.nnz
            assert abs(t.to_scipy() - ref).max() == 0
        else:
            raw = np.loadtxt(f, comments="#", ndmin=2)
            assert t.nnz == len(raw)  # the MANIFEST says: no duplicates
            np.testing.assert_array_equal(t.values.sum(), raw[:, -1].sum())
