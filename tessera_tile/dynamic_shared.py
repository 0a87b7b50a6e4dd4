"""Shared memory beyond 48 KiB per block: the limits, the opt-in and the launch.

``cuda.shared.array`` of a constant shape is *static* shared memory, capped at 48 KiB per block
on every architecture. A block may use more, up to its architecture's limit, only as *dynamic*
shared memory (``cuda.shared.array(0, dtype)``, sized at launch) and only once the kernel has
opted in. numba-cuda has no API for the opt-in; :func:`launch` makes it and launches::

    from tessera_tile import dynamic_shared

    @cuda.jit
    def kernel(x, out):
        smem = cuda.shared.array(0, float32)   # the launch's dynamic bytes, 16-byte aligned
        a = smem[:A_SIZE]                      # carve it into the arrays the kernel needs
        b = smem[A_SIZE:]
        ...

    dynamic_shared.launch(kernel, grid, block, 96 * 1024, (x, out))

Limits per block (CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability", maximum amount of shared memory per thread block): sm_80 and sm_87 163 KiB,
sm_86 and sm_89 99 KiB, sm_90 227 KiB. On a GPU :func:`limit` reads the device's own figure; in
the simulator (an sm_90, unless ``sim.simulated_arch`` says otherwise) and offline it comes from
this table. The simulator refuses what the GPU refuses: static arrays over 48 KiB, dynamic
memory over 48 KiB without the opt-in, and either over the architecture's limit.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import numpy as np

from ._runtime import config as _config
from .sim import compat, shared_limits
from .sim.shared_limits import BLOCK_LIMIT, MAX_BLOCK_LIMIT, STATIC_LIMIT

__all__ = [
    "BLOCK_LIMIT",
    "MAX_BLOCK_LIMIT",
    "STATIC_LIMIT",
    "arch",
    "launch",
    "wgmma",
    "launch_kept",
    "limit",
    "opt_in",
    "planning_for",
]

OFFLINE_ARCH = "sm_90"  # what plans target with no GPU: the machine the default models describe


def arch() -> str:
    """The architecture kernels run on: the GPU's, the simulated one, else :data:`OFFLINE_ARCH`."""
    if _config.SIMULATED:
        return shared_limits.ARCH[0]
    if _config.gpu_present():
        from numba import cuda

        major, minor = cuda.get_current_device().compute_capability
        return f"sm_{major}{minor}"
    return OFFLINE_ARCH


class _Planning(threading.local):
    target: str | None = None  # the architecture an offline compile plans for


_planning = _Planning()


WGMMA_ARCHS = ("sm_90", "sm_90a")  # what numba-cuda builds for compute capability 9.0: sm_90a


@contextlib.contextmanager
def planning_for(arch: str | None):
    """Inside, plans are made for ``arch`` (an offline ``inspect`` or ``explain``): ``"sm_90"``
    (or ``"sm_90a"``) plans what a GPU of compute capability 9.0 runs, the warpgroup-MMA
    kernels; another architecture the others; wherever this runs. ``None`` changes nothing
    (plans for where kernels run)."""
    if arch is None:
        yield
        return
    shared_limits.block_limit(arch)  # an unknown architecture: ValueError, naming the known
    saved, _planning.target = _planning.target, arch
    try:
        yield
    finally:
        _planning.target = saved


def wgmma() -> bool:
    """Whether kernels run where warpgroup MMA is (sm_90a): on a GPU of compute capability 9.0
    or more (numba-cuda compiles for sm_90a there), in plans made for ``"sm_90"`` or
    ``"sm_90a"`` (:func:`planning_for`), or in the simulator standing for sm_90a
    (``sim.simulated_arch("sm_90a")``). The simulator's default device and plans made with no
    GPU and no architecture named run the mma.sync kernels."""
    if _planning.target is not None:
        return _planning.target in WGMMA_ARCHS
    if _config.SIMULATED:
        return shared_limits.ARCH[0] == "sm_90a"
    return _gpu_has_wgmma()


@functools.cache
def _gpu_has_wgmma() -> bool:
    """Asked once per process (every call plans with it): the GPU's compute capability."""
    if not _config.gpu_present():
        return False
    from numba import cuda

    return tuple(cuda.get_current_device().compute_capability) >= (9, 0)


def limit(target: str | None = None) -> int:
    """Bytes of shared memory a block may use once opted in: on ``target`` (from the table), or
    on the device kernels run on (a GPU's own figure; the simulated or offline one's)."""
    if target is None:
        if not _config.SIMULATED and _config.gpu_present():
            from numba import cuda

            return int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        target = arch()
    return shared_limits.block_limit(target)


_opted: dict = {}  # (kernel, argument types, device) -> bytes opted into
_lock = threading.Lock()


def _checked_bytes(nbytes) -> int:
    """``nbytes`` of dynamic shared memory: a non-negative int."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return int(nbytes)


def opt_in(kernel, args, nbytes: int) -> None:
    """Let ``kernel`` launch on ``args`` with up to ``nbytes`` of dynamic shared memory (once
    per kernel, argument types and device; the GPU compiles one kernel per argument types)."""
    nbytes = _checked_bytes(nbytes)
    if _config.SIMULATED:
        shared_limits.opt_in(kernel, args, nbytes)
        return
    from numba import cuda

    argtypes = tuple(kernel.typeof_pyval(a) for a in args)
    key = (kernel, argtypes, cuda.get_current_device().id)
    with _lock:
        if _opted.get(key, -1) < nbytes:
            compat.set_max_dynamic_shared(kernel, argtypes, nbytes)
            _opted[key] = nbytes


def launch_kept(kernel, grid, block, nbytes: int, args, stream=0) -> None:
    """:func:`launch` for arguments of the types ``kernel`` has launched with before (an op's
    kept call): launched without typing them again, and so without the opt-in's cost; where
    the device refuses it (another device, where the kernel has not opted in), opted in and
    launched again."""
    refusals = (
        (shared_limits.SharedMemoryError,) if _config.SIMULATED else compat.gpu_launch_errors()
    )
    try:
        kernel[grid, block, stream, nbytes](*args)
    except refusals:
        opt_in(kernel, args, nbytes)
        kernel[grid, block, stream, nbytes](*args)


def launch(kernel, grid, block, nbytes: int, args, stream=0) -> None:
    """``kernel[grid, block, stream, nbytes](*args)``, opted in first: without the opt-in a
    block's static and dynamic memory together may not pass 48 KiB."""
    if _checked_bytes(nbytes):
        opt_in(kernel, args, nbytes)
    kernel[grid, block, stream, nbytes](*args)
