"""Reductions over an operand's stored pattern: ``op(j in A[i,j], e)``.

Oracle: numpy, row by row over the stored entries of the pattern operand."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.errors import ProgramError
from spfuse.frontend.canonical import to_text
from spfuse.frontend.parser import parse, parse_program
from spfuse.testing import random_sparse


def over_pattern(op, A: sp.csr_array, body: np.ndarray) -> np.ndarray:
    """numpy: ``op`` of ``body[i, j]`` over the stored ``j`` of row ``i`` (0 for an empty row)."""
    A = sp.csr_array(A)
    A.sort_indices()
    out = np.zeros(A.shape[0])
    for i in range(A.shape[0]):
        cols = A.indices[A.indptr[i]:A.indptr[i + 1]]
        if len(cols):
            out[i] = {"sum": np.sum, "max": np.max, "min": np.min}[op](body[i, cols])
    return out


def test_syntax_round_trips_and_lowers():
    text = "m[i] = max(j in A[i,j], S[i,j])"
    assert to_text(parse(text)) == "m[i] = max(j in A[i, j], S[i, j])"
    assert parse(to_text(parse(text))) == parse(text)
    lowered = to_text(parse_program(text))
    assert "A[i, j] / A[i, j]" in lowered and " in " not in lowered


def test_pattern_index_must_be_in_the_pattern():
    with pytest.raises(ProgramError, match="does not appear in the pattern"):
        parse("m[i] = max(k in A[i,j], S[i,k])")
    with pytest.raises(ProgramError, match="expected '\\['"):
        parse("m[i] = max(j in A, S[i,j])")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), op=st.sampled_from(["sum", "max", "min"]),
       density=st.sampled_from([0.0, 0.2, 0.7, 1.0]), shape=st.tuples(st.integers(1, 6), st.integers(1, 6)))
def test_matches_numpy_over_stored_entries(seed, op, density, shape):
    rng = np.random.default_rng(seed)
    A = random_sparse(rng, shape, density, "csr", empty_rows=0.3)
    S = rng.standard_normal(shape) - 2.0  # mostly negative: the implicit zeros would win a plain max
    got = spfuse.evaluate(f"m[i] = {op}(j in A[i,j], S[i,j])", A=A, S=S)
    np.testing.assert_allclose(got, over_pattern(op, A, S), rtol=1e-12, atol=1e-12)


def test_body_with_implicit_contraction(rng):
    A = random_sparse(rng, (7, 5), 0.4, "csr", empty_rows=0.3)
    Q, K = rng.standard_normal((7, 3)), rng.standard_normal((5, 3))
    got = spfuse.evaluate("m[i] = max(j in A[i,j], Q[i,d] * K[j,d])", A=A, Q=Q, K=K)
    np.testing.assert_allclose(got, over_pattern("max", A, Q @ K.T), rtol=1e-12)


ATTENTION = """S[i,j] = A[i,j] * Q[i,h] * K[j,h] * 0.5
m[i] = max(j in A[i,j], S[i,j])
E[i,j] = A[i,j] * exp(S[i,j] - m[i])
Y[i,e] = E[i,j] * V[j,e] / sum(j, E[i,j])"""


def test_sparse_attention_is_one_program_matching_torch_sparse_softmax(rng):
    torch = pytest.importorskip("torch")
    import spfuse.torch as sft

    n, d = 12, 4
    A = random_sparse(rng, (n, n), 0.3, "csr", empty_rows=0.2)
    A.data[:] = 1.0
    Q, K, V = (rng.standard_normal((n, d)) for _ in range(3))
    Y = spfuse.evaluate(ATTENTION, A=A, Q=Q, K=K, V=V)
    coo = A.tocoo()
    idx = torch.from_numpy(np.stack([coo.row, coo.col]).astype(np.int64))
    Qt, Kt, Vt = (torch.tensor(x, requires_grad=True) for x in (Q, K, V))
    scores = (Qt[idx[0]] * Kt[idx[1]]).sum(1) * 0.5
    P = torch.sparse.softmax(torch.sparse_coo_tensor(idx, scores, (n, n)), dim=1)
    Yt = torch.sparse.mm(P, Vt)
    np.testing.assert_allclose(Y, Yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    # gradients through the whole layer agree with torch.sparse's autograd
    G = rng.standard_normal((n, d))
    (Yt * torch.from_numpy(G)).sum().backward()
    Qs, Ks, Vs = (torch.tensor(x, requires_grad=True) for x in (Q, K, V))
    out = sft.function(ATTENTION, A="csr")(torch.from_numpy(A.toarray()), Qs, Ks, Vs)
    (out * torch.from_numpy(G)).sum().backward()
    for mine, ref in ((Qs, Qt), (Ks, Kt), (Vs, Vt)):
        np.testing.assert_allclose(mine.grad.numpy(), ref.grad.numpy(), rtol=1e-8, atol=1e-10)
