"""The one launch path: every kernel the library launches, generated (a fused function's
stages) or hand-written (the ops' kernels, the composer's GEMM and attention stages), goes
through :func:`run` or :func:`one`. So one place records launches for ``tessera_tile.profile``
and one place decides how a kernel is launched.

A hand-written call describes its launches as :class:`KernelLaunch` records whose parameters
are made per call from the call's arrays (:class:`View`, :class:`Unused`, :class:`Value`,
:class:`Extras`); the same records serve the run, a kept call, ``explain`` and ``inspect``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import dynamic_shared
from . import arrays


class View(NamedTuple):
    """A kernel parameter that views one of the call's arrays (inputs in order, then the
    result): as it is (``shape`` None), or with this shape, these byte strides and offset;
    of ``dtype`` where given (a bfloat16 array as its ``uint16`` bits)."""

    array: int
    shape: tuple | None = None
    strides: tuple = ()
    offset: int = 0
    dtype: np.dtype | None = None

    def of(self, handles: list):
        handle = handles[self.array]
        if self.shape is None:
            if self.dtype is None:
                return handle
            return arrays.view(handle, handle.shape, handle.strides, 0, self.dtype)
        return arrays.view(handle, self.shape, self.strides, self.offset, self.dtype)


class Unused(NamedTuple):
    """A kernel parameter the launch never reads or writes (an absent bias): a 1-element
    device array of ``dtype``, kept per device (``arrays.unused``), so calls allocate
    nothing for it."""

    dtype: np.dtype

    def of(self, handles: list):
        return arrays.unused(self.dtype)


class Value(NamedTuple):
    """A kernel parameter passed as the handle it names (a scalar argument of a fused call)."""

    index: int

    def of(self, handles: list):
        return handles[self.index]


class Extras(NamedTuple):
    """A tuple parameter (a generated matmul epilogue's arrays and scalars), its items made as
    the parameters are."""

    items: tuple

    def of(self, handles: list):
        return tuple(i.of(handles) if type(i) in SPECS else i for i in self.items)


SPECS = (View, Unused, Value, Extras)  # parameters given per launch; any other passed as it is


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


def run(launches, handles: list, stream, label, kept: bool = False) -> None:
    """Launch each :class:`KernelLaunch` on ``stream``, its parameters made of ``handles``
    (the call's device arrays: inputs in order, then the result). ``label``: a function
    giving the :class:`Label` a profile records (called only while one is active);
    ``kept``: a kept call, whose kernels have launched on arguments of these types before."""

    def go():
        for launch in launches:
            params = [p.of(handles) if type(p) in SPECS else p for p in launch.params]
            _launch(launch.kernel, launch.grid, launch.threads, params, stream, launch.shared, kept)

    if recorder is None:
        go()
    else:
        recorder.launch(*label(), go, stream, [k.kernel for k in launches])


def one(kernel, grid, threads, params: list, stream, label) -> None:
    """Launch ``kernel`` once on these parameters (a generated stage's), as :func:`run`."""
    if recorder is None:
        kernel[grid, threads, stream](*params)
        return

    def go():
        kernel[grid, threads, stream](*params)

    recorder.launch(*label(), go, stream, [kernel])


def _launch(kernel, grid, threads, params: list, stream, shared: int, kept: bool) -> None:
    if shared:
        go = dynamic_shared.launch_kept if kept else dynamic_shared.launch
        go(kernel, grid, threads, shared, params, stream)
    else:
        kernel[grid, threads, stream](*params)
