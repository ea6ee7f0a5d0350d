"""The forward pass of a differentiated program, fused or statement by
statement (``spfuse.autodiff.run.run_forward``), and the example models'
gradients through the routed kernels against torch's dense autograd."""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from spfuse.autodiff import adjoint
from spfuse.autodiff import run as adrun
from spfuse.frontend.parser import parse_program

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

PROGRAM = "H[i,h] = relu(A[i,j] * X[j,f] * W[f,h]); Z[i,c] = A[i,j] * H[j,h] * V[h,c]"


def _ops(seed=0):
    rng = np.random.default_rng(seed)
    A = sp.random_array((30, 30), density=0.2, format="csr", rng=rng)
    return {"A": A, "X": rng.standard_normal((30, 5)), "W": rng.standard_normal((5, 4)),
            "V": rng.standard_normal((4, 3))}


@pytest.fixture
def forced(monkeypatch):
    """Force the measured choice one way (``forced(True)``: statement by statement)."""
    def force(split: bool):
        def measure(self, run, clock=None):
            # (an adjoint with an alternative measures (shared, split) ways: its own program is forced)
            self.way = split if self.ways == (False, True) else (False, split)
            self.split = split
            self.seconds = {w: 0.0 for w in self.ways}
            return run(self.way)
        monkeypatch.setattr(adrun.ExecutionChoice, "measure", measure)
        adrun._choices.clear()
    yield force
    adrun._choices.clear()


@pytest.mark.parametrize("split", [False, True])
def test_both_ways_give_the_results_and_the_kept_temporaries(forced, split):
    forced(split)
    program = parse_program(PROGRAM)
    adj = adjoint(program, ("W", "V"), ("Z",), frozenset({"A"}), "keep")
    ops = _ops()
    results, saved = adrun.run_forward(program, adj, ops)
    A = ops["A"].toarray()
    H = np.maximum(A @ ops["X"] @ ops["W"], 0.0)
    np.testing.assert_allclose(results["Z"], A @ H @ ops["V"], rtol=1e-12, atol=1e-12)
    assert set(saved) == set(adj.kept) and "H" in saved
    np.testing.assert_allclose(saved["H"], H, rtol=1e-12, atol=1e-12)
    _, only_saved = adrun.run_forward(program, adj, ops, results=False)
    np.testing.assert_array_equal(only_saved["H"], saved["H"])


def test_the_measured_way_is_kept_and_repeats_bit_identically():
    adrun._choices.clear()
    program = parse_program(PROGRAM)
    adj = adjoint(program, ("W", "V"), ("Z",), frozenset({"A"}), "keep")
    ops = _ops(1)
    first = adrun.run_forward(program, adj, ops)
    choices = [c for key, c in adrun._choices.items() if key[0] == adj.saving_program()]
    assert len(choices) == 1 and choices[0].split is not None
    for _ in range(2):
        again = adrun.run_forward(program, adj, ops)
        np.testing.assert_array_equal(again[0]["Z"], first[0]["Z"])
        np.testing.assert_array_equal(again[1]["H"], first[1]["H"])


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("module", ["gcn", "autoencoder", "attention"])
def test_example_gradients_match_dense_torch(forced, module, split):
    """The three training examples' gradients, through whichever routes the
    forward and adjoint programs take now, against torch dense autograd."""
    torch = pytest.importorskip("torch")
    forced(split)
    m = importlib.import_module(f"spfuse.examples.{module}")
    if module == "gcn":
        A, y = m.graph(60, 4, 3, seed=2)
        backends, params = m.model(A, y, features=6, hidden=5)
    elif module == "autoencoder":
        backends, params = m.model(m.ratings(50, 30, 5), hidden=6)
    else:
        backends, params = m.model(m.pattern(30, 4), features=6, head=4)
    grads = {}
    for backend in ("spfuse", "dense"):
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        runs = []
        for _ in range(3):
            for v in p.values():
                v.grad = None
            backends[backend](p).backward()
            runs.append({k: v.grad.clone() for k, v in p.items()})
        for later in runs[1:]:  # calls after the first (which measures) give the same bits
            assert all(torch.equal(later[k], runs[0][k]) for k in p), backend
        grads[backend] = runs[0]
    for k in params:
        torch.testing.assert_close(grads["spfuse"][k], grads["dense"][k], rtol=1e-9, atol=1e-12)
