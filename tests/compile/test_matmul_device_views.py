"""The views the matmul ops launch with, built on numba-cuda's own ``DeviceNDArray`` (no
simulator, no GPU: fake device addresses, nothing is launched or dereferenced).

The simulator's device arrays wrap NumPy arrays, so two things only numba's real ones do are
checked here, both met on an H200:

* ``__cuda_array_interface__`` reports ``strides: None`` (C-contiguous) for an array whose only
  non-contiguous axes have stride 0 (``devicearray.is_contiguous`` skips them), as
  ``cuda.to_device(np.broadcast_to(x, (3, 33, 24)))`` holds: read as contiguous, its batches
  1 and 2 lay past its 3,168-byte allocation (2,106 of 3,168 results wrong);
* ``DeviceNDArray.__getitem__`` goes through numba's dummyarray: a view into an empty
  allocation (a null pointer) raises, e.g. ``[0]`` of a (2, 3, 0) array (K = 0).
"""

import numpy as np
import pytest
from numba.cuda.cudadrv import devices, driver
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from tessera_tile import TileConfig, ops
from tessera_tile._runtime import arrays

A_AT, B_AT, C_AT = 1 << 20, 1 << 24, 1 << 28  # fake device addresses, 256-byte aligned
CONFIGS = [  # (dtype, config, precision): the SIMT, tensor-core and TF32 kernels
    (np.float32, TileConfig(32, 32, 8, 1, 2), None),
    (np.float16, TileConfig(32, 32, 16, 2, 2, dtype="float16"), None),
    (np.float32, TileConfig(32, 32, 16, 1, 2, dtype="tf32"), "tf32"),
]
IDS = ["simt", "tensor cores", "tf32"]


def device(shape, strides, dtype, address):
    """A numba device array over fake memory at ``address`` (its extent, as numba sizes it)."""
    dtype = np.dtype(dtype)
    nbytes = driver.memory_size_from_info(shape, strides, dtype.itemsize)
    memory = driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), size=nbytes)
    return DeviceNDArray(shape, strides, dtype, gpu_data=memory)


def contiguous(shape, dtype, address):
    return device(shape, np.empty(shape, dtype).strides, dtype, address)


def address(view) -> int:
    return view.device_ctypes_pointer.value or 0


def views(plan):
    """Per launch: the (A, B, C) views a matmul call would launch with."""
    c = contiguous(plan.out_shape, plan.dtype, C_AT)
    records = list(plan.inputs().values())
    handles = [r.value for r in records] + [c]
    launches = plan.launches(records, arrays.read(c, "out"))
    return [tuple(launch.params[i].of(handles) for i in (0, 1, 3)) for launch in launches]


@pytest.mark.parametrize(("dtype", "config", "precision"), CONFIGS, ids=IDS)
def test_a_broadcast_batch_keeps_its_stride_0(dtype, config, precision):
    item = np.dtype(dtype).itemsize
    a = device((3, 33, 24), (0, 24 * item, item), dtype, A_AT)  # cuda.to_device of a broadcast
    assert a.__cuda_array_interface__["strides"] is None  # numba's report: "C-contiguous"
    b = contiguous((3, 24, 32), dtype, B_AT)
    plan = ops.matmul._plan(a, b, config=config, precision=precision)
    assert plan.a.strides == a.strides == (0, 24 * item, item)
    ((va, vb, vc),) = views(plan)
    assert va.shape == (3, 33, 24) and va.strides == a.strides and address(va) == A_AT
    assert vb.strides == b.strides and address(vb) == B_AT and address(vc) == C_AT


@pytest.mark.parametrize(("dtype", "config", "precision"), CONFIGS, ids=IDS)
def test_a_broadcast_bias_keeps_its_stride_0(dtype, config, precision):
    x, w = contiguous((5, 8), dtype, A_AT), contiguous((8, 32), dtype, B_AT)
    bias = device((32,), (0,), dtype, C_AT)
    assert bias.__cuda_array_interface__["strides"] is None
    plan = ops.linear._plan(x, w, bias, config=config, precision=precision)
    assert plan.bias.strides == (0,)


@pytest.mark.parametrize(("dtype", "config", "precision"), CONFIGS, ids=IDS)
def test_later_launches_view_past_the_first_matrices(dtype, config, precision):
    """b's stride-0 batch dimension keeps the batch (2, 3) from merging: two launches, the
    second from batch index (1, 0)."""
    item = np.dtype(dtype).itemsize
    a = contiguous((2, 3, 8, 8), dtype, A_AT)
    b = device((2, 3, 8, 12), (8 * 12 * item, 0, 12 * item, item), dtype, B_AT)
    launches = views(ops.matmul._plan(a, b, config=config, precision=precision))
    assert len(launches) == 2
    for i, (va, vb, vc) in enumerate(launches):
        assert va.shape == (3, 8, 8) and va.strides == a.strides[1:]
        assert vb.shape == (3, 8, 12) and vb.strides == b.strides[1:]
        assert address(va) == A_AT + i * a.strides[0]
        assert address(vb) == B_AT + i * b.strides[0]
        assert address(vc) == C_AT + i * 3 * 8 * 12 * item


@pytest.mark.parametrize(("dtype", "config", "precision"), CONFIGS, ids=IDS)
def test_k_zero_never_views_into_the_empty_allocation(monkeypatch, dtype, config, precision):
    # an empty DeviceNDArray asks for a context to make its null pointer: there is no GPU
    monkeypatch.setattr(devices, "get_context", lambda *args, **kwargs: None)
    a = DeviceNDArray((2, 3, 0), np.empty((2, 3, 0), dtype).strides, dtype)
    b = DeviceNDArray((0, 5), np.empty((0, 5), dtype).strides, dtype)
    with pytest.raises(RuntimeError, match="non-empty slice into empty slice"):
        a._do_getitem(0)  # numba's own indexing (its __getitem__ asks for a context first)
    ((va, vb, vc),) = views(ops.matmul._plan(a, b, config=config, precision=precision))
    assert va.shape == (2, 3, 0) and vb.shape == (2, 0, 5) and vc.shape == (2, 3, 5)
    assert address(vc) == C_AT
