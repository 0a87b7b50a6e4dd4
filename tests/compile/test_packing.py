"""Direct launches pack each kernel's parameters as numba-cuda does: byte for byte the same
list as its ``_Kernel._prepare_args`` builds, for every kernel signature the library launches.
No GPU is needed: numba's argument preparation runs on the host, on device arrays made over
made-up pointers."""

import struct

import numpy as np
import pytest
from cases import CASES
from helpers import launch_kinds
from numba import types
from numba.core import sigutils

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile._runtime import packing

SHAPE = (3, 5, 7, 2)


def _Memory(address: int):  # noqa: N802 - stands for a memory class
    """numba-cuda's own record of device memory at ``address`` (no allocation, no GPU)."""
    from numba.cuda.cudadrv import driver

    return driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), size=1 << 12)


def _strides(ty: types.Array, shape: tuple) -> tuple:
    """C-contiguous strides, or (layout A) rows padded by one element, as a strided view."""
    itemsize = np.dtype(str(ty.dtype)).itemsize
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n + (ty.layout == "A")
    return tuple(reversed(strides))


def _values(argtypes, start: int = 0x7F00_0000_0000):
    """Per argument, a numba device array (numba's side) and our Pointer of the same memory,
    or the same scalar for both."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    theirs, ours = [], []
    for k, ty in enumerate(argtypes):
        if isinstance(ty, types.Array):
            shape = SHAPE[: ty.ndim]
            strides = _strides(ty, shape)
            address = start + 0x1000 * k + 16
            dtype = np.dtype(str(ty.dtype))
            theirs.append(DeviceNDArray(shape, strides, dtype, gpu_data=_Memory(address)))
            ours.append(packing.Pointer(address, shape, strides, dtype.itemsize))
        elif isinstance(ty, types.BaseTuple):
            t, o = _values(list(ty), start + 0x10_0000 * (k + 1))
            theirs.append(tuple(t))
            ours.append(tuple(o))
        else:
            value = {types.boolean: True, types.float16: 0.5, types.float32: 1.5}.get(ty, 2.25)
            if isinstance(ty, types.Integer):
                value = -3 if ty.signed else 7
            theirs.append(value)
            ours.append(value)
    return theirs, ours


def _bytes(params: list) -> bytes:
    """The parameters as ``cuda.core.launch`` lays them out (its ``ParamHolder``): a bool as a
    C bool, an int as an ``intptr_t``, a float as a double, a ctypes value as itself."""
    out = b""
    for p in params:
        if isinstance(p, bool | np.bool_):
            out += struct.pack("<?", bool(p))
        elif isinstance(p, int):
            out += struct.pack("<q", p)
        elif isinstance(p, float):
            out += struct.pack("<d", p)
        else:
            out += bytes(p)
    return out


def _numba_params(argtypes, values) -> list:
    from numba.cuda.dispatcher import _Kernel

    kernel = _Kernel.__new__(_Kernel)  # only its argument preparation is used
    kernel.extensions = []
    params: list = []
    for ty, value in zip(argtypes, values, strict=True):
        kernel._prepare_args(ty, value, 0, [], params)
    return params


def _argtypes(signature) -> tuple:
    """Argument types of a signature written as numba's string or given as types."""
    if isinstance(signature, str):
        return tuple(sigutils.normalize_signature(signature)[0])
    return tuple(signature)


def _library_signatures() -> dict:
    """Every signature the compile tier's cases list (the hand-written kernels, the
    examples'), then those of generated kernels: a fused row chain, a column reduction (its
    partials and ticket), a full reduction, a fused GEMM with an epilogue's tuple of extras, and
    the hand-written ops' launches (scalars of every kind they pass)."""
    found = {c.id: _argtypes(c.signature) for c in CASES}
    x = np.zeros((8, 96), np.float32)
    w = np.zeros((96, 32), np.float32)

    scaled_softmax, columns, epilogue = launch_kinds()
    r = np.zeros((8, 32), np.float32)
    total = tt.fuse(lambda x: tt.sum(x))
    calls = {
        "scaled_softmax": (scaled_softmax, (x, np.float32(2))),
        "columns": (columns, (x,)),
        "total": (total, (x,)),
        "epilogue": (epilogue, (x, w, 0.5, r)),
    }
    for name, (fn, args) in calls.items():
        for k, (_, signature, *_) in enumerate(fn.kernel_signatures(*args)):
            found[f"{name}[{k}]"] = _argtypes(signature)
    h = np.zeros((1, 2, 64, 16), np.float16)
    logits, targets = np.zeros((4, 16), np.float32), np.zeros(4, np.int64)
    plans = {
        "linear": ops.linear._plan(x, w, np.zeros(32, np.float32), "gelu"),
        "attention": ops.attention._plan(h, h, h, causal=True),
        "cross_entropy": ops.cross_entropy._plan(logits, targets, reduction="none"),
        "layer_norm_long": ops.layer_norm._plan(np.zeros((2, 16385), np.float32)),
        "transpose": ops.transpose._plan(x),
    }
    for name, plan in plans.items():
        for k, launch in enumerate(plan.report().launches):
            found[f"ops.{name}[{k}]"] = _argtypes(launch.signature)
    return found


SIGNATURES = _library_signatures()


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_packed_parameters_are_numbas_byte_for_byte(name):
    argtypes = SIGNATURES[name]
    theirs, ours = _values(argtypes)
    want = _bytes(_numba_params(argtypes, theirs))
    got = _bytes(packing.packer(argtypes)(ours))
    assert got == want, (name, argtypes)
    # and from device arrays as they are (a kept call's arguments passed whole)
    assert _bytes(packing.packer(argtypes)(theirs)) == want, name


def test_the_signatures_cover_every_kind_of_parameter():
    """The cases above hold arrays of layout C and A, every scalar kind the kernels take, and
    a tuple: a packing rule none of them exercises would go untested."""
    kinds = set()
    for argtypes in SIGNATURES.values():
        for ty in argtypes:
            for t in list(ty) if isinstance(ty, types.BaseTuple) else [ty]:
                kinds.add(("array", t.layout) if isinstance(t, types.Array) else str(t))
            kinds.add("tuple" if isinstance(ty, types.BaseTuple) else None)
    want = {("array", "C"), ("array", "A"), "float32", "float64", "int64", "bool", "tuple"}
    assert want <= kinds, sorted(map(str, kinds))


def test_a_direct_launch_calls_cuda_core_as_numba_cuda_does(monkeypatch):
    """``cuda.core.launch(stream, LaunchConfig(grid, block, shmem_size, is_cooperative),
    kernel, *params)``, as numba-cuda 0.30's ``_Kernel.launch``: checked up to the driver
    call, with the launch and the stream conversion (which need a driver) recorded."""
    from cuda.core import LaunchConfig

    from tessera_tile._runtime import compat

    calls = []
    monkeypatch.setattr(
        compat, "_core_launch", lambda: (lambda *a: calls.append(a), lambda s: ("stream", s))
    )
    compat._default_stream.cache_clear()
    try:
        kernel, params = object(), [0, 0, 12, 4, 0x7F00_0000_0010, 3, 4, 16, 4]
        compat.launch_direct((kernel, False), (2, 1, 1), (64, 1, 1), 256, "s1", params)
        compat.launch_direct((kernel, False), (1, 1, 1), (32, 1, 1), 0, 0, params)
    finally:
        compat._default_stream.cache_clear()
    (stream, config, got_kernel, *got), (default, config2, _, *_) = calls
    assert (stream, default, got_kernel, got) == (("stream", "s1"), ("stream", 0), kernel, params)
    assert isinstance(config, LaunchConfig)
    assert (config.grid, config.block, config.shmem_size) == ((2, 1, 1), (64, 1, 1), 256)
    assert config.is_cooperative is False  # (a cooperative config asks the device: GPU tier)
    assert (config2.grid, config2.block, config2.shmem_size) == ((1, 1, 1), (32, 1, 1), 0)
