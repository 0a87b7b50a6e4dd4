"""Smoke tests of the private numba-cuda names in tessera_tile._runtime.compat: each exists, is the
kind of object expected and has what the simulator uses, so a numba-cuda upgrade fails here.

They hold without the simulator too (the names are importable either way), so every tier runs
them; the launch-path names are exercised for real by every other simulated test.
"""

import inspect

import numpy as np
import pytest
from helpers import SIMULATED

from tessera_tile._runtime import compat


def test_supported_range_is_the_installed_version():
    import importlib.metadata

    version = importlib.metadata.version("numba-cuda")
    low, high = compat.SUPPORTED_NUMBA_CUDA
    assert low <= tuple(int(p) for p in version.split(".")[:2]) < high
    compat._check_version()  # does not raise


def test_every_name_is_listed_and_present():
    for name in compat.__all__:
        assert hasattr(compat, name), name


def test_fake_kernel_launch_path():
    kernel = compat.FakeCUDAKernel
    assert inspect.isclass(kernel) and callable(kernel.__call__)
    params = list(inspect.signature(kernel.__init__).parameters)
    assert params[:3] == ["self", "fn", "device"]
    # engine.Launch reads these attributes of a configured kernel
    k = kernel(lambda: None, device=False)
    attrs = ("fn", "_device", "_debug", "extensions", "grid_dim", "block_dim", "dynshared_size")
    for attr in attrs:
        assert hasattr(k, attr), attr


def test_kernel_context():
    assert compat._get_kernel_context() is None  # no launch running
    marker = object()
    with compat._push_kernel_context(marker):
        assert compat._get_kernel_context() is marker
    assert compat._get_kernel_context() is None


def test_argument_hints_and_fake_arrays():
    assert issubclass(compat.InOut, compat.ArgHint)
    assert callable(compat.InOut.to_device)
    fake = compat.FakeCUDAArray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(fake._ary, np.ndarray) and fake._ary.shape == (2, 3)
    assert isinstance(fake[:, ::2], compat.FakeCUDAArray)  # strided device views stay device
    within = compat.FakeWithinKernelCUDAArray(fake)
    assert within[1, 2] == 5


def test_sentry_contiguous_is_numbas_host_array_check():
    x = np.zeros((4, 6), np.float32)
    compat.sentry_contiguous(x)
    compat.sentry_contiguous(x.T)  # Fortran order: one block too
    compat.sentry_contiguous(np.broadcast_to(np.zeros(6), (4, 6)))  # a broadcast view passes
    with pytest.raises(ValueError, match="non-contiguous buffer"):
        compat.sentry_contiguous(x[:, ::2])


def test_fake_module_pieces():
    dim = compat.Dim3(1, 2, 3)
    assert (dim.x, dim.y, dim.z) == (1, 2, 3) and tuple(dim) == (1, 2, 3)
    module = compat.FakeCUDAModule((1, 1, 1), (32, 1, 1), 0)
    for attr in ("gridDim", "blockDim", "local", "const", "fp16", "grid", "gridsize"):
        assert hasattr(module, attr), attr
    atomic = compat.FakeCUDAAtomic()
    counts = np.zeros(2, np.int32)
    assert atomic.add(counts, 1, 3) == 0 and counts[1] == 3
    local = compat.FakeCUDALocal().array((2, 3), np.float32)
    assert local.shape == (2, 3) and local.dtype == np.float32
    assert callable(compat.swapped_cuda_module)
    assert list(inspect.signature(compat.swapped_cuda_module).parameters) == [
        "fn",
        "fake_cuda_module",
    ]


def test_normalize_kernel_dimensions():
    grid, block = compat.normalize_kernel_dimensions(4, (32, 2))
    assert tuple(grid) == (4, 1, 1) and tuple(block) == (32, 2, 1)


def test_typing_and_lowering_helpers():
    from numba.core import types

    assert issubclass(compat.NumbaTypeError, Exception)
    assert callable(compat.normalize_indices)
    assert list(inspect.signature(compat.normalize_indices).parameters)[:4] == [
        "context",
        "builder",
        "indty",
        "inds",
    ]
    assert callable(compat.cgutils.get_item_pointer)
    assert compat.as_dtype(types.float32) == np.dtype(np.float32)


def test_math_typing_names():
    # sim.cuda_math reads numba-cuda's math signatures and Numba's conversion rules
    import math

    from numba.cuda import types

    registered = dict(compat.cuda_math_registry.globals)
    assert math.exp in registered and math.pow in registered
    cases = [case for template in registered[math.exp].templates for case in template.cases]
    assert types.float32 in [case.return_type for case in cases if case.args == (types.float32,)]
    check = compat.type_manager.check_compatible
    assert check(types.float32, types.float64) == compat.Conversion.promote
    assert check(types.float64, types.float32) == compat.Conversion.unsafe
    assert compat.from_dtype(np.dtype(np.float32)) == types.float32


def test_jit_and_signature_helpers():
    # engine wraps the simulator's jit where kernels find it, to keep an explicit signature
    from numba.core import types

    stock_jit = compat.JIT_MODULES[-1].jit
    assert all(callable(module.jit) for module in compat.JIT_MODULES)
    assert "func_or_sig" in inspect.signature(stock_jit).parameters
    assert compat.is_signature("void(int32)") and not compat.is_signature(len)
    argtypes, restype = compat.normalize_signature("int32(uint32, float32[:])")
    assert argtypes[0] == types.uint32 and restype == types.int32
    assert issubclass(compat.RequireLiteralValue, Exception)


def test_dummy_array_is_numba_cudas_device_array_layout():
    # sim.device_arrays indexes fake device arrays through it, as DeviceNDArray does on a GPU
    view = compat.dummy_array((4, 6), (24, 4), 4)[1:3, ::2]
    assert (view.shape, view.strides, view.is_array) == ((2, 3), (24, 8), True)
    begin, end = view.extent
    assert (begin, end) == (24, 24 + 24 + 16 + 4)
    assert [tuple(e) for e in view.iter_contiguous_extent()][0][0] == 24


def test_device_array_is_looked_up_where_the_simulator_defines_it():
    module = compat.device_array_module()
    assert callable(module.device_array)
    for namespace in compat.device_array_modules():
        assert callable(namespace.device_array), namespace


def test_kernel_options_and_device_functions():
    from numba import cuda

    @cuda.jit(device=True)
    def helper(x):
        return x

    @cuda.jit(lineinfo=True)
    def kernel(x):
        pass

    assert compat.is_device_function(helper) and not compat.is_device_function(kernel)
    assert not compat.is_device_function(lambda x: x)
    assert compat.target_options(object()) == {}
    if not SIMULATED:  # the simulator's kernels keep no options
        assert compat.target_options(kernel).get("lineinfo") is True


def test_disk_cache_methods_are_wrapped():
    calls = []

    class Cache:
        def save_overload(self, sig, data):
            calls.append(("save", sig))

        def load_overload(self, sig, ctx):
            calls.append(("load", sig))

        def flush(self):
            calls.append(("flush",))

    class Kernel:
        _cache = Cache()

    def wrap_save(save):
        return lambda sig, data: save(("wrapped", sig), data)

    def wrap_load(load, flush):
        flush()
        return lambda sig, ctx: load(("wrapped", sig), ctx)

    compat.wrap_disk_cache(Kernel, wrap_save, wrap_load)
    Kernel._cache.save_overload("s", None)
    Kernel._cache.load_overload("l", None)
    assert calls == [("flush",), ("save", ("wrapped", "s")), ("load", ("wrapped", "l"))]
    compat.wrap_disk_cache(object(), wrap_save, wrap_load)  # no cache: nothing to wrap


def test_host_memory_and_device_views():
    from numba import cuda

    d = cuda.to_device(np.arange(6, dtype=np.float32))
    if SIMULATED:
        np.testing.assert_array_equal(compat.host_memory(d), np.arange(6))
    else:  # a view from the pointer, 8 bytes on (needs a GPU: to_device allocates)
        view = compat.device_view(d, (2,), (8,), 8)
        np.testing.assert_array_equal(view.copy_to_host(), [2, 4])


def test_device_pointer_is_the_first_elements_address():
    from numba import cuda

    d = cuda.to_device(np.arange(6, dtype=np.float32))
    view = d[2:]
    assert compat.device_pointer(view) - compat.device_pointer(d) == 8
    assert compat.device_pointer(d) == d.__cuda_array_interface__["data"][0]


def test_layout_is_shape_strides_dtype_and_address():
    from numba import cuda

    d = cuda.to_device(np.zeros((4, 6), np.float32))[:, 1:]
    shape, strides, dtype, address = compat.layout(d)
    assert (shape, strides, dtype) == ((4, 5), (24, 4), np.dtype(np.float32))
    assert address == compat.device_pointer(d) == d.__cuda_array_interface__["data"][0]


@pytest.mark.sim_only(reason="the simulator's kernels and device arrays")
def test_simulated_kernel_flags_and_memory():
    from numba import cuda

    @cuda.jit(debug=True, opt=False)
    def checked(a):
        a[0] = 1

    @cuda.jit
    def plain(a):
        a[0] = 1

    assert compat.debug_kernel(checked) and not compat.debug_kernel(plain)
    d = cuda.device_array(4, np.float32)
    compat.set_host_memory(d, np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(4))
