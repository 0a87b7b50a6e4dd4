"""Fused functions and ops on Dask arrays, on a real cluster, against NumPy.

Simulator tier: a ``distributed.LocalCluster`` of 2 worker processes (they inherit
``NUMBA_ENABLE_CUDASIM=1``), NumPy chunks. GPU tier: ``dask_cuda.LocalCUDACluster`` with CuPy
chunks (skipped, with the reason, without dask_cuda, CuPy or a GPU). One cluster per module.
"""

import os
import signal
import sys

import numpy as np
import pytest
from helpers import SIMULATED
from hypothesis import given, settings
from hypothesis import strategies as st

da = pytest.importorskip("dask.array", reason="dask is not installed (tessera_tile[dask])")
distributed = pytest.importorskip("distributed", reason="distributed is not installed")

import tessera_tile as tt  # noqa: E402
import tessera_tile.dask as ttd  # noqa: E402
from tessera_tile import ops  # noqa: E402

GPU_TIER = os.environ.get("TESSERA_TIER") == "gpu"
# per dtype: (rtol, atol) against float64 NumPy
TOL = {np.float32: (2e-4, 1e-6), np.float64: (1e-10, 1e-12)}
rng = np.random.default_rng(25)


def _cuda_cluster_reason():
    try:
        import cupy  # noqa: F401
        import dask_cuda  # noqa: F401
    except ImportError as e:
        return f"GPU tier needs dask_cuda and cupy: {e}"
    return None


@pytest.fixture(scope="module")
def client():
    """One cluster for the module: 2 worker processes, one thread each."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    if GPU_TIER:
        reason = _cuda_cluster_reason()
        if reason:
            print(f"\n{reason}")
            pytest.skip(reason)
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster()
    else:
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _xp():
    if GPU_TIER:
        import cupy

        return cupy
    return np


def chunked(x, chunks):
    """``x`` as a Dask array of NumPy chunks (CuPy chunks in the GPU tier)."""
    return da.from_array(_xp().asarray(x), chunks=chunks, asarray=False)


def fetch(result, client):
    """Compute on the cluster; check the chunks kept their kind; NumPy out."""
    got = client.compute(result).result()
    if GPU_TIER:
        import cupy

        assert isinstance(got, cupy.ndarray), type(got)
        return cupy.asnumpy(got)
    assert isinstance(got, np.ndarray | np.generic), type(got)
    return np.asarray(got)


def close(got, ref, dtype=np.float32):
    rtol, atol = TOL[np.dtype(dtype).type]
    assert got.shape == np.shape(ref), (got.shape, np.shape(ref))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)


def call(fn, *args, **kwargs):
    """A fused function called on Dask arrays: a lazy Dask array (the call hands them to
    ``tessera_tile.dask.apply``)."""
    got = fn(*args, **kwargs)
    assert all(isinstance(g, da.Array) for g in (got if isinstance(got, tuple) else (got,)))
    return got


def test_workers_run_in_the_simulator(client):
    if GPU_TIER:
        pytest.skip("simulator tier only")
    flags = client.run(lambda: os.environ.get("NUMBA_ENABLE_CUDASIM"))
    assert len(flags) == 2 and set(flags.values()) == {"1"}, flags
    pids = client.run(os.getpid)
    assert os.getpid() not in pids.values()  # worker processes, not threads of this one


# fused functions --------------------------------------------------------------------------


@tt.fuse
def chain(x, bias, scale):
    return tt.tanh(x * scale + bias) * tt.sigmoid(x - bias) - x


def test_elementwise_chain_broadcasts_across_chunks(client):
    x = rng.standard_normal((13, 11)).astype(np.float32)
    bias = rng.standard_normal(11).astype(np.float32)
    # bias chunked differently from x's columns: aligned before the blocks meet
    got = call(chain, chunked(x, (5, 4)), chunked(bias, (6,)), 1.5)
    assert isinstance(got, da.Array)
    ref = np.tanh(x * 1.5 + bias) / (1 + np.exp(-(x - bias))) - x
    close(fetch(got, client), ref)


def test_column_vector_broadcasts_over_column_chunks(client):
    x = rng.standard_normal((9, 12)).astype(np.float64)
    col = rng.standard_normal((9, 1)).astype(np.float64)
    fn = tt.fuse(lambda x, c: tt.exp(x - c) * 2.0)
    close(fetch(call(fn, chunked(x, (4, 5)), col), client), np.exp(x - col) * 2.0, np.float64)


REDUCTIONS = {
    "sum": (tt.sum, np.sum),
    "mean": (tt.mean, np.mean),
    "var": (tt.var, np.var),
    "std": (tt.std, np.std),
    "max": (tt.max, np.max),
    "min": (tt.min, np.min),
    "argmax": (tt.argmax, np.argmax),
    "argmin": (tt.argmin, np.argmin),
}


# Each kind of reduction (sums, moments, selections, indices) over every axis, not every
# reduction over every axis: each call is traced and generated again in the workers.
@pytest.mark.parametrize(
    ("name", "axis"),
    [("sum", None), ("sum", 1), ("mean", 0), ("var", None), ("var", 1), ("std", 0),
     ("max", 1), ("min", None), ("argmax", None), ("argmax", 1), ("argmin", 0)],
)  # fmt: skip
def test_fused_reductions_over_chunked_and_whole_axes(client, name, axis):
    x = rng.standard_normal((10, 9)).astype(np.float32)
    x[3, 4] = x[7, 1] = x.max() + 1  # a tie: the first index wins
    x[5, 2] = x[8, 8] = x.min() - 1
    ours, ref = REDUCTIONS[name]
    fn = tt.fuse(lambda x: ours(x, axis))
    # axis 0 in 3 chunks, axis 1 whole: each axis is reduced both ways across the params
    for chunks in ((4, 9), (10, 4), (3, 2)):
        got = fetch(call(fn, chunked(x, chunks)), client)
        want = ref(x.astype(np.float64), axis=axis)
        if name.startswith("arg"):
            np.testing.assert_array_equal(got, want)
        else:
            close(got, want)


@pytest.mark.parametrize("name", ["max", "argmax", "argmin", "sum"])
def test_nan_and_inf_follow_numpy_across_chunks(client, name):
    x = rng.standard_normal((6, 10)).astype(np.float32)
    x[1, 7] = np.nan
    x[1, 8] = np.nan  # two NaN in one row, in different chunks: the first wins
    x[2, 9] = np.inf
    x[3, 0] = -np.inf
    x[4, 2], x[4, 6] = np.inf, -np.inf
    ours, ref = REDUCTIONS[name]
    fn = tt.fuse(lambda x: ours(x, 1))
    got = fetch(call(fn, chunked(x, (4, 3))), client)
    want = ref(x.astype(np.float64), axis=1)
    if name.startswith("arg"):
        np.testing.assert_array_equal(got, want)
    else:
        close(got, want)


def test_logsumexp_over_chunks(client):
    x = rng.standard_normal((5, 12)).astype(np.float64) * 30
    fn = tt.fuse(lambda x: tt.logsumexp(x, axis=-1))
    m = x.max(-1)
    ref = np.log(np.exp(x - m[:, None]).sum(-1)) + m
    close(fetch(call(fn, chunked(x, (2, 5))), client), ref, np.float64)


@tt.fuse
def softmax(x):
    m = tt.max(x, axis=-1, keepdims=True)
    e = tt.exp(x - m)
    return e / tt.sum(e, axis=-1, keepdims=True)


@tt.fuse
def layer_norm(x, w, b):
    mu = tt.mean(x, axis=-1, keepdims=True)
    d = x - mu
    return d * tt.rsqrt(tt.mean(d * d, axis=-1, keepdims=True) + 1e-5) * w + b


def _softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm_ref(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


@pytest.mark.parametrize("strategy", ["rounds", "rechunk", "auto"])
@pytest.mark.parametrize("chunks", [(4, 16), (4, 5)])  # rows only; rows and the reduced axis
def test_fused_reduce_then_broadcast(client, strategy, chunks):
    x = rng.standard_normal((10, 16)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    X = chunked(x, chunks)
    close(fetch(call(softmax, X, strategy=strategy), client), _softmax_ref(x.astype(np.float64)))
    got = fetch(call(layer_norm, X, chunked(w, (chunks[1],)), b, strategy=strategy), client)
    close(got, _layer_norm_ref(x, w, b))


def test_several_results(client):
    x = rng.standard_normal((8, 6)).astype(np.float32)
    fn = tt.fuse(lambda x: (x * 2, tt.sum(x, axis=0)))
    a, s = call(fn, chunked(x, (3, 4)))
    close(fetch(a, client), x * 2.0)
    close(fetch(s, client), x.astype(np.float64).sum(0))


def test_gradients_of_a_fused_function_on_dask_arrays(client):
    """tt.vjp on Dask arrays: the forward and the pullback both chunk by chunk (rows whole),
    the same gradients as on NumPy arrays; a row-sum result's cotangent gets its axis back."""
    x = rng.standard_normal((10, 16)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    for fn, args, ct in (
        (layer_norm, (x, w, b), rng.standard_normal((10, 16)).astype(np.float32)),
        (lambda x, w: tt.sum(x * w, axis=-1), (x, w), rng.standard_normal(10).astype(np.float32)),
    ):
        want = tt.vjp(fn, *args)[1](ct)
        lazy = [chunked(a, (5, 16) if a.ndim == 2 else (16,)) for a in args]
        _, pullback = tt.vjp(fn, *lazy)
        got = pullback(chunked(ct, (5, 16) if ct.ndim == 2 else (5,)))
        for g, ref in zip(got, want, strict=True):
            assert isinstance(g, da.Array)
            close(fetch(g, client), ref)


# prebuilt ops -----------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["rounds", "rechunk"])
@pytest.mark.parametrize("chunks", [(3, 20), (5, 7)])
def test_row_ops(client, strategy, chunks):
    x = rng.standard_normal((11, 20)).astype(np.float32)
    x[2, 3] = np.inf
    x[4, :] = -np.inf
    x[6, 9] = np.nan
    x[7, 15:] = -np.inf  # a chunk of only -inf beside finite values
    w = rng.uniform(0.5, 1.5, 20).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    X = chunked(x, chunks)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        sm = _softmax_ref(x64)
        close(fetch(ttd.softmax(X, strategy=strategy), client), sm)
        close(fetch(ttd.log_softmax(X, strategy=strategy), client), np.log(sm))
    y = rng.standard_normal((11, 20)).astype(np.float32) + 100  # a large mean
    Y = chunked(y, chunks)
    got = fetch(ttd.layer_norm(Y, chunked(w, (7,)), b, strategy=strategy), client)
    close(got, _layer_norm_ref(y, w, b))
    rms = y / np.sqrt((y.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    close(fetch(ttd.rms_norm(Y, w, strategy=strategy), client), rms)


def test_softmax_over_a_leading_axis(client):
    x = rng.standard_normal((12, 5)).astype(np.float32)
    e = np.exp(x - x.max(0, keepdims=True))
    close(fetch(ttd.softmax(chunked(x, (5, 5)), axis=0), client), e / e.sum(0, keepdims=True))


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_op_reductions(client, name):
    x = rng.standard_normal((9, 10)).astype(np.float32)
    x[4, 4] = x[8, 0] = 9.0
    X = chunked(x, (4, 3))
    for axis in (None, 0, 1):
        for keepdims in (False, True):
            if name.startswith("arg") and axis is None and keepdims:
                continue  # argmax(keepdims=True) over all axes: NumPy >= 2 only
            got = fetch(getattr(ttd, name)(X, axis, keepdims), client)
            want = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
            if name.startswith("arg"):
                np.testing.assert_array_equal(got, want)
            else:
                close(got, want)
    # NumPy's result dtypes: int32 sums to int64, its mean is float64
    n = rng.integers(-50, 50, (7, 8)).astype(np.int32)
    N = chunked(n, (3, 3))
    got = fetch(ttd.sum(N, 0), client)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, n.sum(0))
    close(fetch(ttd.mean(N), client), n.mean(), np.float64)


def test_var_merge_is_sound_for_a_large_mean(client):
    x = (1e4 + rng.standard_normal((6, 64))).astype(np.float32)
    got = fetch(ttd.var(chunked(x, (6, 16)), axis=1), client)
    close(got, x.astype(np.float64).var(1))


@pytest.mark.parametrize("chunks", [(4, 12), (4, 5), (13, 5)])  # rows; rows and K; K only
def test_matmul_and_linear(client, chunks):
    x = rng.standard_normal((13, 12)).astype(np.float32)
    w = rng.standard_normal((12, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    X = chunked(x, chunks)
    W = chunked(w, (chunks[1], 6))  # N chunked too
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    close(fetch(ttd.matmul(X, W), client), x64 @ w64)
    close(fetch(ttd.linear(X, W, b, "relu"), client), np.maximum(x64 @ w64 + b, 0))
    ref = (x64 @ w64 + b) / (1 + np.exp(-(x64 @ w64 + b)))
    close(fetch(ttd.linear(X, w, b, "silu"), client), ref)


def test_mlp(client):
    x = rng.standard_normal((9, 8)).astype(np.float32)
    w1 = rng.standard_normal((8, 16)).astype(np.float32) / 3
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32) / 4
    b2 = rng.standard_normal(4).astype(np.float32)
    got = fetch(ttd.mlp(chunked(x, (4, 3)), w1, b1, w2, b2, "relu"), client)
    ref = np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2 + b2
    close(got, ref)


def test_attention_over_batch_and_head_chunks(client):
    q, k, v = (rng.standard_normal((3, 2, s, 16)).astype(np.float32) for s in (8, 12, 12))
    Q, K, V = (chunked(t, (1, 1, t.shape[2], 16)) for t in (q, k, v))
    got = fetch(ttd.attention(Q, K, V), client)
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) * 0.25
    close(got, _softmax_ref(s) @ v)


def test_cross_entropy_and_transpose(client):
    logits = rng.standard_normal((10, 7)).astype(np.float32)
    targets = rng.integers(0, 7, 10)
    targets[3] = -100
    L = chunked(logits, (4, 3))  # classes chunked: rechunked to whole rows
    lg = logits.astype(np.float64)
    loss = np.log(np.exp(lg).sum(1)) - lg[np.arange(10), np.maximum(targets, 0)]
    loss[3] = 0
    close(fetch(ttd.cross_entropy(L, targets, reduction="none"), client), loss)
    close(fetch(ttd.cross_entropy(L, targets), client), loss.sum() / 9)
    close(fetch(ttd.cross_entropy(L, targets, reduction="sum"), client), loss.sum())
    close(fetch(ttd.transpose(L), client), logits.T)


def test_apply_takes_prebuilt_ops(client):
    x = rng.standard_normal((6, 9)).astype(np.float32)
    got = fetch(ttd.apply(ops.softmax, chunked(x, (2, 9))), client)
    close(got, _softmax_ref(x.astype(np.float64)))


def test_ops_and_tt_functions_take_dask_arrays_as_fused_functions_do(client):
    # ops.layer_norm(dask_array) is ttd.layer_norm; tt.exp(dask_array) a fused function's apply
    x = rng.standard_normal((6, 9)).astype(np.float32)
    lazy = ops.layer_norm(chunked(x, (2, 9)))
    assert type(lazy).__module__.startswith("dask."), type(lazy)
    close(fetch(lazy, client), fetch(ttd.layer_norm(chunked(x, (2, 9))), client))
    close(fetch(ops.sum(chunked(x, (2, 3)), axis=0), client), x.sum(0))
    close(fetch(tt.exp(chunked(x, (2, 3))), client), np.exp(x))
    with pytest.raises(ValueError, match="out= and stream= are not taken"):
        ops.softmax(chunked(x, (2, 9)), out=np.empty_like(x))


# chunkings drawn by hypothesis --------------------------------------------------------------


@st.composite
def chunkings(draw):
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(2, 12))
    rc = draw(st.integers(1, rows))  # chunks of 1 included; an uneven last chunk most often
    cc = draw(st.integers(1, cols))
    return (rows, cols), (rc, cc)


@settings(max_examples=5, deadline=None)
@given(chunkings())
def test_drawn_chunkings(client, case):
    shape, chunks = case
    x = np.random.default_rng(sum(shape + chunks)).standard_normal(shape).astype(np.float32)
    X = chunked(x, chunks)
    x64 = x.astype(np.float64)
    close(fetch(call(softmax, X), client), _softmax_ref(x64))
    close(fetch(ttd.sum(X, 0), client), x64.sum(0))
    close(fetch(ttd.std(X, 1, ddof=1), client), x64.std(1, ddof=1) if shape[1] > 1 else np.nan)
    np.testing.assert_array_equal(fetch(ttd.argmax(X), client), np.argmax(x))


# explain ----------------------------------------------------------------------------------


def test_explain_row_chunks_move_nothing_between_chunks():
    X = da.zeros((64, 32), dtype=np.float32, chunks=(16, 32))
    report = ttd.explain(softmax, X)
    assert report.bytes_between_chunks == 0 and report.minimum_between_chunks == 0
    assert len(report.per_chunk) == 1
    step, blocks, e = report.per_chunk[0]
    assert blocks == 4 and e.kernels == 1
    assert e.bytes_fused == softmax.explain(np.zeros((16, 32), np.float32)).bytes_fused
    assert report.tasks > 4 and "region" in str(report)


def test_explain_counts_the_partials_of_a_tree():
    X = da.zeros((8, 40), dtype=np.float32, chunks=(8, 10))  # 4 chunks along the reduced axis
    report = ttd.explain(ops.sum, X, axis=1)
    assert report.bytes_between_chunks == report.minimum_between_chunks == 3 * 8 * 4
    wide = da.zeros((4, 4096), dtype=np.float32, chunks=(4, 1024))
    report = ttd.explain(layer_norm, wide, np.ones(4096, np.float32), np.zeros(4096, np.float32))
    assert "rounds" in " ".join(report.decisions)
    narrow = da.zeros((256, 8), dtype=np.float32, chunks=(256, 2))  # rows of 8 in 4 chunks
    report = ttd.explain(softmax, narrow)
    assert "rechunk" in " ".join(report.decisions)


def test_explain_matmul_k_chunks():
    X = da.zeros((32, 64), dtype=np.float32, chunks=(16, 16))
    W = np.zeros((64, 8), np.float32)
    report = ttd.explain(ops.matmul, X, W)
    assert report.minimum_between_chunks == 3 * 32 * 8 * 4  # 4 K chunks: 3 partials move
    assert "tensor parallel" in " ".join(report.decisions)


# a worker dies in the middle of a computation --------------------------------------------------


def _die_once(block, marker):
    """Kill this worker's process the first time any block gets here (the marker says so)."""
    try:
        distributed.get_worker()
    except ValueError:  # not in a worker (Dask probing the function): never kill the test
        return block
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return block
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_is_replaced_and_the_result_holds(client, tmp_path):
    marker = str(tmp_path / "killed")
    x = rng.standard_normal((12, 10)).astype(np.float32)
    y = call(chain, chunked(x, (3, 5)), np.ones(10, np.float32), 2.0)
    y = y.map_blocks(_die_once, marker, dtype=y.dtype, meta=y._meta)
    total = ttd.sum(y, axis=0)
    before = set(client.scheduler_info()["workers"])
    got = fetch(total, client)
    assert os.path.exists(marker)  # a worker did die
    ref = (np.tanh(x * 2.0 + 1) / (1 + np.exp(-(x - 1))) - x).astype(np.float64).sum(0)
    close(got, ref)
    client.wait_for_workers(len(before), timeout=60)
    assert set(client.scheduler_info()["workers"]) != before  # the nanny started a new one


@pytest.mark.skipif(not SIMULATED, reason="checks the simulator tier's chunk kind")
def test_results_keep_numpy_chunks(client):
    X = chunked(rng.standard_normal((4, 4)), (2, 2))
    assert isinstance(call(chain, X, 0.0, 1.0)._meta, np.ndarray)
