"""What the backward pass reuses across calls, and the adjoint shapes that
keep it cheap: remembered transposed patterns, the measured fused-or-split
choice, derivatives read from kept temporaries, tie counts on the pattern,
hoisted statements shared modulo index names."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.autodiff import adjoint
from spfuse.autodiff.run import ExecutionChoice, execution_choices
from spfuse.frontend.parser import parse_program
from spfuse.lowering import transposes
from spfuse.tensor import as_tensor

pytest.importorskip("torch")
from test_autodiff import check_gradients  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _csr(rng, n, m, density=0.3):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng)
    A.sort_indices()
    return A


# ---------------------------------------------------------------------------
# transposed patterns
# ---------------------------------------------------------------------------
def test_transpose_matches_scipy_and_follows_new_values(rng):
    transposes.clear()
    A = _csr(rng, 7, 5)
    t = transposes.transposed_csr(as_tensor(A))
    np.testing.assert_array_equal(t.todense(), A.toarray().T)
    B = A.copy()
    B.data = rng.standard_normal(B.nnz)  # same pattern, new values
    t2 = transposes.transposed_csr(as_tensor(B))
    np.testing.assert_array_equal(t2.todense(), B.toarray().T)
    assert t2.format.name == "csr" and t2.shape == (5, 7)


@pytest.mark.parametrize("n", [7, 3000])   # (bytes compared below 64 KiB, integer views above)
def test_same_values_reuse_their_transpose_and_any_changed_bit_gathers_again(rng, n):
    """The last values transposed are remembered per pattern, compared bit
    for bit: the same values (a training loop's adjacency) reuse their
    transpose, read-only; values changed in place -- one entry, or only the
    sign of a zero -- are gathered again."""
    transposes.clear()
    A = _csr(rng, n, 5, density=0.6)
    t1 = transposes.transposed_csr(as_tensor(A))
    t2 = transposes.transposed_csr(as_tensor(A))
    assert np.shares_memory(t1.values, t2.values) and not t2.values.flags.writeable
    A.data[0] += 1.0   # in place: the same buffer, other values
    t3 = transposes.transposed_csr(as_tensor(A))
    np.testing.assert_array_equal(t3.todense(), A.toarray().T)
    assert not np.shares_memory(t2.values, t3.values)
    A.data[0] = 0.0
    t4 = transposes.transposed_csr(as_tensor(A))
    A.data[0] = -0.0
    t5 = transposes.transposed_csr(as_tensor(A))
    at = int(np.flatnonzero(t5.values == 0.0)[0])
    assert np.signbit(t5.values[at]) and not np.signbit(t4.values[at])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_values_gathered_into_the_transposes_order_are_numpys_on_any_team(rng, dtype, monkeypatch):
    A = sp.random_array((300, 200), density=0.2, format="csr", random_state=rng, dtype=dtype)
    t = as_tensor(A)
    monkeypatch.setattr(transposes, "GATHER_TEAM_MIN", 1)   # (the team even for this few)
    with spfuse.threads(2):
        two = transposes.transposed_csr(t.with_values(t.values * 2))
    with spfuse.threads(1):
        one = transposes.transposed_csr(t.with_values(t.values * 3))
    want = (A.T.tocsr() * 2).astype(dtype)
    want.sort_indices()
    assert two.values.dtype == dtype and two.values.tobytes() == want.data.tobytes()
    np.testing.assert_array_equal(one.values, want.data * np.asarray(1.5, dtype))
    with pytest.raises(ValueError, match="gather"):
        from spfuse._kernels._dense_kernels import gather
        gather(np.ones(3), np.zeros(2, dtype=np.int64), np.empty(3))


def test_pattern_changed_in_place_is_not_served_a_stale_transpose(rng):
    transposes.clear()
    A = sp.csr_array(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    before = transposes.transposed_csr(as_tensor(A)).todense()
    A.indices[:] = [0, 1, 2]  # same buffers, new (still canonical) pattern
    after = transposes.transposed_csr(as_tensor(A)).todense()
    np.testing.assert_array_equal(before, np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]).T)
    np.testing.assert_array_equal(after, A.toarray().T)


def test_cache_keeps_no_operand_alive_and_stays_bounded(rng):
    transposes.clear()
    A = _csr(rng, 6, 6)
    refs = [weakref.ref(A.indices), weakref.ref(A.indptr), weakref.ref(A.data)]
    transposes.transposed_csr(as_tensor(A))
    assert transposes.cache_size() == 1
    del A
    gc.collect()
    assert all(r() is None for r in refs)
    for n in range(transposes.MAX_PATTERNS + 3):
        transposes.transposed_csr(as_tensor(_csr(rng, 4 + n, 3)))
    assert transposes.cache_size() == transposes.MAX_PATTERNS


def test_vjp_through_a_transposed_read_sees_each_calls_values(rng):
    """grad_X of Y = A X reads A as the CSR of Aᵀ: same pattern, new values,
    and a pattern rewritten in place, give the right gradient every call."""
    text = "Y[i,h] = A[i,j] * X[j,h]"
    assert "A_T" in adjoint(text, wrt=("X",), sparse=("A",)).text
    A = _csr(rng, 9, 6)
    x, g = rng.standard_normal((6, 3)), rng.standard_normal((9, 3))
    for _ in range(3):
        A.data = rng.standard_normal(A.nnz)
        got = spfuse.vjp(text, g, wrt=("X",), A=A, X=x)["X"]
        np.testing.assert_allclose(got, A.toarray().T @ g, rtol=1e-12)
    rows = np.diff(A.indptr)
    A.indices[:] = np.concatenate([np.arange(r) for r in rows])  # rewrite the pattern in place
    got = spfuse.vjp(text, g, wrt=("X",), A=A, X=x)["X"]
    np.testing.assert_allclose(got, A.toarray().T @ g, rtol=1e-12)


def test_spmv_adjoint_reads_the_matrix_as_stored(rng):
    """grad_x of y = A x scatters A's rows into the one gradient vector (spmv_t): no transpose."""
    text = "y[i] = A[i,j] * x[j]"
    assert adjoint(text, wrt=("x",), sparse=("A",)).text == "grad_x[j] = sum(i, grad_y[i] * A[i, j])"
    A = _csr(rng, 9, 6)
    x, g = rng.standard_normal(6), rng.standard_normal(9)
    np.testing.assert_allclose(spfuse.vjp(text, g, wrt=("x",), A=A, x=x)["x"], A.toarray().T @ g, rtol=1e-12)


# ---------------------------------------------------------------------------
# fused or statement by statement: measured
# ---------------------------------------------------------------------------
def test_execution_choice_measures_each_way_three_times_and_returns_the_winners_result(monkeypatch):
    monkeypatch.setattr(ExecutionChoice, "ROUND_BUDGET", 1e9)   # (rounds of seconds: all three within budget)
    calls = []

    def run(split):
        calls.append(split)
        return "split" if split else "fused"

    c = ExecutionChoice()
    # planning runs (both within HOPELESS of the other), then three timed rounds
    # alternating the ways, the first in reverse of the planning runs' order; the best of each counts
    firsts = [0.0, 1.0, 0.0, 1.0]   # (the planning runs)
    assert c.measure(run, clock=iter(firsts + [0.0, 9.0, 0.0, 2.0, 0.0, 3.0, 0.0, 1.0, 0.0, 8.0, 0.0, 4.0]).__next__
                     ) == "split"
    assert calls == [False, True] + [True, False, False, True, True, False] and c.split is True
    assert c.seconds == {False: 2.0, True: 1.0}
    assert "statement by statement" in c.describe()
    slow_split = ExecutionChoice()
    clock = iter(firsts + [0.0, 5.0, 0.0, 1.0, 0.0, 1.5, 0.0, 4.0, 0.0, 6.0, 0.0, 2.0]).__next__
    assert slow_split.measure(run, clock=clock) == "fused"
    assert slow_split.split is False and "fused" in slow_split.describe()
    # a near tie (statement by statement less than MARGIN faster) goes to the fused program
    tie = ExecutionChoice()
    clock = iter(firsts + [0.0, 0.95, 0.0, 1.0, 0.0, 1.0, 0.0, 0.95, 0.0, 0.95, 0.0, 1.0]).__next__
    assert tie.measure(run, clock=clock) == "fused"


def test_a_way_hopeless_on_its_first_run_is_not_run_again(monkeypatch):
    """A fused adjoint whose contractions fell to the generic executor took
    seconds on the first call of a vjp where statement by statement took
    milliseconds: it is run once (to plan), not timed three more times."""
    monkeypatch.setattr(ExecutionChoice, "ROUND_BUDGET", 1e9)
    calls = []

    def run(split):
        calls.append(split)
        return split

    c = ExecutionChoice()
    assert c.measure(run, clock=iter([0.0, 1.0, 0.0, 0.2, 0.0, 0.3, 0.0, 0.25, 0.0, 0.2]).__next__) is True
    assert calls == [False, True, True, True, True]
    assert c.seconds == {False: 1.0, True: 0.2} and c.split is True
    # within HOPELESS times (and its slack) the fastest: timed as before
    close = ExecutionChoice()
    clock = iter([0.0, 0.06, 0.0, 0.02] + [0.0, 0.02, 0.0, 0.03, 0.0, 0.03, 0.0, 0.02, 0.0, 0.02, 0.0, 0.03]).__next__
    calls.clear()
    assert close.measure(run, clock=clock) is True
    assert calls == [False, True] + [True, False, False, True, True, False]


def test_a_short_hopeless_first_run_is_run_again_before_it_counts(monkeypatch):
    """The way run first pays the process's first kernel call, thread team
    and imports (84 ms of a GCN forward that then runs in 0.2 ms): a
    hopeless first run under RERUN_BELOW seconds is run once more, and
    the way is timed if that run is not hopeless."""
    calls = []

    def run(split):
        calls.append(split)
        return split

    c = ExecutionChoice()
    clock = iter([0.0, 0.08, 0.0, 0.0003, 0.0, 0.0002] + [0.0, 0.0003, 0.0, 0.0002] * 3).__next__
    assert c.measure(run, clock=clock) is False   # (a tie: the fused program)
    assert calls == [False, True, False] + [True, False, False, True, True, False]
    assert c.seconds == {False: 0.0002, True: 0.0002}


def test_slow_ways_are_timed_in_fewer_rounds():
    """No timed round starts once the rounds have taken ROUND_BUDGET
    seconds (one round at least): a first vjp of ways taking 50-100 ms
    each is not three rounds more of both -- and first runs slowed by
    planning do not cut the rounds to one."""
    calls = []

    def run(split):
        calls.append(split)
        return split

    budget = ExecutionChoice.ROUND_BUDGET
    c = ExecutionChoice()
    c.measure(run, clock=iter([0.0, budget / 2, 0.0, budget / 4] + [0.0, budget / 2, 0.0, budget / 4] * 3).__next__)
    assert calls == [False, True, True, False, False, True]   # a round of 0.75 budgets: two rounds
    calls.clear()
    c = ExecutionChoice()
    c.measure(run, clock=iter([0.0, 2 * budget, 0.0, budget] + [0.0, budget / 2, 0.0, budget / 2] * 3).__next__)
    assert calls == [False, True, True, False]   # (first runs of 3 budgets, planning) a round of 1: one
    calls.clear()
    c = ExecutionChoice()
    c.measure(run, clock=iter([0.0, 2 * budget, 0.0, budget] + [0.0, budget / 4, 0.0, budget / 4] * 3).__next__)
    assert calls == [False, True, True, False, False, True]   # ... a round of half a budget: two
    calls.clear()
    c = ExecutionChoice()
    c.measure(run, clock=iter([0.0, budget / 10, 0.0, budget / 10] + [0.0, budget / 10, 0.0, budget / 10] * 3).__next__)
    assert calls == [False, True] + [True, False, False, True, True, False]   # five would fit: three, the most


def test_execution_choice_clock_is_cpu_time_not_wall_time():
    """Time spent descheduled (a busy machine; here a sleep) does not count:
    the way that sleeps is not charged for it."""
    import time

    def run(split):
        if split:
            time.sleep(0.02)  # no CPU time
        else:
            sum(range(300000))  # milliseconds of CPU time, far above a sleep's wake-up
        return split

    c = ExecutionChoice()
    assert c.measure(run) is True and c.seconds[True] < c.seconds[False]


def test_execution_choice_clock_is_the_calling_threads():
    """Other threads' CPU time does not count (a team's workers, spinning
    between parallel regions): a way whose helper thread burns CPU while the
    caller waits is charged the wait, not the helper's work on top."""
    import threading
    import time

    def burn(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def run(split):
        if split:
            burn(0.03)   # the caller's own work
        else:
            helper = threading.Thread(target=burn, args=(0.05,))
            helper.start()
            burn(0.02)   # the caller works less than the split way; a helper works meanwhile
            helper.join()
        return split

    c = ExecutionChoice()
    assert c.measure(run) is False and c.seconds[False] < c.seconds[True]


def test_gradients_are_identical_from_the_first_call_on(rng):
    text = "T[i,k] = A[i,j] * B[j,k]; Z[i,h] = relu(T[i,k]) * W[k,h]"
    A = _csr(rng, 8, 7)
    ops = {"A": A, "B": rng.standard_normal((7, 5)), "W": rng.standard_normal((5, 3))}
    cot = {"Z": rng.standard_normal((8, 3))}
    first = check_gradients(text, ops, rng, wrt=("B", "W"), cotangents=cot)  # measures both ways
    for _ in range(3):  # then the winner, bit for bit the same as the first call's result
        again = check_gradients(text, ops, rng, wrt=("B", "W"), cotangents=cot)
        for name in ("B", "W"):
            np.testing.assert_array_equal(again[name], first[name])
    choices = execution_choices(adjoint(text, wrt=("B", "W"), sparse=("A",)).program)
    assert any(c.split is not None for c in choices)


# ---------------------------------------------------------------------------
# adjoint shapes
# ---------------------------------------------------------------------------
def test_root_function_of_a_kept_temporary_is_differentiated_through_it(rng):
    text = "H[i,h] = sigmoid(A[i,j] * W[j,h]); Z[i,c] = H[i,h] * V[h,c]"
    adj = adjoint(text, wrt=("W", "V"), sparse=("A",))
    assert adj.kept == ("H",)
    assert "sigmoid" not in adj.text and "H[i, h] * (1.0 - H[i, h])" in adj.text
    relu = adjoint("H[i,h] = relu(A[i,j] * W[j,h]); Z[i,c] = H[i,h] * V[h,c]", wrt=("W",), sparse=("A",))
    assert "where(H[i, h]" in relu.text and "relu" not in relu.text
    ops = {"A": _csr(rng, 6, 5), "W": rng.standard_normal((5, 4)), "V": rng.standard_normal((4, 3))}
    for policy in ("auto", "keep", "recompute"):
        check_gradients(text, ops, rng, wrt=("W", "V"), temporaries=policy)


def test_tie_count_of_a_pattern_max_runs_on_the_pattern(rng):
    adj = adjoint("m[i] = max(j in A[i,j], S[i,j])", wrt=("S",), sparse=("A",))
    counts = [s for s in adj.text.splitlines() if "where(" in s and "= sum(" in s]
    assert counts and all("A[i, j" in s.split("where(")[0] for s in counts), adj.text


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_pattern_extremums_bound_gets_no_gradient(op):
    # max(j in A, S) = max(j, A/A * (S - c)) + c with c = min(j, A/A * S): the
    # gradients c gets directly and back through ``- c`` cancel, so the adjoint
    # differentiates neither c nor its ties, and counts the ties on A's pattern
    from spfuse.autodiff.transform import pattern_extrema, split_forward
    text = f"m[i] = {op}(j in A[i,j], S[i,j])"
    assert pattern_extrema(split_forward(parse_program(text))) == {"m_term0": "m_term1"}
    adj = adjoint(text, wrt=("S",), sparse=("A",))
    assert "grad_m_term1" not in adj.text and "ones_" not in adj.text, adj.text
    assert len(adj.program.statements) == 3, adj.text
    # the plain reductions it is lowered to keep their full adjoint (implicit zeros take part)
    plain = adjoint("m[i] = max(j, A[i,j] * S[i,j]) + min(j, A[i,j] * S[i,j])", wrt=("S",), sparse=("A",))
    assert pattern_extrema(split_forward(parse_program(plain.forward.text))) == {}
    assert "ones_" in plain.text


@pytest.mark.parametrize("text", ["m[i] = max(j in A[i,j], S[i,j])", "m[i] = min(j in A[i,j], S[i,j])",
                                  "m[i] = max(j, A[i,j] * S[i,j])", "m[i] = min(j, A[i,j] * S[i,j])"])
def test_pattern_extrema_gradients_with_off_pattern_ties(text, rng):
    # row 0: one stored entry (its bound c equals it: the shifted max is 0 and ties
    # with every unstored position); row 1: all stored entries equal; row 2: empty;
    # row 3: mixed signs with a stored 0 value in S
    A = sp.csr_array(np.array([[0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0],
                               [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 3.0, 1.0]]))
    S = np.array([[5.0, -1.5, 2.0, 1.0], [0.5, 0.5, 9.0, 0.5], [1.0, 2.0, 3.0, 4.0], [-2.0, 7.0, 0.0, 3.0]])
    check_gradients(text, {"A": A, "S": S}, rng, wrt=("S",))
    check_gradients(text, {"A": A, "S": -S}, rng, wrt=("S",))


def test_hoisted_statements_are_shared_across_index_names():
    from spfuse.examples import attention
    adj = adjoint(attention.PROGRAM, wrt=("Wq", "Wk", "Wv"), sparse=("A",))
    bodies = [s.split("=", 1)[1].strip() for s in adj.text.splitlines()]
    assert sum(b.startswith("min(") for b in bodies) <= 2, adj.text
    # grad_S lives on A's pattern (S is a sum of products with A): grad_K reads A, not Aᵀ,
    # so grad_S and A are co-iterated in one storage order
    grad_k = next(s for s in adj.text.splitlines() if s.startswith("grad_K["))
    assert "A_T" not in grad_k
    assert adj.program == parse_program(adj.text)


def test_forward_extrema_are_kept_not_reduced_again():
    """The pattern max ``max(j, A/A*(S - min)) + min`` is split in the forward
    (min first, read by the max): the adjoint reads both kept values as the
    extrema its tie tests compare with, and reduces neither again."""
    from spfuse.examples import attention
    adj = adjoint(attention.PROGRAM, wrt=("Wq", "Wk", "Wv"), sparse=("A",))
    assert {"m_term0", "m_term1"} <= set(adj.kept), adj.describe()
    bodies = [s.split("=", 1)[1].strip() for s in adj.text.splitlines()]
    assert not any(b.startswith(("max(", "min(")) for b in bodies), adj.text
    forward = adj.forward.text.splitlines()
    assert sum("min(" in line for line in forward) == 1, adj.forward.text   # the min computed once
    # a gradient that is another statement's cotangent is read, not copied
    from spfuse.frontend.ast import Access
    assert not any(isinstance(st.value, Access) for st in adj.program.statements), adj.text


@pytest.mark.parametrize("text", [
    "m[i] = max(j, X[i,j] - min(k, X[i,k])) + min(k, X[i,k])",
    "m[i] = min(j, X[i,j]) - 2.0 * max(j, X[i,j] * X[i,j]) + x[i]",
    "T[i,j] = X[i,j] * x[j]; m[i] = max(j, T[i,j]) + sum(j, T[i,j]); y = sum(i, m[i] * m[i])",
])
@pytest.mark.parametrize("policy", ["auto", "recompute"])
def test_split_extremum_terms_match_torch(text, policy, rng):
    ops = {"X": rng.integers(-2, 3, (6, 5)).astype(float),   # small integers: ties
           "x": rng.standard_normal(6 if "x[i]" in text else 5)}
    program = parse_program(text)
    check_gradients(program, {n: ops[n] for n in program.inputs}, rng, temporaries=policy)


def test_a_shared_sparse_prefix_is_computed_once(rng):
    text = "A[i,j] = B[i,j] * (C[i,k] * D[k,j])"
    lines = adjoint(text, wrt=("C", "D"), sparse=("B",)).text.splitlines()
    assert lines == ["grad_A_p[i, j] = grad_A[i, j] * B[i, j]",
                     "grad_C[i, k] = sum(j, grad_A_p[i, j] * D[k, j])",
                     "grad_D[k, j] = sum(i, grad_A_p[i, j] * C[i, k])"]
    # dense B: no pattern to compute the prefix on, it stays inline
    assert "grad_A_p" not in adjoint(text, wrt=("C", "D")).text
    B = _csr(rng, 6, 5)
    check_gradients(text, {"B": B, "C": rng.standard_normal((6, 3)), "D": rng.standard_normal((3, 5))}, rng)
    from spfuse.examples import autoencoder
    X = autoencoder.ratings(12, 9, 3)
    P = X.copy()
    P.data[:] = 1.0
    ops = {"X": X, "We": rng.standard_normal((9, 4)), "b": rng.standard_normal(4), "P": P,
           "Wd": rng.standard_normal((4, 9)), "s": 0.5}
    assert "grad_D_p[i, j] = grad_D[i, j] * P[i, j]" in adjoint(
        autoencoder.PROGRAM, wrt=("We", "b", "Wd"), sparse=("X", "P")).text
    check_gradients(autoencoder.PROGRAM, ops, rng, wrt=("We", "b", "Wd"))


def test_explain_vjp_shows_the_measured_execution(rng):
    k = spfuse.compile("U[i,k] = M[i,j] * B[j,k]; Z[i,h] = tanh(U[i,k]) * W[k,h]", M="csr")
    assert "execution:" not in k.explain_vjp(("B", "W"))  # nothing measured for this program yet
    k.vjp(rng.standard_normal((5, 2)), wrt=("B", "W"), M=_csr(rng, 5, 4), B=rng.standard_normal((4, 3)),
          W=rng.standard_normal((3, 2)))
    shown = k.explain_vjp(("B", "W"))
    assert "execution: " in shown and "ms fused" in shown


# ---------------------------------------------------------------------------
# operands validated once per call
# ---------------------------------------------------------------------------
def _scans(monkeypatch):
    """Names the call path scans again (a Tensor rechecked, a scipy operand's indices scanned)."""
    from spfuse import binding
    seen: list = []
    recheck, scan_ok = binding.rechecked, binding.scan_ok
    monkeypatch.setattr(binding, "rechecked", lambda t, name, nt=1: seen.append(name) or recheck(t, name, nt))
    monkeypatch.setattr(binding, "scan_ok", lambda t, nt: seen.append(t.name) or scan_ok(t, nt))
    return seen


def test_a_training_step_scans_its_operands_once(monkeypatch, rng):
    """The torch bridge validates its inputs when it converts them; the
    forward's and the adjoint's statements (one evaluate() each, split or
    fused) do not scan them, their transposes, patterns or spfuse's own
    intermediate results again -- and the gradients are unchanged."""
    torch = pytest.importorskip("torch")
    import spfuse.torch
    from spfuse.examples import attention
    A = attention.pattern(40, 4)
    A_t = torch.sparse_csr_tensor(torch.from_numpy(A.indptr.astype(np.int64)),
                                  torch.from_numpy(A.indices.astype(np.int64)), torch.from_numpy(A.data),
                                  size=A.shape)
    X = torch.from_numpy(rng.standard_normal((40, 6)))
    W = {n: torch.from_numpy(rng.standard_normal(s)).requires_grad_() for n, s in
         (("Wq", (6, 4)), ("Wk", (6, 4)), ("Wv", (6, 3)))}
    layer = spfuse.torch.function(attention.PROGRAM)
    s = torch.tensor(0.5, dtype=torch.float64)
    layer(A=A_t, X=X, s=s, **W).sum().backward()  # plans
    first = {n: w.grad.clone() for n, w in W.items()}
    for w in W.values():
        w.grad = None
    seen = _scans(monkeypatch)
    layer(A=A_t, X=X, s=s, **W).sum().backward()
    assert seen == []
    for n, w in W.items():
        np.testing.assert_array_equal(w.grad.numpy(), first[n].numpy())


def test_a_callers_own_tensor_is_still_scanned_per_statement(monkeypatch, rng):
    A = as_tensor(_csr(rng, 6, 5))
    X = rng.standard_normal((6, 5))
    seen = _scans(monkeypatch)
    g = spfuse.vjp("y[i] = sum(j, A[i,j] * X[i,j])", np.ones(6), wrt=("X",), A=A, X=X)
    assert "A" in seen   # the caller may still write to its arrays: evaluate() rescans it, as always
    np.testing.assert_allclose(g["X"], A.todense())


def test_statement_results_are_handed_on_as_made(rng):
    """Between a differentiated program's statements results stay spfuse's
    own: a sparse one a Tensor on its operand's very pattern arrays (no
    scipy conversion, no copy of the pattern; the next statement's transpose
    is found again by those arrays), a dense one an ndarray; same values as
    evaluate() gives the caller."""
    from spfuse import api
    from spfuse.tensor import Tensor
    A = _csr(rng, 7, 6)
    tA = as_tensor(A)
    X = rng.standard_normal((7, 6))
    text = "E[i,j] = A[i,j] * exp(X[i,j]); y[j] = sum(i, E[i,j])"
    got = api._run(api._parse(text), {"A": tA, "X": X}, None, "auto", None, raw=True)
    want = spfuse.evaluate(text, A=tA, X=X)
    assert isinstance(got, np.ndarray)   # (E is consumed: y is the one result)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    single = api._run(api._parse("E[i,j] = A[i,j] * exp(X[i,j])"), {"A": tA, "X": X}, None, "auto", None,
                      raw=True)
    assert isinstance(single, Tensor)
    assert single.levels[1].crd is tA.levels[1].crd or np.shares_memory(single.levels[1].crd, tA.levels[1].crd)
    np.testing.assert_allclose(single.todense(), A.toarray() * np.exp(X), rtol=1e-14)
    f32 = api._run(api._parse("y[j] = sum(i, A[i,j] * X[i,j])"), {"A": as_tensor(A.astype(np.float32)),
                   "X": X.astype(np.float32)}, None, "auto", None, raw=True)
    assert f32.dtype == np.float32   # the result dtype, as evaluate() gives it
