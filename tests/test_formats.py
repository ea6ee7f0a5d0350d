"""Format model: named formats, names, mode orders, errors."""
from __future__ import annotations

import itertools

import pytest

from spfuse.formats import COMPRESSED, DENSE, FORMAT_NAMES, Format, as_format

D, C = DENSE, COMPRESSED

# (name, ndim) -> (levels, mode_order): the table of docs/TACO
NAMED = [
    ("dense", 0, (), ()),
    ("dense", 1, (D,), (0,)),
    ("dense", 3, (D, D, D), (0, 1, 2)),
    ("csr", 2, (D, C), (0, 1)),
    ("csc", 2, (D, C), (1, 0)),
    ("dcsr", 2, (C, C), (0, 1)),
    ("dcsc", 2, (C, C), (1, 0)),
    ("csf", 1, (C,), (0,)),
    ("csf", 3, (C, C, C), (0, 1, 2)),
    ("csf", 4, (C, C, C, C), (0, 1, 2, 3)),
]


@pytest.mark.parametrize("name, ndim, levels, order", NAMED)
def test_named_formats(name, ndim, levels, order):
    f = Format.named(name, ndim)
    assert f.levels == levels and f.mode_order == order
    assert f.ndim == ndim
    # the name round-trips (2-d csf is dcsr by definition)
    assert f.name == ("dcsr" if (name, ndim) == ("csf", 2) else name)
    assert Format.named(f.name, ndim) == f


def test_named_constructors_match_named():
    assert Format.csr() == Format.named("csr", 2)
    assert Format.csc() == Format.named("csc", 2)
    assert Format.dcsr() == Format.named("dcsr", 2)
    assert Format.dcsc() == Format.named("dcsc", 2)
    assert Format.dense(3) == Format.named("dense", 3)
    assert Format.csf(3) == Format.named("csf", 3)


def test_names_are_case_insensitive():
    assert Format.named("CSR", 2) == Format.csr()


@pytest.mark.parametrize("ndim, expected", [(1, "csf"), (2, "csr"), (3, "csf"), (4, "csf")])
def test_coo_is_input_only(ndim, expected):
    f = Format.named("coo", ndim)
    assert f.name == expected
    assert "coo" not in FORMAT_NAMES


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_csf_any_permutation(order):
    f = Format.csf(order)
    assert f.levels == (C, C, C) and f.mode_order == order
    assert f.name == ("csf" if order == (0, 1, 2) else "csf({})".format(",".join(map(str, order))))
    inv = f.inverse_order
    assert all(f.mode_order[inv[m]] == m for m in range(3))
    assert f.storage_shape((2, 3, 5)) == tuple((2, 3, 5)[m] for m in order)


def test_descriptive_names():
    assert Format((C, D)).name == "cd"
    assert Format((D, C, C), (0, 2, 1)).name == "dcc(0,2,1)"
    assert Format((D, D), (1, 0)).name == "dd(1,0)"
    assert str(Format.csc()) == "csc"


def test_formats_are_hashable_values():
    assert len({Format.csr(), Format.named("csr", 2), Format((D, C), (0, 1))}) == 1
    assert Format.csr() != Format.csc()
    with pytest.raises(AttributeError):
        Format.csr().levels = (D, D)  # frozen


def test_properties():
    assert Format.dense(2).is_dense and not Format.csr().is_dense
    assert Format(("dense", "dense"), (1, 0)).is_dense
    assert Format.csr().is_identity_order and not Format.csc().is_identity_order
    assert Format.csc().storage_shape((3, 7)) == (7, 3)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError) as info:
        Format.named("ell", 2)
    msg = str(info.value)
    for name in FORMAT_NAMES:
        assert repr(name) in msg


@pytest.mark.parametrize("name", ["csr", "csc", "dcsr", "dcsc"])
@pytest.mark.parametrize("ndim", [1, 3])
def test_matrix_formats_need_two_modes(name, ndim):
    with pytest.raises(ValueError, match="ndim == 2"):
        Format.named(name, ndim)


@pytest.mark.parametrize("levels, order", [
    (("dense", "sparse"), None),        # unknown level kind
    (("dense", "dense"), (0, 0)),       # not a permutation
    (("dense", "dense"), (0, 1, 2)),    # wrong length
    (("dense",), (1,)),                 # out of range
])
def test_invalid_formats(levels, order):
    with pytest.raises(ValueError):
        Format(levels, order)


def test_bad_ndim():
    with pytest.raises(ValueError):
        Format.named("dense", -1)
    with pytest.raises(ValueError):
        Format.dense(True)


def test_as_format():
    assert as_format(None, 2) == Format.dense(2)
    assert as_format(None, 2, default="csf") == Format.dcsr()
    assert as_format(Format.csc(), 2) is not None
    with pytest.raises(ValueError, match="levels"):
        as_format(Format.csc(), 3)
    with pytest.raises(TypeError):
        as_format(3, 2)
