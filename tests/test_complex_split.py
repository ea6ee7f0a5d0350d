"""The complex-lowering pass alone: program in, program out (no execution).

Each case is (program, complex inputs, expected real program text).  A
reference check then evaluates the rewritten program with a tiny dense
interpreter of the AST on random values, against the original program
evaluated in complex numpy arithmetic.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import Access, Assignment, Binary, Literal, Program, Reduce
from spfuse.frontend.parser import parse_program
from spfuse.passes.complex_split import NeedsExtents, expand_terms, split_complex
from spfuse.testing import dense_reference

CASES = [
    ("y[i] = A[i,j] * x[j]", {"A", "x"},
     "y__re[i] = sum(j, A__re[i, j] * x__re[j] - A__im[i, j] * x__im[j])\n"
     "y__im[i] = sum(j, A__re[i, j] * x__im[j] + A__im[i, j] * x__re[j])"),
    # a real factor: two products, not four
    ("y[i] = A[i,j] * x[j]", {"A"},
     "y__re[i] = sum(j, A__re[i, j] * x[j])\ny__im[i] = sum(j, A__im[i, j] * x[j])"),
    # nothing complex: the program as it was
    ("y[i] = A[i,j] * x[j]", set(), "y[i] = sum(j, A[i, j] * x[j])"),
    ("C[i,j] = A[i,j] + B[i,j] - D[i,j]", {"A", "D"},
     "C__re[i, j] = A__re[i, j] + B[i, j] - D__re[i, j]\nC__im[i, j] = A__im[i, j] - D__im[i, j]"),
    ("y[i] = -x[i]", {"x"}, "y__re[i] = -x__re[i]\ny__im[i] = -x__im[i]"),
    ("y[i] = abs(x[i])", {"x"}, "y[i] = sqrt(x__re[i] * x__re[i] + x__im[i] * x__im[i])"),
    ("y[i] = x[i] / s", {"x"}, "y__re[i] = x__re[i] / s\ny__im[i] = x__im[i] / s"),
    # GNN-1: the inner reduction is bound once (two statements), then read twice per part
    ("Z[i,j] = A[i,k] * X[k,h] * W[h,j]", {"A", "X", "W"},
     "_cx0__re[i, h] = sum(k, A__re[i, k] * X__re[k, h] - A__im[i, k] * X__im[k, h])\n"
     "_cx0__im[i, h] = sum(k, A__re[i, k] * X__im[k, h] + A__im[i, k] * X__re[k, h])\n"
     "Z__re[i, j] = sum(h, _cx0__re[i, h] * W__re[h, j] - _cx0__im[i, h] * W__im[h, j])\n"
     "Z__im[i, j] = sum(h, _cx0__re[i, h] * W__im[h, j] + _cx0__im[i, h] * W__re[h, j])"),
    ("y[i] = where(m[i], x[i], 0)", {"x"},
     "y__re[i] = where(m[i], x__re[i], 0.0)\ny__im[i] = where(m[i], x__im[i], 0.0)"),
    # a real temporary stays real; a later complex statement reads it as is
    ("t[i] = relu(r[i])\ny[i] = t[i] * x[i]", {"x"},
     "t[i] = relu(r[i])\ny__re[i] = t[i] * x__re[i]\ny__im[i] = t[i] * x__im[i]"),
]


@pytest.mark.parametrize("text, complex_inputs, expected", CASES)
def test_split_program_text(text, complex_inputs, expected):
    split = split_complex(parse_program(text), complex_inputs)
    assert split.program.text == expected
    assert split.program == parse_program(expected)  # structurally, not only as text


def test_inputs_and_results_are_named():
    split = split_complex(parse_program("t[i] = A[i,j] * x[j]\ny[i] = t[i] + x[i]\nz[i] = abs(t[i])"), {"A", "x"})
    assert dict(split.inputs) == {"A": ("A__re", "A__im"), "x": ("x__re", "x__im")}
    assert dict(split.results) == {"y": ("y__re", "y__im"), "z": ("z", None)}
    assert split.complex_results == {"y"}
    assert set(split.program.results) == {"y__re", "y__im", "z"}


def test_names_never_collide_with_the_programs_own():
    split = split_complex(parse_program("y[i] = A[i] * A__re[i]"), {"A"})
    assert split.inputs["A"] == ("A___re", "A___im")
    assert "A__re" in split.program.inputs  # the user's real operand, read as it is


def test_pure_imaginary_literal_has_no_real_statement():
    program = Program((Assignment(Access("y", ("i",)), Binary("*", Literal(2j), Access("x", ("i",)))),))
    split = split_complex(program, set())
    assert dict(split.results) == {"y": (None, "y__im")}
    assert split.program.text == "y__im[i] = 2.0 * x[i]"


@pytest.mark.parametrize("k", range(2, 9))
def test_product_chains_grow_linearly(k):
    """k complex factors: 4 products per pairwise step, not 2**k copies of the chain."""
    factors = " * ".join(f"A{n}[i,j]" for n in range(k))
    split = split_complex(parse_program(f"y[i,j] = {factors}"), {f"A{n}" for n in range(k)})
    products = split.program.text.count("*")
    assert products == 4 * (k - 1)


def test_reduction_chain_binds_each_reduction_once():
    text = "y[i] = A[i,j] * B[j,k] * C[k,l] * D[l,m] * x[m]"
    split = split_complex(parse_program(text), {"A", "B", "C", "D", "x"})
    assert len(split.program.statements) == 2 * 4
    assert split.program.text.count("*") == 4 * 4


@pytest.mark.parametrize("text, what", [
    ("y[i] = exp(x[i])", "exp()"), ("y[i] = relu(x[i])", "relu()"), ("y[i] = log(x[i])", "log()"),
    ("y[i] = sqrt(x[i])", "sqrt()"), ("y[i] = max(j, A[i,j])", "max() reduction"),
    ("y[i] = min(j, A[i,j])", "min() reduction"), ("y[i] = where(x[i], 1, 2)", "where() condition"),
    ("y[i] = sigmoid(A[i,j] * x[j])", "sigmoid()"),
])
def test_nonlinear_functions_of_complex_values_are_refused(text, what):
    program = parse_program(text)
    pattern = what.replace("(", "[(]").replace(")", "[)]")
    with pytest.raises(UnsupportedError, match=rf"^{pattern} of a complex64 value"):
        split_complex(program, set(program.inputs), "complex64")


def test_nonlinear_functions_of_real_values_in_a_complex_program_are_kept():
    split = split_complex(parse_program("y[i] = exp(r[i]) * x[i]"), {"x"})
    # computed once (bound), read by both parts
    assert split.program.text == "_cx0[i] = exp(r[i])\ny__re[i] = _cx0[i] * x__re[i]\ny__im[i] = _cx0[i] * x__im[i]"


def test_unknown_complex_input_is_an_error():
    with pytest.raises(ValueError, match="not inputs"):
        split_complex(parse_program("y[i] = x[i]"), {"q"})


def test_pure_function():
    program = parse_program("Z[i,j] = A[i,k] * X[k,h] * W[h,j]")
    assert split_complex(program, {"A", "W"}) == split_complex(program, {"W", "A"})


# -- semantics: the rewritten program, evaluated by the reference interpreter, equals complex numpy --------

SEMANTIC = [
    ("y[i] = A[i,j] * x[j]", {"A": (4, 3), "x": (3,)}),
    ("Z[i,j] = A[i,k] * X[k,h] * W[h,j]", {"A": (3, 4), "X": (4, 2), "W": (2, 3)}),
    ("S[i,j] = B[i,j] * (C[i,k] * D[k,j])", {"B": (3, 3), "C": (3, 2), "D": (2, 3)}),
    ("S[i,j] = B[i,j] / (C[i,k] * D[k,j])", {"B": (3, 3), "C": (3, 2), "D": (2, 3)}),
    ("y[i] = abs(x[i]) * x[i] - 2 * x[i] / r[i]", {"x": (5,), "r": (5,)}),
    ("y[i] = A[i,j] * A[i,j] * A[i,j] * A[i,j] * x[j]", {"A": (3, 4), "x": (4,)}),
    ("t[i,j] = A[i,j] - B[i,j]\ny[i] = t[i,j] * x[j]\nz[j] = t[i,j] * t[i,j]",
     {"A": (3, 2), "B": (3, 2), "x": (2,)}),
]


def _all_results(program, values):
    """Every result of ``program`` on dense ``values`` (complex arithmetic when they are complex)."""
    out = dense_reference(program, values)
    return out if isinstance(out, dict) else {program.results[0]: out}


@pytest.mark.parametrize("text, shapes", SEMANTIC)
def test_split_program_computes_the_complex_program(text, shapes, rng):
    program = parse_program(text)
    real_names = {"r"}
    values = {n: rng.standard_normal(s) + (0 if n in real_names else 1j * rng.standard_normal(s))
              for n, s in shapes.items()}
    values = {n: v + 3 if n == "r" else v for n, v in values.items()}
    split = split_complex(program, set(shapes) - real_names)
    real_values = {}
    for name, v in values.items():
        if name in split.inputs:
            re_name, im_name = split.inputs[name]
            real_values[re_name], real_values[im_name] = v.real.copy(), v.imag.copy()
        else:
            real_values[name] = v
    got = _all_results(split.program, real_values)
    want = _all_results(program, values)
    for name, (re_name, im_name) in split.results.items():
        value = (got[re_name] if re_name else 0) + (1j * got[im_name] if im_name else 0)
        np.testing.assert_allclose(value, want[name], rtol=1e-12, atol=1e-12)


def test_reduction_node_shape(rng):
    split = split_complex(parse_program("y = sum(i, x[i])"), {"x"})
    assert split.program.statements[0].value == Reduce("sum", "i", Access("x__re", ("i",)))


def test_sum_whose_imaginary_part_does_not_use_the_index_needs_extents():
    program = parse_program("R[i] = sum(m, E[i] + F[i,m])")
    with pytest.raises(NeedsExtents):
        split_complex(program, {"E"})
    split = split_complex(program, {"E"}, extents=[{"i": 3, "m": 4}])
    assert split.program.text == "R__re[i] = sum(m, E__re[i] + F[i, m])\nR__im[i] = 4.0 * E__im[i]"


def test_part_without_some_target_indices_is_stored_without_them():
    split = split_complex(parse_program("R[j,k] = sum(i, E[i] - F[j,i]) + G[k]\nQ[j] = R[j,k] * G[k]"), {"E"})
    assert "R__im = sum(i, E__im[i])" in split.program.text
    assert "Q__im = sum(k, R__im * G[k])" in split.program.text
    assert split.kept == {"Q__im": ()}  # only results are listed: Q's imaginary part is constant along j
    split = split_complex(parse_program("R[j] = E[i] - F[j,i]"), {"E"})
    assert dict(split.results) == {"R": ("R__re", "R__im")} and split.kept == {"R__im": ()}


# -- term expansion: one statement as signed sums of real one-statement programs -----------------------------

def _expansion_text(e):
    return [(c, p.text) for c, p in e.real], [(c, p.text) for c, p in e.imag]


def test_expansion_of_spmv():
    real, imag = _expansion_text(expand_terms(parse_program("y[i] = A[i,j] * x[j]"), {"A", "x"}))
    assert real == [(1.0, "y__re0[i] = sum(j, A__re[i, j] * x__re[j])"),
                    (-1.0, "y__re1[i] = sum(j, A__im[i, j] * x__im[j])")]
    assert imag == [(1.0, "y__im0[i] = sum(j, A__re[i, j] * x__im[j])"),
                    (1.0, "y__im1[i] = sum(j, A__im[i, j] * x__re[j])")]


def test_expansion_keeps_the_statement_shape():
    """SDDMM: every term is a real SDDMM (the template kernel's shape): 2**3 terms for 3 complex factors."""
    e = expand_terms(parse_program("A[i,j] = B[i,j] * (C[i,k] * D[k,j])"), {"B", "C", "D"})
    assert len(e.real) == len(e.imag) == 4
    for _, p in e.real + e.imag:
        assert re.fullmatch(r"A__(re|im)\d\[i, j\] = B__(re|im)\[i, j\] \* sum\(k, C__(re|im)\[i, k\] \* "
                            r"D__(re|im)\[k, j\]\)", p.text), p.text
    # a real factor halves the terms
    assert len(expand_terms(parse_program("A[i,j] = B[i,j] * (C[i,k] * D[k,j])"), {"C", "D"}).real) == 2


def test_expansion_refuses_many_terms_and_several_statements():
    five = parse_program("y[i,j] = A[i,j] * B[i,j] * C[i,j] * D[i,j] * E[i,j]")
    assert expand_terms(five, set(five.inputs)) is None  # 32 terms > 16: split_complex instead
    assert expand_terms(five, set(five.inputs), max_terms=32) is not None
    assert expand_terms(parse_program("t[i] = x[i]\ny[i] = t[i]"), {"x"}) is None


def test_expansion_of_real_parts_and_constants():
    real, imag = _expansion_text(expand_terms(parse_program("y[i] = abs(x[i]) * r[i]"), {"x"}))
    assert real == [(1.0, "y__re0[i] = sqrt(x__re[i] * x__re[i] + x__im[i] * x__im[i]) * r[i]")] and imag == []
    program = Program((Assignment(Access("y", ("i",)), Binary("*", Literal(2 - 3j), Access("x", ("i",)))),))
    real, imag = _expansion_text(expand_terms(program, {"x"}))
    # (2 - 3j)(a + bi) = (2a - (-3)b) + (2b + (-3)a)i
    assert real == [(1.0, "y__re0[i] = 2.0 * x__re[i]"), (-1.0, "y__re1[i] = (-3.0) * x__im[i]")]
    assert imag == [(1.0, "y__im0[i] = 2.0 * x__im[i]"), (1.0, "y__im1[i] = (-3.0) * x__re[i]")]


def test_expansion_refuses_nonlinear_functions():
    with pytest.raises(UnsupportedError, match=r"^exp\(\) of a complex128 value"):
        expand_terms(parse_program("y[i] = exp(x[i])"), {"x"}, "complex128")


@pytest.mark.parametrize("text, shapes", SEMANTIC[:6])
def test_expansion_computes_the_complex_program(text, shapes, rng):
    program = parse_program(text)
    if len(program.statements) != 1:
        pytest.skip("one statement only")
    values = {n: rng.standard_normal(s) + (0 if n == "r" else 1j * rng.standard_normal(s)) for n, s in shapes.items()}
    values = {n: v + 3 if n == "r" else v for n, v in values.items()}
    expansion = expand_terms(program, set(shapes) - {"r"}, max_terms=64)
    real_values = dict(values)
    for name in set(shapes) - {"r"}:
        real_values[f"{name}__re"], real_values[f"{name}__im"] = values[name].real.copy(), values[name].imag.copy()
    got = 0
    for unit, terms in ((1, expansion.real), (1j, expansion.imag)):
        for coef, p in terms:
            got = got + unit * coef * dense_reference(p, {n: real_values[n] for n in p.inputs})
    np.testing.assert_allclose(got, dense_reference(program, values), rtol=1e-12, atol=1e-12)
