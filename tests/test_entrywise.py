"""Element-wise groups over whole dense arrays run as numpy calls
(spfuse/lowering/entrywise.py).

Their results must be the generic executor's bit for bit -- NaN (its
sign aside), infinities and signed zeros included -- so each program runs twice, with
the numpy path and with it switched off, and the results are compared
exactly (and against numpy on dense operands).  The groups that must stay
on the executor (reductions, sparse operands) do not qualify; a result the
planner stores transposed does."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering import groups
from spfuse.lowering.entrywise import entrywise_group
from spfuse.lowering.groups import split_groups

#: program and numpy oracle (A n×m sparse, X m×k, Q n×k, D n×m, W k×k, b k dense)
PROGRAMS = {
    "relu_after_spmm": ("Y[i,h] = relu(A[i,j] * X[j,h])", lambda A, X, Q, D, W, b: np.maximum(A @ X, 0.0)),
    "gcn_layer": ("Y[i,h] = relu(A[i,j] * X[j,f] * W[f,h])",
                  lambda A, X, Q, D, W, b: np.maximum(A @ X @ W, 0.0)),
    "relu_gradient": ("T[i,h] = where(Q[i,h], Q[i,h], 0.0); Y[j,h] = sum(i, T[i,h] * D[i,j])",
                      lambda A, X, Q, D, W, b: D.T @ np.where(Q != 0, Q, 0.0)),
    "arithmetic_tail": ("Y[i,h] = abs(A[i,j] * X[j,h]) / (sqrt(abs(Q[i,h])) + 1.0) - neg(Q[i,h]) * 2.0",
                        lambda A, X, Q, D, W, b: np.abs(A @ X) / (np.sqrt(np.abs(Q)) + 1.0) + Q * 2.0),
    # a broadcast bias and libm's sigmoid (the autoencoder's encoder)
    "bias_sigmoid": ("Y[i,h] = sigmoid(A[i,j] * X[j,h] + b[h])",
                     lambda A, X, Q, D, W, b: 1.0 / (1.0 + np.exp(-(A @ X + b)))),
    "libm_tail": ("Y[i,h] = exp(Q[i,h]) * tanh(A[i,j] * X[j,h]) + log(abs(Q[i,h]) + 1.0)",
                  lambda A, X, Q, D, W, b: np.exp(Q) * np.tanh(A @ X) + np.log(np.abs(Q) + 1.0)),
    # a transposed read (a numpy view) and a broadcast one
    "transposed_and_broadcast": ("Y[f,h] = W[h,f] * b[h] + W[f,h]", lambda A, X, Q, D, W, b: W.T * b + W),
    # a result the planner stores transposed (every operand read across its
    # rows: a gradient's sum of two scattered terms), returned C-ordered
    "transposed_result": ("Y[h,i] = Q[i,h] * 2.0 + abs(Q[i,h])", lambda A, X, Q, D, W, b: (Q * 2.0 + np.abs(Q)).T),
}


def _operands(rng, n, m, k, density, dtype, special: bool):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
    A.data = rng.standard_normal(A.nnz)
    X, Q, D, W, b = (rng.standard_normal(s) for s in ((m, k), (n, k), (n, m), (k, k), (k,)))
    for arr in (X, Q, b):
        arr[rng.random(arr.shape) < 0.3] = 0.0
        if special:   # the values where numpy and the executor could part ways
            picks = rng.random(arr.shape)
            arr[picks < 0.05] = np.nan
            arr[(picks >= 0.05) & (picks < 0.1)] = -0.0
            arr[(picks >= 0.1) & (picks < 0.13)] = np.inf
            arr[(picks >= 0.13) & (picks < 0.16)] = -np.inf
    ops = {"A": A.astype(dtype), "X": X.astype(dtype), "Q": Q.astype(dtype), "D": D.astype(dtype),
           "W": W.astype(dtype), "b": b.astype(dtype)}
    if special:   # a Fortran-ordered operand: read in its logical order
        ops["Q"] = np.asfortranarray(ops["Q"])
    return ops


def _run(program, ops, numpy_path: bool, monkeypatch):
    spfuse.clear_cache()
    with monkeypatch.context() as m:
        if not numpy_path:
            m.setattr(groups, "entrywise_group", lambda plan, ops, outs: None)
        kernel = spfuse.compile(program)
        reads = {n: ops[n] for n in kernel.program.inputs}
        plan = kernel.plans(**reads)["auto"]
        # (a tail of an SpMM runs in its kernel: spfuse.lowering.epilogues)
        ran = any(g.entrywise is not None or g.epilogue for g in split_groups(plan))
        out = spfuse.evaluate(program, **reads)
    spfuse.clear_cache()
    return out, ran


def _same_bits(a, b) -> bool:
    """Equal values, NaN where NaN and the same signed zeros (a NaN's sign
    and payload are not values: x86 gives the sign of whichever operation
    made it)."""
    a, b = np.asarray(a), np.asarray(b)
    numbers = ~np.isnan(a)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True) and np.array_equal(
        np.signbit(a[numbers]), np.signbit(b[numbers]))


@pytest.mark.parametrize("case", sorted(PROGRAMS))
def test_numpy_path_taken_and_equal_to_executor(case, any_work, monkeypatch):
    program, oracle = PROGRAMS[case]
    ops = _operands(np.random.default_rng(3), 12, 9, 4, 0.3, np.float64, special=False)
    fast, ran = _run(program, ops, True, monkeypatch)
    slow, _ = _run(program, ops, False, monkeypatch)
    assert ran, "the element-wise group should run as numpy calls or in the SpMM kernel"
    assert _same_bits(fast, slow)
    dense = {n: (v.toarray() if sp.issparse(v) else v) for n, v in ops.items()}
    np.testing.assert_allclose(fast, oracle(**dense), rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(sorted(PROGRAMS)), n=st.integers(1, 20), m=st.integers(1, 20), k=st.integers(1, 5),
       density=st.sampled_from([0.0, 0.3, 1.0]), dtype=st.sampled_from([np.float64, np.float32]),
       special=st.booleans(), seed=st.integers(0, 2**31 - 1))
# (a NaN of either sign)
@example(case="arithmetic_tail", n=1, m=1, k=1, density=1.0, dtype=np.float64, special=True, seed=1)
def test_bit_for_bit_with_executor(case, n, m, k, density, dtype, special, seed, any_work, monkeypatch):
    """NaN, ±inf and -0.0 in the operands: the same bits either way."""
    program, _ = PROGRAMS[case]
    ops = _operands(np.random.default_rng(seed), n, m, k, density, dtype, special)
    with np.errstate(all="ignore"):
        fast, _ = _run(program, ops, True, monkeypatch)
        slow, _ = _run(program, ops, False, monkeypatch)
    assert _same_bits(fast, slow)


#: programs whose single group must not qualify (T, S dense n×k; v length k; A sparse)
NOT_ENTRYWISE = {
    "reduction": "y[i] = sum(h, T[i,h])",
    "sparse_operand": "Y[i,h] = A[i,h] * 2.0",
}


def _plan(program):
    rng = np.random.default_rng(0)
    ops = {"T": rng.standard_normal((5, 3)), "S": rng.standard_normal((5, 3)), "v": rng.standard_normal(3),
           "A": sp.random_array((5, 3), density=0.5, format="csr", rng=rng)}
    kernel = spfuse.compile(program)
    return kernel.plans(**{n: ops[n] for n in kernel.program.inputs})["auto"]


@pytest.mark.parametrize("case", sorted(NOT_ENTRYWISE))
def test_groups_left_to_the_executor(case):
    plan = _plan(NOT_ENTRYWISE[case])
    assert entrywise_group(plan, plan.ops, plan.results) is None


def test_element_wise_chain_qualifies_and_is_explained(any_work):
    plan = _plan("Y[i,h] = relu(T[i,h]) - S[i,h] * 0.5")
    eg = entrywise_group(plan, plan.ops, plan.results)
    assert eg is not None and eg.describe() == "numpy, element-wise over whole dense arrays"
    # in a split plan the group says how it runs
    A = sp.random_array((30, 20), density=0.2, format="csr", rng=1)
    kernel = spfuse.compile("Y[i,h] = sigmoid(A[i,j] * X[j,h])")
    plan = kernel.plans(A=A, X=np.ones((20, 4)))["auto"]
    described = [g.describe() for g in split_groups(plan)]
    assert any(d.startswith("numpy, element-wise over whole dense arrays: ") for d in described)
    # a tail the SpMM kernel runs says so
    plan = spfuse.compile("Y[i,h] = relu(A[i,j] * X[j,h])").plans(A=A, X=np.ones((20, 4)))["auto"]
    assert any("then in the kernel, as each row is stored: " in g.describe() for g in split_groups(plan))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 12), m=st.integers(2, 12), special=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_operations_on_transposed_operands_run_in_their_layout_bit_for_bit(n, m, special, seed, any_work,
                                                                           monkeypatch):
    """Every matrix operand read transposed (a gradient's terms added up):
    the operation runs over them as stored and its result is transposed
    once -- the same bits as the executor, C-ordered.  (A 1-row matrix is
    both C- and F-ordered: nothing to transpose.)"""
    from spfuse.lowering import entrywise
    program = "Y[k,h] = relu(T0[h,k]) + T1[h,k] * 2.0 - where(T0[h,k], T1[h,k], 0.0) / exp(T1[h,k])"
    ops = _operands(np.random.default_rng(seed), n, m, 1, 0.3, np.float64, special)
    ops = {"T0": ops["D"], "T1": np.asarray(ops["Q"][:, :1] + ops["D"] if special else ops["D"] * 0.5)}
    taken = []

    def spy(xs, shape):
        taken.append(entrywise_all_transposed(xs, shape))
        return taken[-1]

    entrywise_all_transposed = entrywise._all_transposed
    monkeypatch.setattr(entrywise, "TRANSPOSED_MIN_ELEMENTS", 0)   # (every size takes the path here)
    monkeypatch.setattr(entrywise, "_all_transposed", spy)
    with np.errstate(all="ignore"):
        fast, ran = _run(program, ops, True, monkeypatch)
        slow, _ = _run(program, ops, False, monkeypatch)
        want = (np.maximum(ops["T0"], 0) + ops["T1"] * 2.0
                - np.where(ops["T0"] != 0, ops["T1"], 0.0) / np.exp(ops["T1"])).T
    assert ran and any(taken)
    assert _same_bits(fast, slow) and fast.flags.c_contiguous
    np.testing.assert_allclose(fast, want, rtol=1e-12, atol=1e-12, equal_nan=True)
