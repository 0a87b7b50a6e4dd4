"""Arrays at the library's boundary: every argument read once, device memory and streams.

A public call (a fused function, a prebuilt op) reads each argument exactly once into an
:class:`Arg` record (host array, device array or scalar; shape, byte strides, dtype, address);
every later step reads the record, never the argument again.

Device arrays are numba's (``cuda.to_device``, ``cuda.device_array``; in the simulator the fake
ones it returns), CuPy's, and any object with ``__cuda_array_interface__`` (versions 2 and 3).
In the simulator, device memory is host memory: an interface's data pointer points into it, so
the simulator runs the device path exactly as a GPU would, and a device call copies nothing
between host and device there either.

Where a call runs (its stream, and whether it waits for an interface's producer stream):
:mod:`streams`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import ml_dtypes
import numpy as np
from numba import cuda

from . import compat
from . import config as _config
from .streams import resolve_stream, wait_for_producers
from .target import VECTOR_BYTES

HOST, DEVICE, SCALAR = "host", "device", "scalar"
DEVICE_ALIGN = 256  # device allocations (host inputs' copies, results) start this aligned


class Arg(NamedTuple):
    """One argument of a call, read once (a named tuple: made on every call, and cheaply)."""

    kind: str  # HOST, DEVICE or SCALAR
    value: object  # the array as given, or the scalar's value
    shape: tuple = ()
    strides: tuple = ()  # bytes
    dtype: np.dtype | None = None
    address: int = 0  # of the first element
    family: str = ""  # "numpy", "numba", "cupy" or "cai": what results are made of
    readonly: bool = False
    stream: int | None = None  # an interface's producer stream (version 3), to wait for

    @property
    def is_array(self) -> bool:
        return self.kind != SCALAR

    @property
    def contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape, self.dtype.itemsize)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact (a stand-in's shape may exceed int64)

    def layout(self) -> tuple:
        """What a launch plan depends on of this array: its side, shape, strides, dtype and
        address modulo :data:`VECTOR_BYTES` (a kernel makes 16-byte accesses where the
        address allows). Every plan cache keys its arrays by this."""
        return self.kind, self.shape, self.strides, self.dtype, self.address % VECTOR_BYTES

    def extent(self) -> tuple[int, int]:
        """[first, last) byte addresses the array covers."""
        steps = [(n - 1) * s for n, s in zip(self.shape, self.strides, strict=True)]
        lo = self.address + sum(min(0, d) for d in steps)
        hi = self.address + sum(max(0, d) for d in steps)
        return lo, hi + self.dtype.itemsize


def contiguous_strides(shape, itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def placeholder(shape, dtype) -> Arg:
    """The record of a device array nothing backs yet (a result, a temporary, a host input's
    device copy; explain and inspect): C-contiguous, aligned as device allocations."""
    dtype = np.dtype(dtype)
    strides = contiguous_strides(shape, dtype.itemsize)
    return Arg(DEVICE, None, tuple(shape), strides, dtype, DEVICE_ALIGN)


def scalar(value) -> Arg:
    return Arg(SCALAR, value, dtype=None if _python_scalar(value) else np.asarray(value).dtype)


def _python_scalar(value) -> bool:
    return isinstance(value, bool | int | float) and not isinstance(value, np.generic)


def read(value, name: str, *, scalars: bool = True) -> Arg:
    """The record of one argument; TypeError or ValueError naming ``name`` when it is no
    array (or, with ``scalars``, scalar) the library can take. A record passes through as it
    is: an op that checked its arguments hands their records on, and nothing is read twice."""
    if isinstance(value, Arg):
        return value
    is_scalar = _python_scalar(value) or isinstance(value, np.generic)
    if isinstance(value, np.ndarray) and value.ndim == 0 and scalars:
        is_scalar, value = True, value[()]  # a 0-d array argument is a scalar; as out=, an array
    if is_scalar:
        if not scalars:
            raise TypeError(f"{name} is a {type(value).__name__}, not an array")
        return scalar(value)
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: masks are not supported; pass .filled()")
    if isinstance(value, np.ndarray):
        return Arg(
            HOST, value, value.shape, value.strides, value.dtype,
            value.__array_interface__["data"][0], "numpy", not value.flags.writeable,
        )  # fmt: skip
    if getattr(value, "__cuda_ndarray__", False):
        # A numba device array, read from itself: faster than its interface, which also calls
        # an array with a stride-0 axis contiguous and leaves its strides out.
        shape, strides, dtype, address = compat.layout(value)
        rec = Arg(DEVICE, value, tuple(shape), tuple(strides), np.dtype(dtype), address, "numba")
        return _check_device(rec, name)
    try:
        cai = value.__cuda_array_interface__
    except AttributeError:
        raise TypeError(
            f"{name} is a {type(value).__name__}, not an array (NumPy, CuPy, a numba device "
            "array or any __cuda_array_interface__ object)" + (" or a scalar" if scalars else "")
        ) from None
    return _check_simulated_memory(_check_device(_from_interface(value, cai, name), name), name)


def _from_interface(value, cai, name: str) -> Arg:
    """The record of a ``__cuda_array_interface__`` object, every field checked first:
    ValueError or TypeError naming ``name``, of the class NumPy raises for the same fault in
    ``__array_interface__``."""
    what = f"{name}: __cuda_array_interface__"
    if not isinstance(cai, dict):
        raise ValueError(f"{what} must be a dict, got {type(cai).__name__}")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            raise ValueError(f"{what} has no {key!r} (the protocol requires shape, typestr, data)")
    if cai.get("mask") is not None:
        raise TypeError(f"{name} is a masked array (__cuda_array_interface__ mask): not supported")
    dtype = _interface_dtype(cai["typestr"], what)
    shape = _interface_ints(cai["shape"], "shape", what)
    if any(n < 0 for n in shape):
        raise ValueError(f"{what} shape {shape} has a negative dimension")
    strides = cai.get("strides")
    if strides is None:
        strides = contiguous_strides(shape, dtype.itemsize)
    else:
        strides = _interface_ints(strides, "strides", what)
        if len(strides) != len(shape):
            raise ValueError(f"{what} has {len(strides)} strides for the {len(shape)} dimensions")
    pointer, readonly = _interface_data(cai["data"], what)
    family = "cupy" if type(value).__module__.partition(".")[0] == "cupy" else "cai"
    stream = _interface_stream(cai, what)
    return Arg(DEVICE, value, shape, strides, dtype, pointer, family, bool(readonly), stream)


def _interface_stream(cai: dict, what: str) -> int | None:
    """The stream whose work must be complete before the memory is read (version 3), as a
    handle: 1 the legacy default stream, 2 the per-thread one. The protocol disallows 0, but
    numba-cuda 0.30 reports it for an array bound to ``cuda.default_stream()`` (``int()`` of
    that stream is 0): read as the legacy default stream."""
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if stream is None:
        return None
    if isinstance(stream, bool) or not isinstance(stream, int | np.integer) or stream < 0:
        raise ValueError(f"{what} stream must be None or a stream handle (an int >= 0): {stream!r}")
    return int(stream) or 1


def _check_simulated_memory(rec: Arg, name: str) -> Arg:
    """In the simulator, an interface's elements must lie in one live allocation of its device
    memory: a GPU's kernels fault on a host pointer (or a freed one), which the simulator, whose
    device memory is host memory, would otherwise read."""
    if _config.SIMULATED and rec.size:
        from ..sim import device_arrays

        first, last = rec.extent()
        if not device_arrays.in_device_memory(first, last):
            raise ValueError(
                f"{name}: __cuda_array_interface__ data pointer {rec.address:#x} is not in device "
                f"memory (bytes {first:#x} to {last:#x} lie in no live allocation of the "
                "simulator's device): a GPU's kernels fault on a host pointer"
            )
    return rec


# bfloat16 has no typestr of its own: ml_dtypes' dtype.str, which CuPy and PyTorch (since
# pytorch/pytorch#143042) put in __cuda_array_interface__, is the 2-byte void "<V2"
BFLOAT16_TYPESTR = np.dtype(ml_dtypes.bfloat16).str


def _interface_dtype(typestr, what: str) -> np.dtype:
    if not isinstance(typestr, str):
        raise TypeError(f"{what} typestr must be a str, got {type(typestr).__name__}")
    if typestr == BFLOAT16_TYPESTR:
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(typestr)
    except (TypeError, ValueError):
        raise TypeError(f"{what} typestr {typestr!r} is not a data type") from None


def _interface_ints(values, key: str, what: str) -> tuple[int, ...]:
    if not isinstance(values, tuple | list):
        raise TypeError(f"{what} {key} must be a tuple of ints, got {type(values).__name__}")
    if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in values):
        raise TypeError(f"{what} {key} {values!r} must hold ints")
    return tuple(int(n) for n in values)


def _interface_data(data, what: str) -> tuple[int, bool]:
    if not (isinstance(data, tuple | list) and len(data) == 2):
        raise TypeError(f"{what} data must be a 2-tuple (pointer, read-only flag), got {data!r}")
    pointer, readonly = data
    if pointer is None:  # protocol version 2's null pointer of an empty array
        pointer = 0
    if isinstance(pointer, bool) or not isinstance(pointer, int | np.integer):
        raise TypeError(f"{what} data pointer must be an int, got {type(pointer).__name__}")
    if pointer < 0:
        raise ValueError(f"{what} data pointer {pointer} is negative")
    return int(pointer), readonly


def _check_device(rec: Arg, name: str) -> Arg:
    """A device array the kernels can read: a pointer to its elements, and an address and
    strides that are whole elements (a GPU faults on a misaligned access, and the fault
    poisons the context)."""
    item = rec.dtype.itemsize
    if rec.address and not rec.address % item and not any(s % item for s in rec.strides):
        return rec  # the common case, decided without the size
    if not rec.size:
        return rec
    if rec.address == 0:
        raise ValueError(f"{name} has a null data pointer and {rec.size} element(s)")
    used = [s for n, s in zip(rec.shape, rec.strides, strict=True) if n > 1]
    if rec.address % item or any(s % item for s in used):
        raise ValueError(
            f"{name} has address {rec.address:#x} and byte strides {rec.strides}: both must "
            f"be multiples of its itemsize, {item} (the kernels read whole aligned elements)"
        )
    return rec


def overlap(a: Arg, b: Arg) -> bool:
    """True when two array arguments share memory."""
    if a.kind != b.kind or not a.size or not b.size:
        return False
    if a.kind == HOST:
        return bool(np.shares_memory(a.value, b.value))
    lo_a, hi_a = a.extent()
    lo_b, hi_b = b.extent()
    return lo_a < hi_b and lo_b < hi_a


def check_out(out: Arg, name: str, shape, dtype, inputs: dict[str, Arg]) -> None:
    """``out=`` must have the result's shape and dtype, be writable, and share no memory with
    an input (``inputs``: name -> record); ValueError naming ``name`` otherwise."""
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"{name} has shape {out.shape} and dtype {out.dtype}; the result has shape "
            f"{tuple(shape)} and dtype {dtype}"
        )
    if out.readonly:
        raise ValueError(f"{name} is read-only")
    for input_name, a in inputs.items():
        if a.is_array and overlap(out, a):
            raise ValueError(f"{name} overlaps {input_name}: inputs are never modified")


def check_cast(result, out, into: str) -> None:
    """NumPy's ``same_kind`` rule for writing a result of dtype ``result`` into an ``out=`` of
    dtype ``out`` (the one rule for every fused function and op): TypeError in NumPy's words
    otherwise; ``into`` names the destination ("into out")."""
    if result != out and not np.can_cast(result, out, "same_kind"):
        raise TypeError(
            f"Cannot cast the result {into} from dtype('{result}') to dtype('{out}') with "
            "casting rule 'same_kind'"
        )


def check_one_side(args: list[Arg], names: list[str]) -> None:
    """Arrays must all be on the host or all on the device: TypeError naming two of them."""
    host = [n for a, n in zip(args, names, strict=True) if a.kind == HOST]
    device = [n for a, n in zip(args, names, strict=True) if a.kind == DEVICE]
    if host and device:
        raise TypeError(
            f"{host[0]} is a host (NumPy) array and {device[0]} a device array: move them to "
            "one side first (cuda.to_device, cupy.asarray, or .copy_to_host())"
        )


def result_family(args: list[Arg]) -> str:
    """What results are made of: CuPy in, CuPy out; NumPy in, NumPy out; else numba arrays."""
    families = {a.family for a in args if a.is_array}
    if "numpy" in families:
        return "numpy"
    return "cupy" if "cupy" in families else "numba"


# --------------------------------------------------------------------------------------------
# where a call runs


class Placement:
    """Where one call runs: its stream, the device side of its arrays, and results of the
    inputs' family (a host call's results are device arrays, copied back at the end)."""

    def __init__(self, inputs: list[Arg], outs: list[Arg | None], stream):
        arrays = [a for a in inputs + outs if a is not None]
        self.stream = resolve_stream(stream, arrays)
        self.on_device = any(a.kind == DEVICE for a in arrays)
        self.family = result_family(inputs) if self.on_device else "numba"
        wait_for_producers(arrays, self.stream)

    @classmethod
    def kept(cls, stream, family: str, values, interfaces: tuple = ()) -> Placement:
        """The placement of a kept call (every array on the device), its results of
        ``family``; ``interfaces``: where its ``__cuda_array_interface__`` arrays' records are
        among ``values`` (``interface_positions``)."""
        place = cls.__new__(cls)
        place.stream = resolve_stream(stream, [], cupy=family == "cupy")
        place.on_device, place.family = True, family
        if interfaces:
            wait_for_producers([values[i] for i in interfaces], place.stream)
        return place

    def device(self, rec: Arg) -> Arg:
        """``rec`` on the device: a host array is copied there (once, contiguously)."""
        return rec if rec.kind == DEVICE else to_device(rec, self.stream)

    def result(self, shape, dtype, out: Arg | None = None) -> Arg:
        """The device record of one result: ``out`` when it is a device array, else a new
        array of the call's family (its ``value`` is what a device call returns)."""
        if out is not None and out.kind == DEVICE:
            return out
        if self.family != "numba":
            return read(self.new(shape, dtype), "a result")
        return self.temp(shape, dtype)

    def temp(self, shape, dtype) -> Arg:
        """A new numba device array (a temporary, or a result of numba's family): its record
        is known as it is made, not read."""
        value = self.new(shape, dtype, "numba")
        strides = contiguous_strides(shape, dtype.itemsize)
        return Arg(
            DEVICE, value, tuple(shape), strides, dtype, compat.device_pointer(value), "numba"
        )

    def new(self, shape, dtype, family: str | None = None):
        """A new, uninitialised device array of ``family`` (default: the call's)."""
        return empty(shape, dtype, family or self.family, self.stream)

    def finish(self, result, out: Arg | None = None):
        """A result (the device array a kernel wrote) on the caller's side: as it is for
        device calls, else copied back (into ``out`` when given; a host call's results are
        numba device arrays)."""
        if self.on_device:
            return result
        return to_host(result, None if out is None else out.value, self.stream)


# --------------------------------------------------------------------------------------------
# device memory


def device_handle(arg: Arg):
    """The numba device array of a device argument, to launch kernels with (no copy)."""
    if arg.family == "numba":
        return arg.value
    if not _config.SIMULATED:  # the call's Placement waited for the interface's stream
        return cuda.as_cuda_array(arg.value, sync=False)
    # The simulator's device memory is host memory: view the pointer as a NumPy array.
    host = np.asarray(_Interface(arg))
    return _fake_device_array(host if host.dtype == arg.dtype else host.view(arg.dtype))


class _Interface:
    """``__array_interface__`` over an address (simulator: device pointers are host memory)."""

    def __init__(self, arg: Arg):
        self.__array_interface__ = {
            "version": 3,
            "shape": arg.shape,
            "typestr": arg.dtype.str,
            "data": (arg.address, arg.readonly),
            "strides": arg.strides,
        }


def _fake_device_array(host: np.ndarray):
    return compat.FakeCUDAArray(host)


def view(handle, shape, strides, offset: int = 0, dtype=None):
    """A view of a numba device array, starting ``offset`` bytes past its first element, with
    these byte strides, of ``dtype`` (default: the array's; one of the same item size reads
    the same bytes as another type: a bfloat16 array as its ``uint16`` bits). It is made from
    the pointer, never by indexing: numba's indexing gives a stride-0 axis size 1 and refuses
    any view of an empty array (its pointer is null), so a view without elements never touches
    the memory."""
    if not math.prod(shape):
        offset = 0
    if _config.SIMULATED:
        host = _host_view(compat.host_memory(handle), shape, strides, offset, dtype)
        return _fake_device_array(host)
    return compat.device_view(handle, shape, strides, offset, dtype)


def _host_view(base: np.ndarray, shape, strides, offset: int, dtype=None) -> np.ndarray:
    """The simulator's view: over ``base``'s buffer where the view lies inside it (fast, and
    its ``base`` chain leads to the allocation), else by ``as_strided``."""
    dtype = base.dtype if dtype is None else np.dtype(dtype)
    try:
        return np.ndarray(shape, dtype, base, offset, strides)
    except (TypeError, ValueError, BufferError):  # a strided base, or a view reaching before it
        if offset:
            base = np.lib.stride_tricks.as_strided(base, (2,), (offset,))[1:]
        return np.lib.stride_tricks.as_strided(base.view(dtype), shape, strides)


def empty(shape, dtype, family: str, stream):
    """An uninitialised array of ``family`` (device memory for every family but numpy)."""
    if family == "numpy":
        return np.empty(shape, dtype)
    if family == "cupy":
        from . import cupy as _cupy

        return _cupy.empty(shape, dtype)
    return cuda.device_array(shape, dtype, stream=stream)


_UNUSED: dict = {}


def unused(dtype):
    """A 1-element device array of ``dtype`` for a kernel argument the launch never reads or
    writes (an absent bias): one per device and dtype, kept, so calls allocate nothing for it."""
    key = (0 if _config.SIMULATED else id(cuda.current_context()), np.dtype(dtype).str)
    if key not in _UNUSED:
        _UNUSED[key] = cuda.device_array(1, dtype)
    return _UNUSED[key]


def unused_all() -> list:
    """Every array :func:`unused` keeps."""
    return list(_UNUSED.values())


def zeros(n: int, dtype, stream):
    """A zeroed 1-D device array, by a device memset (no host transfer)."""
    a = cuda.device_array(n, dtype, stream=stream)
    if _config.SIMULATED:
        compat.host_memory(a).fill(0)  # the simulator's memset
    else:
        _, _, device_memset = compat.driver_names()
        device_memset(a, 0, a.nbytes, stream=stream)
    return a


def exportable(host: np.ndarray) -> np.ndarray:
    """``host`` as an array numba-cuda can copy: it copies through the buffer protocol, which
    NumPy refuses for ml_dtypes' types ("cannot include dtype 'E' in a buffer"), so a
    bfloat16 array travels as its ``uint16`` bits."""
    return host.view(np.uint16) if host.dtype == ml_dtypes.bfloat16 else host


def host_to_device(host, stream=0):
    """A numba device copy of a host array, contiguous, of the same dtype (bfloat16 too)."""
    host = np.asarray(host, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
    return as_dtype(cuda.to_device(exportable(host), stream=stream), host.dtype)


def as_dtype(handle, dtype):
    """A numba device array as another dtype of its item size (its bits: numba's own ``view``
    refuses a 0-d array, TypeError: unhashable type: 'list', seen on an H200)."""
    if handle.dtype == np.dtype(dtype):
        return handle
    return view(handle, handle.shape, handle.strides, 0, dtype)


def to_device(arg: Arg, stream) -> Arg:
    """Copy a host array to the device (contiguously, as numba requires); the copy's record."""
    return read(host_to_device(arg.value, stream), "a device copy")


def to_host(handle, out: np.ndarray | None, stream) -> np.ndarray:
    """Copy a device array back; into ``out`` when given (any strides)."""
    if out is not None and out.flags.c_contiguous:
        bits = exportable(out)  # the device array viewed alike: numba checks the dtypes match
        as_dtype(handle, bits.dtype).copy_to_host(bits, stream=stream)
        host = out
    else:
        host = handle.copy_to_host(stream=stream)
    if not _config.SIMULATED:
        stream.synchronize()  # the copy is asynchronous on the call's stream
    if out is not None and host is not out:
        out[...] = host
        return out
    return host


def kept_call(args: tuple, constants: bool = False) -> tuple[tuple, tuple | list] | None:
    """A call's key and the values it runs on, for calls that skip checking and planning (a
    kept call), or None. The key determines the call's program and launch plan: it holds what
    the composer's ``Call`` and ``layout_key`` read of the arguments, and nothing else; with
    ``constants`` (a prebuilt op's key), scalars, strings and None by value. Arrays must be on
    the device: numba device arrays (read from themselves), their records, and any
    ``__cuda_array_interface__`` object (a CuPy array), read here into its record, which the
    values hold in its place (``args`` itself when there is none)."""
    key, values = [], None
    for k, a in enumerate(args):
        if getattr(a, "__cuda_ndarray__", False):
            shape, strides, dtype, address = compat.layout(a)
            if not address:
                return None
            key.append((type(a), shape, strides, dtype, address % VECTOR_BYTES))
        elif type(a) in _SCALARS or isinstance(a, np.generic):
            typed = type(a) if type(a) in _SCALARS else a.dtype
            key.append((typed, a) if constants else typed)
        elif constants and (a is None or type(a) is str):
            key.append(a)
        else:
            rec = a if type(a) is Arg else _interface_record(a)
            if rec is None or rec.kind != DEVICE or not rec.address:
                return None
            key.append(
                (Arg, rec.family, rec.shape, rec.strides, rec.dtype, rec.address % VECTOR_BYTES)
            )
            if rec is not a:
                values = values or list(args)
                values[k] = rec
    return tuple(key), args if values is None else values


def _interface_record(value) -> Arg | None:
    """The checked record of an interface array, or None (not one, or one a call refuses:
    its full read names the fault)."""
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None or type(cai) is not dict or cai.get("mask") is not None:
        return None
    try:
        return _check_simulated_memory(_check_device(_from_interface(value, cai, ""), ""), "")
    except (TypeError, ValueError):
        return None


def interface_positions(records) -> tuple[int, ...]:
    """Where a call's ``__cuda_array_interface__`` arrays are among its records: a kept call
    with the same key holds their records there (``kept_call``), whose streams it waits for."""
    return tuple(i for i, a in enumerate(records) if a.family in ("cupy", "cai"))


_SCALARS = (float, int, bool)
