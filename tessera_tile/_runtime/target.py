"""The one record of what kernels are planned and compiled for: :class:`Target`.

Every plan, cache key, ``explain`` and ``inspect`` reads :func:`current`, made here and nowhere
else: from the GPU where one runs kernels, from the simulated device in the simulator
(``sim.simulated_arch``), from :func:`planning_for` where an offline report names an
architecture, and otherwise :data:`OFFLINE`.

A name is a GPU as numba-cuda compiles for it: it builds every kernel for a device of compute
capability 9.0 as ``sm_90a`` (with Hopper's arch-specific instructions, warpgroup MMA among
them), so ``"sm_90"`` is that target and ``"sm_90a"`` another name for it. The simulator stands
for an sm_80 device (the mma.sync kernels) unless ``sim.simulated_arch`` names another.

Figures per architecture: CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability" (shared memory per block once opted in, per SM, resident warps and blocks per SM,
registers per SM).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from dataclasses import dataclass

from . import config as _config

STATIC_SHARED = 48 * 1024  # bytes of static shared memory per block, on every architecture
VECTOR_BYTES = 16  # the widest access a thread makes (128 bits: ld.v4.b32, a cp.async chunk)
GPU_SMS = 132  # the SMs of the largest parts (H100, H200) that grids are sized to fill


@dataclass(frozen=True)
class Target:
    """One architecture: what its kernels may use and which kernels it runs."""

    name: str  # "sm_80" ... "sm_90a"
    cc: tuple  # what NVVM and ptxas are given: (major, minor), and "a" for arch-specific
    block_shared: int  # bytes of shared memory a block may use once opted in
    sm_shared: int  # bytes of shared memory per SM usable by blocks
    max_warps: int  # resident warps per SM
    max_blocks: int  # resident blocks per SM
    registers: int = 65536  # 32-bit registers per SM
    static_shared: int = STATIC_SHARED
    reserved_shared: int = 1024  # per block, reserved by the system on sm_80+
    register_granularity: int = 256  # registers are allocated per warp in units of this
    shared_granularity: int = 128
    warp_size: int = 32

    @property
    def wgmma(self) -> bool:
        """Whether warpgroup MMA runs here (the arch-specific sm_90a)."""
        return self.cc == (9, 0, "a")


_KIB = 1024
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", (8, 0), 163 * _KIB, 164 * _KIB, max_warps=64, max_blocks=32),
        Target("sm_86", (8, 6), 99 * _KIB, 100 * _KIB, max_warps=48, max_blocks=16),
        Target("sm_87", (8, 7), 163 * _KIB, 164 * _KIB, max_warps=48, max_blocks=16),
        Target("sm_89", (8, 9), 99 * _KIB, 100 * _KIB, max_warps=48, max_blocks=24),
        Target("sm_90", (9, 0, "a"), 227 * _KIB, 228 * _KIB, max_warps=64, max_blocks=32),
        Target("sm_90a", (9, 0, "a"), 227 * _KIB, 228 * _KIB, max_warps=64, max_blocks=32),
    )
}
MAX_BLOCK_SHARED = max(t.block_shared for t in TARGETS.values())  # no architecture gives more
OFFLINE = "sm_90"  # planned for with no GPU, no simulator and no architecture named


def target(name: str | None) -> Target:
    """The target called ``name`` (None: :func:`current`); ``ValueError`` naming the known
    ones otherwise."""
    if name is None:
        return current()
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(TARGETS)}") from None


class _Planned(threading.local):
    name: str | None = None  # planning_for's architecture, in this thread


_planned = _Planned()
# The simulated device (simulating() changes it). Not per thread: the simulator runs a block's
# threads on threads of its own.
_simulated = ["sm_80"]


def current() -> Target:
    """What kernels are planned for now: :func:`planning_for`'s, else the simulated device's,
    else the GPU's, else :data:`OFFLINE`'s."""
    if _planned.name is not None:
        return TARGETS[_planned.name]
    if _config.SIMULATED:
        return simulated()
    return _gpu_target()


def simulated() -> Target:
    """The device the simulator stands for (its limits hold whatever is being planned)."""
    return TARGETS[_simulated[0]]


@functools.cache
def _gpu_target() -> Target:
    """Asked once per process (every plan reads it)."""
    if not _config.gpu_present():
        return TARGETS[OFFLINE]
    from numba import cuda

    device = cuda.get_current_device()
    major, minor = device.compute_capability
    name = f"sm_{major}{minor}"
    known = TARGETS.get(name) or Target(name, (major, minor), 0, 0, max_warps=64, max_blocks=32)
    return dataclasses.replace(  # the device's own shared-memory figures
        known,
        block_shared=int(device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        sm_shared=int(device.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
    )


@contextlib.contextmanager
def planning_for(name: str | None):
    """Inside, in this thread, plans are made for ``name`` wherever this runs (an offline
    ``explain`` or ``inspect``). ``None`` changes nothing."""
    if name is None:
        yield
        return
    target(name)
    saved, _planned.name = _planned.name, name
    try:
        yield
    finally:
        _planned.name = saved


@contextlib.contextmanager
def simulating(name: str):
    """Inside, the simulator stands for a device of architecture ``name``."""
    target(str(name))  # a known name (None is not one here)
    saved, _simulated[0] = _simulated[0], name
    try:
        yield
    finally:
        _simulated[0] = saved
