"""The adjoint's contraction order: not fixed by the forward's nesting.

A gradient through a forward partial product (GCN's ``A·H`` inside
``Z = A·H·W2``) is one contraction chain; a part several gradients share
(``Aᵀ·grad_Z``) is computed once, and the remaining order is the planner's
reassociation (cost model).  Costs are the planner's own estimates
(``report.estimate``, loop iterations) on GCN-shaped operand statistics;
gradients are checked against torch's dense autograd.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.autodiff import adjoint
from spfuse.autodiff.run import run_adjoint
from spfuse.examples.gcn import PROGRAM as GCN
from spfuse.frontend.ast import iter_accesses
from spfuse.frontend.parser import parse_program
from spfuse.ir.ops import TensorInfo
from spfuse.planner import plan_program
from spfuse.tensor import as_tensor
from spfuse.testing import densify

pytest.importorskip("torch")
from torch_oracle import torch_vjp  # noqa: E402

#: the GCN adjoint as the forward's nesting fixes it (spfuse a7660fb): it
#: contracts A·H (nnz·hidden) and A·X (nnz·features) again
NESTED_GCN_ADJOINT = """Z_r[i, h] = sum(j, A[i, j] * H[j, h])
H_r[i, f] = sum(j, A[i, j] * X[j, f])
grad_H[i, h] = sum(i_1, sum(c, grad_Z[i_1, c] * W2[h, c]) * A_T[i, i_1])
grad_W1[f, h] = sum(i, where(H[i, h], grad_H[i, h], 0.0) * H_r[i, f])
grad_W2[h, c] = sum(i, grad_Z[i, c] * Z_r[i, h])"""


def gcn_infos(nodes: int, nnz: int, features: int, hidden: int, classes: int) -> dict[str, TensorInfo]:
    """Operand statistics of every name a GCN adjoint statement may read."""
    csr = {n: TensorInfo(n, 2, ("dense", "compressed"), (0, 1), (nodes, nodes), nnz=nnz) for n in ("A", "A_T")}
    dense = {"X": (nodes, features), "W1": (features, hidden), "W2": (hidden, classes), "H": (nodes, hidden),
             "grad_Z": (nodes, classes), "grad_H": (nodes, hidden), "Z_r": (nodes, hidden),
             "H_r": (nodes, features), "grad_Z_c": (nodes, classes)}
    return {**csr, **{n: TensorInfo.dense(n, s) for n, s in dense.items()}}


def planned_cost(program_text: str, infos: dict[str, TensorInfo]) -> float:
    """Iterations the planner estimates for the program run statement by statement."""
    total = 0.0
    for line in program_text.splitlines():
        statement = parse_program(line)
        plan = plan_program(statement, {n: infos[n] for n in statement.inputs})
        assert plan.report.estimate is not None
        total += plan.report.estimate
    return total


def gcn_adjoint():
    return adjoint(GCN, ("W1", "W2"), sparse=("A",))


def test_gcn_adjoint_contracts_no_forward_partial_product_again():
    adj = gcn_adjoint()
    statements = {s.target.name: s for s in adj.program.statements}
    assert set(statements) == {"grad_H", "grad_W1", "grad_W2"}, adj.text   # Z_r = A·H and H_r = A·X are gone
    # grad_W2 is one chain grad_Z·A·H, written with Aᵀ·grad_Z (nnz·classes) first
    assert {a.name for a in iter_accesses(statements["grad_W2"].value)} == {"A_T", "grad_Z", "H"}
    assert "sum(i, A_T[j, i] * grad_Z[i, c])" in adj.text
    text = adj.describe()
    assert "multiplied out  sum(j, A[i, j] * H[j, h])" in text
    assert "multiplied out  sum(j, A[i, j] * X[j, f])" in text


def test_gcn_alternative_shares_the_transposed_product():
    """The alternative computes Aᵀ·grad_Z once for grad_H and grad_W2 (one
    statement more, nnz·classes less); it reads the same operands."""
    adj = gcn_adjoint()
    alt = adj.alternative
    assert alt is not None and alt.alternative is None
    shared = [s for s in alt.program.statements if {a.name for a in iter_accesses(s.value)} == {"A_T", "grad_Z"}]
    assert len(shared) == 1, alt.text
    name = shared[0].target.name
    readers = sorted(s.target.name for s in alt.program.statements if name in {a.name for a in iter_accesses(s.value)})
    assert readers == ["grad_H", "grad_W2"]
    assert alt.gradients == adj.gradients and alt.kept == adj.kept and set(alt.program.inputs) <= set(
        adj.program.inputs) | {"A_T"}
    text = adj.describe()
    assert "alternative (measured" in text and f"shared  {name}[j, c] = " in text


def test_no_alternative_without_a_multiplied_out_chain():
    assert adjoint("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", ("C", "D"), sparse=("B",)).alternative is None
    assert adjoint("A[i,l] = B[i,j,k] * C[j,l] * D[k,l]", ("C", "D"), sparse=("B",)).alternative is None


@pytest.mark.parametrize("shape", [(2000, 16_000, 32, 16, 8), (34, 156, 34, 16, 2), (5000, 50_000, 128, 64, 4)])
def test_gcn_adjoint_is_cheaper_than_the_nested_order(shape):
    """The planner's estimate of the whole adjoint (GCN-2000, karate and a
    wider model): below the order the forward's nesting fixed."""
    infos = gcn_infos(*shape)
    new, nested = planned_cost(gcn_adjoint().text, infos), planned_cost(NESTED_GCN_ADJOINT, infos)
    nodes, nnz, features, hidden, classes = shape
    assert new < nested
    # at least what Aᵀ·grad_Z saves over A·H in grad_W2 (nnz·classes in place of nnz·hidden)
    assert nested - new >= nnz * (hidden - classes)


@pytest.mark.parametrize("features, hidden, reassociated", [(4, 64, True), (64, 4, False)])
def test_grad_w1_order_is_the_planners_choice(features, hidden, reassociated):
    """``grad_W1 = Xᵀ·(Aᵀ·G)`` or ``(Aᵀ·X)ᵀ·G``: the planner's cost model
    picks the one with the narrower side against A's stored entries."""
    statement = parse_program(next(line for line in gcn_adjoint().text.splitlines() if line.startswith("grad_W1")))
    infos = gcn_infos(2000, 16_000, features, hidden, 8)
    plan = plan_program(statement, {n: infos[n] for n in statement.inputs})
    (association,) = plan.associations
    assert association.changed == reassociated, association.note
    assert association.chosen_cost <= association.written_cost
    if reassociated:   # A's entries met the 4 features, not the 64 hidden units
        assert association.chosen_cost < 16_000 * hidden


def gcn_operands(rng, nodes: int, features: int, hidden: int, classes: int, density: float = 0.2):
    a = sp.random_array((nodes, nodes), density=density, format="csr", rng=rng) + sp.eye_array(nodes, format="csr")
    return {"A": sp.csr_array(a), "X": rng.standard_normal((nodes, features)),
            "W1": rng.standard_normal((features, hidden)), "W2": rng.standard_normal((hidden, classes))}


@pytest.mark.parametrize("features, hidden, classes", [(12, 5, 2), (3, 9, 4), (6, 4, 10)])
@pytest.mark.parametrize("wrt", [("W1", "W2"), ("W1", "W2", "X")])
def test_gcn_gradients_match_torch(features, hidden, classes, wrt, rng):
    ops = gcn_operands(rng, 11, features, hidden, classes)
    program = parse_program(GCN)
    cot = rng.standard_normal((11, classes))
    _, expected = torch_vjp(program, {"Z": cot}, wrt, ops)
    adj = adjoint(program, wrt, sparse=("A",))
    tensors = {n: as_tensor(v, name=n) for n, v in ops.items()}
    assert adj.alternative is not None
    for variant in (adj, adj.alternative):   # both programs, both ways each runs
        for split in (False, True):
            got = run_adjoint(variant, tensors, {"Z": cot}, split=split)
            for name in wrt:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, atol=1e-10, err_msg=name)
    got = run_adjoint(adj, tensors, {"Z": cot})   # measured: the four ways, the fastest one's gradients
    for name in wrt:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, atol=1e-10, err_msg=name)


def test_the_measurement_covers_both_programs(rng):
    from spfuse.autodiff.run import execution_choices
    ops = gcn_operands(rng, 13, 4, 6, 3)
    k = spfuse.compile(GCN, A="csr")
    k.vjp(rng.standard_normal((13, 3)), wrt=("W1", "W2"), **ops)
    adj = gcn_adjoint()
    choices = execution_choices(adj.program)   # (one per operand signature measured in this process)
    assert choices
    for choice in choices:
        assert set(choice.seconds) == {(False, False), (False, True), (True, False), (True, True)}
        assert choice.way in choice.seconds
    assert "shared contractions, statement by statement" in k.explain_vjp(("W1", "W2"))


CHAINS = [
    ("Z[i,j] = A[i,k] * X[k,h] * W[h,j]", {"A": (9, 7), "X": (7, 5), "W": (5, 3)}),                # GNN-1
    ("A[i,l] = B[i,j] * C[j,k] * D[k,l]", {"B": (9, 8), "C": (8, 5), "D": (5, 4)}),                # SpMM-GEMM
    ("A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]",                                         # SDDMM-SpMM-GEMM
     {"B": (9, 8), "C": (9, 3), "D": (8, 3), "F": (8, 4), "W": (4, 2)}),
    ("Y[i,e] = relu(A[i,j] * X[j,f] * W[f,h]) * V[h,e]", {"A": (9, 9), "X": (9, 4), "W": (4, 6), "V": (6, 3)}),
]


@pytest.mark.parametrize("text, shapes", CHAINS)
def test_chains_match_torch(text, shapes, rng):
    program = parse_program(text)
    sparse = program.inputs[0]
    ops = {n: (sp.random_array(s, density=0.35, format="csr", rng=rng) if n == sparse else rng.standard_normal(s))
           for n, s in shapes.items()}
    wrt = tuple(n for n in program.inputs if n != sparse)
    result_shape = np.shape(densify(spfuse.evaluate(text, **ops)))
    cot = rng.standard_normal(result_shape)
    _, expected = torch_vjp(program, {program.results[0]: cot}, wrt, ops)
    got = spfuse.vjp(text, cot, wrt=wrt, **ops)
    for name in wrt:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, atol=1e-10, err_msg=name)


def test_sddmm_inside_a_chain_is_computed_once():
    """SDDMM-SpMM-GEMM: the SDDMM on B's pattern is hoisted once and both
    F's and W's gradients read it (no recomputation inside a contraction)."""
    adj = adjoint("A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]", ("C", "D", "F", "W"), sparse=("B",))
    sddmm = [s for s in adj.program.statements if {"B", "C", "D"} <= {a.name for a in iter_accesses(s.value)}]
    assert len(sddmm) == 1, adj.text
