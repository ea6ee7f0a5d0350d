"""spfuse.dask: results equal single-node spfuse.evaluate, on the synchronous
scheduler and on a 2-process LocalCluster (so blocks, plans and partials are
serialised between processes)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("dask")
pytest.importorskip("distributed")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from dask.sizeof import sizeof  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import spfuse  # noqa: E402
import spfuse.dask as sfd  # noqa: E402
from spfuse.errors import OperandTypeError, ProgramError, UnsupportedError  # noqa: E402

SPMV = "y[i] = A[i,j] * x[j]"
SPMV_T = "y[j] = A[i,j] * x[i]"
SPMM = "C[i,k] = A[i,j] * B[j,k]"
SDDMM = "A[i,j] = B[i,j] * (C[i,k] * D[k,j])"
SDDMM_SPMM = "A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]"
GNN1 = "Z[i,j] = A[i,k] * X[k,h] * W[h,j]"
GNN2 = "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]"
MTTKRP = "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]"
SPGEMM = "C[i,k] = A[i,j] * B[j,k]"


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    # no work stealing: the transfer-cost tests compare a prediction made from
    # the placement with what moves, and a stolen task moves more (or less)
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                     dashboard_address=None, memory_limit="1GiB") as cluster, \
            distributed.Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture(params=["sync", "cluster"])
def run(request):
    """Compute a dask collection on the synchronous scheduler or the LocalCluster."""
    if request.param == "sync":
        return lambda x: dask.compute(x, scheduler="sync")[0]
    c = request.getfixturevalue("client")
    return lambda x: c.compute(x).result()


def power_law(rng, n, m, hub_row=0):
    """A CSR matrix with Zipf-like row lengths and one full hub row."""
    lengths = np.minimum(rng.zipf(1.8, n), m)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.concatenate([rng.choice(m, k, replace=False) for k in lengths]) if n else np.zeros(0, int)
    A = sp.coo_array((rng.random(len(rows)), (rows, cols)), shape=(n, m)).tocsr()
    A = A.tolil()
    A[hub_row, :] = rng.random(m)
    return sp.csr_array(A)


def dense_of(x):
    if isinstance(x, spfuse.Tensor):
        return x.todense()
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def assert_same(got, ref):
    assert type(got) is type(ref) or (isinstance(got, np.ndarray) and isinstance(ref, np.ndarray)), \
        (type(got), type(ref))
    np.testing.assert_allclose(dense_of(got), dense_of(ref), rtol=1e-12, atol=1e-12)


CHUNKINGS = {
    "irregular": (7, 1, 20, 2, 10),
    "single": (40,),
    "empty-blocks": (0, 13, 0, 0, 27, 0),
    "balanced": 4,
}


@pytest.fixture
def operands(rng):
    A = power_law(rng, 40, 30, hub_row=17)
    return {
        "A": A, "x": rng.random(30), "xi": rng.random(40), "B": rng.random((30, 5)),
        "C": rng.random((40, 3)), "D": rng.random((3, 30)),
        "Ct": rng.random((40, 3)), "Dt": rng.random((30, 3)), "E": rng.random((30, 4)),
        "X": rng.random((30, 6)), "W": rng.random((6, 2)), "Y": rng.random((40, 30)),
    }


@pytest.mark.parametrize("chunks", list(CHUNKINGS.values()), ids=list(CHUNKINGS))
@pytest.mark.parametrize("program,names", [
    (SPMV, dict(A="A", x="x")),
    (SPMM, dict(A="A", B="B")),
    (SDDMM, dict(B="A", C="C", D="D")),
    (SDDMM_SPMM, dict(B="A", C="Ct", D="Dt", E="E")),
    (GNN1, dict(A="A", X="X", W="W")),
    (SPMV_T, dict(A="A", x="xi")),
])
def test_row_partitioned_kernels_equal_single_node(run, operands, program, names, chunks):
    ops = {k: operands[v] for k, v in names.items()}
    sparse_name = next(k for k, v in ops.items() if sp.issparse(v))
    dops = dict(ops, **{sparse_name: sfd.from_scipy(ops[sparse_name], chunks=chunks)})
    got = run(sfd.evaluate(program, **dops))
    assert_same(got, spfuse.evaluate(program, **ops))


def test_gnn2_uses_a_factor_twice(run, rng):
    A = power_law(rng, 30, 30, hub_row=3)
    X, Y = rng.random((30, 4)), rng.random((4, 30))
    got = run(sfd.evaluate(GNN2, A=sfd.from_scipy(A, chunks=3), X=X, Y=Y))
    assert_same(got, spfuse.evaluate(GNN2, A=A, X=X, Y=Y))


def test_user_built_from_array_chunks(run, operands):
    A = operands["A"]
    dA = da.from_array(A, chunks=((9, 31), A.shape[1]), asarray=False)
    got = run(sfd.evaluate(SDDMM, B=dA, C=operands["C"], D=operands["D"]))
    assert_same(got, spfuse.evaluate(SDDMM, B=A, C=operands["C"], D=operands["D"]))


def test_spmatrix_flavour_is_kept(run, operands):
    A = sp.csr_matrix(operands["A"])
    got = run(sfd.evaluate(SDDMM, B=sfd.from_scipy(A, chunks=3), C=operands["C"], D=operands["D"]))
    assert isinstance(got, sp.csr_matrix)
    assert_same(got, spfuse.evaluate(SDDMM, B=A, C=operands["C"], D=operands["D"]))


def test_dense_dask_operands_follow_the_row_blocks(run, operands):
    """A dense dask factor indexed by the partitioned index is rechunked to the row blocks."""
    dC = da.from_array(operands["C"], chunks=(11, 3))
    got = run(sfd.evaluate(SDDMM, B=sfd.from_scipy(operands["A"], chunks=(5, 35)), C=dC, D=operands["D"]))
    assert_same(got, spfuse.evaluate(SDDMM, B=operands["A"], C=operands["C"], D=operands["D"]))


@pytest.mark.parametrize("factor_chunks", [(10, 10, 10), (1, 28, 1), (30,)])
def test_large_factors_partitioned_along_the_contracted_index(run, operands, factor_chunks):
    """D and E chunked along j: j is contracted-and-distributed; the hub row (17)
    touches every factor block, so boundaries fall inside it."""
    A = operands["A"]
    ops = dict(B=A, C=operands["Ct"], D=operands["Dt"], E=operands["E"])
    dops = dict(B=sfd.from_scipy(A, chunks=(10, 10, 20)), C=operands["Ct"],
                D=da.from_array(operands["Dt"], chunks=(factor_chunks, 3)),
                E=da.from_array(operands["E"], chunks=(factor_chunks, 4)))
    got = run(sfd.evaluate(SDDMM_SPMM, broadcast_bytes=0, **dops))
    assert_same(got, spfuse.evaluate(SDDMM_SPMM, **ops))


def test_spgemm_reduces_sparse_partials_and_skips_blocks_that_do_not_touch(run, rng):
    n = 48
    A = sp.block_diag([sp.random_array((12, 12), density=0.3, rng=k) for k in range(4)], format="csr")
    A = sp.csr_array(A)
    B = sp.random_array((n, 20), density=0.2, format="csr", rng=1)
    dA, dB = sfd.from_scipy(A, chunks=(12,) * 4), sfd.from_scipy(B, chunks=(12,) * 4)
    k = sfd.compile(SPGEMM)
    lay = k.layout(A=dA, B=dB)
    assert len(lay.cells) == 4  # the diagonal block pairs only, not all 16
    got = run(k(A=dA, B=dB))
    assert isinstance(got, sp.csr_array)
    assert_same(got, spfuse.evaluate(SPGEMM, A=A, B=B))
    unpruned = sfd.compile(SPGEMM, prune=False)
    assert len(unpruned.layout(A=dA, B=dB).cells) == 16
    assert_same(run(unpruned(A=dA, B=dB)), spfuse.evaluate(SPGEMM, A=A, B=B))


@pytest.mark.parametrize("split_every", [2, 3, 8])
def test_tree_reduction_fan_in(run, operands, split_every):
    A = operands["A"]
    y = sfd.evaluate(SPMV_T, A=sfd.from_scipy(A, chunks=(3, 5, 2, 9, 1, 7, 13)), x=operands["xi"],
                     split_every=split_every)
    assert_same(run(y), spfuse.evaluate(SPMV_T, A=A, x=operands["xi"]))


@pytest.mark.parametrize("chunks", [(2, 0, 3, 5), (10,), 3])
def test_mttkrp_on_tensor_slabs(run, rng, chunks):
    shape = (10, 7, 6)
    nnz = 60
    coords = np.array([rng.integers(0, s, nnz) for s in shape])
    coords[0, :20] = 4  # a hub slice
    X = spfuse.Tensor.from_coo(coords, rng.random(nnz), shape)
    C, D = rng.random((7, 3)), rng.random((6, 3))
    dX = sfd.from_tensor(X, chunks=chunks)
    got = run(sfd.evaluate(MTTKRP, X=dX, C=C, D=D))
    assert_same(got, spfuse.evaluate(MTTKRP, X=X, C=C, D=D))
    # factor C chunked along j: X's slabs are cut along mode 1 in the task, partials summed
    got = run(sfd.evaluate(MTTKRP, X=dX, C=da.from_array(C, chunks=((3, 4), 3)), D=D, broadcast_bytes=0))
    assert_same(got, spfuse.evaluate(MTTKRP, X=X, C=C, D=D))


def test_multi_statement_program_returns_every_result(run, operands):
    prog = "T[i,k] = A[i,j] * B[j,k]; Z[i,k] = relu(T[i,k]); s[k] = A[i,j] * B[j,k]"
    A, B = operands["A"], operands["B"]
    out = sfd.evaluate(prog, A=sfd.from_scipy(A, chunks=(7, 33)), B=B)
    ref = spfuse.evaluate(prog, A=A, B=B)
    assert sorted(out) == sorted(ref)
    got = run(out)
    for name in ref:
        assert_same(got[name], ref[name])


def test_float32_stays_float32(run, operands):
    A = operands["A"].astype(np.float32)
    x = operands["x"].astype(np.float32)
    got = run(sfd.evaluate(SPMV, A=sfd.from_scipy(A, chunks=3), x=x))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, spfuse.evaluate(SPMV, A=A, x=x), rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_row_chunking_gives_the_single_node_result(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n = data.draw(st.integers(1, 25))
    counts = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=6))
    cuts = sorted(min(c, n) for c in counts)
    chunks = tuple(np.diff([0, *cuts, n]).tolist())
    A = power_law(rng, n, 9, hub_row=int(rng.integers(0, n)))
    B, C, D = rng.random((9, 3)), rng.random((n, 2)), rng.random((2, 9))
    dA = sfd.from_scipy(A, chunks=chunks)
    for prog, ops in [(SPMM, dict(A=A, B=B)), (SDDMM, dict(B=A, C=C, D=D)),
                      (SPMV_T, dict(A=A, x=C[:, 0].copy()))]:
        sparse_name = "A" if "A" in ops and sp.issparse(ops["A"]) else "B"
        got = dask.compute(sfd.evaluate(prog, **dict(ops, **{sparse_name: dA})), scheduler="sync")[0]
        assert_same(got, spfuse.evaluate(prog, **ops))


# -- partitioning -------------------------------------------------------------------------------
def test_balanced_boundaries_split_work_and_isolate_hubs(rng):
    A = power_law(rng, 200, 100, hub_row=50)
    bounds = sfd.balanced_boundaries(A.indptr, 4)
    assert bounds[0] == 0 and bounds[-1] == 200 and (np.diff(bounds) > 0).all()
    work = np.diff(A.indptr[bounds] + bounds)
    assert work.max() <= (A.nnz + 200) / 4 + 100 + 1  # at most one row over the share
    assert sfd.balanced_boundaries(np.zeros(1, np.int64), 3).tolist() == [0, 0]
    with pytest.raises(ValueError, match="nblocks"):
        sfd.balanced_boundaries(A.indptr, 0)


def test_from_scipy_blocks_and_metadata(operands):
    A = operands["A"]
    dA = sfd.from_scipy(A, chunks=(10, 0, 30))
    info = sfd.block_info(dA)
    assert info.nnz == (A[:10].nnz, 0, A[10:].nnz)
    np.testing.assert_array_equal(info.columns[2][0], np.unique(A[10:].indices))
    assert (dask.compute(dA, scheduler="sync")[0] != A).nnz == 0
    with pytest.raises(ValueError, match="summing to 40"):
        sfd.from_scipy(A, chunks=(10, 10))
    with pytest.raises(TypeError, match="scipy.sparse"):
        sfd.from_scipy(A.toarray())


def test_block_info_of_a_user_built_array(operands):
    A = operands["A"]
    info = sfd.block_info(da.from_array(A, chunks=(20, 30), asarray=False))
    assert info.nnz == (A[:20].nnz, A[20:].nnz)


def test_from_mtx_and_from_npz(tmp_path, operands):
    A = operands["A"]
    spfuse.io.write_mtx(tmp_path / "a.mtx", A)
    np.testing.assert_allclose(sfd.from_mtx(tmp_path / "a.mtx", chunks=3).compute(scheduler="sync").toarray(),
                               A.toarray())
    paths = []
    for k, (lo, hi) in enumerate([(0, 15), (15, 15), (15, 40)]):
        paths.append(tmp_path / f"{k}.npz")
        sp.save_npz(paths[-1], sp.csr_array(A[lo:hi]))
    dA = sfd.from_npz(paths)
    assert dA.chunks[0] == (15, 0, 25)
    got = sfd.evaluate(SPMV, A=dA, x=operands["x"]).compute(scheduler="sync")
    np.testing.assert_allclose(got, A @ operands["x"])


# -- errors -------------------------------------------------------------------------------------
def test_bad_inputs_are_refused_on_the_client(operands):
    A = operands["A"]
    dA = sfd.from_scipy(A, chunks=3)
    with pytest.raises(OperandTypeError, match="'x'"):
        sfd.evaluate(SPMV, A=dA, x=[1.0] * 30)
    with pytest.raises(ProgramError, match="missing x"):
        sfd.evaluate(SPMV, A=dA)
    with pytest.raises(ProgramError, match="extent"):
        sfd.evaluate(SPMV, A=dA, x=np.ones(31))
    with pytest.raises(UnsupportedError, match="non-linear"):
        sfd.evaluate("y[j] = relu(A[i,j] * x[i])", A=dA, x=operands["xi"])
    with pytest.raises(UnsupportedError, match="non-linear"):
        sfd.evaluate("y[j] = A[i,j] * x[i] + b[j]", A=dA, x=operands["xi"], b=np.ones(30))
    with pytest.raises(ValueError, match="axis 0 only"):
        sfd.evaluate(SPMV, A=da.from_array(A, chunks=(20, 15), asarray=False), x=operands["x"])
    with pytest.raises(ValueError, match="split_every"):
        sfd.compile(SPMV, split_every=1)


def test_non_linear_program_is_fine_when_the_contracted_index_is_not_partitioned(operands):
    """relu(sum_j ...) over a local j is row-local: allowed."""
    A = operands["A"]
    prog = "y[i] = relu(A[i,j] * x[j])"
    got = sfd.evaluate(prog, A=sfd.from_scipy(A, chunks=3), x=operands["x"] - 0.5).compute(scheduler="sync")
    np.testing.assert_allclose(got, spfuse.evaluate(prog, A=A, x=operands["x"] - 0.5))


# -- graph structure ----------------------------------------------------------------------------
def test_graph_ships_one_plan_and_uses_no_dask_contractions(operands):
    y = sfd.evaluate(SPMV_T, A=sfd.from_scipy(operands["A"], chunks=5), x=operands["xi"])
    graph = dict(y.__dask_graph__())
    plans = [k for k in graph if isinstance(k, str) and k.startswith("spfuse-plan-")]
    assert len(plans) == 1
    names = {k[0] if isinstance(k, tuple) else k for k in graph}
    assert not any(w in n for n in names for w in ("tensordot", "einsum", "matmul", "concatenate"))
    assert any(n.startswith("spfuse-sum-") for n in names)


def test_meta_is_declared_and_never_computed_by_dask(operands, monkeypatch):
    """Building the graph calls the kernel once, on the client, on 1-extent operands."""
    calls = []
    orig = spfuse.Kernel.__call__

    def spy(self, **ops):
        calls.append({n: getattr(v, "shape", None) for n, v in ops.items()})
        return orig(self, **ops)
    monkeypatch.setattr(spfuse.Kernel, "__call__", spy)
    y = sfd.evaluate(SDDMM, B=sfd.from_scipy(operands["A"], chunks=3), C=operands["C"], D=operands["D"])
    assert calls == [{"B": (1, 1), "C": (1, 1), "D": (1, 1)}]
    assert isinstance(y._meta, sp.csr_array) and y.dtype == np.float64


# -- dask registrations ---------------------------------------------------------------------------
def test_sizeof_counts_sparse_buffers(operands):
    A = operands["A"]
    assert sizeof(A) >= A.data.nbytes + A.indices.nbytes + A.indptr.nbytes
    assert sizeof(sp.coo_array(A)) >= A.data.nbytes + 2 * A.nnz * 4
    t = spfuse.Tensor.from_scipy(A)
    assert sizeof(t) >= t.values.nbytes + t.levels[1].crd.nbytes


def test_tensor_tokenize_pickle_and_concatenate(rng):
    X = spfuse.Tensor.from_coo(np.array([[0, 1, 3], [0, 1, 2], [1, 0, 0]]), [1.0, 2.0, 3.0], (4, 3, 2))
    Y = spfuse.Tensor.from_coo(np.array([[0, 1, 3], [0, 1, 2], [1, 0, 0]]), [1.0, 2.0, 3.0], (4, 3, 2))
    Z = X.with_values([1.0, 2.0, 4.0])
    assert dask.base.tokenize(X) == dask.base.tokenize(Y) != dask.base.tokenize(Z)
    back = pickle.loads(pickle.dumps(X, protocol=5))
    np.testing.assert_array_equal(back.todense(), X.todense())
    whole = sfd.from_tensor(X, chunks=(1, 0, 3)).compute(scheduler="sync")
    assert isinstance(whole, spfuse.Tensor)
    np.testing.assert_array_equal(whole.todense(), X.todense())


def test_tensor_blocks_travel_between_processes(client, rng):
    X = spfuse.Tensor.from_coo(np.array([rng.integers(0, 5, 30) for _ in range(3)]), rng.random(30), (5, 5, 5))
    fut = client.scatter(X)
    assert client.submit(lambda t: t.nnz, fut).result() == X.nnz
    assert client.submit(lambda t: t.__dask_tokenize__()[1], fut).result() == (5, 5, 5)


# -- strategies for a contracted partitioned index --------------------------------------------------
@pytest.mark.parametrize("strategy", ["reduce", "gather", "auto"])
def test_gather_and_reduce_strategies_agree(run, rng, strategy):
    A = power_law(rng, 60, 50, hub_row=7)
    B = sp.random_array((50, 9), density=0.3, format="csr", rng=2)
    dA, dB = sfd.from_scipy(A, chunks=(20, 0, 40)), sfd.from_scipy(B, chunks=(13, 7, 30))
    assert_same(run(sfd.evaluate(SPGEMM, A=dA, B=dB, strategy=strategy)), spfuse.evaluate(SPGEMM, A=A, B=B))
    C, D, E = rng.random((60, 3)), rng.random((50, 3)), rng.random((50, 4))
    dops = dict(B=dA, C=C, D=da.from_array(D, chunks=((13, 7, 30), 3)), E=da.from_array(E, chunks=((13, 7, 30), 4)))
    got = run(sfd.evaluate(SDDMM_SPMM, strategy=strategy, broadcast_bytes=0, **dops))
    assert_same(got, spfuse.evaluate(SDDMM_SPMM, B=A, C=C, D=D, E=E))


def test_gather_fetches_only_touched_rows(rng):
    """A block-diagonal A touches one B block per row block: one row task each, no sum."""
    A = sp.csr_array(sp.block_diag([sp.random_array((10, 10), density=0.3, rng=k) for k in range(3)]))
    B = rng.random((30, 4))
    y = sfd.evaluate(SPMM, A=sfd.from_scipy(A, chunks=(10,) * 3), B=da.from_array(B, chunks=(10, 4)),
                     strategy="gather", broadcast_bytes=0)
    names = [k[0] if isinstance(k, tuple) else k for k in dict(y.__dask_graph__())]
    assert sum(n.startswith("spfuse-rows-") for n in names) == 3
    assert not any(n.startswith("spfuse-sum-") for n in names)
    np.testing.assert_allclose(y.compute(scheduler="sync"), A @ B)


def test_gather_is_refused_where_it_does_not_apply(operands):
    with pytest.raises(UnsupportedError, match="gather"):
        sfd.evaluate(SPMM, A=sfd.from_scipy(operands["A"], chunks=3), B=operands["B"], strategy="gather")
    with pytest.raises(ValueError, match="strategy"):
        sfd.compile(SPMM, strategy="fastest")


# -- communication cost model ----------------------------------------------------------------------
def test_cost_counts_a_broadcast_once_per_worker(rng):
    A = sp.random_array((400, 400), density=0.02, format="csr", rng=3)
    B = rng.random((400, 16))
    for nworkers in (2, 4, 8):
        c = sfd.cost(SPMM, nworkers=nworkers, A=sfd.from_scipy(A, chunks=(50,) * 8), B=B)
        for w in range(1, nworkers):  # every worker but B's gets B once (+ the plan, ~1 kB)
            assert 0 <= c.per_worker[w] - B.nbytes < 4096


def test_cost_prefers_gathering_touched_rows_for_a_banded_matrix(rng):
    """Each row block of a band matrix touches a few rows of its neighbours'
    blocks: gathering those rows beats shipping blocks and partial results."""
    A = sp.csr_array(sp.diags([rng.random(400 - abs(k)) for k in range(-3, 4)], list(range(-3, 4))))
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 4), B=da.from_array(rng.random((400, 32)), chunks=(100, 32)))
    gather = sfd.compile(SPMM, strategy="gather", broadcast_bytes=0).cost(nworkers=4, **ops)
    reduce = sfd.compile(SPMM, strategy="reduce", broadcast_bytes=0).cost(nworkers=4, **ops)
    assert gather.total < reduce.total
    k = sfd.compile(SPMM, broadcast_bytes=0)
    assert k.choose_strategy(k.layout(**ops)) == "gather"
    np.testing.assert_allclose(k(**ops).compute(scheduler="sync"), A @ ops["B"].compute())


def test_cost_prediction_matches_measured_transfers_for_a_broadcast(client, rng):
    """SpMM with B broadcast: B moves once to the other worker, the result
    blocks move to the worker that joins them.  Pinned where the model places
    each task (Dask's own placement weighs occupancy and varies run to run),
    the workers' transfer logs match the prediction."""
    A = sp.random_array((4000, 4000), density=0.002, format="csr", rng=5)
    dA = client.persist(sfd.from_scipy(A, chunks=(1000,) * 4))
    B = rng.random((4000, 16))
    distributed = pytest.importorskip("distributed")
    with client.as_current():
        distributed.wait(dA)
    sfd.partition._remember(dA.name, sfd.block_info(sfd.from_scipy(A, chunks=(1000,) * 4)))
    assert len(sfd.placement_of(client, [dA])) == 4
    k = sfd.compile(SPMM, nworkers=2)
    y, predicted = k.pinned(client, A=dA, B=B)
    t0 = sfd.transfer_marks(client)
    got = client.compute(y, optimize_graph=False).result()
    measured = sum(sfd.measured_transfers(client, since=t0).values())
    np.testing.assert_allclose(got, A @ B)
    assert B.nbytes <= measured and abs(predicted.total - measured) <= 0.01 * measured + 4096, \
        (predicted.total, measured)


def test_cli_wires_the_dask_suite():
    from spfuse.cli import build_parser
    args = build_parser().parse_args(["bench", "--suite", "dask", "--size", "small", "--plot", "p.png"])
    assert args.suite == "dask" and args.plot == "p.png"
    assert build_parser().parse_args(["bench"]).suite == "catalogue"


def test_dask_suite_rejects_unknown_kernels():
    from spfuse.bench.dask_suite import run_dask_suite
    with pytest.raises(ValueError, match="SDDMM"):
        run_dask_suite(kernels="SDDMM")


def test_small_dense_factors_are_broadcast_large_ones_partition(rng, operands):
    A = operands["A"]
    E = da.from_array(rng.random((30, 4)), chunks=(10, 4))
    dops = dict(B=sfd.from_scipy(A, chunks=3), C=operands["Ct"], D=operands["Dt"], E=E)
    small = sfd.compile(SDDMM_SPMM).layout(**dops)
    assert all(o.dims == (None, None) for o in small.operands if o.name == "E")
    assert not next(iter(small.classification.results.values())).contracted_dims
    large = sfd.compile(SDDMM_SPMM, broadcast_bytes=100).layout(**dops)
    assert next(iter(large.classification.results.values())).contracted_dims


def test_combine_adds_sparse_dense_and_tensor_partials():
    from spfuse.dask.combine import add_partials
    a = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0]]))
    np.testing.assert_array_equal(add_partials([a, np.ones((2, 2)), None]), a.toarray() + 1)
    assert add_partials([[None], None]) is None
    s = add_partials([a, a, sp.csr_array(np.eye(2))])
    assert isinstance(s, sp.csr_array)
    np.testing.assert_array_equal(s.toarray(), 2 * a.toarray() + np.eye(2))
    t = spfuse.Tensor.from_coo([[0, 1], [1, 0], [0, 1]], [1.0, 2.0], (2, 2, 2))
    np.testing.assert_array_equal(add_partials([t, t, t]).todense(), 3 * t.todense())


# -- broadcast or partition: a cost-model decision under a memory cap ------------------------------
def band_spmm_operands(rng, n=20000, blocks=4):
    A = sp.csr_array(sp.diags([rng.random(n - abs(k)) for k in range(-3, 4)], list(range(-3, 4))))
    B = rng.random((n, 32))
    return A, B, dict(A=sfd.from_scipy(A, chunks=(n // blocks,) * blocks),
                      B=da.from_array(B, chunks=(n // blocks, 32)))


def test_cost_model_broadcasts_a_small_factor_every_block_touches(rng):
    """Random columns: every row block touches every block of B, so partitioning
    B means a task and a partial per block pair; shipping B once per worker is cheaper."""
    A = sp.random_array((400, 400), density=0.05, format="csr", rng=1)
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 4), B=da.from_array(rng.random((400, 8)), chunks=(100, 8)))
    lay = sfd.compile(SPMM, nworkers=4).layout(**ops)
    (why,) = lay.factors
    assert why.name == "B" and why.choice == "broadcast"
    assert why.broadcast[1] < why.partition[1]  # predicted seconds
    assert next(o for o in lay.operands if o.name == "B").dims == (None, None)
    assert lay.nworkers == 4 and "B (0.02 MiB): broadcast" in sfd.compile(SPMM, nworkers=4).explain(**ops)


def test_cost_model_partitions_a_large_factor_of_a_band_matrix(run, rng):
    """A band matrix's row block reads a few rows of its neighbours' blocks of
    B: gathering them beats shipping 5 MB of B to every worker."""
    A, B, ops = band_spmm_operands(rng)
    k = sfd.compile(SPMM, nworkers=4)
    lay = k.layout(**ops)
    (why,) = lay.factors
    assert why.choice == "partition" and why.partition[1] < why.broadcast[1]
    assert why.partition[0] < why.broadcast[0] / 4
    assert next(o for o in lay.operands if o.name == "B").dims[0] is not None
    assert k.choose_strategy(lay) == "gather"
    np.testing.assert_allclose(run(k(**ops)), A @ B)
    # on one worker nothing moves: the fewer tasks of a broadcast win
    one = sfd.compile(SPMM, nworkers=1).layout(**ops)
    assert one.factors[0].choice == "broadcast" and one.factors[0].broadcast[0] == 0


def test_a_factor_over_the_memory_cap_is_never_broadcast(rng):
    A = sp.random_array((400, 400), density=0.05, format="csr", rng=1)
    B = da.from_array(rng.random((400, 8)), chunks=(100, 8))
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 4), B=B)
    lay = sfd.compile(SPMM, nworkers=4, broadcast_bytes=B.nbytes - 1).layout(**ops)
    (why,) = lay.factors
    assert why.choice == "partition" and why.broadcast is None and "memory cap" in why.reason
    assert next(o for o in lay.operands if o.name == "B").dims[0] is not None
    np.testing.assert_allclose(sfd.compile(SPMM, broadcast_bytes=B.nbytes - 1)(**ops).compute(scheduler="sync"),
                               A @ B.compute())


def test_workers_and_memory_cap_come_from_the_current_client(client):
    k = sfd.compile(SPMM)
    assert k._resources() == (1, sfd.kernel.BROADCAST_BYTES)  # no client: one process
    with client.as_current():
        assert k._resources() == (2, 2**30 // 4)  # two workers of 1 GiB: a quarter each
    assert sfd.compile(SPMM, nworkers=3, broadcast_bytes=5)._resources() == (3, 5)
    with pytest.raises(ValueError, match="nworkers"):
        sfd.compile(SPMM, nworkers=0)
    with pytest.raises(ValueError, match="broadcast_bytes"):
        sfd.compile(SPMM, broadcast_bytes=-1)


@pytest.mark.parametrize("strategy", ["reduce", "gather"])
def test_pinned_tasks_move_exactly_the_predicted_bytes(client, rng, strategy):
    """With a partitioned factor Dask's own placement (occupancy, stealing)
    decides which blocks move; pinned where the model places each task, the
    workers' transfer logs equal the prediction (up to the plan: Dask's
    sizeof counts a pickled kernel as ~56 bytes)."""
    A = power_law(rng, 2000, 2000)
    B = rng.random((2000, 16))
    k = sfd.compile(SPMM, strategy=strategy, broadcast_bytes=0)
    lay = k.layout(A=sfd.from_scipy(A, chunks=(500,) * 4), B=da.from_array(B, chunks=(500, 16)))
    ops = {o.name: client.persist(o.array) for o in lay.operands}
    distributed = pytest.importorskip("distributed")
    with client.as_current():
        distributed.wait(list(ops.values()))
    sfd.partition._remember(ops["A"].name, sfd.block_info(lay.operands[0].array))
    assert len(sfd.placement_of(client, [ops["A"]])) == 4
    y, predicted = k.pinned(client, **ops)
    assert set(predicted.placed.values()) == {0, 1}  # both workers get work
    t0 = sfd.transfer_marks(client)
    got = client.compute(y, optimize_graph=False).result()
    measured = sum(sfd.measured_transfers(client, since=t0).values())
    np.testing.assert_allclose(got, A @ B)
    assert measured > 0 and abs(predicted.total - measured) <= 0.01 * measured + 4096, (predicted.total, measured)


def test_persisted_tensor_slabs_stay_sparse(client, rng):
    """Dask gives a persisted array of Tensor slabs a numpy meta; spfuse still
    knows the operand is sparse (its block metadata) and returns the right kind."""
    shape = (40, 7, 6)
    X = spfuse.Tensor.from_coo(np.array([rng.integers(0, s, 200) for s in shape]), rng.random(200), shape)
    C, D = rng.random((7, 3)), rng.random((6, 3))
    dX = client.persist(sfd.from_tensor(X, chunks=(10,) * 4))
    assert not isinstance(dX._meta, spfuse.Tensor)
    lay = sfd.compile(MTTKRP).layout(X=dX, C=C, D=D)
    assert next(o for o in lay.operands if o.name == "X").sparse and lay.factors == ()
    assert not isinstance(dX._meta, spfuse.Tensor)  # the caller's array is not changed
    assert_same(client.compute(sfd.evaluate(MTTKRP, X=dX, C=C, D=D)).result(),
                spfuse.evaluate(MTTKRP, X=X, C=C, D=D))


def test_factors_chunked_along_one_index_are_decided_together(rng, operands):
    """D and E are both chunked along j: broadcasting one alone changes nothing
    (the other still partitions j), so both must be candidates."""
    A = power_law(rng, 400, 400)
    part = lambda k: da.from_array(rng.random((400, k)), chunks=(100, k))  # noqa: E731
    ops = dict(B=sfd.from_scipy(A, chunks=(100,) * 4), C=part(4), D=part(4), E=part(4))
    lay = sfd.compile(SDDMM_SPMM, nworkers=2).layout(**ops)
    assert {f.name for f in lay.factors} == {"D", "E"}
    assert len({f.choice for f in lay.factors}) == 1


def test_planning_decisions_and_metas_are_reused_across_calls(rng, monkeypatch):
    """The broadcast-or-partition decision (several planned graphs through the
    cost model) and the result metas (a kernel call) are made once per kind of call."""
    import importlib
    cost_module = importlib.import_module("spfuse.dask.cost")  # (spfuse.dask.cost is also the function)
    A = sp.random_array((400, 400), density=0.05, format="csr", rng=1)
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 4), B=da.from_array(rng.random((400, 8)), chunks=(100, 8)))
    k = sfd.compile(SPMM, nworkers=4)
    calls = {"decide": 0, "metas": 0}
    decide, metas = cost_module.choose_factors, k._compute_metas

    def counting_decide(*a, **kw):
        calls["decide"] += 1
        return decide(*a, **kw)

    def counting_metas(*a, **kw):
        calls["metas"] += 1
        return metas(*a, **kw)
    monkeypatch.setattr(cost_module, "choose_factors", counting_decide)
    monkeypatch.setattr(k, "_compute_metas", counting_metas)
    first = k(**ops)
    second = k(**ops)
    assert calls == {"decide": 1, "metas": 1}
    assert first.name == second.name
    k(**{**ops, "B": ops["B"] + 1})  # another factor: decided again, same kinds of metas
    assert calls == {"decide": 2, "metas": 1}
    sfd.compile(SPMM, nworkers=1)(**ops)  # another kernel (other cluster size): its own decision
    assert calls["decide"] == 3


def test_a_chunked_broadcast_factor_is_read_chunk_by_chunk_not_merged(run, rng):
    """D and E broadcast but given in row chunks: no task merges them (a merged
    copy was the largest input of every block task, so Dask ran the blocks on
    the worker holding it); each block task reads every chunk itself."""
    B = power_law(rng, 300, 300)
    C, D, E = rng.random((300, 3)), rng.random((300, 3)), rng.random((300, 4))
    ops = dict(B=sfd.from_scipy(B, chunks=(100,) * 3), C=C,
               D=da.from_array(D, chunks=(100, 3)), E=da.from_array(E, chunks=((50, 150, 100), (2, 2))))
    k = sfd.compile(SDDMM_SPMM, broadcast_bytes=2**30, nworkers=1)
    assert {f.choice for f in k.layout(**ops).factors} == {"broadcast"}
    A = k(**ops)
    graph = dict(A.__dask_graph__())
    assert not [key for key in graph if "rechunk" in str(key)]
    cells = [key for key in graph if str(key[0] if isinstance(key, tuple) else key).startswith("spfuse-block")]
    assert len(cells) == 3
    from dask.core import get_dependencies
    for cell in cells:
        deps = get_dependencies(graph, cell)
        assert {d for d in deps if d[0] == ops["D"].name} == {(ops["D"].name, c, 0) for c in range(3)}
        assert {d for d in deps if d[0] == ops["E"].name} == {(ops["E"].name, c, h) for c in range(3) for h in range(2)}
    assert_same(run(A), spfuse.evaluate(SDDMM_SPMM, B=B, C=C, D=D, E=E))


def test_chunked_broadcast_moves_each_chunk_once_per_worker(rng):
    """The model: every worker fetches each chunk it lacks once, whatever
    number of its block tasks read it."""
    A = power_law(rng, 400, 400)
    B = da.from_array(rng.random((400, 8)), chunks=(100, 8))
    k = sfd.compile(SPMM, broadcast_bytes=2**30, nworkers=2, strategy="reduce")
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 4), B=B)
    lay = k.layout(**ops)
    assert [f.choice for f in lay.factors] == ["broadcast"]
    c = k.cost(nworkers=2, finalize=False, **ops)
    chunk = 100 * 8 * 8
    moved = [(key, w) for key, w, _ in c.moved if key[0] == B.name]
    assert len(moved) == len(set(moved)) == 4  # two chunks to each worker, once each
    assert sorted(w for _, w in moved) == [0, 0, 1, 1]
    assert all(b == chunk for key, _, b in c.moved if key[0] == B.name)


def test_the_model_told_where_dask_ran_each_task_predicts_the_measured_bytes(client, rng):
    """Dask's own placement (occupancy from measured durations, its bandwidth
    estimate, work stealing) is decided at run time; given where it ran each
    task (the task stream), the model's byte count equals the transfer logs."""
    distributed = pytest.importorskip("distributed")
    A = power_law(rng, 2000, 2000)
    B = rng.random((2000, 16))
    k = sfd.compile(SPMM, strategy="reduce", broadcast_bytes=0)
    lay = k.layout(A=sfd.from_scipy(A, chunks=(500,) * 4), B=da.from_array(B + 1, chunks=(500, 16)))
    ops = {o.name: client.persist(o.array) for o in lay.operands}
    with client.as_current():
        distributed.wait(list(ops.values()))
    sfd.partition._remember(ops["A"].name, sfd.block_info(lay.operands[0].array))
    lay = k.layout(**ops)
    built = k._build(lay, "reduce")
    before = sfd.placement_of(client, [o.array for o in lay.operands])
    addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
    t0 = sfd.transfer_marks(client)
    with distributed.get_task_stream(client) as stream:
        got = client.compute(built[0], optimize_graph=False).result()
    measured = sum(sfd.measured_transfers(client, since=t0).values())
    ran = {r["key"]: addrs.index(r["worker"]) for r in stream.data}
    from spfuse.dask.cost import predict_bytes
    predicted = predict_bytes(k, lay, "reduce", before, 2, built=built, tasks_on=ran)
    np.testing.assert_allclose(got, A @ (B + 1))
    assert all(predicted.placed[key] == w for key, w in ran.items() if key in predicted.placed)
    assert abs(predicted.total - measured) <= 0.01 * measured + 4096, (predicted.total, measured)


def test_joined_chunks_are_reused_while_the_same_chunks_live():
    from spfuse.dask import blocks
    a, b = np.ones((2, 3)), np.zeros((1, 3))
    first = blocks.joined([[a], [b]])
    assert first is blocks.joined([[a], [b]])  # the second task on a worker reuses the join
    assert not first.flags.writeable and not np.shares_memory(first, a)
    c = b.copy()
    again = blocks.joined([[a], [c]])  # other chunk objects: joined anew
    assert again is not first
    np.testing.assert_array_equal(again, np.vstack([a, c]))
    key = (id(a), id(c))
    assert key in blocks._JOINED
    del c, again
    import gc
    gc.collect()
    assert key not in blocks._JOINED  # a dead chunk takes its entry with it


def _persisted(client, lay):
    """The layout's operands persisted on the cluster (sparse block metadata carried over)."""
    distributed = pytest.importorskip("distributed")
    ops = {o.name: client.persist(o.array) for o in lay.operands}
    with client.as_current():
        distributed.wait(list(ops.values()))
    for o in lay.operands:
        if o.sparse:
            sfd.partition._remember(ops[o.name].name, sfd.block_info(o.array))
    return ops


@pytest.mark.parametrize("strategy,broadcast", [("reduce", 0), ("gather", 0), ("auto", 2**30)])
def test_a_plain_call_on_a_current_client_moves_the_predicted_bytes(client, rng, strategy, broadcast):
    """Normal use -- call, then ``.compute()`` with Dask's graph optimisation --
    runs every task where the model places it, so the bytes moved are the ones
    ``cost`` predicts for the same operands on the same client."""
    distributed = pytest.importorskip("distributed")
    A = power_law(rng, 2000, 2000)
    B = rng.random((2000, 16))
    k = sfd.compile(SPMM, strategy=strategy, broadcast_bytes=broadcast)
    lay = k.layout(A=sfd.from_scipy(A, chunks=(500,) * 4), B=da.from_array(B, chunks=(500, 16)))
    ops = _persisted(client, lay)
    addrs = sorted(client.scheduler_info(n_workers=-1)["workers"])
    with client.as_current():
        y = k(**ops)
        predicted = k.cost(**ops)
        assert isinstance(y, sfd.placement.PlacedArray)
        t0 = sfd.transfer_marks(client)
        with distributed.get_task_stream(client) as stream:
            got = y.compute()
    measured = sum(sfd.measured_transfers(client, since=t0).values())
    np.testing.assert_allclose(got, A @ B)
    ran = {r["key"]: addrs.index(r["worker"]) for r in stream.data}
    assert set(predicted.placed.values()) == {0, 1}
    pinned = [key for key in ran if key in predicted.placed]
    assert len(pinned) >= 4 and all(ran[key] == predicted.placed[key] for key in pinned)
    assert measured > 0 and abs(predicted.total - measured) <= 0.01 * measured + 4096, (predicted.total, measured)


def test_pins_leave_the_callers_graph_and_derived_arrays_alone(client, rng):
    """Pinning annotates copies of the graph layers; an array derived from a
    pinned result is a plain dask array that Dask optimises and places as usual."""
    A = power_law(rng, 200, 200)
    dB = da.from_array(rng.random((200, 4)), chunks=(50, 4))
    dA = sfd.from_scipy(A, chunks=(50,) * 4)
    with client.as_current():
        y = sfd.compile(SPMM, broadcast_bytes=0)(A=dA, B=dB)
        z = (y + 1).sum(axis=1)
        assert type(z) is da.Array
        np.testing.assert_allclose(z.compute(), (A @ dB.compute() + 1).sum(axis=1))
        np.testing.assert_allclose(y.compute(optimize_graph=False), A @ dB.compute())
        assert type(sfd.compile(SPMM, pin=False)(A=dA, B=dB)) is da.Array
    strict, _ = sfd.compile(SPMM, broadcast_bytes=0).pinned(client, A=dA, B=dB)
    assert all(layer.annotations["allow_other_workers"] is False for layer in strict.dask.layers.values())
    assert all(layer.annotations is None for g in (dA.dask, dB.dask) for layer in g.layers.values())
    with pytest.raises(ValueError, match="pin=True needs a current synchronous distributed client"):
        sfd.compile(SPMM, pin=True)(A=dA, B=dB)
    with pytest.raises(ValueError, match="pin must be"):
        sfd.compile(SPMM, pin="yes")


def test_each_program_has_its_own_task_prefix():
    """Dask estimates durations per task-name prefix: two programs must not share one."""
    from dask.utils import key_split
    A = sfd.from_scipy(sp.csr_array(np.eye(4)), chunks=2)
    prefixes = set()
    for program in (SPMV, "y[i] = A[i,j] * x[j] * x[j]"):
        y = sfd.compile(program, pin=False)(A=A, x=np.ones(4))
        prefixes |= {key_split(k[0]) for k in dict(y.dask) if "block" in str(k[0])}
    assert len(prefixes) == 2 and all(p.startswith("spfuse-block-") for p in prefixes), prefixes


def test_the_strategy_is_chosen_for_the_planned_number_of_workers():
    """reduce vs gather is decided on the workers the call is planned for (it
    was decided on 2 whatever the cluster: at 64 nodes the projection took
    reduce, 3x the bytes and tasks of gather), by the network's seconds."""
    from spfuse.bench import suite
    from spfuse.dask.cost import Network, predict_bytes
    A = suite.powerlaw_matrix(1600, 1600, 4, 0)
    ops = dict(A=sfd.from_scipy(A, chunks=(100,) * 16), B=da.ones((1600, 8), chunks=(100, 8)))
    bytes_only = Network(latency=0.0, task_overhead=0.0)  # busiest worker's receive time only
    chosen = {}
    for w in (2, 8):
        k = sfd.compile(SPMM, broadcast_bytes=0, nworkers=w, network=bytes_only)
        lay = k.layout(**ops)
        busiest = {s: max(predict_bytes(k, lay, s, None, w).per_worker.values()) for s in ("reduce", "gather")}
        chosen[w] = k.choose_strategy(lay)
        assert chosen[w] == min(busiest, key=busiest.get)
        assert k.choose_strategy(lay, nworkers=2) == chosen.get(2, chosen[w])
    assert chosen == {2: "reduce", 8: "gather"}
    # with the scheduler's cost per task counted, gather's fewer tasks win on 2 workers too
    k = sfd.compile(SPMM, broadcast_bytes=0, nworkers=2)
    assert k.choose_strategy(k.layout(**ops)) == "gather"


def test_loose_pins_to_a_worker_that_left_run_elsewhere(client, rng):
    """A plain call's pins are loose: a task pinned to a worker that is gone
    (restarted under a new address) runs on another one instead of waiting;
    the strict pins of ``pinned`` are annotated as such."""
    from spfuse.dask.placement import pin
    A = power_law(rng, 100, 100)
    y = sfd.compile(SPMV, pin=False)(A=sfd.from_scipy(A, chunks=(50, 50)), x=np.ones(100))
    gone = "tcp://127.0.0.1:9"  # nothing listens there
    loose = pin(y, {key: gone for key in dict(y.dask)}, strict=False)
    np.testing.assert_allclose(client.compute(loose).result(timeout=60), A @ np.ones(100))
    strict = pin(y, {}, strict=True)
    assert all(layer.annotations["allow_other_workers"] is False for layer in strict.dask.layers.values())


def test_a_plain_call_on_operands_not_yet_on_the_cluster_moves_the_predicted_bytes(client, rng):
    """Operand blocks made by tasks of the same graph (not persisted) are pinned
    where the model puts them (row block b on worker b mod W) too."""
    A = power_law(rng, 2000, 2000)
    B = rng.random((2000, 16))
    ops = dict(A=sfd.from_scipy(A, chunks=(500,) * 4), B=da.from_array(B, chunks=(500, 16)))
    k = sfd.compile(SPMM, strategy="reduce", broadcast_bytes=0)
    with client.as_current():
        y, predicted = k(**ops), k.cost(**ops)
        t0 = sfd.transfer_marks(client)
        got = y.compute()
    measured = sum(sfd.measured_transfers(client, since=t0).values())
    np.testing.assert_allclose(got, A @ B)
    assert measured > 0 and abs(predicted.total - measured) <= 0.01 * measured + 4096, (predicted.total, measured)


def test_workers_count_the_thread_cpu_of_their_block_tasks(client, rng):
    """``block_cpu_seconds`` grows in the worker processes that ran block tasks
    (reduce and gather tasks alike), and by no more than those tasks' wall time."""
    import time as _time

    def spent(dask_worker=None):
        from spfuse.dask.blocks import block_cpu_seconds
        return block_cpu_seconds()

    A = power_law(rng, 3000, 3000)
    ops = dict(A=sfd.from_scipy(A, chunks=(750,) * 4), B=da.from_array(rng.random((3000, 16)), chunks=(750, 16)))
    for strategy in ("reduce", "gather"):
        before = client.run(spent)
        t0 = _time.perf_counter()
        client.compute(sfd.compile(SPMM, strategy=strategy, broadcast_bytes=0, pin=False)(**ops)).result()
        wall = _time.perf_counter() - t0
        grew = {w: client.run(spent)[w] - before[w] for w in before}
        assert sum(grew.values()) > 0 and all(0 <= g <= wall for g in grew.values()), (strategy, grew, wall)


def test_a_call_on_a_current_asynchronous_client_is_not_pinned(client):
    """An asynchronous client's queries return awaitables: a call made while one
    is current is left to Dask's placement (and still computes)."""
    import asyncio
    distributed = pytest.importorskip("distributed")
    A = sp.csr_array(np.eye(6))

    async def main():
        async with distributed.Client(client.scheduler.address, asynchronous=True) as ac:
            y = sfd.compile(SPMV)(A=sfd.from_scipy(A, chunks=(3, 3)), x=np.arange(6.0))
            assert type(y) is da.Array
            np.testing.assert_allclose(await ac.compute(y), np.arange(6.0))
            with pytest.raises(ValueError, match="synchronous"):
                sfd.compile(SPMV, pin=True)(A=sfd.from_scipy(A, chunks=(3, 3)), x=np.arange(6.0))
    asyncio.run(main())
