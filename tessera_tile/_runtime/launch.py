"""The one launch path: every kernel the library launches, generated (a fused function's
stages) or hand-written (the ops' kernels, the composer's GEMM and attention stages), is
described by :class:`KernelLaunch` records and goes through :func:`run` or :class:`Kept`. So
one place records launches for ``tessera_tile.profile`` and one place decides how a kernel is
launched.

A launch's parameters are made per call from the call's arrays (:class:`View`,
:class:`Unused`, :class:`Value`, :class:`Extras`); the same records serve the run, a kept call,
``explain`` and ``inspect``.

**Direct launches.** Launches that run again on arrays of the same layouts (a kept op call, a
fused function's launch plan) are :class:`Kept`: the first run goes through numba-cuda's
dispatcher, which compiles each kernel for its arguments' types (and opts it in past 48 KiB of
dynamic shared memory); every later run launches each compiled kernel directly, with its
parameters packed here from the arrays' pointers, shapes and strides (:mod:`packing`): no
argument typing, no device-array object per view, and none for a CuPy array either (a
parameter may be given as its ``arrays.Arg`` record, made into a numba array only when
numba-cuda launches it). In the simulator the packed parameters are decoded back into arrays
(``sim.packed``), so a packing mistake gives wrong results there."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import types

from .. import dynamic_shared
from . import arrays, compat, packing
from . import config as _config


class View(NamedTuple):
    """A kernel parameter that views one of the call's arrays (inputs in order, then the
    result): as it is (``shape`` None), or with this shape, these byte strides and offset;
    of ``dtype`` where given (a bfloat16 array as its ``uint16`` bits)."""

    array: int
    shape: tuple | None = None
    strides: tuple = ()
    offset: int = 0
    dtype: np.dtype | None = None

    def of(self, handles):
        handle = _handle(handles[self.array])
        if self.shape is None:
            if self.dtype is None:
                return handle
            return arrays.view(handle, handle.shape, handle.strides, 0, self.dtype)
        return arrays.view(handle, self.shape, self.strides, self.offset, self.dtype)

    def raw(self, handles):
        """What :mod:`packing` packs for it (the view's pointer, without making the view)."""
        handle = handles[self.array]
        if self.shape is None:
            return packing.pointer_of(handle)
        return packing.view_pointer(handle, self.shape, self.strides, self.offset)


class Unused(NamedTuple):
    """A kernel parameter the launch never reads or writes (an absent bias): a 1-element
    device array of ``dtype``, kept per device (``arrays.unused``), so calls allocate
    nothing for it."""

    dtype: np.dtype

    def of(self, handles):
        return arrays.unused(self.dtype)

    def raw(self, handles):
        return packing.pointer_of(arrays.unused(self.dtype))


class Value(NamedTuple):
    """A kernel parameter passed as the handle it names (a scalar argument of a fused call)."""

    index: int

    def of(self, handles):
        return _handle(handles[self.index])

    def raw(self, handles):
        return handles[self.index]


class Extras(NamedTuple):
    """A tuple parameter (a generated matmul epilogue's arrays and scalars), its items made as
    the parameters are."""

    items: tuple

    def of(self, handles):
        return tuple(i.of(handles) if type(i) in SPECS else i for i in self.items)

    def raw(self, handles):
        return tuple(i.raw(handles) if type(i) in SPECS else i for i in self.items)


SPECS = (View, Unused, Value, Extras)  # parameters given per launch; any other passed as it is


def _handle(value):
    """A parameter as numba-cuda takes it: an array's record (``arrays.Arg``) as its numba
    device array, made here (so a direct launch, which packs the record, never makes it)."""
    return arrays.device_handle(value) if type(value) is arrays.Arg else value


@dataclass(frozen=True)
class KernelLaunch:
    """One launch: the kernel, its grid and block, its parameters (:data:`SPECS` or values),
    its numba signature (for ``inspect``) and its bytes of dynamic shared memory."""

    kernel: object
    grid: object
    threads: object
    params: tuple
    signature: object
    shared: int = 0


class Label(NamedTuple):
    """What a profile records of a group of launches: a name, the global bytes they move and
    the FLOPs they compute (the figures ``explain`` predicts)."""

    name: str
    nbytes: int
    flops: int


recorder = None  # the active tessera_tile.profile() (set by tessera_tile.profiling), or None


def run(launches, handles: list, stream, label) -> None:
    """Launch each :class:`KernelLaunch` on ``stream`` through numba-cuda, its parameters
    made of ``handles`` (the call's device arrays: inputs in order, then the result).
    ``label``: a function giving the :class:`Label` a profile records (called only while one
    is active)."""

    def go():
        for launch in launches:
            params = [p.of(handles) if type(p) in SPECS else p for p in launch.params]
            _launch(launch.kernel, launch.grid, launch.threads, params, stream, launch.shared)

    if recorder is None:
        go()
    else:
        recorder.launch(*label(), go, stream, launches)


class Direct(NamedTuple):
    """A kernel compiled for these argument types, launched without its dispatcher. Its
    parameters, packed once (``template``), differ between calls on arrays of the same layouts
    only in the arrays' addresses and the scalars' values: ``patches``, per such position,
    the function that reads it from the call's handles."""

    handle: object  # compat.direct_handle's
    argtypes: tuple
    grid: tuple
    block: tuple
    shared: int
    template: list
    patches: tuple

    def params(self, handles) -> list:
        """The packed parameters of a launch on ``handles``."""
        params = self.template.copy()
        for at, read in self.patches:
            params[at] = read(handles)
        return params


class Kept:
    """Launches that run again on arrays of the same layouts (see the module docstring): the
    first :meth:`run` through numba-cuda (which compiles each kernel for its arguments' types
    and opts it in past 48 KiB of dynamic shared memory), later ones direct where every kernel
    allows it."""

    def __init__(self, launches):
        self.launches = tuple(launches)
        self.direct = None  # None: not run yet; (): through numba-cuda always; else per launch

    def run(self, handles, stream, label) -> None:
        """As :func:`run` (``handles``: a list or a dict, as the parameters' indices are)."""
        if recorder is None:
            self._go(handles, stream)
        else:
            recorder.launch(*label(), lambda: self._go(handles, stream), stream, self.launches)

    def _go(self, handles, stream) -> None:
        if self.direct:
            for direct in self.direct:
                params = direct.params(handles)
                if _config.SIMULATED:
                    _packed_launch(direct, stream, params, handles)
                else:
                    compat.launch_direct(
                        direct.handle, direct.grid, direct.block, direct.shared, stream, params
                    )
            return
        found = []
        for launch in self.launches:
            params = [p.of(handles) if type(p) in SPECS else p for p in launch.params]
            kept = self.direct is not None
            _launch(launch.kernel, launch.grid, launch.threads, params, stream, launch.shared, kept)
            if self.direct is None:
                found.append(_direct(launch, params, handles))
        if self.direct is None:
            self.direct = tuple(found) if all(found) else ()


def _direct(launch: KernelLaunch, params: list, handles) -> Direct | None:
    """How to launch ``launch`` directly, from its first launch's parameters (``params``, made
    of ``handles``), or None where numba-cuda must launch it."""
    argtypes = compat.argument_types(params)
    handle = compat.direct_handle(launch.kernel, argtypes)
    if handle is None:
        return None
    grid, block = compat.normalize_kernel_dimensions(launch.grid, launch.threads)
    values = [p.raw(handles) if type(p) in SPECS else p for p in launch.params]
    template = packing.packer(argtypes)(values)
    leaves = zip(packing.leaves(argtypes), _leaf_specs(launch.params), strict=True)
    patches = tuple((at, read) for (at, ty), p in leaves if (read := _reader(p, ty)) is not None)
    return Direct(handle, argtypes, grid, block, launch.shared, template, patches)


def _leaf_specs(params):
    """The launch's parameters with tuples flattened, in order (as ``packing.leaves``)."""
    for p in params:
        if type(p) is Extras:
            yield from _leaf_specs(p.items)
        elif type(p) is tuple:
            yield from _leaf_specs(p)
        else:
            yield p


def _reader(spec, ty):
    """The function reading what a call changes at a leaf parameter (an array's address, a
    scalar's packed value) from its handles; None for a value fixed for every call."""
    address = packing.address_of
    if type(spec) is View:
        at = spec.array
        shift = spec.offset if spec.shape is not None and math.prod(spec.shape) else 0
        return lambda handles: address(handles[at]) + shift
    if type(spec) is Unused:
        return lambda handles, dtype=spec.dtype: address(arrays.unused(dtype))
    if type(spec) is Value:
        at = spec.index
        if isinstance(ty, types.Array):
            return lambda handles: address(handles[at])
        make = packing.scalar(ty)
        return lambda handles: make(handles[at])
    return None


def _packed_launch(direct: Direct, stream, params: list, handles) -> None:
    """The simulator's launch from packed parameters, their arrays found among the call's
    (``handles``) and the placeholders of absent ones (``arrays.unused``)."""
    from ..sim import packed

    if packed.skipped:  # sim.launches_skipped: the launch is not the caller's work
        return
    given = handles.values() if isinstance(handles, dict) else handles
    owners = [*map(_owner, given), *arrays.unused_all()]
    d = direct
    packed.launch(d.handle, d.grid, d.block, d.shared, stream, d.argtypes, params, owners)


def _owner(value):
    """The simulator's memory a launch's value lies in: an array's record (a CuPy or
    interface array, read but never made a numba array) as the allocation holding it."""
    from ..sim import device_arrays

    if type(value) is arrays.Arg and value.kind == arrays.DEVICE:
        memory = device_arrays.memory_at(value.address)
        if memory is not None:
            return memory
    return _handle(value)


def _launch(kernel, grid, threads, params: list, stream, shared: int, kept=False) -> None:
    if shared:
        go = dynamic_shared.launch_kept if kept else dynamic_shared.launch
        go(kernel, grid, threads, shared, params, stream)
    else:
        kernel[grid, threads, stream](*params)
