"""A warp-aware, faster, instrumented extension of numba-cuda's CUDA simulator.

Under ``NUMBA_ENABLE_CUDASIM=1``, importing tessera_tile installs it (``install()`` does it
explicitly and is idempotent). It changes numba-cuda's simulator from outside, without editing
it, and every simulated kernel gets it, whether or not it uses tessera_tile:

* warp operations with CUDA's semantics: ``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
  ``shfl_xor_sync``, ``syncwarp``, ``all_sync``, ``any_sync``, ``eq_sync``, ``ballot_sync``,
  ``match_any_sync``, ``match_all_sync``, ``activemask``, ``lanemask_lt``, ``laneid``,
  ``warpsize``; masks follow PTX (lanes that exited or do not exist are not waited for;
  :func:`strict_masks` makes naming them an error); a mask that excludes the caller or a
  divergent deadlock raises :class:`SimulationError` naming the lanes and source lines
  instead of hanging;
* the GPU's rules: a non-contiguous host array passed to a kernel is refused as on a GPU,
  integer arithmetic follows Numba's typing (``int32 + int32`` is int64), and ``math.*`` follows
  CUDA (IEEE results instead of exceptions, numba-cuda's result types: :mod:`.cuda_math`);
* speed: a block's threads are greenlets in one OS thread, not OS threads polled in a loop;
* twins: inline-PTX intrinsics register a Python implementation with :func:`twin`; warp
  collectives of ``.sync.aligned`` instructions (``ldmatrix``, ``mma.sync``) define their
  semantics with :func:`register_aligned` and arrive with :func:`aligned_collective`;
* ``with profile() as prof:``: global traffic, bank conflicts, races, out-of-bounds accesses
  and undefined shuffle reads;
* shared memory held to the GPU's limits (:mod:`.shared_limits`): static arrays over 48 KiB,
  dynamic memory over 48 KiB without an opt-in, either over the architecture's limit.

Kernels must refer to the module as ``cuda`` (``from numba import cuda``), as numba-cuda's
simulator requires.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING

from .._device.twins import twin, twins
from .._runtime import config as _config
from ._base import SimulationError
from .transfers import transfers  # named as its module: a lazy name would lose to the module

if TYPE_CHECKING:
    from .profiler import Profile

# Everything else is imported on first use (a user's kernel module that registers a twin with
# sim.twin loads _base, not the simulator).
_LAZY = {
    "wavefronts": ".._device.banks",
    "Profile": ".profiler", "Race": ".profiler",
    "aligned_collective": ".scheduler", "block_until": ".scheduler",
    "in_shared_memory": ".scheduler", "register_aligned": ".scheduler",
    "strict_masks": ".scheduler",
    "SharedMemoryError": ".shared_limits", "simulated_arch": ".shared_limits",
    "OutOfBounds": ".tracked_arrays", "TrackedArray": ".tracked_arrays",
    "address": ".tracked_arrays", "carved": ".tracked_arrays",
    "element_address": ".tracked_arrays", "in_allocation": ".tracked_arrays",
    "load": ".tracked_arrays", "store": ".tracked_arrays",
}  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:  # kept as a global: twins ask for these names in their inner loops
        value = globals()[name] = getattr(importlib.import_module(_LAZY[name], __name__), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "OutOfBounds",
    "Profile",
    "Race",
    "SharedMemoryError",
    "SimulationError",
    "TrackedArray",
    "address",
    "aligned_collective",
    "block_until",
    "carved",
    "current_thread",
    "element_address",
    "enabled",
    "in_allocation",
    "in_shared_memory",
    "install",
    "installed",
    "launches_skipped",
    "load",
    "profile",
    "register_aligned",
    "simulated_arch",
    "stock",
    "store",
    "strict_masks",
    "transfers",
    "twin",
    "twins",
    "wavefronts",
]


def enabled() -> bool:
    """True when Numba runs kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return _config.SIMULATED


def _engine():
    from . import engine

    return engine


def install() -> None:
    """Install the warp-aware simulator (idempotent). Needs ``NUMBA_ENABLE_CUDASIM=1``."""
    if not _config.SIMULATED:
        raise RuntimeError(
            "tessera_tile.sim.install() needs NUMBA_ENABLE_CUDASIM=1 set before Numba is imported"
        )
    if not _engine().patched():
        _engine().patch()


def installed() -> bool:
    """True when simulated launches go through this simulator."""
    return _config.SIMULATED and _engine().patched()


@contextlib.contextmanager
def stock():
    """Run the launches inside with numba-cuda's own simulator (for side-by-side benchmarks)."""
    engine = _engine()
    was = engine.patched()
    engine.unpatch()
    try:
        yield
    finally:
        if was:
            engine.patch()


@contextlib.contextmanager
def launches_skipped():
    """Inside, a kernel launch (``kernel[grid, block, stream](...)``, configuration included)
    returns at once without running: what a call costs then is the host's own work
    (``benchmarks/overhead.py`` times it). Not for results: outputs stay unset."""
    install()
    _engine().skip_launches(True)
    try:
        yield
    finally:
        _engine().skip_launches(False)


def current_thread():
    """The simulated thread running now; twins keep per-thread state in its ``state`` dict."""
    return _engine().current_thread()


def profile() -> Profile:
    """Profile the simulated launches made inside the ``with`` block.

    >>> with tessera_tile.sim.profile() as prof:
    ...     kernel[blocks, threads](x, y)
    >>> prof.bytes_read, prof.bytes_written, prof.bank_conflicts, prof.races

    See :class:`Profile` for what it holds; ``print(prof)`` shows a report.
    """
    install()
    from .profiler import Profile

    return Profile()
