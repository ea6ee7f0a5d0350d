"""What keeps a backward pass near its forward's cost (issue 15's backward
target): the adjoint programs' statements reach the same fast paths as
forward programs.

Every program is checked against numpy on densified operands (so a faster
path that changes the numbers fails here) and checked to take the path it
is written for (so the test exercises it)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.api import _cached_plan, _info
from spfuse.lowering.groups import _subplan, split_groups
from spfuse.tensor import Tensor, as_tensor
from spfuse.testing import dense_reference


def _csf(rng, shape, density):
    dense = np.where(rng.random(shape) < density, rng.uniform(0.1, 1.0, shape), 0.0)
    return Tensor.from_numpy(dense, "csf")


def _on_fibres(B, extent, rng):
    """A (compressed, compressed, dense) tensor on B's (i,j) fibres, as a
    TTM of B makes it (the cotangent of SpTTM-SpTTM lives there)."""
    return spfuse.evaluate("G[i,j,m] = B[i,j,k] * C[k,m]", B=B, C=rng.random((B.shape[2], extent)))


def _plan(text, **ops):
    from spfuse.frontend.parser import parse_program
    tensors = {n: as_tensor(v, name=n) for n, v in ops.items()}
    return _cached_plan(parse_program(text), {n: _info(n, t) for n, t in tensors.items()}, "auto")


# -- a temporary crossing from a generic group to a later one is stored dense

CROSSING = "T[k,l] = sum(i, j, sum(m, G[i,j,m] * D[l,m]) * B[i,j,k])"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(i=st.integers(1, 6), j=st.integers(1, 6), k=st.integers(1, 7), m=st.integers(1, 5), l=st.integers(1, 5),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 16))
def test_a_crossing_temporary_under_a_sparse_mask_matches_numpy(i, j, k, m, l, density, seed):
    rng = np.random.default_rng(seed)
    B = _csf(rng, (i, j, k), density)
    G, D = _on_fibres(B, m, rng), rng.random((l, m))
    got = spfuse.evaluate(CROSSING, G=G, D=D, B=B)
    np.testing.assert_allclose(np.asarray(got), dense_reference(CROSSING, {"G": G.todense(), "D": D,
                                                                             "B": B.todense()}), atol=1e-12)


def test_a_crossing_temporary_is_stored_dense_by_the_group_making_it():
    rng = np.random.default_rng(0)
    B = _csf(rng, (6, 5, 8), 0.3)
    G, D = _on_fibres(B, 4, rng), rng.random((3, 4))
    plan = _plan(CROSSING, G=G, D=D, B=B)
    groups = split_groups(plan)
    assert [g.kernel for g in groups] == ["generic", "gemm"]   # (the case this test is about)
    crossing = groups[0].outputs[0]
    assert crossing not in plan.results
    assert all(lv == "dense" for lv in _subplan(plan, groups[0]).formats[crossing].levels)
