"""Thread-private workspaces never share a cache line (``_kernels/_workspace.pxd``).

Two threads writing to one line slow each other down without changing any
result: mttkrp_mid's per-thread row temporaries, 512-byte malloc blocks side
by side, ran slower on two threads than on one.  These tests pin the
allocation contract that prevents it.
"""
import numpy as np
import pytest

ws = pytest.importorskip("spfuse._kernels._workspace")


def test_workspaces_are_line_aligned_whole_lines():
    sizes = [0, 1, 8, 63, 64, 65, 512, 4096 + 8]
    for (offset, span), nbytes in zip(ws._line_offsets(sizes), sizes, strict=True):
        assert offset == 0
        assert span % 64 == 0 and span >= max(nbytes, 1)


@pytest.mark.parametrize("count,item,expected", [(0, 8, 8), (1, 8, 16), (8, 8, 16), (9, 8, 24), (5, 4, 32)])
def test_padded_stride_leaves_a_line_between_threads(count, item, expected):
    stride = ws._padded_stride(count, item)
    assert stride == expected
    # any two threads' regions, wherever the shared array starts, are >= one line apart
    for start in range(0, 64, 8):
        end_first = start + count * item - 1
        begin_second = start + stride * item
        assert begin_second // 64 > end_first // 64 or count == 0


def test_mttkrp_mid_same_bits_on_one_and_two_threads():
    import spfuse
    rng = np.random.default_rng(3)
    coords = np.stack([rng.integers(0, s, 4000) for s in (30, 40, 20)])
    X = spfuse.Tensor.from_coo(coords, rng.random(4000), (30, 40, 20), format="csf")
    C, D = rng.standard_normal((30, 64)), rng.standard_normal((20, 64))
    k = spfuse.compile("A[j,r] = X[i,j,k] * C[i,r] * D[k,r]")
    with spfuse.threads(1):
        one = k(X=X, C=C, D=D)
    with spfuse.threads(2):
        two = k(X=X, C=C, D=D)
    assert np.array_equal(one, two)
    np.testing.assert_allclose(one, np.einsum("ijk,ir,kr->jr", X.todense(), C, D), rtol=1e-10, atol=1e-10)
