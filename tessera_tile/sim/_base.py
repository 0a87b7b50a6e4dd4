"""What every part of the simulator shares: its error, call-site attribution and the twin
registry. A leaf: it imports no other module of :mod:`tessera_tile.sim`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from .._runtime import config as _config

SIM_DIR = str(Path(__file__).resolve().parent)
# Code objects of twins: the accesses a twin makes belong to the kernel line that called it.
transparent_code: set = set()
_TWINS: dict[str, tuple[Callable, Callable]] = {}


class SimulationError(RuntimeError):
    """A kernel did something that has no defined meaning on a GPU (bad mask, deadlock...)."""


def user_site(depth: int = 2) -> tuple[str, int]:
    """(file, line) of the nearest frame outside the simulator and registered twins."""
    frame = sys._getframe(depth)
    while frame is not None and (
        frame.f_code.co_filename.startswith(SIM_DIR) or frame.f_code in transparent_code
    ):
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def format_site(site: tuple[str, int]) -> str:
    """``file.py:line`` of a :func:`user_site` result."""
    return f"{Path(site[0]).name}:{site[1]}"


def twin(python_impl: Callable) -> Callable[[Callable], Callable]:
    """Register ``python_impl`` as the simulator twin of an inline-PTX intrinsic.

    ::

        @twin(_cp_async_commit_twin)
        @intrinsic
        def cp_async_commit(typingctx): ...

    Under the simulator the decorated name is bound to the twin, which must have the same
    semantics (an async copy lands at its wait, not before); on a GPU, to the intrinsic.
    Accesses a twin makes through :func:`tessera_tile.sim.load` and
    :func:`tessera_tile.sim.store` are attributed to the kernel line that called it.
    """

    def register(intrinsic: Callable) -> Callable:
        # named where the intrinsic is defined (its twin may live in the simulator's modules)
        module = getattr(getattr(intrinsic, "_defn", intrinsic), "__module__", None)
        name = f"{module or python_impl.__module__}."
        name += getattr(intrinsic, "__name__", python_impl.__name__)
        _TWINS[name] = (intrinsic, python_impl)
        if _config.SIMULATED:
            transparent_code.add(python_impl.__code__)
            return python_impl
        return intrinsic

    return register


def twins() -> dict[str, tuple[Callable, Callable]]:
    """Registered intrinsics: name -> (intrinsic, twin)."""
    return dict(_TWINS)
