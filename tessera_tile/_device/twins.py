"""The twin registry: each inline-PTX intrinsic of the library names the Python function that
stands for it in the simulator (:func:`twin`). Kept outside :mod:`tessera_tile.sim`, so that
defining an intrinsic on a GPU, or offline, loads no part of the simulator; the simulator reads
the registry (:func:`twins`, :data:`transparent_code`).
"""

from __future__ import annotations

from collections.abc import Callable

from .._runtime import config as _config

# Code objects of twins: the accesses a twin makes belong to the kernel line that called it.
transparent_code: set = set()
_TWINS: dict[str, tuple[Callable, Callable]] = {}


def twin(python_impl: Callable) -> Callable[[Callable], Callable]:
    """Register ``python_impl`` as the simulator twin of an inline-PTX intrinsic.

    ::

        @twin(_cp_async_commit_twin)
        @intrinsic
        def cp_async_commit(typingctx): ...

    Under the simulator the decorated name is bound to the twin, which must have the same
    semantics (an async copy lands at its wait, not before); on a GPU, to the intrinsic.
    ``python_impl`` None: a twin the simulator defines, which a module imports only under it
    (:func:`absent` stands for a function of the simulator that makes twins); the decorator
    then changes nothing.
    Accesses a twin makes through :func:`tessera_tile.sim.load` and
    :func:`tessera_tile.sim.store` are attributed to the kernel line that called it.
    """

    if python_impl is None:  # a twin of the simulator's, not imported outside it
        return _unchanged

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


def _unchanged(intrinsic: Callable) -> Callable:
    return intrinsic


def absent(*args, **kwargs) -> None:
    """Stands outside the simulator for a function of it that makes twins: none is made."""
    return None


def twins() -> dict[str, tuple[Callable, Callable]]:
    """Registered intrinsics: name -> (intrinsic, twin)."""
    return dict(_TWINS)
