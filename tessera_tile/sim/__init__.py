"""A warp-aware, faster, instrumented extension of numba-cuda's CUDA simulator.

Under ``NUMBA_ENABLE_CUDASIM=1``, importing tessera_tile installs it (``install()`` does it
explicitly and is idempotent). It changes numba-cuda's simulator from outside, without editing
it, and every simulated kernel gets it, whether or not it uses tessera_tile:

* warp operations with CUDA's semantics: ``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
  ``shfl_xor_sync``, ``syncwarp``, ``all_sync``, ``any_sync``, ``eq_sync``, ``ballot_sync``,
  ``match_any_sync``, ``match_all_sync``, ``activemask``, ``lanemask_lt``, ``laneid``,
  ``warpsize``; a bad mask or a divergent deadlock raises :class:`SimulationError` naming the
  lanes and source lines instead of hanging;
* speed: a block's threads are greenlets in one OS thread, not OS threads polled in a loop;
* twins: inline-PTX intrinsics register a Python implementation with :func:`twin`;
* ``with profile() as prof:``: global traffic, bank conflicts, races and out-of-bounds accesses.

Kernels must refer to the module as ``cuda`` (``from numba import cuda``), as numba-cuda's
simulator requires.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Callable

from .profiler import (
    OutOfBounds,
    Profile,
    Race,
    TrackedArray,
    address,
    load,
    profile,
    store,
    wavefronts,
)

__all__ = [
    "OutOfBounds",
    "Profile",
    "Race",
    "SimulationError",
    "TrackedArray",
    "address",
    "current_thread",
    "enabled",
    "install",
    "installed",
    "load",
    "profile",
    "stock",
    "store",
    "twin",
    "twins",
    "wavefronts",
]

SUPPORTED_NUMBA_CUDA = ((0, 30), (0, 31))  # [lowest, highest) major.minor


def enabled() -> bool:
    """True when Numba runs kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _check_version() -> None:
    version = importlib.metadata.version("numba-cuda")
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    low, high = SUPPORTED_NUMBA_CUDA
    if not low <= major_minor < high:
        raise RuntimeError(
            f"tessera_tile.sim supports numba-cuda {low[0]}.{low[1]} up to (not including) "
            f"{high[0]}.{high[1]}; numba-cuda {version} is installed. Install a supported "
            "version (pip install 'numba-cuda[cu13]>=0.30,<0.31')."
        )


def install() -> None:
    """Install the warp-aware simulator (idempotent). Needs ``NUMBA_ENABLE_CUDASIM=1``."""
    if not enabled():
        raise RuntimeError(
            "tessera_tile.sim.install() needs NUMBA_ENABLE_CUDASIM=1 set before Numba is imported"
        )
    _check_version()
    from . import engine

    if not engine.patched():
        engine.patch()


def installed() -> bool:
    if not enabled():
        return False
    from . import engine

    return engine.patched()


@contextlib.contextmanager
def stock():
    """Run the launches inside with numba-cuda's own simulator (for side-by-side benchmarks)."""
    from . import engine

    was = engine.patched()
    engine.unpatch()
    try:
        yield
    finally:
        if was:
            engine.patch()


def current_thread():
    """The simulated thread running now; twins keep per-thread state in its ``state`` dict."""
    from .engine import current_thread as _current

    return _current()


_TWINS: dict[str, tuple[Callable, Callable]] = {}


def twin(python_impl: Callable) -> Callable[[Callable], Callable]:
    """Register ``python_impl`` as the simulator twin of an inline-PTX intrinsic.

    ::

        @twin(_cp_async_commit_twin)
        @intrinsic
        def cp_async_commit(typingctx): ...

    Under the simulator the decorated name is bound to the twin, which must have the same
    semantics (an async copy lands at its wait, not before); on a GPU, to the intrinsic.
    Accesses a twin makes through :func:`load` and :func:`store` are attributed to the kernel
    line that called it.
    """

    def register(intrinsic: Callable) -> Callable:
        name = f"{python_impl.__module__}.{getattr(intrinsic, '__name__', python_impl.__name__)}"
        _TWINS[name] = (intrinsic, python_impl)
        if enabled():
            from .engine import _transparent_code

            _transparent_code.add(python_impl.__code__)
            return python_impl
        return intrinsic

    return register


def twins() -> dict[str, tuple[Callable, Callable]]:
    """Registered intrinsics: name -> (intrinsic, twin)."""
    return dict(_TWINS)


def __getattr__(name: str):
    if name == "SimulationError":
        from .engine import SimulationError

        return SimulationError
    raise AttributeError(name)


def _auto_install() -> None:
    if enabled():
        install()
