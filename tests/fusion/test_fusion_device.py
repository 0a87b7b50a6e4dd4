"""The device path of fused functions: device arrays in and out, interface objects, streams,
and what a call copies and allocates (counted by instrumenting numba's transfer functions)."""

import numpy as np
import pytest
from helpers import Interface
from numba import cuda

import tessera_tile as tt
from tessera_tile import sim
from tessera_tile._fusion.plan import StageKind

rng = np.random.default_rng(11)


@tt.fuse
def softmax(x):
    e = tt.exp(x - tt.max(x, axis=-1, keepdims=True))
    return e / tt.sum(e, axis=-1, keepdims=True)


@tt.fuse
def centred_total(x):
    """Two kernels (the full mean runs first), so one temporary between them."""
    return tt.sum(x - tt.mean(x))


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_device_calls_copy_nothing_and_allocate_only_results():
    x = cuda.to_device(rng.standard_normal((4, 40)).astype(np.float32))
    softmax(x), centred_total(x)  # compile outside the count
    with sim.transfers() as counts:
        y = softmax(x)
    assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": 1}
    assert type(y) is type(x)
    with sim.transfers() as counts:
        total = centred_total(x)
    # its result, the temporary mean, and each full reduction's per-block partials and ticket
    program = next(iter(centred_total._programs._entries.values()))
    partials = sum(2 for s in program.plan.stages if s.kind is StageKind.FULL)
    expected = 1 + len(program.plan.temps) + partials
    assert counts == {"to_device": 0, "copy_to_host": 0, "device_array": expected}
    host = x.copy_to_host()
    np.testing.assert_allclose(y.copy_to_host(), softmax_ref(host), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        total.copy_to_host(), np.sum(host - host.mean()), rtol=1e-4, atol=1e-4
    )


def test_host_calls_copy_exactly_the_inputs_in_and_the_results_back():
    x = rng.standard_normal((4, 40)).astype(np.float32)
    softmax(x)
    with sim.transfers() as counts:
        y = softmax(x[:, ::2])  # a strided host view is copied contiguously, once
    assert counts == {"to_device": 1, "copy_to_host": 1, "device_array": 1}
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, softmax_ref(x[:, ::2]), rtol=1e-5, atol=1e-7)


def test_interface_objects_in_give_numba_device_arrays_out():
    x = rng.standard_normal((3, 33)).astype(np.float32)
    view = cuda.to_device(x)[:, 1::2]
    y = softmax(Interface(view, stream=1))  # the legacy default stream: allowed
    assert getattr(y, "__cuda_ndarray__", False)
    np.testing.assert_allclose(y.copy_to_host(), softmax_ref(x[:, 1::2]), rtol=1e-5, atol=1e-7)


def test_out_accepts_device_arrays_and_strided_device_views():
    x = rng.standard_normal((4, 6)).astype(np.float32)
    backing = cuda.to_device(np.zeros((4, 12), np.float32))
    out = backing[:, ::2]
    result = softmax(cuda.to_device(x), out=out)
    assert result is out
    got = backing.copy_to_host()
    np.testing.assert_allclose(got[:, ::2], softmax_ref(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[:, 1::2], 0)


def test_streams_numba_raw_and_default():
    x = cuda.to_device(rng.standard_normal((2, 8)).astype(np.float32))
    ref = softmax_ref(x.copy_to_host())
    for stream in (None, 0, cuda.stream()):
        np.testing.assert_allclose(
            softmax(x, stream=stream).copy_to_host(), ref, rtol=1e-5, atol=1e-7
        )


def test_bad_device_input_is_named_before_anything_runs():
    x = np.ones((2, 8), np.float32)
    d = cuda.to_device(x)
    with pytest.raises(TypeError, match="argument 0 of softmax is a masked array"):
        softmax(Interface(d, mask=object()))
    with pytest.raises(TypeError, match="argument 0 of softmax is a masked array"):
        softmax(np.ma.masked_array(x))
    # The protocol disallows stream 0, but numba-cuda 0.30 reports it for an array bound to
    # cuda.default_stream() (int() of that stream is 0): read as the legacy default stream.
    np.testing.assert_allclose(
        softmax(Interface(d, stream=0)).copy_to_host(), softmax_ref(x), rtol=1e-5, atol=1e-7
    )
    readonly = Interface(cuda.to_device(x))
    pointer, _ = readonly.__cuda_array_interface__["data"]
    readonly.__cuda_array_interface__["data"] = (pointer, True)
    with pytest.raises(ValueError, match=r"out is read-only"):
        softmax(d, out=readonly)
    with pytest.raises(TypeError, match="stream= must be a numba stream"):
        softmax(d, stream="fast")
    with pytest.raises(ValueError, match="stream= handle must be >= 0"):
        softmax(d, stream=-1)
    with pytest.raises(ValueError, match=r"out overlaps argument 0"):
        softmax(d, out=d)


def test_zero_d_device_arrays_are_arrays():
    x = rng.standard_normal(5).astype(np.float32)
    scale = cuda.to_device(np.array(3.0, np.float32))
    y = tt.fuse(lambda x, s: x * s)(cuda.to_device(x), scale)
    np.testing.assert_allclose(y.copy_to_host(), x * np.float32(3.0), rtol=1e-6)


def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install .[cupy])")
    if not cuda.is_available() or tt._config.SIMULATED:
        pytest.skip("CuPy arrays need a GPU: run in the GPU tier")
    x = cupy.asarray(rng.standard_normal((4, 40)).astype(np.float32))
    y = softmax(x)
    assert isinstance(y, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(y), softmax_ref(cupy.asnumpy(x)), rtol=1e-5)
    stream = cupy.cuda.Stream()
    with stream:
        z = softmax(x)
    stream.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(z), cupy.asnumpy(y), rtol=0, atol=0)
