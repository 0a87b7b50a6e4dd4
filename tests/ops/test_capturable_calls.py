"""A warm call with ``out=`` on numba device arrays allocates nothing and copies nothing, so a
CUDA graph can capture it (issue 39): the prebuilt ops and a fused function, counted at the
runtime's allocation and copy functions (``_runtime.arrays``). Numba device arrays need no
interface (so nothing synchronises on one)."""

import numpy as np
import pytest
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
