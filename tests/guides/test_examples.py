"""Every example runs and matches NumPy (simulator tier, and GPU tier when there is a device)."""

import numpy as np
import pytest
from helpers import load_example
from hypothesis import given
from hypothesis import strategies as st


@given(n=st.sampled_from([0, 1, 31, 32, 33, 127, 128, 129, 300]), seed=st.integers(0, 2**16))
def test_elementwise_chain_matches_numpy(n, seed):
    chain = load_example("elementwise_chain")
    assert chain.run(n=n, threads=64, blocks=2, seed=seed) <= 1e-5


def test_elementwise_chain_reference_is_not_trivial():
    chain = load_example("elementwise_chain")
    a = np.array([0.5], np.float32)
    assert chain.reference(a, a, a)[0] == pytest.approx(np.tanh(0.75) / (1 + np.exp(-0.75)) - 0.5)


@given(n=st.sampled_from([0, 1, 31, 32, 33, 127, 128, 129, 300]), seed=st.integers(0, 2**16))
def test_axpy_matches_numpy(n, seed):
    axpy = load_example("axpy")
    assert axpy.run(n=n, a=-1.5, threads=64, blocks=2, seed=seed) <= 1e-5  # asserted per element


def test_fused_softmax_example_matches_numpy():
    example = load_example("fused_softmax")
    assert example.run(rows=5, cols=70) < 1e-4
    assert example.softmax.explain(example.inputs(4, 40)[0]).kernels == 1


def test_bf16_mlp_block_example_matches_numpy():
    """Four roundings to bfloat16 (the hidden activation, the second product, the residual sum,
    the output), each within 2^-8 relatively: the block within 4 * 2^-8 of float64."""
    example = load_example("bf16_mlp_block")
    assert example.BOUND == 4 * 2**-8
    assert example.run(tokens=16, width=32, hidden=64) < example.BOUND
    assert example.run(tokens=33, width=36, hidden=24, seed=1) < example.BOUND  # 72-byte rows


@pytest.mark.parametrize(("rows", "cols"), [(0, 5), (1, 1), (64, 256), (70, 300), (129, 257)])
def test_large_shared_tile_example_matches_numpy(rows, cols):
    """64 KiB of dynamic shared memory per block, opted in; panels straddling 64 x 256."""
    example = load_example("large_shared_tile")
    assert example.PANEL_BYTES > 48 * 1024
    assert example.run(rows=rows, cols=cols) == 0.0  # bit for bit, host and device


@pytest.mark.sim_only(reason="the simulator's own error type; a GPU refuses with a CUDA error")
def test_large_shared_tile_needs_the_opt_in():
    from numba import cuda

    from tessera_tile import sim

    example = load_example("large_shared_tile")
    kernel = cuda.jit(example.panel_cumsum.py_func)  # never opted in
    x = np.ones((64, 256), np.float32)
    with pytest.raises(sim.SharedMemoryError, match="without an opt-in"):
        kernel[(1, 1), example.THREADS, 0, example.PANEL_BYTES](x, np.empty_like(x))


def test_algebraic_fusion_example_matches_numpy_in_the_kernels_it_promises():
    example = load_example("algebraic_fusion")
    host = example.inputs()
    x, w, b, r, w1, w3, q, k, v, sx, sw = host
    assert example.linear_residual.explain(x, w, b, r, 0.5).kernels == 1
    assert example.gated_mlp.explain(x, w1, w3).kernels == 1
    assert example.attention.explain(q, k, v).kernels == 1
    assert example.scaled.explain(x, w, sx, sw).kernels == 1
    assert example.relu_in.explain(x, w).kernels == 1
    for _, check in example.checks():
        assert check() < 4 * 2.0**-11


def test_dask_example_matches_numpy_on_a_cluster():
    pytest.importorskip("distributed", reason="distributed is not installed (tessera_tile[dask])")
    assert load_example("dask_layer_norm").run() < 1e-5
