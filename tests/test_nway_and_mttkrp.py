"""The plan explain() shows is the plan that runs: n-way sums and MTTKRP.

* A sum of n terms is ONE unit operation (an n-way union, TACO's merge
  lattice for ``+``): the IR tree, the redundancy cost, explain() and the
  ``spadd`` template agree; the generic executor runs the same op with a
  k-way union loop, for every mix of terms (scaled, negated, products,
  reductions, dense, transposed, broadcast).
* MTTKRP's plan contracts the CSF's inner level k first (a row temporary
  per (i,j) fiber), the tree the ``mttkrp`` template implements; a plan with
  another tree does not run under the template's name.
"""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernels import KERNELS, infos, operands

import spfuse
from spfuse.api import _execute_generic, _info, _parse, describe_execution
from spfuse.binding import bind_operands
from spfuse.frontend.parser import parse_program
from spfuse.ir.tree import loop_shape
from spfuse.lowering.templates import match_template
from spfuse.passes.decompose import decompose
from spfuse.planner import plan_program
from spfuse.tensor import Tensor
from spfuse.testing import dense_reference

SPADD7 = KERNELS["SpAdd-7"]
MTTKRP_TREE = [("i", [("j", ["reset T0", ("k", [("r", ["T0"])]), ("r", ["A"])])])]


def densify(x):
    return x.toarray() if sp.issparse(x) else np.asarray(x.todense() if isinstance(x, Tensor) else x)


def plans_for(text, ops):
    prog = _parse(text)
    tensors, _ = bind_operands(prog, ops)  # every operand scanned (no deferral)
    ins = {n: _info(n, t) for n, t in tensors.items()}
    return {f: plan_program(prog, ins, f) for f in ("auto", "none")}, tensors


# -- SpAdd-n: one n-way op ------------------------------------------------------

def test_spadd7_is_one_nway_op_in_ir_cost_explain_and_template(rng):
    ops = operands("SpAdd-7", rng, n=40, density=0.1)
    plans, _ = plans_for(SPADD7, ops)
    auto = plans["auto"]
    (op,) = auto.ops
    assert op.operator == "+" and len(op.args) == 7 and op.reduction is None
    assert loop_shape(auto.tree) == [("i", [("j", ["A"])])] and not auto.temporaries
    assert auto.report.cost_text == "O(nnz(" + " ∨ ".join(f"B{n}" for n in range(1, 8)) + "))"
    # the library approach adds two operands per call: six ops, five temporaries
    assert len(plans["none"].ops) == 6 and plans["none"].report.estimate > 2 * auto.report.estimate
    m = match_template(auto)
    assert m.kernel == "spadd" and list(m.roles) == [r.name for r in op.args]
    text = spfuse.compile(SPADD7).explain(**ops)
    tree = text.split("index tree after fusion")[1].split("temporaries")[0]
    assert tree.count("S0:") == 1 and "reset" not in tree and "S1:" not in tree
    assert "temporaries: none" in text and "template kernel 'spadd'" in text


def test_decompose_keeps_sums_nary_and_none_binary():
    prog = parse_program("C[i,j] = A[i,j] - 2*B[i,j] + -D[i,j] + E[i,j]*3 + 1.5")
    (op,) = decompose(prog)
    assert op.operator == "+" and op.coefficients == (1.0, -2.0, -1.0, 3.0, 1.0)
    assert str(op) == "C[i,j] = A[i,j] - 2*B[i,j] - D[i,j] + 3*E[i,j] + 1.5"
    assert all(o.operator in ("+", "-", "*", "neg") and len(o.args) <= 2 for o in decompose(prog, nary=False))


def test_weighted_spadd_runs_the_template_with_the_ir_coefficients(rng):
    A, B, C = (sp.random_array((30, 20), density=0.2, format="csr", rng=rng) for _ in range(3))
    text = "Z[i,j] = 2*A[i,j] - B[i,j] + C[i,j]*0.5"
    plans, tensors = plans_for(text, {"A": A, "B": B, "C": C})
    (op,) = plans["auto"].ops
    m = match_template(plans["auto"])
    assert m.kernel == "spadd" and op.coefficients == (2.0, -1.0, 0.5)
    want = 2 * A.toarray() - B.toarray() + 0.5 * C.toarray()
    np.testing.assert_allclose(densify(m.run(tensors, 1)["Z"]), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(densify(_execute_generic(plans["auto"], tensors, 1)["Z"]), want,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(densify(spfuse.evaluate(text, A=A, B=B, C=C)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text", [
    "Z[i,j] = A[i,j] + B[j,i] + C[i,j]",                      # a transposed term
    "Z[i,j] = A[i,j] + D[i,j] - C[i,j]",                      # sparse + dense
    "Z[i,j] = A[i,j] * D[i,j] + B[i,j] + 2*C[i,j]",           # a product term
    "Z[i,j] = A[i,k] * E[k,j] + B[i,j] - C[i,j]",             # a reduction term
    "Z[i,j] = A[i,j] + x[j] - C[i,j] + 1",                    # broadcast and a constant
    "y[i] = A[i,j] + B[i,j] - 3*C[i,j]",                      # the sum is reduced over j
    "Z[i,j] = -(A[i,j] + B[i,j]) + relu(C[i,j] - D[i,j])",    # nested sums
])
@pytest.mark.parametrize("threads", [1, 2])
def test_generic_executor_runs_nway_sums(text, threads, rng):
    n = 9
    ops = {"A": sp.random_array((n, n), density=0.3, format="csr", rng=rng),
           "B": sp.random_array((n, n), density=0.3, format="csr", rng=rng),
           "C": sp.random_array((n, n), density=0.3, format="csc", rng=rng),
           "D": rng.standard_normal((n, n)), "E": rng.standard_normal((n, n)), "x": rng.standard_normal(n)}
    used = set(parse_program(text).inputs)
    ops = {k: v for k, v in ops.items() if k in used}
    want = dense_reference(text, {k: densify(v) for k, v in ops.items()})
    plans, tensors = plans_for(text, ops)
    last = plans["auto"].ops[-1]
    sums = [o for o in plans["auto"].ops if o.operator == "+"]
    assert sums and all(len(o.args) >= 2 for o in sums)
    assert last.operator == "+" or any(len(o.args) >= 3 for o in sums)
    got = _execute_generic(plans["auto"], tensors, threads)
    np.testing.assert_allclose(densify(got[plans["auto"].results[0]]), want, rtol=1e-12, atol=1e-12)
    for fusion in ("auto", "none", "max"):
        try:
            res = spfuse.evaluate(text, fusion=fusion, num_threads=threads, **ops)
        except spfuse.UnsupportedError:
            assert fusion == "max"
            continue
        np.testing.assert_allclose(densify(res), want, rtol=1e-12, atol=1e-12, err_msg=fusion)


# -- hypothesis: random sums of terms ---------------------------------------------

_TERMS = st.sampled_from(["S", "St", "D", "2S", "-S", "S*D", "S*S", "x", "R", "c"])


def _sum_program(kinds, signs):
    """``Z[i,j] = t0 ± t1 ± ...`` and the operands' (name, shape, sparse) it reads."""
    terms, operands_ = [], []
    kinds = ["S"] + list(kinds)  # one term indexed by both i and j
    # signs is a fixed pool of 6 draws: only the first len(kinds) - 1 are used
    for n, (kind, sign) in enumerate(zip(kinds, [False] + list(signs), strict=False)):
        a, b = f"P{n}", f"Q{n}"
        t = {"S": f"{a}[i,j]", "St": f"{a}[j,i]", "D": f"{b}[i,j]", "2S": f"2*{a}[i,j]",
             "-S": f"-{a}[i,j]", "S*D": f"{a}[i,j]*{b}[i,j]", "S*S": f"{a}[i,j]*{a}[i,j]",
             "x": f"{b}[j]", "R": f"{a}[i,{'klmnhg'[n % 6]}]*{b}[{'klmnhg'[n % 6]},j]",
             "c": "0.5"}[kind]  # (each reduction term sums its own index)
        if "P" in t:
            operands_.append((a, (4, 4) if kind != "R" else (4, 3), True))
        if "Q" in t:
            operands_.append((b, {"x": (4,), "R": (3, 4)}.get(kind, (4, 4)), False))
        terms.append(t if n == 0 else f"{'-' if sign else '+'} {t}")
    return "Z[i,j] = " + " ".join(terms), operands_


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_TERMS, min_size=1, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6),
       st.integers(0, 2**31 - 1), st.sampled_from(["csr", "csc", "coo"]), st.sampled_from([1, 2]))
def test_random_sums_match_numpy_and_stay_one_op(kinds, signs, seed, fmt, threads):
    text, spec = _sum_program(kinds, signs)
    g = np.random.default_rng(seed)
    ops = {}
    for name, shape, sparse in spec:
        if sparse and len(shape) == 2:
            ops[name] = sp.random_array(shape, density=0.4, format=fmt, rng=g)
        else:
            ops[name] = g.standard_normal(shape)
    want = dense_reference(text, {k: densify(v) for k, v in ops.items()})
    plans, tensors = plans_for(text, ops)
    final = [o for o in plans["auto"].ops if o.out == "Z"]
    assert len(final) == 1 and final[0].operator == "+" and len(final[0].args) == len(kinds) + 1
    np.testing.assert_allclose(densify(_execute_generic(plans["auto"], tensors, threads)["Z"]), want,
                               rtol=1e-10, atol=1e-10)
    for fusion in ("auto", "none"):
        got = spfuse.evaluate(text, fusion=fusion, num_threads=threads, **ops)
        np.testing.assert_allclose(densify(got), want, rtol=1e-10, atol=1e-10, err_msg=fusion)


# -- MTTKRP: the planned tree is the template's ---------------------------------------

@pytest.mark.parametrize("text", [KERNELS["MTTKRP"], "A[i,r] = X[i,j,k] * D[k,r] * C[j,r]"])
def test_mttkrp_tree_is_the_template_loop_structure(text, rng):
    ops = operands("MTTKRP", rng)
    plans, tensors = plans_for(text, ops)
    auto = plans["auto"]
    assert loop_shape(auto.tree) == MTTKRP_TREE
    t0 = auto.ops[0]
    assert t0.reduced == ("k",) and {a.name for a in t0.args} == {"X", "D"}
    assert auto.temporaries["T0"].kept == ("r",)
    assert "fibers(X; I·J)" in auto.report.cost_text and "I·K·R" not in auto.report.cost_text
    assert describe_execution(auto).startswith("template kernel 'mttkrp'")
    want = np.einsum("ijk,jr,kr->ir", ops["X"].todense(), ops["C"], ops["D"])
    np.testing.assert_allclose(densify(spfuse.evaluate(text, **ops)), want, rtol=1e-10)


def test_mttkrp_planning_without_data_and_real_tensor_shapes():
    # planning-only infos (100 x 116 x 117 CSF, 1% dense): still the inner level first
    p = plan_program(parse_program(KERNELS["MTTKRP"]), infos("MTTKRP"))
    assert loop_shape(p.tree) == MTTKRP_TREE
    assert p.associations[0].changed and "outer sparse level first" in p.associations[0].reason


def test_a_plan_with_another_tree_does_not_run_the_template(rng, monkeypatch):
    # Without the preference for the template's (concordant) tree, the text's (X·C)·D -- ReACT's
    # T0[k,r] per i -- is kept: the mttkrp template does not implement it, so the
    # generic executor runs the tree explain() shows.
    import spfuse.passes.reassociate as ra
    import spfuse.planner as planner
    monkeypatch.setattr(planner, "TEMPLATE_MARGIN", 0.0)
    monkeypatch.setattr(ra, "REASSOCIATE_MARGIN", 1e9)
    spfuse.clear_cache()
    ops = operands("MTTKRP", rng)
    plans, tensors = plans_for(KERNELS["MTTKRP"], ops)
    auto = plans["auto"]
    assert loop_shape(auto.tree) == [("i", ["reset T0", ("j", [("k", [("r", ["T0"])])]), ("k", [("r", ["A"])])])]
    assert match_template(auto) is None
    assert describe_execution(auto).startswith("generic")
    want = np.einsum("ijk,jr,kr->ir", ops["X"].todense(), ops["C"], ops["D"])
    np.testing.assert_allclose(densify(_execute_generic(auto, tensors, 1)["A"]), want, rtol=1e-10)
    spfuse.clear_cache()


def test_concordant_preference_is_a_tie_break_without_a_template():
    # X's slices dense and its modes stored in order (i, k, j): no template
    # implements this statement, so only near-ties prefer contracting the
    # stored inner level (j) first; the estimate's cheaper tree wins otherwise.
    from spfuse.ir.ops import TensorInfo
    from spfuse.passes.reassociate import CONCORDANT_MARGIN, REASSOCIATE_MARGIN
    assert CONCORDANT_MARGIN == REASSOCIATE_MARGIN
    ins = {"X": TensorInfo("X", 3, ("dense", "compressed", "compressed"), (0, 2, 1), (120, 100, 80), nnz=20000),
           "C": TensorInfo.dense("C", (100, 16)), "D": TensorInfo.dense("D", (80, 16))}
    p = plan_program(parse_program(KERNELS["MTTKRP"]), ins)
    (a,) = p.associations
    assert a.chosen == "((X·C)·D)" and p.ops[0].reduced == ("j",)   # j is X's stored inner level
    assert match_template(p) is None


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
@pytest.mark.parametrize("out", "ijk")
@pytest.mark.parametrize("threads", [1, 2])
def test_mttkrp_on_any_mode_of_a_csf_in_any_mode_order(order, out, threads, rng):
    # A CSF's levels are read as stored: the MTTKRP on its outer stored mode
    # runs 'mttkrp', on its middle one 'mttkrp_mid', on its inner one
    # 'mttkrp_inner' -- none converts X.  The results match numpy and do not
    # depend on the thread count.
    from spfuse.formats import Format
    X = np.where(rng.random((13, 9, 11)) < 0.15, rng.standard_normal((13, 9, 11)), 0.0)
    X[3] = 0.0   # an empty slice
    T = Tensor.from_numpy(X).asformat(Format.csf(order))
    factor = {"i": rng.standard_normal((13, 5)), "j": rng.standard_normal((9, 5)), "k": rng.standard_normal((11, 5))}
    a, b = (m for m in "ijk" if m != out)
    text = f"A[{out},r] = X[i,j,k] * B[{a},r] * C[{b},r]"
    kernel = spfuse.compile(text, num_threads=threads)
    got = kernel(X=T, B=factor[a], C=factor[b])
    np.testing.assert_allclose(got, np.einsum(f"ijk,{a}r,{b}r->{out}r", X, factor[a], factor[b]), rtol=1e-10)
    assert np.array_equal(got, spfuse.compile(text, num_threads=3 - threads)(X=T, B=factor[a], C=factor[b]))
    stored = "ijk"[order[0]] + "ijk"[order[1]] + "ijk"[order[2]]
    expected = {0: "template kernel 'mttkrp'", 1: "template kernel 'mttkrp_mid'", 2: "template kernel 'mttkrp_inner'"}[
        stored.index(out)]
    explained = kernel.explain(X=T, B=factor[a], C=factor[b])
    assert expected in explained
    assert "X is read in mode order" not in explained


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(order=st.permutations(range(3)), shape=st.tuples(st.integers(0, 7), st.integers(0, 6), st.integers(0, 5)),
       density=st.sampled_from([0.0, 0.3, 1.0]), kind=st.sampled_from(["ttv", "ttm", "mttkrp", "spttm"]),
       out_modes=st.permutations("ijk"), dtype=st.sampled_from([np.float64, np.float32]),
       seed=st.integers(0, 2**16))
def test_csf_templates_in_any_mode_order_match_numpy(order, shape, density, kind, out_modes, dtype, seed):
    """The CSF kernels read levels as stored: any mode order, any output
    order of the indices, zero-size modes and float32/int64 give numpy's
    result, and the same bits on 1 and 2 threads (which kernel runs depends
    on the stored order; whether one runs is not asserted).  int32/int64
    indices are covered by the kernel tests (test_template_kernels)."""
    from spfuse.formats import Format
    rng = np.random.default_rng(seed)
    X = np.where(rng.random(shape) < density, rng.standard_normal(shape), 0.0).astype(dtype)
    T = Tensor.from_numpy(X).asformat(Format.csf(tuple(order)))
    dims = dict(zip("ijk", shape, strict=True))
    a, b, c = out_modes   # c: the contracted mode (mttkrp: a is kept, b and c contracted)
    W = rng.standard_normal((dims[c], 3)).astype(dtype)
    E = rng.standard_normal((3, 2)).astype(dtype)
    V = rng.standard_normal((dims[b], 3)).astype(dtype)
    text, ops, spec = {
        "ttv": (f"A[{a},{b}] = X[i,j,k] * w[{c}]", {"w": W[:, 0].copy()}, f"ijk,{c}->{a}{b}"),
        "ttm": (f"A[{a},{b},l] = X[i,j,k] * W[{c},l]", {"W": W}, f"ijk,{c}l->{a}{b}l"),
        "mttkrp": (f"A[{a},r] = X[i,j,k] * V[{b},r] * W[{c},r]", {"V": V, "W": W}, f"ijk,{b}r,{c}r->{a}r"),
        "spttm": (f"A[{a},{b},m] = X[i,j,k] * W[{c},l] * E[l,m]", {"W": W, "E": E}, f"ijk,{c}l,lm->{a}{b}m"),
    }[kind]
    got = [spfuse.evaluate(text, X=T, **ops, num_threads=t) for t in (1, 2)]
    dense = [np.asarray(densify(g)) for g in got]
    np.testing.assert_array_equal(dense[0], dense[1])
    want = np.einsum(spec, X.astype(np.float64), *(o.astype(np.float64) for o in ops.values()))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(dense[0], want, rtol=tol, atol=tol)
