"""Calls on CuPy arrays and other ``__cuda_array_interface__`` objects are kept like calls on
numba device arrays (issue 39): a warm call reads each interface once into its record, skips
checking and planning, launches directly from the records' pointers (no numba device array is
made of them, so no ``cuda.as_cuda_array``), returns results of the caller's family (CuPy's
pool for CuPy arrays) and waits for an interface's producer stream only when it is not the
stream the call launches on."""

import math
import sys
import types

import numpy as np
import pytest
from helpers import SIMULATED, Interface
from numba import cuda

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._runtime import arrays, streams
from tessera_tile.fusion import FusedFunction


@tt.fuse
def gelu_residual(x, b):
    return tt.gelu(x + b) + x


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _cases(rng, wrap):
    """(name, op or fused function, call, NumPy reference) on fresh arrays wrapped by ``wrap``."""
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    wl = rng.standard_normal((64, 16)).astype(np.float32)
    t = rng.integers(0, 64, 8)
    dx, dw, db, dwl, dt = (wrap(cuda.to_device(a)) for a in (x, w, b, wl, t))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    y = x + b
    gelu = 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))  # tt.gelu is erf's
    return [
        ("fused", gelu_residual, lambda: gelu_residual(dx, db), gelu + x),
        ("softmax", ops.softmax, lambda: ops.softmax(dx), _softmax(x)),
        ("layer_norm", ops.layer_norm, lambda: ops.layer_norm(dx, dw, db),
         (x - mu) / np.sqrt(var + 1e-5) * w + b),
        ("linear", ops.linear, lambda: ops.linear(dx, dwl), x @ wl),
        ("transpose", ops.transpose, lambda: ops.transpose(dx), x.T),
        ("cross_entropy", ops.cross_entropy,
         lambda: ops.cross_entropy(dx, dt, reduction="none"), lse - x[np.arange(8), t]),
    ]  # fmt: skip


def _host(result) -> np.ndarray:
    if getattr(result, "__cuda_ndarray__", False):
        return result.copy_to_host()
    return result.device_array.copy_to_host()  # a stand-in CuPy array


def _planning(monkeypatch, fns) -> list:
    """Records the name of each op that plans and each fused function that reads its call's
    arguments (neither happens on a kept call)."""
    seen = []
    for name, fn in fns.items():
        slow = "_call" if isinstance(fn, FusedFunction) else "_plan"
        original = getattr(fn, slow)
        monkeypatch.setattr(
            fn, slow, lambda *a, n=name, f=original, **k: seen.append(n) or f(*a, **k)
        )
    return seen


def _warm_calls_are_kept(monkeypatch, wrap, result_type):
    """Three calls per case on fresh wrapped arrays: each right; the second and third run kept
    (no planning) and make no numba device array of an interface (``arrays.device_handle``)."""
    made = []
    handle = arrays.device_handle
    monkeypatch.setattr(arrays, "device_handle", lambda arg: made.append(arg) or handle(arg))
    rng = np.random.default_rng(5)
    planning = None
    for k in range(3):
        cases = _cases(rng, wrap)
        if planning is None:
            planning = _planning(monkeypatch, {name: fn for name, fn, _, _ in cases})
        for name, _, call, want in cases:
            del planning[:], made[:]
            got = call()
            assert type(got) is result_type, name
            np.testing.assert_allclose(_host(got), want, rtol=1e-5, atol=1e-5, err_msg=name)
            if k:
                assert not planning, f"{name}: a warm call on interface arrays planned again"
                assert not made, (
                    f"{name}: a warm call made numba arrays of {len(made)} interface(s)"
                )


def test_warm_calls_on_interface_arrays_are_kept(monkeypatch):
    _warm_calls_are_kept(monkeypatch, Interface, type(cuda.device_array(1)))


class ndarray(Interface):  # noqa: N801 - CuPy's name: the runtime knows CuPy by its module
    """A stand-in CuPy array over a simulator device array, on CuPy's null stream (which
    CuPy's interface reports as 1, the legacy default stream)."""

    __module__ = "cupy"

    def __init__(self, device_array):
        super().__init__(device_array, stream=1)


@pytest.mark.sim_only(reason="stands a fake module in for CuPy, which the GPU tier has")
def test_warm_calls_on_cupy_arrays_are_kept_and_give_cupy_arrays(monkeypatch):
    streams = []

    def current_stream():
        streams.append(0)
        return types.SimpleNamespace(ptr=0)  # CuPy's null stream

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(get_current_stream=current_stream)
    fake.empty = lambda shape, dtype: ndarray(cuda.device_array(shape, dtype))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    _warm_calls_are_kept(monkeypatch, ndarray, ndarray)
    assert streams, "calls on CuPy arrays run on CuPy's current stream"


def test_warm_calls_on_real_cupy_arrays_are_kept(monkeypatch):
    if SIMULATED:
        pytest.skip("CuPy arrays live on a GPU (the simulator tier runs the stand-in above)")
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install .[cupy])")
    _warm_calls_are_kept(monkeypatch, lambda d: cupy.asarray(d), cupy.ndarray)


def test_a_producer_stream_is_waited_for_unless_the_call_launches_on_it(monkeypatch):
    """The interface protocol: work on the stream an array names must be done before a launch
    reads it. A call on the default stream (the legacy default, handle 1) waits for stream 7,
    planned or kept, and not for stream 1 or for none."""
    waited = []
    monkeypatch.setattr(streams, "_synchronize", waited.append)
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    d = cuda.to_device(x)
    for fn in (ops.softmax, gelu_residual):
        args = (d,) if fn is ops.softmax else (d, d[0])
        for stream, want in ((7, [7, 7, 7]), (1, []), (None, [])):
            del waited[:]
            for _ in range(3):  # planned, then kept
                got = fn(*(Interface(a, stream=stream) for a in args))
            assert waited == want, (fn, stream)
            assert getattr(got, "__cuda_ndarray__", False)
    with pytest.raises(ValueError, match="stream must be None or a stream handle"):
        ops.softmax(Interface(d, stream="default"))
