"""Adjoint shapes that let statements reach template kernels: a recomputed
sub-reduction restricted to the sparse pattern it is multiplied by, and a
sum of reducing terms run one term per statement."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from spfuse.autodiff import adjoint
from spfuse.autodiff import run as adrun
from spfuse.frontend.parser import parse_program

pytest.importorskip("torch")
from test_autodiff import check_gradients  # noqa: E402

SDDMM_DIV = "A[i,j] = B[i,j] / (C[i,k] * D[k,j])"
GNN2 = "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]"


@pytest.fixture
def rng():
    return np.random.default_rng(11)


@pytest.fixture
def forced(monkeypatch):
    """Force the fused-or-split choice one way."""
    def force(split: bool):
        def measure(self, run, clock=None):
            self.split, self.seconds = split, {False: 0.0, True: 0.0}
            return run(split)
        monkeypatch.setattr(adrun.ExecutionChoice, "measure", measure)
        adrun._choices.clear()
    yield force
    adrun._choices.clear()


def _csr(rng, n, m, density, empty_rows=(0,)):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng)
    A = sp.lil_array(A)
    for r in empty_rows:
        A[r, :] = 0.0
    A = sp.csr_array(A)
    A.eliminate_zeros()
    A.sort_indices()
    return A


def test_recomputed_reductions_live_on_the_pattern_they_are_multiplied_by():
    lines = adjoint(SDDMM_DIV, wrt=("C", "D"), sparse=frozenset({"B"})).text.splitlines()
    assert lines[0] == "A_r[i, j] = B[i, j] / B[i, j] * sum(k, C[i, k] * D[k, j])"
    lines = adjoint(GNN2, wrt=("X", "Y"), sparse=frozenset({"A"})).text.splitlines()
    assert lines[0] == "Z_r[i, h] = A[i, h] / A[i, h] * sum(k, X[i, k] * Y[k, h])"
    # read next to A itself, not A_T: two sparse operands in one storage order
    grad_y = next(line for line in lines if line.startswith("grad_Y["))
    assert "(A[i, h] * Z_r[i, h])" in grad_y and "A_T[h, i] * Z_r" not in grad_y
    # a dense reduction factor without a sparse partner stays whole
    lines = adjoint("y[i] = relu(sum(k, C[i,k] * x[k])) * w[i]", wrt=("x",)).text.splitlines()
    assert lines[0].startswith("y_r[i] = sum(k")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("program", [SDDMM_DIV, GNN2])
def test_gradients_through_pattern_recomputation_match_torch(rng, forced, program, split):
    forced(split)
    if program == SDDMM_DIV:
        ops = {"B": _csr(rng, 30, 25, 0.2), "C": rng.random((30, 4)) + 0.5, "D": rng.random((4, 25)) + 0.5}
        wrt = ("B", "C", "D")
    else:
        ops = {"A": _csr(rng, 30, 30, 0.15), "X": rng.standard_normal((30, 3)),
               "Y": rng.standard_normal((3, 30))}
        wrt = ("A", "X", "Y")
    check_gradients(program, ops, rng, wrt=wrt)
    check_gradients(program, ops, rng, wrt=wrt[1:])


@pytest.mark.parametrize("text", [
    "y[i] = x[i] - sum(j, B[i,j] * x[j]) + 2.0 * x[i]",
    "y[i] = -sum(j, B[i,j] * x[j]) + x[i]",
    "Z[k,h] = sum(i, B[i,h] * X[i,k]) - sum(j, W[j,k] * V[j,h])",
    "Y[i,j] = sum(k, B[i,k] * W[k,j]) + c[j]",
    # terms whose indices appear in other orders, one contained in another
    "Z[k,h] = sum(i, B[i,h] * X[i,k]) + sum(i, W[i,k] * V[i,h])",
    "Z[k,h] = sum(i, B[i,h] * X[i,k]) + sum(j, V[j,h] * sum(i, W[i,k] * V[i,j])) + sum(i, W[i,k] * V[i,h])",
])
def test_a_sum_of_reducing_terms_runs_one_term_per_statement(rng, text):
    B = _csr(rng, 6, 6, 0.4)
    ops = {"B": B, "x": rng.standard_normal(6), "X": rng.standard_normal((6, 3)), "W": rng.standard_normal((6, 3)),
           "V": rng.standard_normal((6, 6)), "c": rng.standard_normal(3)}
    program = parse_program(text)
    ops = {n: ops[n] for n in program.inputs}
    statements = adrun._statements(program)
    assert len(statements) > 1 and statements[-1][0] == program.results[0]
    assert all("sum(" not in s[1] for s in statements[-1:])  # the last one only adds the terms
    split = adrun._run_split(program, ops, "auto", None)[program.results[0]]
    fused = adrun._run_fused(program, ops, "auto", None)[program.results[0]]
    np.testing.assert_allclose(np.asarray(split), np.asarray(fused), rtol=1e-12, atol=1e-12)
    Bd, x = B.toarray(), ops.get("x")
    want = {
        "y[i] = x[i] - sum(j, B[i,j] * x[j]) + 2.0 * x[i]": lambda: x - Bd @ x + 2.0 * x,
        "y[i] = -sum(j, B[i,j] * x[j]) + x[i]": lambda: -(Bd @ x) + x,
        "Z[k,h] = sum(i, B[i,h] * X[i,k]) - sum(j, W[j,k] * V[j,h])": lambda: ops["X"].T @ Bd - ops["W"].T @ ops["V"],
        "Y[i,j] = sum(k, B[i,k] * W[k,j]) + c[j]": lambda: Bd @ ops["W"] + ops["c"],
        "Z[k,h] = sum(i, B[i,h] * X[i,k]) + sum(i, W[i,k] * V[i,h])": lambda: ops["X"].T @ Bd + ops["W"].T @ ops["V"],
        "Z[k,h] = sum(i, B[i,h] * X[i,k]) + sum(j, V[j,h] * sum(i, W[i,k] * V[i,j])) + sum(i, W[i,k] * V[i,h])":
            lambda: ops["X"].T @ Bd + ops["W"].T @ ops["V"] @ ops["V"] + ops["W"].T @ ops["V"],
    }[text]()
    np.testing.assert_allclose(np.asarray(split), want, rtol=1e-12, atol=1e-12)


def test_the_terms_of_a_sum_share_one_layout():
    """Each term is stored with its indices in the first term's order, so the
    last statement adds arrays of one layout (no strided add)."""
    program = parse_program("Z[k,h] = sum(i, B[i,h] * X[i,k]) + sum(j, V[j,h] * sum(i, W[i,k] * V[i,j])) "
                            "+ sum(i, W[i,k] * V[i,h])")
    texts = [s[1] for s in adrun._statements(program)]
    assert texts == ["Z_term0[h, k] = sum(i, B[i, h] * X[i, k])",
                     "Z_term2[h, k] = sum(i, W[i, k] * V[i, h])",
                     "Z_term1[h, k] = sum(j, V[j, h] * Z_term2[j, k])",
                     "Z[k, h] = Z_term0[h, k] + Z_term1[h, k] + Z_term2[h, k]"], texts


def test_term_names_do_not_clash_with_the_program():
    program = parse_program("y_term1[i] = x[i] * 2.0; y[i] = y_term1[i] - sum(j, B[i,j] * x[j])")
    names = [s[0] for s in adrun._statements(program)]
    assert names.count("y_term1") == 1 and len(set(names)) == len(names)
