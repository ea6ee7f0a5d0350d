"""The pass that decides which access iterates each sparse loop
(:mod:`spfuse.passes.mask_drivers`), and the planner's use of it: a plan
whose propagated masks cannot all be iterated exactly is planned without
propagation, never re-planned after a lowering failure."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import spfuse
from spfuse import planner
from spfuse.frontend.parser import parse_program
from spfuse.ir.ops import TensorInfo
from spfuse.ir.tree import Loop, iter_nodes
from spfuse.lowering.looptree import lower_to_looptree
from spfuse.passes.mask_drivers import MaskDrivers, atom_bindings, storage_of
from spfuse.planner import plan_program
from spfuse.testing import dense_reference, densify


def _csr(name, shape, mode_order=(0, 1), nnz=40):
    return TensorInfo(name, 2, ("dense", "compressed"), mode_order, shape, nnz=nnz)


def _drivers(plan, strict):
    return MaskDrivers(plan.tree, plan.atom_bindings, plan.atoms, storage_of(plan.inputs), strict)


def test_sddmm_is_driven_by_its_sparse_operand_at_the_inner_loop():
    ins = {"B": _csr("B", (8, 9)), "C": TensorInfo.dense("C", (8, 4)), "D": TensorInfo.dense("D", (4, 9))}
    plan = plan_program(parse_program("A[i,j] = B[i,j] * (C[i,k] * D[k,j])"), ins)
    drivers = _drivers(plan, strict=True)
    assert plan.propagated and drivers.undriven(plan.temporaries) == []
    outer = plan.tree.children[0]
    assert drivers.iteration(outer, frozenset()) == ("dense", ())
    inner = next(n for n in iter_nodes(plan.tree) if isinstance(n, Loop) and not n.mask.is_true)
    kind, (driver,) = drivers.iteration(inner, frozenset({id(outer)}))
    assert kind == "intersect" and driver.ref.name == "B" and driver.order == (0, 1)
    # the outer loop not bound: B's row is unknown there, so nothing drives j
    assert drivers.iteration(inner, frozenset()) is None


def test_an_operand_read_against_its_storage_order_drives_only_through_a_copy():
    """``A[i,j] * B[j,i]`` with both CSR: one of them is read transposed,
    so its mask has no exact driver.  Strict (propagated), the planner
    drops propagation and says which mask; not strict, the transposed
    copy drives the loop (a superset is safe there)."""
    ins = {"A": _csr("A", (6, 5)), "B": _csr("B", (5, 6))}
    program = parse_program("C[i,j] = A[i,j] * B[j,i]")
    unpropagated = plan_program(program, ins, propagate=False)
    assert not unpropagated.propagated
    token = planner._restoring.set(True)   # the loop-order choice alone, before storage orders
    try:
        raw = plan_program(program, ins)
    finally:
        planner._restoring.reset(token)
    assert not raw.propagated
    assert len(raw.notes) == 1 and "no access iterates the propagated mask" in raw.notes[0]
    # auto's own plan reads one operand converted per call instead: every mask driven
    auto = plan_program(program, ins)
    assert auto.propagated and any("converted per call" in d for d in auto.decisions)
    # B stored column-major: both read in storage order, each mask driven exactly
    with_masks = plan_program(program, {**ins, "B": _csr("B", (5, 6), (1, 0))})
    assert with_masks.propagated
    drivers = _drivers(unpropagated, strict=False)
    inner = [n for n in iter_nodes(unpropagated.tree) if isinstance(n, Loop) and not n.mask.is_true]
    assert inner and all(drivers.iteration(n, frozenset({id(unpropagated.tree.children[0])})) is not None
                         for n in inner)


def test_atom_bindings_follow_the_mask_through_a_temporary():
    """SDDMM written with its dense product as a temporary ``T[p,q]``:
    propagation restricts ``T`` to ``B``'s pattern, and ``B``'s modes are
    ``T``'s ``(p, q)`` through the statement that reads both."""
    ins = {"B": _csr("B", (8, 9)), "C": TensorInfo.dense("C", (8, 4)), "D": TensorInfo.dense("D", (4, 9))}
    plan = plan_program(parse_program("T[p,q] = C[p,k] * D[k,q]; A[i,j] = B[i,j] * T[i,j]"), ins)
    assert atom_bindings(plan.ops, plan.masks, plan.atoms) == plan.atom_bindings == {
        (0, "B_j"): ("p", "q"), (1, "B_j"): ("i", "j")}
    assert plan.propagated and _drivers(plan, strict=True).undriven(plan.temporaries) == []


@pytest.mark.parametrize("b_order", ["csr", "csc"])
def test_a_plan_without_propagation_runs_once_and_matches_numpy(b_order, monkeypatch):
    """No lowering failure, no second planning: the first call plans once
    (propagation dropped by the planner where it must be), later calls
    reuse the lowering."""
    rng = np.random.default_rng(3)
    A = sp.random_array((30, 20), density=0.2, format="csr", rng=rng)
    B = sp.random_array((20, 30), density=0.3, format=b_order, rng=rng)
    text = "C[i,j] = A[i,j] * B[j,i]"
    k = spfuse.compile(text)
    plans: list = []
    replan = planner.plan_program
    monkeypatch.setattr(planner, "plan_program", lambda *a, **kw: plans.append(1) or replan(*a, **kw))
    want = dense_reference(text, {"A": A, "B": B})
    np.testing.assert_allclose(densify(k(A=A, B=B)), want, rtol=1e-13, atol=1e-13)
    first = len(plans)
    for _ in range(2):
        np.testing.assert_allclose(densify(k(A=A, B=B)), want, rtol=1e-13, atol=1e-13)
    assert len(plans) == first


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["C[i,j] = A[i,j] * B[j,i]", "y[i] = A[i,j] * B[j,i]",
                        "C[i,j] = A[i,j] * (B[j,i] + A[i,j])", "C[i,k] = A[i,j] * B[j,k] * A[i,k]",
                        "s = A[i,j] * B[j,i] * A[i,j]", "C[j,i] = relu(A[i,j]) * B[j,i]"]),
       st.sampled_from(["csr", "csc"]), st.sampled_from(["csr", "csc"]), st.floats(0.0, 0.6),
       st.integers(0, 2 ** 16))
def test_every_plan_lowers_with_the_drivers_the_planner_found(text, fa, fb, density, seed):
    """Whatever the storage orders, the lowering finds an exact driver for
    every propagated mask (it asserts so), and the answer is numpy's."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((7, 7), density=density, format=fa, rng=rng)
    B = sp.random_array((7, 7), density=density, format=fb, rng=rng)
    tensors = {"A": spfuse.as_tensor(A, name="A"), "B": spfuse.as_tensor(B, name="B")}
    infos = {n: TensorInfo(n, 2, tuple(t.format.levels), tuple(t.format.mode_order), t.shape, nnz=t.nnz)
             for n, t in tensors.items()}
    plan = plan_program(parse_program(text), infos)
    if plan.propagated:
        assert _drivers(plan, strict=True).undriven(plan.temporaries) == []
    # (an operand the plan reads in another storage order is converted to it)
    lower_to_looptree(plan, tensors)
    np.testing.assert_allclose(densify(spfuse.evaluate(text, A=A, B=B)),
                               dense_reference(text, {"A": A, "B": B}), rtol=1e-12, atol=1e-12)


def test_groups_that_lost_a_driver_run_on_the_generic_executor_and_match_torch(monkeypatch):
    """MTTKRP-GEMM's adjoint splits into template groups; one of them (the
    GEMM ``grad_E = grad_Aᵀ·A_r``) has loops whose propagated masks no
    access of its own can drive.  A template group runs on the generic
    executor when its kernel refuses the operands: such a group then
    iterates a superset of its masks (its plan not propagated), as the
    template would, and the gradients still match torch's."""
    pytest.importorskip("torch")
    import functools
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_autodiff import check_gradients

    import spfuse.lowering.groups as G
    relaxed: list = []
    subplan = G._subplan

    def spy(plan, g):
        sub = subplan(plan, g)
        if plan.propagated and not sub.propagated:
            relaxed.append(g.kernel)
        return sub
    monkeypatch.setattr(G, "_subplan", spy)
    # every template group refuses its operands: the generic executor runs it
    monkeypatch.setattr(G, "_runner", lambda plan, g: lambda env, nt: None)
    monkeypatch.setattr(G, "_bound_group", lambda plan, g, env: functools.partial(G._run_group, plan, g))
    rng = np.random.default_rng(7)
    X = np.where(rng.random((5, 4, 6)) < 0.4, rng.standard_normal((5, 4, 6)), 0.0)
    ops = {"B": spfuse.Tensor.from_numpy(X, "csf"), "C": rng.standard_normal((6, 3)),
           "D": rng.standard_normal((4, 3)), "E": rng.standard_normal((3, 2))}
    check_gradients("A[i,m] = B[i,k,l] * C[l,j] * D[k,j] * E[j,m]", ops, rng, wrt=("C", "D", "E"))
    assert "gemm" in relaxed


@pytest.mark.parametrize("name", [k.name for k in __import__("spfuse.bench.suite", fromlist=["KERNELS"]).KERNELS])
def test_every_template_group_gives_the_same_values_on_the_generic_executor(name, monkeypatch):
    """The generic executor is each template group's fallback (a kernel that
    refuses its operands): for every catalogue kernel and its adjoint, each
    template group run there matches the template."""
    import functools

    import spfuse.lowering.groups as G
    from spfuse.bench import suite
    mismatched: list = []
    template_runner = G._runner

    def both(plan, g):
        run = template_runner(plan, g)

        def compare(env, nt):
            want = run(env, nt)
            if want is None:
                return None
            got = G._run_generic(G._subplan(plan, g), env, nt)
            for out, value in want.items():
                if not np.allclose(densify(got[out]), densify(value), rtol=1e-10, atol=1e-10):
                    mismatched.append((g.kernel, out))
            return want
        return compare
    monkeypatch.setattr(G, "_runner", both)
    monkeypatch.setattr(G, "_bound_group", lambda plan, g, env: functools.partial(G._run_group, plan, g))
    kernel = suite.KERNELS_BY_NAME[name]
    size = suite.SIZES["tiny"]
    inp = suite.synthetic_inputs(size)[2 if kernel.kind == "tensor" else 0]
    ops = kernel.operands(inp, size)
    result = spfuse.evaluate(kernel.program, **ops)
    dense = tuple(n for n, v in ops.items() if isinstance(v, np.ndarray))
    if dense:
        cotangent = np.ones(np.shape(result)) if isinstance(result, np.ndarray) else result
        spfuse.vjp(kernel.program, cotangent, wrt=dense, **ops)
    assert mismatched == []


def test_explain_names_the_accesses_that_iterate_each_sparse_loop():
    rng = np.random.default_rng(2)
    B = sp.random_array((30, 20), density=0.2, format="csr", rng=rng)
    text = spfuse.compile("A[i,j] = B[i,j] * (C[i,k] * D[k,j])").explain(
        B=B, C=rng.random((30, 4)), D=rng.random((4, 20)))
    section = text.split("sparse loops (the accesses that iterate each mask, exactly: masks propagated):\n")[1]
    assert section.splitlines()[:2] == ["  i › k › j ∈ B_j: B[i,j] (S0)", "  i › j ∈ B_j: B[i,j] (S1)"]
    A = sp.random_array((20, 30), density=0.2, format="csr", rng=rng)
    text = spfuse.compile("C[i,j] = A[i,j] * B[j,i]").explain(A=A, B=B)
    assert "∈ A_j ∧ B_j: A[i,j] (S0) ∩ B[j,i] (S0)" in text   # B converted per call, both exact
