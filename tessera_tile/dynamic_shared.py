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
sm_86 and sm_89 99 KiB, sm_90 227 KiB. On a GPU :func:`limit` reads the device's own figure;
in the simulator (an sm_80, unless ``sim.simulated_arch`` says otherwise) and offline (an sm_90)
it comes from this table. The simulator refuses what the GPU refuses: static arrays over 48 KiB,
dynamic memory over 48 KiB without the opt-in, and either over the architecture's limit.
"""

from __future__ import annotations

import threading

import numpy as np

from ._runtime import compat
from ._runtime import config as _config
from ._runtime import target as _target

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

STATIC_LIMIT = _target.STATIC_SHARED  # bytes of static shared memory per block, everywhere
BLOCK_LIMIT = {name: t.block_shared for name, t in _target.TARGETS.items()}  # once opted in
MAX_BLOCK_LIMIT = _target.MAX_BLOCK_SHARED  # no architecture gives a block more
planning_for = _target.planning_for  # inside, plans are made for the architecture named


def arch() -> str:
    """The architecture kernels are planned for (:func:`tessera_tile._runtime.target.current`):
    the GPU's, the simulated one (sm_80 unless ``sim.simulated_arch`` names another), the one
    :func:`planning_for` names, else ``"sm_90"``."""
    return _target.current().name


def wgmma() -> bool:
    """Whether the kernels are planned for a device with warpgroup MMA: compute capability 9.0,
    which numba-cuda compiles for as sm_90a (a GPU, ``planning_for("sm_90")``, offline with no
    architecture named, or ``sim.simulated_arch("sm_90")``)."""
    return _target.current().wgmma


def limit(target: str | None = None) -> int:
    """Bytes of shared memory a block may use once opted in: on ``target`` (from the table), or
    where kernels are planned for (a GPU's own figure; the simulated or offline one's)."""
    return _target.target(target).block_shared


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
        from .sim import shared_limits

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
    refusals = _simulated_refusals() if _config.SIMULATED else compat.gpu_launch_errors()
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


def _simulated_refusals() -> tuple[type, ...]:
    from .sim import shared_limits  # the simulator's, loaded only when it runs

    return (shared_limits.SharedMemoryError,)
