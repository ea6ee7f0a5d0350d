"""einsum subscripts → program, checked against numpy.einsum through the oracle."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spfuse.errors import ProgramError
from spfuse.frontend.canonical import to_text
from spfuse.frontend.einsum import einsum_to_program
from spfuse.testing import dense_reference

SUBSCRIPTS = [
    ("ij,j->i", [(3, 4), (4,)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),               # implicit output
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ij,ij->", [(3, 4), (3, 4)]),             # scalar output
    ("ij,ij", [(3, 4), (3, 4)]),
    ("ii->i", [(4, 4)]),                       # diagonal
    ("ii", [(4, 4)]),                          # trace
    ("iij->ij", [(3, 3, 2)]),
    ("iji->j", [(3, 2, 3)]),
    ("ij->ji", [(3, 4)]),
    ("ij", [(3, 4)]),
    ("ji", [(3, 4)]),                          # implicit output is sorted: transpose
    ("ij->", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),                 # outer product
    ("i,j", [(3,), (4,)]),
    ("ijk,jr,kr->ir", [(3, 4, 5), (4, 2), (5, 2)]),   # MTTKRP
    ("ij,ik,jk->ij", [(3, 4), (3, 5), (4, 5)]),       # SDDMM
    ("bA", [(3, 4)]),                          # uppercase sorts first
    ("Ab,bc->Ac", [(2, 3), (3, 4)]),
    ("ij,,j->i", [(3, 4), (), (4,)]),           # 0-d operand
    ("->", [()]),
    (" i j , j k -> i k ", [(3, 4), (4, 5)]),   # spaces ignored
    ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("ab,cd->abcd", [(2, 1), (0, 3)]),           # zero-size dimension
    ("ij,jk->ik", [(3, 0), (0, 5)]),           # empty contraction = zeros
]


def _operands(rng, shapes):
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("subscripts,shapes", SUBSCRIPTS, ids=[s for s, _ in SUBSCRIPTS])
def test_einsum_matches_numpy(subscripts, shapes, rng):
    ops = _operands(rng, shapes)
    program, names = einsum_to_program(subscripts, [len(s) for s in shapes])
    assert names == [f"T{n}" for n in range(len(shapes))]
    assert program.results == ("out",)
    got = dense_reference(program, dict(zip(names, ops, strict=True)))
    want = np.einsum(subscripts, *ops)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_generated_text():
    p, _ = einsum_to_program("ij,jk->ik", [2, 2])
    assert to_text(p) == "out[i, k] = sum(j, T0[i, j] * T1[j, k])"
    p, _ = einsum_to_program("ij,ij->", [2, 2])
    assert to_text(p) == "out = sum(i, j, T0[i, j] * T1[i, j])"
    p, _ = einsum_to_program(",i->i", [0, 1])
    assert to_text(p) == "out[i] = T0 * T1[i]"


@st.composite
def einsum_cases(draw):
    labels = "abcdeAB"
    n_ops = draw(st.integers(1, 3))
    extent = {c: draw(st.integers(1, 3)) for c in labels}
    terms = [draw(st.lists(st.sampled_from(labels), max_size=3)) for _ in range(n_ops)]
    used = sorted({c for t in terms for c in t})
    if draw(st.booleans()):
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        subscripts = ",".join("".join(t) for t in terms) + "->" + "".join(out)
    else:
        subscripts = ",".join("".join(t) for t in terms)
    shapes = [tuple(extent[c] for c in t) for t in terms]
    return subscripts, shapes, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(einsum_cases())
def test_random_einsum_matches_numpy(case):
    subscripts, shapes, seed = case
    ops = _operands(np.random.default_rng(seed), shapes)
    program, names = einsum_to_program(subscripts, [len(s) for s in shapes])
    got = dense_reference(program, dict(zip(names, ops, strict=True)))
    want = np.einsum(subscripts, *ops)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


ERRORS = [
    ("ij,j->i", [2], "fewer operands provided to einstein sum function than specified", ",j"),
    ("ij->i", [2, 1], "more operands provided to einstein sum function than specified", "->i"),
    ("ij,j->k", [2, 1], "output subscript 'k' which never appeared in an input", "k"),
    ("ij,j->ii", [2, 1], "includes output subscript 'i' multiple times", "i", 2),
    ("ij,jk->ik", [2, 3], "operand has more dimensions than subscripts given", "jk"),
    ("ij,jk->ik", [2, 1], "contains too many subscripts for operand 1", "jk"),
    # caret where the empty term starts
    ("i,,j->ij", [1, 1, 1], "operand has more dimensions than subscripts given", ",j"),
    ("i1,j->ij", [2, 1], "invalid subscript '1' in einstein sum subscripts string", "1"),
    ("ij,j->i->i", [2, 1], "more than one '->'", "-", 1),
    ("ij,j->i!", [2, 1], "invalid subscript '!'", "!"),
    ("ij", [], "at least one operand", "ij"),
    ("i..,j", [2, 1], "a '.' that is not part of an ellipsis ('...') in operand 0", "."),
    ("i......,j", [2, 1], "more than one ellipsis ('...') in operand 0", "...", 1),
    ("...i,j->i", [2, 1], "output has more dimensions than subscripts given", "i", 1),
    ("i,j->..i", [1, 1], "not part of an ellipsis ('...') in the output", "."),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_einsum_errors(case):
    subscripts, ndims, message, at, *occ = case
    with pytest.raises(ProgramError, match=re.escape(message)) as e:
        einsum_to_program(subscripts, ndims)
    positions = [m.start() for m in re.finditer(re.escape(at), subscripts)]
    pos = positions[occ[0] if occ else 0]
    assert e.value.position == pos
    assert str(e.value).splitlines()[-2] == "  " + subscripts
    assert str(e.value).splitlines()[-1] == "  " + " " * pos + "^"
