"""The launch path of the warp-aware simulator.

:class:`Launch` makes one kernel call into device arguments, the ``cuda`` module its kernel sees
(:mod:`.cuda_module`) and its blocks, run one after another (:mod:`.scheduler`). :func:`patch`
routes numba-cuda's simulated launches through it (``FakeCUDAKernel.__call__`` and
``__getitem__``, ``cuda.jit``); :func:`unpatch` gives them back.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
from contextlib import ExitStack

import numpy as np
from greenlet import getcurrent

from .._runtime import compat
from . import cuda_math, device_arrays, host_copies, ints, packed, shared_limits
from .allocations import own_allocation
from .cuda_module import WarpAwareModule
from .profiler import Profile, active
from .scheduler import BlockRun, SimThread
from .scheduler import current_thread as current_thread  # sim.current_thread() finds it here


class Launch:
    """One kernel launch: the fake ``cuda`` module, arguments and blocks."""

    def __init__(self, kernel, args):
        code = kernel.fn.__code__
        if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
            # numba-cuda binds ``*args`` to the first argument alone (a kernel of one argument
            # mis-types) and refuses more: "Signature mismatch" (numba-cuda 0.30)
            raise TypeError(
                f"Signature mismatch: {len(args)} argument types given, but function takes "
                f"{code.co_argcount + 1} arguments (kernels cannot take *args or **kwargs)"
            )
        self.grid_dim, self.block_dim = compat.normalize_kernel_dimensions(
            kernel.grid_dim, kernel.block_dim
        )
        self.dynshared_size = kernel.dynshared_size
        self.opted_shared = shared_limits.opted(kernel, args)
        shared_limits.check_launch(kernel.fn, self.opted_shared, self.dynshared_size)
        self.kernel = kernel
        self.profile: Profile | None = active()
        self.module = WarpAwareModule(self)
        self.swaps = ExitStack()
        self.swapped: set[int] = set()
        self.retr: list = []
        argtypes, _ = _declared_types(kernel, len(args))
        self.args = [self._device_arg(a) for a in map(ints.as_declared, args, argtypes)]
        if self.profile:
            self.args = self.profile.wrap_args(kernel.fn, self.args)
        fn, kargs = kernel.fn, self.args
        self.target = lambda: fn(*kargs)

    def _device_arg(self, arg):
        if type(arg) is tuple:  # numba-cuda passes a tuple's items as arguments of their own
            return tuple(self._device_arg(a) for a in arg)
        _, arg = functools.reduce(
            lambda ty_val, ext: ext.prepare_args(*ty_val, stream=0, retr=self.retr),
            self.kernel.extensions,
            (None, arg),
        )
        if isinstance(arg, np.ndarray) and arg.dtype.kind == "V" and arg.dtype.fields is None:
            # ml_dtypes' types (bfloat16): a GPU launch passes a host array through DLPack,
            # which refuses them (seen on an H200, numba-cuda 0.30.4); so does the simulator.
            raise BufferError(
                "DLPack only supports signed/unsigned integers, float and complex dtypes."
            )
        if isinstance(arg, np.ndarray) and arg.ndim > 0 and arg.dtype.fields is None:
            flags = arg.flags
            if not (flags.c_contiguous or flags.f_contiguous):
                # A GPU launch copies a host array as one block and refuses a strided view
                # (broadcast views pass): the same check, the same ValueError.
                compat.sentry_contiguous(arg)
            # Run on the array itself (no copy), seen as an allocation of its own, as its device
            # copy would be: a vector access past its end is out of bounds even where the
            # NumPy array it is a view of goes on.
            return _typed(own_allocation(arg))
        if isinstance(arg, compat.ArgHint):
            arg = arg.to_device(self.retr)
        if isinstance(arg, compat.FakeCUDAArray) and compat.host_memory(arg).dtype.fields is None:
            return _typed(compat.host_memory(arg))  # device arrays and their views: any strides
        if isinstance(arg, np.ndarray) and arg.ndim > 0:
            arg = compat.InOut(arg).to_device(self.retr)
        elif isinstance(arg, np.void):
            arg = compat.FakeCUDAArray(arg)
        if isinstance(arg, compat.FakeCUDAArray):
            return compat.FakeWithinKernelCUDAArray(arg)
        return ints.narrow(arg)  # an int32 scalar argument computes as Numba types it

    def swap_module_of(self, fn) -> None:
        """Point ``cuda`` in ``fn``'s module at the fake module, and ``math`` at CUDA's
        (:mod:`.cuda_math`), for the rest of the launch."""
        gid = id(fn.__globals__)
        if gid not in self.swapped:
            self.swapped.add(gid)
            self.swaps.enter_context(compat.swapped_cuda_module(fn, self.module))
            self.swaps.enter_context(cuda_math.swapped_math(fn))

    def run(self) -> None:
        if self.profile:
            self.profile.launch_started()
        try:
            with compat._push_kernel_context(self.module), self.swaps, self._error_model():
                self.swap_module_of(self.kernel.fn)
                for block_idx in np.ndindex(*self.grid_dim):
                    BlockRun(self, block_idx).run()
        finally:
            if self.profile:
                self.profile.launch_finished()
        for write_back in self.retr:
            write_back()

    def _error_model(self):
        """``debug=True`` kernels stop at a division by zero with ``FloatingPointError``, as
        numba-cuda's simulator documents (compiled, they raise ``ZeroDivisionError``); other
        kernels compute as a GPU does, without floating-point warnings (inf, NaN)."""
        if compat.debug_kernel(self.kernel):
            return np.errstate(divide="raise")  # the block's threads copy this context
        return np.errstate(all="ignore")


class _AnyLayout(np.ndarray):
    """A kernel argument neither C- nor F-contiguous, which Numba types as layout "A": it has no
    ``reshape`` in a kernel."""

    def reshape(self, *args, **kwargs):
        raise compat.NumbaTypeError("reshape() supports contiguous array only")


class _AnyLayoutInts(ints.IntArray, _AnyLayout):
    pass


def _typed(array: np.ndarray) -> np.ndarray:
    """A kernel's view of an array argument: narrow integers typed as Numba types them, and
    layout "A" as Numba types it."""
    array = ints.typed_view(array)
    if array.ndim and not (array.flags.c_contiguous or array.flags.f_contiguous):
        return array.view(_AnyLayoutInts if isinstance(array, ints.IntArray) else _AnyLayout)
    return array


_stock_call = compat.FakeCUDAKernel.__call__
_stock_jit = compat.JIT_MODULES[-1].jit
_SIGNATURE = "_tessera_signature"  # (argument types, return type) of an explicit signature
# Launches from several host threads run one after the other, as on one stream. Reentrant so
# that a launch made while launching fails with numba-cuda's error instead of hanging.
_launch_lock = threading.RLock()


def _call(self, *args):
    """Replacement for ``FakeCUDAKernel.__call__``: launches go through :class:`Launch`."""
    t = getcurrent()
    if isinstance(t, SimThread):  # called by a running kernel: a device function
        t.block.launch.swap_module_of(self.fn)
        if getattr(self, _SIGNATURE, None) is None:  # nothing declared: nothing to convert
            return self.fn(*args)
        argtypes, restype = _declared_types(self, len(args))
        result = self.fn(*map(ints.as_declared, args, argtypes))
        return ints.as_declared(result, restype)
    if compat.is_device_function(self):
        return _stock_call(self, *args)
    with _launch_lock:
        Launch(self, args).run()


def _declared_types(kernel, nargs: int) -> tuple:
    """``(argument types, return type)`` of ``kernel``'s explicit signature, else ``None`` for
    each."""
    signature = getattr(kernel, _SIGNATURE, None)
    if signature is None or len(signature[0]) != nargs:
        return (None,) * nargs, None  # a wrong count fails at the call, with Python's TypeError
    return signature


# Options of numba-cuda's ``cuda.jit`` that change only the compiled code: its simulator's
# ``jit`` refuses them (a TypeError for code a GPU compiles), so they are dropped here.
_CODE_ONLY_OPTIONS = ("lineinfo", "launch_bounds", "forceinline", "lto", "max_registers")


def _jit(func_or_sig=None, *args, **kwargs):
    """numba-cuda's simulated ``cuda.jit``, keeping an explicit signature on the kernel (a GPU
    converts scalar arguments to the types it declares; numba-cuda's simulator drops it)."""
    for option in _CODE_ONLY_OPTIONS:
        kwargs.pop(option, None)
    made = _stock_jit(func_or_sig, *args, **kwargs)
    signature = _one_signature(func_or_sig)
    if signature is None:
        return made

    def decorate(fn):
        kernel = made(fn)
        setattr(kernel, _SIGNATURE, signature)
        return kernel

    return decorate


def _one_signature(func_or_sig) -> tuple | None:
    """``(argument types, return type)`` of a single explicit signature, else ``None`` (with
    several, the GPU picks one by the arguments' types: left to Python's typing here)."""
    if isinstance(func_or_sig, list) and len(func_or_sig) == 1:
        func_or_sig = func_or_sig[0]
    if isinstance(func_or_sig, list) or not compat.is_signature(func_or_sig):
        return None
    return compat.normalize_signature(func_or_sig)


_stock_configure = compat.FakeCUDAKernel.__getitem__


def _configure(self, configuration):
    """``kernel[grid, block, ...]``: a configured copy, as numba-cuda makes a launch
    configuration of its own on a GPU. The stock fake sets the grid on the kernel itself, so
    two threads configuring one kernel at once launched each other's grids."""
    return _stock_configure(copy.copy(self), configuration)


def patch() -> None:
    """Route simulated launches through :class:`Launch`."""
    compat.FakeCUDAKernel.__call__ = _call
    compat.FakeCUDAKernel.__getitem__ = _configure
    for module in compat.JIT_MODULES:
        module.jit = _jit
    device_arrays.patch()
    host_copies.patch()


def unpatch() -> None:
    """Give launches back to numba-cuda's simulator."""
    compat.FakeCUDAKernel.__call__ = _stock_call
    compat.FakeCUDAKernel.__getitem__ = _stock_configure
    for module in compat.JIT_MODULES:
        module.jit = _stock_jit
    device_arrays.unpatch()
    host_copies.unpatch()


def _skip(self, *args):
    return None


def _skip_configure(self, configuration):
    return self  # whose call is skipped too


def skip_launches(skip: bool) -> None:
    """Launches, their configuration included (numba-cuda's work, not the caller's), return
    without running (``sim.launches_skipped``), or run again."""
    compat.FakeCUDAKernel.__call__ = _skip if skip else _call
    compat.FakeCUDAKernel.__getitem__ = _skip_configure if skip else _configure
    packed.skipped = skip


def patched() -> bool:
    """Whether launches go through :class:`Launch`."""
    return compat.FakeCUDAKernel.__call__ in (_call, _skip)
