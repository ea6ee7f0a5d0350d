"""spfuse.einsum takes numpy.einsum's calls and gives numpy's answers (oracle: numpy.einsum)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.errors import ProgramError, UnsupportedError


def _dense(x):
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def _check(got, want, rtol=1e-12):
    got = _dense(got)
    assert got.shape == np.shape(want)
    assert got.dtype == np.asarray(want).dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


CASES = [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),          # ellipsis of different lengths
    ("...ij,...jk", [(1, 3, 4), (2, 4, 5)]),               # size-1 broadcast inside '...', implicit output
    ("i...->...", [(3, 2, 2)]),
    ("...i,...i", [(2, 3), (3,)]),
    ("ij...,j...->i...", [(2, 2, 1), (2, 1)]),
    ("ij,j->i", [(2, 3), (1,)]),                           # size-1 broadcast of a letter
    ("ij,j->ij", [(2, 1), (3,)]),
    ("ijp,ipq,ikq->ijk", [(3, 1, 1), (3, 1, 3), (1, 3, 3)]),
    ("cacc,bcb->", [(1, 1, 1, 1), (1, 4, 1)]),
    ("ii...->...i", [(3, 3, 2)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("i...i->...i", [(3, 2, 3)]),
    ("...", [(2, 3)]),
    ("..., ...", [(2, 3), (2, 3)]),
]


@pytest.mark.parametrize("subscripts,shapes", CASES, ids=[c[0] + str(c[1]) for c in CASES])
def test_ellipsis_and_broadcasting(subscripts, shapes, rng):
    ops = [rng.standard_normal(s) for s in shapes]
    _check(spfuse.einsum(subscripts, *ops), np.einsum(subscripts, *ops))


@pytest.mark.parametrize("subscripts,shapes", CASES, ids=[c[0] + str(c[1]) for c in CASES])
def test_ellipsis_and_broadcasting_csr(subscripts, shapes, rng):
    ops = [rng.standard_normal(s) * (rng.random(s) < 0.5) for s in shapes]
    given_ops = [sp.csr_array(o) if o.ndim == 2 else o for o in ops]
    _check(spfuse.einsum(subscripts, *given_ops), np.einsum(subscripts, *ops))


def test_interleaved_form(rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    _check(spfuse.einsum(a, [0, 1], b, [1, 2], [0, 2]), a @ b)
    _check(spfuse.einsum(a, [0, 1], b, [1, 2]), a @ b)                 # implicit output
    _check(spfuse.einsum(a, np.array([1, 0])), a.T)                   # sublist as an array
    x = rng.standard_normal((2, 2, 3))
    _check(spfuse.einsum(x, [Ellipsis, 0], [Ellipsis]), x.sum(-1))
    _check(spfuse.einsum(a, [0, 51], b, [51, 26], [0, 26]), a @ b)    # 51 -> 'z', 26 -> 'a'


@pytest.mark.parametrize("call, exc, message", [
    (lambda: spfuse.einsum(), ValueError, "at least one operand"),
    (lambda: spfuse.einsum(""), ValueError, "at least one operand"),
    (lambda: spfuse.einsum(0, 0), TypeError, "must be a list or a tuple"),
    (lambda: spfuse.einsum(*(None,) * 63), TypeError, "must be a list or a tuple"),
    (lambda: spfuse.einsum("", 0, 0), ValueError, "more operands provided"),
    (lambda: spfuse.einsum(",", 0), ValueError, "fewer operands provided"),
    (lambda: spfuse.einsum("i", 0), ValueError, "too many subscripts for operand 0"),
    (lambda: spfuse.einsum("i..", [0, 0]), ValueError, "not part of an ellipsis"),
    (lambda: spfuse.einsum("i%...", [0, 0]), ValueError, "invalid subscript '%'"),
    (lambda: spfuse.einsum("i->ij", [0, 0]), ValueError, "never appeared in an input"),
    (lambda: spfuse.einsum("ij->jij", [[0, 0], [0, 0]]), ValueError, "multiple times"),
    (lambda: spfuse.einsum("ii", np.ones((2, 3))), ValueError, "collapsing index 'i' don't match (2 != 3)"),
    (lambda: spfuse.einsum("aabcb,abc", np.ones((3, 3, 4, 5, 6)), np.ones((3, 4, 5))), ValueError, "'b'"),
    (lambda: spfuse.einsum("i,i", np.ones(2), np.ones(3)), ValueError, "could not be broadcast together"),
    (lambda: spfuse.einsum("i", np.ones((2, 3))), ValueError, "operand has more dimensions"),
    (lambda: spfuse.einsum("...i->", np.ones((2, 3))), ValueError, "output has more dimensions"),
    (lambda: spfuse.einsum(np.ones(2), [0, 52]), ValueError, "not within the valid range [0, 52)"),
    (lambda: spfuse.einsum(np.ones(2), ["a"]), TypeError, "integer or an ellipsis"),
    (lambda: spfuse.einsum("", 0, out="test"), TypeError, "out must be an array"),
    (lambda: spfuse.einsum("", 0, order="W"), ValueError, "order must be one of"),
    (lambda: spfuse.einsum("", 0, casting="blah"), ValueError, "casting must be one of"),
    (lambda: spfuse.einsum("", 0, dtype="bad_data_type"), TypeError, "not understood"),
    (lambda: spfuse.einsum("", 0, bad_arg=0), TypeError, "bad_arg"),
    (lambda: spfuse.einsum("i->", np.ones(3), dtype="f4"), TypeError, "according to the rule 'safe'"),
    (lambda: spfuse.einsum("i->", np.ones(3), out=np.empty((), "f4")), TypeError, "rule 'safe'"),
    (lambda: spfuse.einsum("i->", np.ones(3), out=np.empty(1)), ValueError, "correct number of dimensions"),
    (lambda: spfuse.einsum("i->i", np.ones(3), out=np.empty(2)), ValueError, "has shape (2,)"),
])
def test_errors_like_numpy(call, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        call()


def test_program_errors_show_a_caret():
    with pytest.raises(ProgramError) as e:
        spfuse.einsum("ij,jk->iz", np.ones((2, 2)), np.ones((2, 2)))
    assert str(e.value).splitlines()[-2:] == ["  ij,jk->iz", "          ^"]


def test_out_dtype_casting(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    out = np.empty(3)
    assert spfuse.einsum("ij,j", a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b)
    out32 = np.empty(3, np.float32)
    spfuse.einsum("ij,j", a, b, out=out32, dtype="f8", casting="unsafe")
    np.testing.assert_allclose(out32, (a @ b).astype(np.float32), rtol=1e-6)
    r = spfuse.einsum("ij,j", a.astype(np.float32), b.astype(np.float32), dtype="f8")
    assert r.dtype == np.float64
    r = spfuse.einsum("ij,j", a, b, dtype="f4", casting="same_kind")
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, np.einsum("ij,j", a, b, dtype="f4", casting="same_kind"), rtol=1e-5)
    with pytest.raises(TypeError):
        spfuse.einsum("i,i", a[0].astype(np.float32), b, casting="no")
    # a 0-d out receives the scalar; without out a numpy scalar comes back, as numpy's does
    out0 = np.empty(())
    assert spfuse.einsum("i,i->", b, b, out=out0) is out0
    assert isinstance(spfuse.einsum("i,i->", b, b), np.float64)
    # optimize is accepted in every form numpy accepts
    for opt in (True, False, "greedy", "optimal", ["einsum_path", (0, 1)]):
        np.testing.assert_allclose(spfuse.einsum("ij,j", a, b, optimize=opt), a @ b)


def test_order(rng):
    a, b = np.asfortranarray(np.ones((2, 3, 5))), np.asfortranarray(np.ones((4, 3)))
    assert spfuse.einsum("...ft,mf->...mt", a, b, order="F").flags.f_contiguous
    assert spfuse.einsum("...ft,mf->...mt", a, b, order="c").flags.c_contiguous
    assert spfuse.einsum("...ft,mf->...mt", a, b, order="A").flags.f_contiguous
    assert spfuse.einsum("...ft,mf->...mt", a, np.ones((4, 3)), order="a").flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.bool_])
def test_integer_and_bool_exact(dtype, rng):
    a = rng.integers(0, 2 if dtype is np.bool_ else 100, (5, 6)).astype(dtype)
    b = rng.integers(0, 2 if dtype is np.bool_ else 100, (6, 3)).astype(dtype)
    want = np.einsum("ij,jk", a, b)      # int8/uint8 wrap around: spfuse wraps the same way
    for ops in ((a, b), (sp.csr_array(a), b)):
        got = _dense(spfuse.einsum("ij,jk", *ops))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_integers_that_float64_cannot_hold_are_refused():
    a = np.full(4, 2 ** 40, dtype=np.int64)
    with pytest.raises(UnsupportedError, match="2\\*\\*53"):
        spfuse.einsum("i,i", a, a)


def test_object_dtype_is_refused():
    with pytest.raises(UnsupportedError, match="object values are not supported"):
        spfuse.einsum("i,i", np.ones(3, object), np.ones(3, object))


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_long_double_answered_only_when_float64_is_exact(dtype):
    a = np.arange(-3, 5).astype(dtype) * (1 + (1j if np.dtype(dtype).kind == "c" else 0))
    got = spfuse.einsum("i,i", a, a)
    assert got.dtype == np.dtype(dtype) and got == np.einsum("i,i", a, a)
    with pytest.raises(UnsupportedError, match="not all integers.*lower-precision"):
        spfuse.einsum("i,i", a / 3, a)
    with pytest.raises(UnsupportedError, match="2\\*\\*53"):
        spfuse.einsum("i,i", a * 2 ** 30, a * 2 ** 30)


def test_complex_einsum_dtype_out_and_casting():
    a = np.arange(6.0).reshape(2, 3) * (1 - 2j)
    b = np.arange(3.0)
    got = spfuse.einsum("ij,j->i", a, b, dtype=np.complex64, casting="same_kind")
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, np.einsum("ij,j->i", a, b), rtol=1e-6)
    out = np.empty(2, np.complex128)
    assert spfuse.einsum("ij,j->i", a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b)
    with pytest.raises(TypeError, match="could not be cast"):
        spfuse.einsum("ij,j->i", a, b, out=np.empty(2))  # complex into float under 'safe'
    with pytest.raises(TypeError, match="could not be cast"):
        spfuse.einsum("ij,j->i", a, b, dtype=np.float64)


def test_float16_computed_in_float32():
    a = np.linspace(0, 1, 7).astype(np.float16)
    got = spfuse.einsum("i,i", a, a)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.einsum("i,i", a, a), rtol=2e-3)


def test_inputs_not_modified(rng):
    a = rng.standard_normal((3, 1))
    csr = sp.csr_array(rng.standard_normal((3, 3)))
    a0, data0 = a.copy(), csr.data.copy()
    spfuse.einsum("ij,jk->ik", a, np.ones((4, 2)))
    spfuse.einsum("ij,jk->ik", csr, a)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(csr.data, data0)


@st.composite
def broadcast_cases(draw):
    """Random einsums with ellipses, size-1 broadcasting, diagonals and implicit or explicit outputs."""
    labels = "abcdA"
    extent = {c: draw(st.integers(1, 3)) for c in labels}
    nb = draw(st.integers(0, 2))
    batch = [draw(st.integers(1, 3)) for _ in range(nb)]
    terms, shapes = [], []
    for _ in range(draw(st.integers(1, 3))):
        term = draw(st.lists(st.sampled_from(labels), max_size=3))
        shape = [1 if draw(st.integers(0, 4)) == 0 else extent[c] for c in term]
        # a diagonal needs one extent per label on the operand
        first = {}
        shape = [first.setdefault(c, s) for c, s in zip(term, shape, strict=True)]
        if nb and draw(st.booleans()):
            k = draw(st.integers(0, nb))
            pos = draw(st.integers(0, len(term)))
            bshape = [1 if draw(st.integers(0, 3)) == 0 else e for e in batch[nb - k:]]
            shape = shape[:pos] + bshape + shape[pos:]
            term = term[:pos] + ["..."] + term[pos:]
        terms.append("".join(term))
        shapes.append(tuple(shape))
    subscripts = ",".join(terms)
    used = sorted({c for t in terms for c in t if c.isalpha()})
    if draw(st.booleans()):
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        ell = "..." if any("..." in t for t in terms) else ""
        at = draw(st.integers(0, len(out)))
        subscripts += "->" + "".join(out[:at]) + ell + "".join(out[at:])
    return subscripts, shapes, draw(st.integers(0, 2 ** 32 - 1)), draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(broadcast_cases())
def test_random_broadcasting_einsums_match_numpy(case):
    subscripts, shapes, seed, as_csr = case
    r = np.random.default_rng(seed)
    ops = [r.standard_normal(s) * (r.random(s) < 0.6) for s in shapes]
    try:
        want = np.einsum(subscripts, *ops)
    except ValueError:
        with pytest.raises(ValueError):
            spfuse.einsum(subscripts, *ops)
        return
    given_ops = [sp.csr_array(o) if as_csr and o.ndim == 2 else o for o in ops]
    _check(spfuse.einsum(subscripts, *given_ops), want, rtol=1e-10)
