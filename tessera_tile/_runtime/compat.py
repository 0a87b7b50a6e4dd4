"""Every private numba-cuda name that :mod:`tessera_tile.sim` and :mod:`tessera_tile.inspect`
rely on, in one place, each with a smoke test (``tests/simulator/test_compat.py``,
``tests/compile/test_inspect.py``), so that a numba-cuda upgrade fails here, clearly, and
nowhere else.

The supported numba-cuda range is checked once, when this module is imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import threading

import numpy as np

SUPPORTED_NUMBA_CUDA = ((0, 30), (0, 31))  # [lowest, highest) major.minor


def _check_version() -> None:
    version = importlib.metadata.version("numba-cuda")
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    low, high = SUPPORTED_NUMBA_CUDA
    if not low <= major_minor < high:
        raise ImportError(
            f"tessera_tile supports numba-cuda {low[0]}.{low[1]}.x (it extends numba-cuda's "
            f"simulator through private names); numba-cuda {version} is installed. Run: "
            f"pip install 'numba-cuda[cu13]>={low[0]}.{low[1]},<{high[0]}.{high[1]}'"
        )


_check_version()

# The imports below are the private names themselves; they come after the version check so that
# an unsupported numba-cuda fails with its message, not with an ImportError from inside it.
# ruff: noqa: E402

# The simulator (numba.cuda.simulator: launch path, fake module, fake arrays) and the typing and
# lowering helpers of tessera_tile._device.intrinsics.
import numba.cuda
import numba.cuda.simulator
import numba.cuda.simulator.api
from numba.cuda import cgutils
from numba.cuda.api_util import normalize_indices
from numba.cuda.core.errors import NumbaTypeError, RequireLiteralValue
from numba.cuda.core.sigutils import is_signature, normalize_signature
from numba.cuda.cudamath import registry as cuda_math_registry
from numba.cuda.errors import normalize_kernel_dimensions
from numba.cuda.np.numpy_support import as_dtype, from_dtype
from numba.cuda.simulator.args import ArgHint, InOut
from numba.cuda.simulator.cudadrv.devicearray import (
    FakeCUDAArray,
    FakeWithinKernelCUDAArray,
    sentry_contiguous,
)
from numba.cuda.simulator.kernel import (
    FakeCUDAKernel,
    _get_kernel_context,
    _push_kernel_context,
)
from numba.cuda.simulator.kernelapi import (
    Dim3,
    FakeCUDAAtomic,
    FakeCUDALocal,
    FakeCUDAModule,
    swapped_cuda_module,
)

# The simulator's math (sim.cuda_math): numba-cuda's math signatures and Numba's conversion rules.
from numba.cuda.typeconv import Conversion
from numba.cuda.typeconv.rules import default_type_manager as type_manager

# Where kernels find the simulator's ``jit`` (``cuda.jit``, ``numba.cuda.simulator.jit``): it
# drops an explicit signature, which the launch path needs to type scalar arguments.
JIT_MODULES = (numba.cuda, numba.cuda.simulator, numba.cuda.simulator.api)

__all__ = [
    "SUPPORTED_NUMBA_CUDA",
    "ArgHint",
    "Conversion",
    "Dim3",
    "FakeCUDAArray",
    "FakeCUDAAtomic",
    "FakeCUDAKernel",
    "FakeCUDALocal",
    "FakeCUDAModule",
    "FakeWithinKernelCUDAArray",
    "InOut",
    "JIT_MODULES",
    "NumbaTypeError",
    "RequireLiteralValue",
    "as_dtype",
    "cgutils",
    "cuda_math_registry",
    "current_device_answered",
    "driver_names",
    "device_array_module",
    "device_pointer",
    "device_view",
    "device_array_modules",
    "dummy_array",
    "from_dtype",
    "host_memory",
    "is_device_function",
    "is_signature",
    "normalize_indices",
    "normalize_kernel_dimensions",
    "normalize_signature",
    "sentry_contiguous",
    "swapped_cuda_module",
    "target_options",
    "type_manager",
    "wrap_disk_cache",
    "_get_kernel_context",
    "_push_kernel_context",
]


# -- kernels, caches and device memory: what numba-cuda keeps private -------------------------


def target_options(fn) -> dict:
    """The jit options of a compiled kernel or device function (``targetoptions``); {} for
    anything else (the simulator's kernels keep none)."""
    return getattr(fn, "targetoptions", None) or {}


def is_device_function(fn) -> bool:
    """Whether ``fn`` is a ``@cuda.jit(device=True)`` function, compiled or simulated."""
    if isinstance(fn, FakeCUDAKernel):
        return bool(fn._device)
    return bool(target_options(fn).get("device"))


def wrap_disk_cache(kernel, wrap_save, wrap_load) -> None:
    """Replace the save and load of a dispatcher's disk cache (``_cache.save_overload``,
    ``_cache.load_overload``) with ``wrap_save(save)`` and ``wrap_load(load, flush)``, where
    ``flush`` empties the cache's index (None where it has none). Nothing happens for a
    kernel without a disk cache."""
    cache = getattr(kernel, "_cache", None)
    save = getattr(cache, "save_overload", None)
    load = getattr(cache, "load_overload", None)
    if save is not None:
        cache.save_overload = wrap_save(save)
    if load is not None:
        cache.load_overload = wrap_load(load, getattr(cache, "flush", None))


def layout(array) -> tuple:
    """``(shape, strides, dtype, address)`` of a numba device array, read from itself (its
    attributes; in the simulator, from the host array its memory is, as fast as NumPy)."""
    if isinstance(array, FakeCUDAArray):
        host = array._ary
        return host.shape, host.strides, host.dtype, host.__array_interface__["data"][0]
    return array.shape, array.strides, array.dtype, _pointer(array)


def device_pointer(array) -> int:
    """The address of a numba device array's first element (0 where numba holds none): what
    its ``device_ctypes_pointer`` holds, or in the simulator the host address of its memory."""
    if isinstance(array, FakeCUDAArray):
        return array._ary.__array_interface__["data"][0]
    return _pointer(array)


def _pointer(array) -> int:
    """``device_ctypes_pointer.value`` without the two properties and the ctypes object."""
    try:
        return int(array.gpu_data.device_pointer)
    except AttributeError:  # no memory (an empty array)
        return 0


def host_memory(fake) -> np.ndarray:
    """The host array a simulated device array's memory is."""
    return fake._ary


def set_host_memory(fake, host: np.ndarray) -> None:
    """Make ``host`` the simulated device array's memory (a view of the same allocation)."""
    fake._ary = host


def debug_kernel(fake) -> bool:
    """Whether a simulated kernel was compiled with ``debug=True``."""
    return bool(fake._debug)


def device_view(handle, shape, strides, offset: int, dtype=None):
    """A numba device array over ``handle``'s memory from ``offset`` bytes on (a GPU's
    ``gpu_data`` pointer, sliced without indexing ``handle``), of ``dtype`` (default: the
    handle's; one of the same size reads the same bytes as another type)."""
    device_ndarray, _, _ = driver_names()
    data = handle.gpu_data.view(offset) if offset else handle.gpu_data
    return device_ndarray(shape, strides, dtype or handle.dtype, gpu_data=data)


# -- device-array indexing (sim.device_arrays): numba-cuda's dummyarray, as on a GPU ------------


@functools.cache
def _dummyarray():
    """numba-cuda's ``cudadrv/dummyarray.py``, which indexes device arrays on a GPU. Under the
    simulator its module name resolves to a stub, so the real file (plain Python and NumPy) is
    loaded from numba-cuda's package under a private name."""
    import importlib.util
    import pathlib

    import numba_cuda

    path = pathlib.Path(numba_cuda.__file__).parent / "numba" / "cuda" / "cudadrv" / "dummyarray.py"
    spec = importlib.util.spec_from_file_location("tessera_tile.sim._numba_dummyarray", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dummy_array(shape, strides, itemsize: int):
    """numba-cuda's dummy array of a device array's layout (offset 0)."""
    return _dummyarray().Array.from_desc(0, shape, strides, itemsize)


def device_array_module():
    """The simulator's devicearray module (its ``device_array`` makes every new array)."""
    import numba.cuda.simulator.cudadrv.devicearray as module

    return module


def device_array_modules() -> tuple:
    """Where ``device_array`` is looked up: the module that defines it (its ``_like`` and pinned
    variants call it there) and the namespaces that import it."""
    return (device_array_module(), numba.cuda.simulator, numba.cuda)


# -- inspect: compiling kernels that call device functions without a GPU -----------------------

_device_lock = threading.Lock()


@contextlib.contextmanager
def current_device_answered(cc: tuple[int, int]):
    """Inside, numba-cuda's dispatcher sees a current device of compute capability ``cc``.

    numba-cuda compiles a called device function for the current device's compute capability,
    which asks the driver for a device; with no GPU, this answers for it.
    """
    import numba.cuda.dispatcher as dispatcher

    class _TargetDevice:
        compute_capability = cc

    with _device_lock:
        saved = dispatcher.get_current_device
        dispatcher.get_current_device = lambda: _TargetDevice()
        try:
            yield
        finally:
            dispatcher.get_current_device = saved


# -- the device path (tessera_tile._runtime.arrays): numba-cuda's driver layer, on a GPU only --


def driver_names():
    """``(DeviceNDArray, Stream, device_memset)`` of numba-cuda's driver layer.

    Imported on call: under the simulator numba-cuda replaces these modules with its fakes.
    """
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import Stream, device_memset

    return DeviceNDArray, Stream, device_memset


def gpu_launch_errors() -> tuple[type, ...]:
    """What a launch a GPU refuses raises: ``cuda.core``'s ``CUDAError`` (numba-cuda 0.30
    launches through ``cuda.core``: ``CUDA_ERROR_INVALID_VALUE``) and numba-cuda's own
    ``CudaAPIError``."""
    from cuda.core._utils.cuda_utils import CUDAError
    from numba.cuda.cudadrv.driver import CudaAPIError

    return (CUDAError, CudaAPIError)


def argument_kinds(args) -> tuple:
    """What a GPU compiles one kernel per, read from launch arguments in the simulator: each
    array's dtype, rank and layout (C, F or any), each scalar's type (a GPU keeps a kernel's
    opt-in per compiled kernel, so per these)."""
    kinds = []
    for a in args:
        a = host_memory(a) if isinstance(a, FakeCUDAArray) else a
        if isinstance(a, np.ndarray):
            layout = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "A"
            kinds.append((a.dtype.str, a.ndim, layout))
        else:
            kinds.append(a.dtype.str if isinstance(a, np.generic) else type(a))
    return tuple(kinds)


def set_max_dynamic_shared(kernel, argtypes: tuple, nbytes: int) -> None:
    """On a GPU: let ``kernel``, compiled for ``argtypes`` on the current device, launch with
    up to ``nbytes`` of dynamic shared memory (numba-cuda has no API for the opt-in, its issue
    94). numba-cuda loads kernels through the library API: the handle is a ``CUkernel``, whose
    attribute is set per device, as numba-cuda's own ``set_shared_memory_carveout`` does."""
    from cuda.bindings import driver as binding

    cufunc = kernel.compile(argtypes).library.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (err,) = binding.cuKernelSetAttribute(attr, int(nbytes), cufunc.handle, cufunc.device.id)
    if err != binding.CUresult.CUDA_SUCCESS:
        raise RuntimeError(
            f"cannot opt {cufunc.name} into {nbytes} B of dynamic shared memory: {err.name}"
        )


# -- direct launches (tessera_tile._runtime.launch): a compiled kernel launched as numba-cuda does


def argument_types(params) -> tuple:
    """The numba types of launch arguments, as numba-cuda's dispatcher types them."""
    from numba.cuda.typing.typeof import Purpose, typeof

    return tuple(typeof(p, Purpose.argument) for p in params)


def direct_handle(kernel, argtypes: tuple):
    """What launches ``kernel``, compiled for ``argtypes`` (launched on them before), without
    its dispatcher: on a GPU ``(the compiled function, whether it is cooperative)``; in the
    simulator the kernel itself. None where numba-cuda's launch does more than launch: a debug
    kernel (an error code is checked after it), a kernel specialised per launch configuration,
    or one not compiled for these types; and None where this numba-cuda lacks the private
    names read here (the launch then stays on the dispatcher, and the GPU tier's
    ``test_direct_launches`` fails, naming the gap)."""
    if isinstance(kernel, FakeCUDAKernel):
        return kernel
    compiled = kernel.overloads.get(argtypes)
    if compiled is None or compiled.debug or getattr(compiled, "launch_config_sensitive", False):
        return None
    try:
        return compiled._codelibrary.get_cufunc().kernel, compiled.cooperative
    except AttributeError:
        return None


def launch_direct(handle, grid: tuple, block: tuple, shared: int, stream, params: list) -> None:
    """On a GPU: launch ``handle`` (:func:`direct_handle`) with the packed ``params`` through
    ``cuda.core``, as numba-cuda's ``_Kernel.launch`` does (0.30: ``LaunchConfig`` and
    ``launch``, the stream converted by its ``_to_core_stream``)."""
    function, cooperative = handle
    launch, core_stream = _core_launch()
    config = _launch_config(grid, block, shared, cooperative)
    launch(core_stream(stream) if stream else _default_stream(), config, function, *params)


@functools.cache
def _core_launch():
    """``cuda.core``'s launch and numba-cuda's stream conversion, imported once (on a GPU)."""
    from cuda.core import launch
    from numba.cuda.cudadrv.driver import _to_core_stream

    return launch, _to_core_stream


@functools.cache
def _default_stream():
    return _core_launch()[1](0)


@functools.lru_cache(maxsize=1024)
def _launch_config(grid: tuple, block: tuple, shared: int, cooperative: bool):
    """A launch's ``cuda.core.LaunchConfig``, made once per configuration."""
    from cuda.core import LaunchConfig
    from numba.cuda import dispatcher

    new_names = getattr(dispatcher, "CUDA_CORE_GE_1_0", True)  # cuda.core 1.0 renamed the flag
    flag = "is_cooperative" if new_names else "cooperative_launch"
    return LaunchConfig(grid=grid, block=block, shmem_size=shared, **{flag: cooperative})
