"""passes.common_subexpressions: a unit operation written twice is computed once."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.frontend.canonical import to_text
from spfuse.frontend.parser import parse_program
from spfuse.ir.ops import Const, Ref, UnitOp
from spfuse.passes.common_subexpressions import eliminate_common_subexpressions
from spfuse.passes.decompose import decompose
from spfuse.testing import dense_reference, densify, programs, random_operands


def lines(text: str, kept=None) -> list[str]:
    program = parse_program(text)
    kept = {s.target.name for s in program.statements} if kept is None else kept
    return [str(op) for op in eliminate_common_subexpressions(decompose(program), kept)]


def test_repeats_are_equal_up_to_index_names_and_the_order_of_a_product():
    assert lines("y[i] = sum(j, A[i,j] * x[j]) * sum(k, x[k] * A[i,k])") == [
        "T0[i] = sum(j, A[i,j] * x[j])", "y[i] = T0[i] * T0[i]"]


def test_a_transposed_repeat_is_another_tensor():
    text = "C[i,j] = sum(k, A[i,k] * B[k,j]) + sum(k, A[j,k] * B[k,i])"
    assert lines(text) == [str(op) for op in decompose(parse_program(text))]


def test_the_order_of_a_reduction_and_of_a_long_sum_is_kept():
    assert len(lines("y[i] = sum(j, sum(k, T[i,j,k])) + sum(k, sum(j, T[i,j,k]))")) == 3
    assert len(lines("y[i] = exp(a[i] + b[i] + c[i]) + exp(c[i] + b[i] + a[i])")) == 5


def test_statement_targets_stay_and_statements_do_not_share():
    text = "u[i] = exp(x[i]); v[i] = exp(x[i]); w[i] = relu(exp(x[i])) + sqrt(exp(x[i]))"
    out = lines(text)
    assert out[:2] == ["u[i] = exp(x[i])", "v[i] = exp(x[i])"]
    assert sum("= exp(x[i])" in s for s in out[2:]) == 1   # w's two exp(x) once, not u's


def test_signed_zeros_and_reassigned_names_are_not_merged():
    a = Ref("a", ("i",))
    ops = (UnitOp(0, "T0", ("i",), "*", (a, Const(0.0))), UnitOp(1, "T1", ("i",), "*", (a, Const(-0.0))),
           UnitOp(2, "y", ("i",), "+", (Ref("T0", ("i",)), Ref("T1", ("i",)))))
    assert eliminate_common_subexpressions(ops, {"y"}) == ops
    again = (UnitOp(0, "T0", ("i",), "exp", (a,)), UnitOp(1, "T1", ("i",), "exp", (a,)),
             UnitOp(2, "T1", ("i",), "+", (Ref("T1", ("i",)), a)))
    assert [op.out for op in eliminate_common_subexpressions(again, set())] == ["T0", "T1", "T1"]


def test_a_repeat_under_other_loops_of_its_statement_is_kept_apart():
    """``S[i,j] - m[i]`` under the product's ``j`` and under ``sum(j_1, ...)``
    run on different positions: one shared temporary would be computed
    densely on both (a pattern program fell back to the generic executor)."""
    out = lines("Y[i,j] = A[i,j] * exp(S[i,j] - m[i]) - sum(j_1, A[i,j_1] * exp(S[i,j_1] - m[i]))")
    assert sum(" - m[i]" in s for s in out) == 2
    assert lines("y[i] = exp(x[i]) / (1 + exp(x[i]))") == [
        "T0[i] = exp(x[i])", "T1[i] = 1 + T0[i]", "y[i] = T0[i] / T1[i]"]


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(n_statements=(1, 2), max_ndim=2, max_extent=5), st.integers(0, 2**31 - 1))
def test_a_statement_written_twice_over_matches_the_oracle(case, seed):
    """Each statement's value ``e`` rewritten ``e * e + e``: its repeats merge
    (the reduced indices, renamed apart, do not matter), and the answers stay numpy's."""
    program, shapes = case
    doubled = "; ".join(to_text(s).replace(" = ", " = (", 1) + ") * (" + to_text(s).split(" = ", 1)[1]
                        + ") + (" + to_text(s).split(" = ", 1)[1] + ")" for s in program.statements)
    ops = random_operands(np.random.default_rng(seed), shapes, formats=("csr", "dense", "dense"))
    try:
        got = spfuse.evaluate(doubled, **ops)
    except (ValueError, ZeroDivisionError, FloatingPointError):
        return   # (max over an empty extent raises, as numpy does)
    want = dense_reference(doubled, ops)
    gots = got if isinstance(got, dict) else {"r": got}
    wants = want if isinstance(want, dict) else {"r": want}
    for r in gots:
        np.testing.assert_allclose(densify(gots[r]), densify(wants[r]), rtol=1e-9, atol=1e-9)
    parsed = parse_program(doubled)
    written = decompose(parsed)
    merged = eliminate_common_subexpressions(written, {s.target.name for s in parsed.statements})
    # every repeat merges when nothing is reduced (a reduction's body runs
    # under its own, renamed index: kept apart); a bare access has no repeat
    ops = decompose(parse_program("; ".join(to_text(s) for s in program.statements)))   # (implicit sums explicit)
    element_wise = all(op.reduction is None for op in ops) and any(op.operator is not None for op in ops)
    assert len(merged) < len(written) if element_wise else len(merged) <= len(written)
