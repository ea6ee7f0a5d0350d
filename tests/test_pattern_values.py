"""Element-wise work on one sparse pattern run on its values arrays
(spfuse/lowering/pattern_values.py): softmax-on-the-pattern statements and
their gradients.

Each program is checked against the dense numpy oracle
(:func:`spfuse.testing.dense_reference`) and against the generic executor
(the route switched off), for the route it takes, and for falling back when
the operands store different patterns or a result is not finite."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering import groups
from spfuse.lowering.groups import split_groups
from spfuse.testing import dense_reference

#: attention's statements and their adjoint's, on A's pattern (S, G share it; m, g row vectors, V dense)
PROGRAMS = [
    "E[i,j] = A[i,j] * exp(S[i,j] - m[i])",
    "r[i] = min(j, A[i,j] / A[i,j] * S[i,j])",
    "r[i] = max(j, A[i,j] / A[i,j] * (S[i,j] - min(j_, A[i,j_] / A[i,j_] * S[i,j_])))",
    "r[i] = sum(j, A[i,j] / A[i,j] * where(S[i,j] - m[i], 0.0, 1.0))",
    "g2[i] = -sum(j, G[i,j] * exp(S[i,j] - m[i]))",
    "Y[i,j] = A[i,j] / A[i,j] * (G[i,j] * exp(S[i,j] - m[i]) + g[i] * where(S[i,j] - m[i], 0.0, 1.0) / (m[i] + 2.0)"
    " - sum(j_1, g[i] * where(S[i,j_1] - m[i], 0.0, 1.0) * (A[i,j_1] / A[i,j_1])) * G[i,j])",
    "Y[i,j] = A[i,j] * S[i,j] * D[i,j] + G[i,j] * w[j]",
    "Y[i,j] = sigmoid(S[i,j]) * A[i,j] - G[i,j] / (S[i,j] * S[i,j] + 1.0)",
    # a row's dot product over dense operands, on one sparse operand (the attention gradient's)
    "Y[i,j] = A[i,j] / A[i,j] * (g[i] * S[i,j] - sum(e, P[i,e] * Q[i,e]) / (m[i] * m[i] + 1.0) * w[j])",
    "Y[i,j] = A[i,j] * (g[i] - sum(e, P[i,e] * Q[i,e]) * w[j])",
    # one sparse operand, with the work after an SDDMM kept on its pattern
    "Y[i,j] = A[i,j] * exp(P[i,e] * R[j,e])",
    "Y[i,j] = A[i,j] * (P[i,e] * R[j,e] + w[j]) / 8.0",
    # dense-row leaves in the program: an SDDMM's dot per entry, an SpMM's row (dense operands read
    # either way round), the scores, softmax and weighted sum of an attention layer in one pass
    "Y[i,j] = A[i,j] * exp(sum(e, P[i,e] * R[j,e]) - m[i])",
    "Y[i,f] = sum(j, A[i,j] * exp(A[i,j]) * Rt[f,j])",
    "Y[i,f] = sum(j, A[i,j] * tanh(sum(e, Pt[e,i] * Rt[e,j])) * R[j,f])",
    "Y[i,j] = A[i,j] / A[i,j] * sum(e, P[i,e] * R[j,e]); Z[i,f] = sum(j, sigmoid(Y[i,j]) * A[i,j] * R[j,f])",
    "S[i,j] = A[i,j] * P[i,e] * R[j,e] * 0.5; mx[i] = max(j in A[i,j], S[i,j]); E[i,j] = A[i,j] * exp(S[i,j] - mx[i]);"
    " Y[i,f] = E[i,j] * R[j,f] / sum(j, E[i,j])",
    # the program's entries handed on sparse to a scatter over the pattern's rows (an SDDMM gradient's)
    "T[i,j] = A[i,j] * exp(sum(e, P[i,e] * R[j,e])); G[i,f] = sum(j, T[i,j] * R[j,f]);"
    " H[j,f] = sum(i, T[i,j] * G[i,f])",
    # one operand, reduced twice: a softmax over each row's stored entries
    "m[i] = max(j in A[i,j], A[i,j]); E[i,j] = A[i,j] / A[i,j] * exp(A[i,j] - m[i]); s[i] = sum(j, E[i,j]);"
    " Y[i,j] = E[i,j] / s[i]",
    # a minimum over the stored entries of an affine body (its terms and the bound in one sum)
    "m[i] = min(j in A[i,j], 2.0 * S[i,j] + 1.0); Y[i,j] = A[i,j] * exp(S[i,j] - m[i])",
    # several operands known (per call) to store one pattern: a cotangent and its operand
    "Y[i,f] = sum(j, G[i,j] * exp(A[i,j]) * R[j,f])",
    "H[j,f] = -sum(i, G[i,j] * S[i,j] / A[i,j] / A[i,j] * P[i,f])",
    "Ar[i,j] = A[i,j] * sum(e, P[i,e] * R[j,e]); gP[i,e] = -sum(j, G[i,j] * A[i,j] / Ar[i,j] * R[j,e]);"
    " gR[j,e] = -sum(i, G[i,j] * A[i,j] / Ar[i,j] * gP[i,e])",
]


def _operands(rng, n, m, density, full_rows=False, pattern=None):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng) if pattern is None else pattern.copy()
    n, m = A.shape
    if full_rows and n and m:
        A = sp.csr_array(A + sp.csr_array((np.ones(n), (np.arange(n), np.arange(n) % m)), shape=(n, m)))
    A.sort_indices()
    A.data = rng.uniform(0.5, 2.0, A.nnz)

    def on_pattern():
        X = A.copy()
        X.data = rng.standard_normal(A.nnz)
        X.data[rng.random(A.nnz) < 0.2] = 0.0  # stored zeros (where, X/X)
        return X

    return {"A": A, "S": on_pattern(), "G": on_pattern(), "m": rng.standard_normal(n), "g": rng.standard_normal(n),
            "D": rng.standard_normal((n, m)), "w": rng.standard_normal(m), "P": rng.standard_normal((n, 5)),
            "Q": rng.standard_normal((n, 5)), "R": rng.standard_normal((m, 5)), "Pt": rng.standard_normal((5, n)),
            "Rt": rng.standard_normal((5, m))}


def _dense(x):
    if sp.issparse(x):
        return x.toarray()
    return np.asarray(x.todense() if isinstance(x, spfuse.Tensor) else x)


def _kernels(program, ops):
    plan = spfuse.compile(program).plans(**ops)["auto"]
    return [g.kernel for g in split_groups(plan)]


def _generic(program, ops, monkeypatch):
    """The generic executor's answer (the route switched off)."""
    with monkeypatch.context() as mp:
        mp.setattr(groups, "pattern_group", lambda *a: None)
        spfuse.clear_cache()
        out = spfuse.evaluate(program, **ops)
    spfuse.clear_cache()
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(k=st.integers(0, len(PROGRAMS) - 1), n=st.integers(0, 12), m=st.integers(1, 12),
       density=st.sampled_from([0.0, 0.2, 0.6, 1.0]), dtype=st.sampled_from([np.float64, np.float32]),
       seed=st.integers(0, 2**16), block=st.sampled_from([5, 32768]))
# a float32 row vector gathered at each entry (into a float64 work buffer: take refused the cast)
@example(k=0, n=0, m=1, density=0.0, dtype=np.float32, seed=0, block=32768)
def test_pattern_programs_match_numpy_and_the_generic_executor(monkeypatch, k, n, m, density, dtype, seed, block):
    from spfuse.lowering import pattern_values
    monkeypatch.setattr(pattern_values, "BLOCK", block)   # 5: many row blocks per call
    program = PROGRAMS[k]
    ops = _operands(np.random.default_rng(seed), n, m, density)
    ops = {name: ops[name].astype(dtype) for name in spfuse.compile(program).program.inputs}
    got = spfuse.evaluate(program, **ops)
    assert _dense(got).dtype == _dense(_generic(program, ops, monkeypatch)).dtype
    want = dense_reference(program, {name: v.astype(np.float64) for name, v in ops.items()})
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(_dense(got), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(_dense(got), _dense(_generic(program, ops, monkeypatch)), rtol=tol, atol=tol)
    np.testing.assert_array_equal(_dense(got), _dense(spfuse.evaluate(program, **ops)))  # repeat: same bits


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_program_takes_the_pattern_route(program):
    ops = _operands(np.random.default_rng(3), 9, 7, 0.4, full_rows=True)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    assert "pattern" in _kernels(program, ops)
    assert "on the values of the one pattern" in spfuse.compile(program).explain(**ops)


def test_different_patterns_fall_back_to_the_generic_executor(monkeypatch):
    rng = np.random.default_rng(5)
    ops = _operands(rng, 10, 10, 0.3)
    other = sp.random_array((10, 10), density=0.3, format="csr", rng=rng)
    other.data = rng.standard_normal(other.nnz)
    program = PROGRAMS[0]
    ops = {"A": ops["A"], "S": other, "m": ops["m"]}
    got = spfuse.evaluate(program, **ops)
    np.testing.assert_allclose(_dense(got), dense_reference(program, ops), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("share", ["arrays", "equal", "different"])
def test_operands_on_one_pattern_are_known_per_call(share):
    """Two sparse operands run as one pattern's value arrays when the call's
    operands store one pattern (the same index arrays, or equal ones): an
    SpMM over their product is one pattern program, a scatter over it a
    program then spmm_t.  Operands of different patterns are planned as
    before (a program checked per call, handing back to the generic
    executor), and every answer is numpy's."""
    rng = np.random.default_rng(11)
    ops = _operands(rng, 30, 20, 0.3, full_rows=True)
    A, R, P = ops["A"], ops["R"], ops["P"]
    if share == "arrays":
        G = sp.csr_array((rng.standard_normal(A.nnz), A.indices, A.indptr), shape=A.shape)
    elif share == "equal":
        G = sp.csr_array((rng.standard_normal(A.nnz), A.indices.copy(), A.indptr.copy()), shape=A.shape)
    else:
        G = sp.random_array(A.shape, density=0.3, format="csr", rng=rng)
    before = (G.indices.copy(), G.data.copy(), A.indices.copy(), A.data.copy())
    for program, extra in ((PROGRAMS[-3], {"R": R}), (PROGRAMS[-2], {"S": ops["S"], "P": P})):
        given = {"A": A, "G": G, **extra}
        if share != "different" or "S[" not in program:
            got = spfuse.evaluate(program, **given)
            np.testing.assert_allclose(_dense(got), dense_reference(program, given), rtol=1e-10, atol=1e-10)
        if share != "different":
            assert _kernels(program, given)[0] == "pattern"
            operands_line = spfuse.compile(program).explain(**given).splitlines()[3]
            assert "(stores G's pattern)" in operands_line or "(stores A's pattern)" in operands_line
    np.testing.assert_array_equal(before[0], G.indices)
    np.testing.assert_array_equal(before[1], G.data)
    np.testing.assert_array_equal(before[2], A.indices)
    np.testing.assert_array_equal(before[3], A.data)


def test_a_non_finite_result_falls_back_to_the_generic_executor(monkeypatch):
    rng = np.random.default_rng(6)
    ops = _operands(rng, 8, 8, 0.5, full_rows=True)
    ops = {"A": ops["A"], "S": ops["S"], "m": ops["m"]}
    ops["m"][0] = -np.inf  # exp(S - m) = inf on row 0
    program = PROGRAMS[0]
    calls = []
    real = groups.run_pattern_group
    monkeypatch.setattr(groups, "run_pattern_group", lambda *a: calls.append(1) or real(*a))
    got = spfuse.evaluate(program, **ops)
    assert calls  # the route was tried, and handed the call back
    np.testing.assert_array_equal(_dense(got), _dense(_generic(program, ops, monkeypatch)))


@pytest.mark.parametrize("program", [
    "E[i,j] = A[i,j] * exp(S[i,j] - m[i])",               # an infinity among the entries
    "g2[i] = -sum(j, G[i,j] * exp(S[i,j] - m[i]))",       # ... in a row's value
    "Y[i,f] = sum(j, G[i,j] * exp(S[i,j] - m[i]) * R[j,f])",   # ... in a row an SpMM leaf writes
])
def test_each_kind_of_non_finite_output_hands_the_call_back(program, monkeypatch):
    """The compiled program counts the infinities and NaNs it writes, in
    every kind of output; any makes the route hand the call back."""
    ops = _operands(np.random.default_rng(6), 8, 8, 0.5, full_rows=True)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    ops["m"][3] = -np.inf   # exp(S - m) = inf on row 3
    handed = []
    real = groups.run_pattern_group
    monkeypatch.setattr(groups, "run_pattern_group", lambda *a: handed.append(real(*a)) or handed[-1])
    got = spfuse.evaluate(program, **ops)
    assert handed == [None]
    np.testing.assert_array_equal(_dense(got), _dense(_generic(program, ops, monkeypatch)))
    ops["m"][3] = 0.0
    handed.clear()
    spfuse.evaluate(program, **ops)
    assert len(handed) == 1 and handed[0] is not None


def test_not_restricted_to_the_pattern_stays_generic():
    """``exp(S - m)`` without a factor on the pattern has values off it (a
    dense result): no pattern route."""
    ops = _operands(np.random.default_rng(7), 6, 6, 0.5)
    program = "E[i,j] = exp(S[i,j] - m[i]) * G[i,j] + S[i,j] + 1.0"
    ops = {name: ops[name] for name in ("S", "m", "G")}
    assert "pattern" not in _kernels(program, ops)
    np.testing.assert_allclose(_dense(spfuse.evaluate(program, **ops)), dense_reference(program, ops), rtol=1e-12)


def test_a_dense_operand_read_across_the_pattern_stays_generic():
    """``D[j,i]`` at an entry (i, j) of the pattern is not a row of D: the
    route gathers only ``D[i,j]``, ``w[j]`` and ``m[i]``, so this group runs on
    the generic executor (the route indexed D[i,j] and went out of bounds)."""
    ops = _operands(np.random.default_rng(11), 5, 3, 0.6, full_rows=True)
    ops["D"] = np.random.default_rng(12).standard_normal((3, 5))
    program = "Y[i,j] = A[i,j] * S[i,j] * D[j,i] + G[i,j]"
    ops = {name: ops[name] for name in ("A", "S", "D", "G")}
    assert "pattern" not in _kernels(program, ops)
    np.testing.assert_allclose(_dense(spfuse.evaluate(program, **ops)), dense_reference(program, ops), rtol=1e-12)


def test_inputs_are_not_mutated():
    ops = _operands(np.random.default_rng(8), 9, 9, 0.5, full_rows=True)
    ops = {name: ops[name] for name in ("A", "S", "G", "m", "g")}
    before = {n: _dense(v).copy() for n, v in ops.items()}
    spfuse.evaluate(PROGRAMS[5], **ops)
    for n, v in ops.items():
        np.testing.assert_array_equal(_dense(v), before[n])


def _numpy_blocks(monkeypatch):
    """Run pattern groups on the numpy row blocks (the compiled program switched off)."""
    from spfuse.lowering import pattern_values
    monkeypatch.setattr(pattern_values, "_program", lambda *a: None)


@pytest.mark.parametrize("k", range(len(PROGRAMS)))
@pytest.mark.parametrize("n,m,density", [(9, 7, 0.4), (40, 33, 0.2), (5, 4, 1.0)])
def test_the_compiled_program_agrees_with_the_numpy_blocks(monkeypatch, k, n, m, density):
    program = PROGRAMS[k]
    if "sum(e," in program:
        pytest.skip("a row's dot product or a dense-row leaf runs in the compiled program only")
    ops = _operands(np.random.default_rng(k + n), n, m, density)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    spfuse.clear_cache()
    compiled = _dense(spfuse.evaluate(program, **ops))
    with monkeypatch.context() as mp:
        _numpy_blocks(mp)
        spfuse.clear_cache()
        blocks = _dense(spfuse.evaluate(program, **ops))
    spfuse.clear_cache()
    # the same operations in the same order; libm's exp/tanh against numpy's may differ in the last bit
    np.testing.assert_allclose(compiled, blocks, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_the_compiled_program_gives_the_same_bits_on_any_team(k):
    from spfuse.lowering.pattern_values import pattern_group, run_pattern_group
    from spfuse.tensor import as_tensor
    program = PROGRAMS[k]
    ops = _operands(np.random.default_rng(3), 600, 400, 0.3, full_rows=True)   # (past PARALLEL_MIN_WORK)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    plan = spfuse.compile(program).plans(**ops)["auto"]
    gs = split_groups(plan)
    (g,) = [g for g in gs if g.on_pattern is not None]
    env = {name: as_tensor(v) for name, v in ops.items()}
    if len(gs) > 1:   # (the work after an SDDMM: the groups before it make what it reads)
        one, two = (groups.run_groups(plan, gs, env, nt) for nt in (1, 2))
    else:
        one, two = (run_pattern_group(g.on_pattern, env, plan.shapes, nt) for nt in (1, 2))
    assert pattern_group(plan, g.ops, g.outputs) is not None
    for name in one:
        np.testing.assert_array_equal(_dense(one[name]), _dense(two[name]))


def _block_edges_pattern(rng):
    """Rows the compiled program's blocks of rows (256 entries, 64 rows)
    meet at their edges: 100 empty rows, a full row of 600 entries, rows
    of 255-257 entries, a run of rows of one entry and random rows."""
    n, m = 300, 600
    lengths = np.zeros(n, dtype=int)
    lengths[100] = m
    lengths[101:104] = (255, 256, 257)
    lengths[104:200] = 1
    lengths[200:] = rng.integers(0, 40, n - 200)
    cols = np.concatenate([np.sort(rng.choice(m, k, replace=False)) for k in lengths])
    rows = np.repeat(np.arange(n), lengths)
    return sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, m))


@pytest.mark.parametrize("k", range(len(PROGRAMS)))
def test_the_compiled_program_across_block_edges_matches_numpy(k):
    """Empty rows, a row longer than a block, rows just below and past a
    block's entries: every program as numpy has it, on 1 and 2 threads."""
    rng = np.random.default_rng(40 + k)
    program = PROGRAMS[k]
    ops = _operands(rng, 0, 0, 0.0, pattern=_block_edges_pattern(rng))
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    want = dense_reference(program, ops)
    for nt in (1, 2):
        got = spfuse.evaluate(program, **ops, num_threads=nt)
        np.testing.assert_allclose(_dense(got), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("width", [0, 1, 9])
def test_dense_row_leaves_on_edge_operands(width):
    """Dense rows of no, one or nine elements; an unsorted, duplicated CSR
    operand with empty rows (canonicalised first), int32 or int64 indices;
    the leaves' route taken."""
    rng = np.random.default_rng(width)
    rows = np.array([0, 0, 2, 2, 2, 4, 0])
    cols = np.array([3, 1, 0, 3, 0, 2, 3])   # unsorted, (0, 3) and (2, 0) stored twice
    A = sp.csr_array((rng.uniform(0.5, 2.0, len(rows)), (rows, cols)), shape=(6, 4))
    A.has_canonical_format = False
    if width == 9:   # int64 indices: the program reads either index type as stored
        A.indptr, A.indices = A.indptr.astype(np.int64), A.indices.astype(np.int64)
    P, R, V = rng.standard_normal((6, width)), rng.standard_normal((4, width)), rng.standard_normal((4, 3))
    program = ("S[i,j] = A[i,j] * P[i,e] * R[j,e]; E[i,j] = A[i,j] * exp(S[i,j]); "
               "Y[i,f] = E[i,j] * V[j,f] / (sum(j, E[i,j]) + 1.0); Z[i,e] = sum(j, E[i,j] * R[j,e])")
    ops = {"A": A, "P": P, "R": R, "V": V}
    before = {n: (v.copy() if not sp.issparse(v) else v.copy()) for n, v in ops.items()}
    got = spfuse.evaluate(program, **ops)
    Ad = A.toarray()
    E = np.where(Ad != 0, Ad * np.exp(Ad * (P @ R.T)), 0.0)
    np.testing.assert_allclose(got["Y"], (E @ V) / (E.sum(1, keepdims=True) + 1.0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["Z"], E @ R, rtol=1e-12, atol=1e-12)
    assert got["Z"].shape == (6, width)
    assert "pattern" in _kernels(program, ops)
    for n, v in ops.items():   # nothing written into the operands
        np.testing.assert_array_equal(v.toarray() if sp.issparse(v) else v,
                                      before[n].toarray() if sp.issparse(before[n]) else before[n])


#: GNN-2's adjoint written as one program: the recomputed scores, the
#: gradient's SDDMM and grad_X's rows in one pattern program, its entries
#: handed on sparse to the two scatters of grad_Y
GNN2_ADJOINT = ("Z_r[i,h] = A[i,h] / A[i,h] * sum(k, X[i,k] * Y[k,h]); "
                "grad_Z_p[i,h] = sum(j, grad_Z[i,j] * Y[j,h]) * A[i,h]; "
                "grad_X[i,k] = sum(h, grad_Z_p[i,h] * Y[k,h]); "
                "grad_Y[k,h] = sum(i, grad_Z_p[i,h] * X[i,k]) + sum(i, grad_Z[i,k] * (A[i,h] * Z_r[i,h]))")


@pytest.mark.parametrize("big", [False, True])
def test_pattern_entries_handed_on_sparse(big):
    """The scatters read the pattern program's entries as CSR operands on
    its pattern (no generic executor); with an overflowing score the program
    hands back and the generic executor's entries are put on the pattern."""
    rng = np.random.default_rng(4)
    n, K = 60, 6
    A = sp.random_array((n, n), density=0.1, format="csr", rng=rng)
    X, Y, gZ = rng.standard_normal((n, K)), rng.standard_normal((K, n)), rng.standard_normal((n, K))
    if big:
        X[3] = 1e200   # Z_r overflows to ±inf on row 3 (where its stored entries are)
    ops = {"A": A, "X": X, "Y": Y, "grad_Z": gZ}
    kernel = spfuse.compile(GNN2_ADJOINT)
    assert _kernels(GNN2_ADJOINT, ops)[:2] == ["pattern", "spmm_t_sum"]   # (the two scatters: one walk)
    assert "generic executor" not in kernel.explain(**ops).split("execution:")[1].split("\n")[0]
    got = spfuse.evaluate(GNN2_ADJOINT, **ops)
    Ad = A.toarray()
    with np.errstate(all="ignore"):
        Zr = np.where(Ad != 0, X @ Y, 0.0)
        gZp = (gZ @ Y) * Ad
        want = {"grad_X": gZp @ Y.T, "grad_Y": X.T @ gZp + gZ.T @ np.where(Ad != 0, Ad * Zr, 0.0)}
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-10, atol=1e-10)


def test_a_signature_with_shared_patterns_is_not_reused_for_different_ones():
    """Whether operands store one pattern is part of the call's signature:
    a kernel called on a cotangent sharing its operand's pattern, then on
    one of the same shape and entry count but other coordinates (and back),
    answers as numpy each time."""
    rng = np.random.default_rng(12)
    A = sp.random_array((40, 30), density=0.2, format="csr", rng=rng)
    A.sort_indices()
    R = rng.standard_normal((30, 4))
    same = sp.csr_array((rng.standard_normal(A.nnz), A.indices.copy(), A.indptr.copy()), shape=A.shape)
    rows = np.repeat(np.arange(40), np.diff(A.indptr))
    other = sp.csr_array((rng.standard_normal(A.nnz), ((rows + 1) % 40, A.indices)), shape=A.shape)
    assert other.nnz == A.nnz and not np.array_equal(other.indices, A.indices)
    program = "Y[i,f] = sum(j, G[i,j] * exp(A[i,j]) * R[j,f])"
    kernel = spfuse.compile(program)
    for G in (same, other, same, other):
        ops = {"A": A, "G": G, "R": R}
        np.testing.assert_allclose(kernel(**ops), dense_reference(program, ops), rtol=1e-10, atol=1e-10)
    assert spfuse.tensor.shared_patterns({"A": spfuse.as_tensor(A), "G": spfuse.as_tensor(same)}) == (("G", "A"),)
    assert spfuse.tensor.shared_patterns({"A": spfuse.as_tensor(A), "G": spfuse.as_tensor(other)}) == ()


def test_shared_patterns_compares_whole_patterns_within_a_fingerprint():
    """Operands of one shape and entry count are bucketed by a few sampled
    coordinates; within a bucket the whole patterns decide.  Patterns that
    differ only away from the samples are told apart, equal ones found, each
    naming the earliest operand of its pattern."""
    rng = np.random.default_rng(3)
    A = sp.random_array((20, 20), density=0.3, format="csr", rng=rng)
    A.sort_indices()
    n = A.nnz
    assert n > 8
    moved = A.indices.copy()
    k = 1 if 1 not in (n >> 2, n >> 1, n - 1) else 2   # a position no sample reads
    row = np.searchsorted(A.indptr, k, side="right") - 1
    free = sorted(set(range(20)) - set(A.indices[A.indptr[row]:A.indptr[row + 1]]))
    moved[k] = free[0]   # (the row may then be unsorted: a pattern all the same)
    near = sp.csr_array((A.data, moved, A.indptr.copy()), shape=A.shape)
    other = sp.random_array((20, 20), density=0.3, format="csr", rng=rng)
    ts = {"A": A, "B": near, "C": other, "D": sp.csr_array((A.data * 2, A.indices.copy(), A.indptr.copy()),
                                                            shape=A.shape),
          "E": sp.csr_array((near.data, near.indices.copy(), near.indptr.copy()), shape=A.shape)}
    tensors = {name: spfuse.Tensor._fast_compressed(m, "sparray", scan=False) for name, m in ts.items()}
    assert spfuse.tensor.shared_patterns(tensors) == (("D", "A"), ("E", "B"))


@pytest.mark.parametrize("op", ["max", "min"])
def test_row_extrema_with_nans_and_infinities_give_the_generic_executors_bits(op, monkeypatch):
    """A row's maximum or minimum in a pattern program: a NaN anywhere in
    the row (first, inside, last, alone, several) makes it NaN, infinities
    and the implicit zeros take part, as on the generic executor."""
    nan, inf = np.nan, np.inf
    rows = [[nan, 1.0, 2.0], [1.0, nan, 3.0], [-1.0, -2.0, nan], [nan], [nan, nan, -1.0],
            [inf, -inf, 1.0], [-inf, -3.0], [-5.0, -4.0, -6.0], [4.0, 2.0], [], [-0.5]]
    data = [v for r in rows for v in r]
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.concatenate([np.arange(len(r)) * 2 for r in rows]).astype(np.int32)
    ops = {"A": sp.csr_array((np.array(data), indices, indptr), shape=(len(rows), 7)),
           "S": np.ones((len(rows), 7))}
    program = f"m[i] = {op}(j, A[i,j] * S[i,j]) + {op}(j, A[i,j] / S[i,j])"
    assert "pattern" in _kernels(program, ops)
    got = spfuse.evaluate(program, **ops)
    np.testing.assert_array_equal(got, _generic(program, ops, monkeypatch))
    want = dense_reference(program, ops)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want)


#: reductions over the stored entries, each found by ``_stored_extrema`` (one instruction)
STORED_EXTREMA = [p for p in PROGRAMS if " in A[i,j]" in p] + [
    "m[i] = max(j in A[i,j], S[i,j])",
    "m[i] = min(j in A[i,j], S[i,j] * G[i,j]); y[i] = m[i] * 3.0 + sum(j, A[i,j])",
    "m[i] = max(j in A[i,j], S[i,j] - 2.0 * G[i,j] - 1.0); Y[i,j] = G[i,j] * exp(S[i,j] - m[i])",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(0, len(STORED_EXTREMA) - 1), n=st.integers(1, 12), m=st.integers(1, 12),
       density=st.sampled_from([0.0, 0.2, 0.6, 1.0]), full_rows=st.booleans(), seed=st.integers(0, 2**16))
def test_a_stored_extremum_is_one_instruction_with_the_bits_of_its_five(monkeypatch, k, n, m, density, full_rows,
                                                                       seed):
    """``max(j in A[i,j], e)`` lowers to five operations (a bound, a shift,
    two products reduced, a sum); the compiled program runs them as one
    ``stored_extremum`` instruction, which must give their bits."""
    from spfuse.lowering import pattern_values
    program = STORED_EXTREMA[k]
    ops = _operands(np.random.default_rng(seed), n, m, density, full_rows=full_rows)
    ops = {name: ops[name] for name in spfuse.compile(program).program.inputs}
    found = []
    real = pattern_values._stored_extrema
    spfuse.clear_cache()
    with monkeypatch.context() as mp:
        mp.setattr(pattern_values, "_stored_extrema", lambda pg: found.append(real(pg)[0]) or real(pg))
        fused = _dense(spfuse.evaluate(program, **ops))
    assert any(found), "the stored extremum was not recognised"
    spfuse.clear_cache()
    with monkeypatch.context() as mp:
        mp.setattr(pattern_values, "_stored_extrema", lambda pg: ({}, frozenset()))
        apart = _dense(spfuse.evaluate(program, **ops))
    spfuse.clear_cache()
    np.testing.assert_array_equal(fused.view(np.int64), apart.view(np.int64))
    np.testing.assert_allclose(fused, dense_reference(program, ops), rtol=1e-10, atol=1e-10)


def test_a_stored_extremum_read_elsewhere_is_left_in_its_parts():
    """The bound ``c`` read by a third operation too: the five operations stay."""
    from spfuse.lowering.pattern_values import _stored_extrema, pattern_group
    c = "min(j_{0}, A[i,j_{0}] / A[i,j_{0}] * S[i,j_{0}])"
    program = f"m[i] = (max(j, A[i,j] / A[i,j] * (S[i,j] - {c.format(1)})) + {c.format(2)}) * {c.format(3)}"
    ops = _operands(np.random.default_rng(0), 9, 7, 0.4)
    ops = {name: ops[name] for name in ("A", "S")}
    plan = spfuse.compile(program).plans(**ops)["auto"]
    (g,) = [g for g in split_groups(plan) if g.on_pattern is not None]
    assert _stored_extrema(pattern_group(plan, g.ops, g.outputs)) == ({}, frozenset())
    np.testing.assert_allclose(spfuse.evaluate(program, **ops), dense_reference(program, ops), rtol=1e-12)


def test_a_pattern_indicator_has_the_divisions_bits():
    """``A / A`` in a pattern program (a subtraction, not a division): 1,
    +0 where A is +-0, NaN (with a NaN's payload) where A is not finite."""
    from spfuse._kernels._dense_kernels import PATTERN_ARGS, PATTERN_OPS, pattern_program
    payload = np.array([0x7FF8000000000123], dtype=np.int64).view(np.float64)[0]
    values = np.array([2.5, -0.0, 0.0, np.inf, -np.inf, np.nan, payload, -7.0, 1e-310, 5e300])
    out = np.full(values.size, 9.0)
    pattern = PATTERN_ARGS["pattern"]
    code = np.array([[PATTERN_OPS["/"], 0, 0, 0, 2, 0, 0, pattern, 0, pattern, 0]], dtype=np.int64)
    indptr, cols = np.array([0, 4, values.size], dtype=np.int64), np.r_[0:4, 0:6].astype(np.int64)
    nonfinite = pattern_program(indptr, cols, 6, code, np.zeros(1), [values, out], np.zeros(2, dtype=np.int64), 1,
                                0, np.array([[0, 0, 1]], dtype=np.int64))
    assert nonfinite == 4   # (the NaNs of +-inf / +-inf and of the NaNs, counted as written)
    with np.errstate(invalid="ignore"):
        want = np.where(values == 0, 0.0, values / np.where(values == 0, 1.0, values))
    np.testing.assert_array_equal(out.view(np.int64), want.view(np.int64))
