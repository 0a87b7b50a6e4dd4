"""A warm call with ``out=`` on numba device arrays allocates nothing and copies nothing, so a
CUDA graph can capture it (issue 39): the prebuilt ops and a fused function, counted at the
runtime's allocation and copy functions (``_runtime.arrays``). Numba device arrays need no
interface (so nothing synchronises on one)."""

import numpy as np
import pytest
from helpers import SIMULATED, attention_reference
from numba import cuda

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._runtime import arrays

PLACING = ("empty", "zeros", "to_device", "host_to_device", "to_host")


@tt.fuse
def gelu_residual(x, b):
    return tt.gelu(x + b) + x


def _calls():
    rng = np.random.default_rng(0)

    def dev(*shape, dtype=np.float32):
        return cuda.to_device(rng.standard_normal(shape).astype(dtype))

    x, w, b, wl, bl = dev(8, 64), dev(64), dev(64), dev(64, 32), dev(32)
    q = dev(1, 32, 16, dtype=np.float16)
    t = cuda.to_device(rng.integers(0, 64, 8))
    out_x, out_l, out_t, out_ce = dev(8, 64), dev(8, 32), dev(64, 8), dev(8)
    out_q = cuda.device_array((1, 32, 16), np.float16)
    return {
        "fused": (lambda: gelu_residual(x, b, out=out_x), out_x),
        "softmax": (lambda: ops.softmax(x, out=out_x), out_x),
        "layer_norm": (lambda: ops.layer_norm(x, w, b, out=out_x), out_x),
        "linear": (lambda: ops.linear(x, wl, bl, "gelu", out=out_l), out_l),
        "attention": (lambda: ops.attention(q, q, q, out=out_q), out_q),
        "transpose": (lambda: ops.transpose(x, out=out_t), out_t),
        "cross_entropy": (lambda: ops.cross_entropy(x, t, reduction="none", out=out_ce), out_ce),
    }


NAMES = ["attention", "cross_entropy", "fused", "layer_norm", "linear", "softmax", "transpose"]


@pytest.fixture(scope="module")
def calls():
    """Made when the first test runs (collection allocates nothing: a tier may have no GPU)."""
    made = _calls()
    assert sorted(made) == NAMES
    return made


@pytest.mark.parametrize("name", NAMES)
def test_a_warm_call_with_out_allocates_and_copies_nothing(name, calls, monkeypatch):
    call, out = calls[name]
    assert call() is out  # warm: compiled, tuned, the absent operands' placeholders made
    placed = []

    def counted(fn, original):
        def placing(*args, **kwargs):
            placed.append(fn)
            return original(*args, **kwargs)

        return placing

    for fn in PLACING:
        monkeypatch.setattr(arrays, fn, counted(fn, getattr(arrays, fn)))
    before = out.copy_to_host()
    out.copy_to_device(np.zeros_like(before))
    assert call() is out
    assert placed == [], f"{name} allocated or copied: {placed}"
    np.testing.assert_array_equal(out.copy_to_host(), before)  # the same result, written again


def test_a_transformer_block_replays_from_a_cuda_graph():
    """A pre-norm attention block on CuPy arrays, every call with ``out=`` (layer norm, the
    q, k and v projections, attention, the output projection with its bias, the residual as a
    fused function), captured once by CuPy's stream capture after a warm run (compiled, tuned,
    opted in): replaying the graph on new inputs gives NumPy's block."""
    if SIMULATED:
        pytest.skip("CUDA graphs need a GPU (the tests above count what a warm out= call does)")
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install .[cupy])")
    rng = np.random.default_rng(7)
    t, c = 64, 64
    weights = [rng.standard_normal((c, c)).astype(np.float32) / 8 for _ in range(4)]
    gain, shift, bias = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    dq, dk, dv, do = (cupy.asarray(w) for w in weights)
    dgain, dshift, dbias = (cupy.asarray(a) for a in (gain, shift, bias))
    dx = cupy.asarray(rng.standard_normal((t, c)).astype(np.float32))
    h, q, k, v, o, y, z = (cupy.empty((t, c), cupy.float32) for _ in range(7))

    def block():
        ops.layer_norm(dx, dgain, dshift, out=h)
        for w, result in ((dq, q), (dk, k), (dv, v)):
            ops.linear(h, w, out=result)
        heads = [a.reshape(1, t, c) for a in (q, k, v, o)]
        ops.attention(*heads[:3], out=heads[3])
        ops.linear(o, do, dbias, out=y)
        residual(dx, y, out=z)

    def reference(x):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        hn = (x - mu) / np.sqrt(var + 1e-5) * gain + shift
        qn, kn, vn = (hn @ w for w in weights[:3])
        on = attention_reference(qn[None], kn[None], vn[None], False, c**-0.5)[0]
        return x + on @ weights[3] + bias

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        block()
        stream.synchronize()
        stream.begin_capture()
        block()
        graph = stream.end_capture()
    for _ in range(2):  # new inputs in the same memory, then the replay
        x = rng.standard_normal((t, c)).astype(np.float32)
        dx.set(x, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_allclose(cupy.asnumpy(z), reference(x), rtol=1e-4, atol=1e-4)


@tt.fuse
def residual(x, y):
    return x + y
