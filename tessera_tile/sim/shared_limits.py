"""The simulator refuses shared memory a GPU refuses.

* Static shared memory (``cuda.shared.array`` of a constant shape) over 48 KiB per block: ptxas
  refuses to build such a kernel ("uses too much shared data").
* Dynamic shared memory (``kernel[grid, block, stream, nbytes]``) that, with the block's static
  arrays, passes 48 KiB without the kernel's opt-in (:func:`opt_in`), or passes what it opted in
  to: the launch fails (``CUDA_ERROR_INVALID_VALUE``).
* An opt-in over the simulated architecture's limit: the driver refuses the attribute.

The simulator models an sm_80 device unless :func:`simulated_arch` says otherwise; the limits
per architecture are :mod:`tessera_tile._runtime.target`'s.
"""

from __future__ import annotations

from .._runtime import compat
from .._runtime import target as _target
from ._base import SimulationError

STATIC_LIMIT = _target.STATIC_SHARED  # bytes of static shared memory per block


# The bytes of dynamic shared memory a kernel opted into, per argument kinds: an attribute of
# the kernel object (two kernels of one function opt in apart), a dict its configured copies
# share, keyed as a GPU compiles one kernel (and keeps one attribute) per argument types.
_OPTED_IN = "_tessera_max_dynamic_shared"


class SharedMemoryError(SimulationError):
    """Shared memory a GPU would refuse (at compile time or at launch)."""


def block_limit(arch: str) -> int:
    """Bytes of shared memory (static and dynamic) a block may use on ``arch`` once opted in."""
    return _target.target(arch).block_shared


def simulated_arch(arch: str):
    """Inside (a context manager), the simulator stands for a device of architecture ``arch``:
    its shared-memory limits, and the kernels plans choose for it (``"sm_90a"``: warpgroup
    MMA)."""
    return _target.simulating(arch)


def _arch() -> str:
    return _target.simulated().name


def opt_in(kernel, args, nbytes: int) -> None:
    """Let ``kernel``, launched on arguments of the kinds of ``args``, use up to ``nbytes`` of
    dynamic shared memory, as ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` does for one
    compiled kernel; refused over the architecture's limit."""
    limit = block_limit(_arch())
    if not 0 <= nbytes <= limit:
        raise SharedMemoryError(
            f"cannot opt {kernel.fn.__name__} into {nbytes} B of dynamic shared memory: "
            f"{_arch()} allows a block at most {limit} B (CUDA_ERROR_INVALID_VALUE)"
        )
    opted = kernel.__dict__.setdefault(_OPTED_IN, {})
    opted[compat.argument_kinds(args)] = nbytes


def opted(kernel, args) -> int | None:
    """The bytes ``kernel`` opted into for arguments of the kinds of ``args``, or None."""
    return getattr(kernel, _OPTED_IN, {}).get(compat.argument_kinds(args))


def check_launch(fn, opted: int | None, dynamic: int) -> None:
    """At launch: the dynamic size within the kernel's attribute (what it opted into, else
    48 KiB less its static arrays, checked as they are declared: :func:`check_block`)."""
    limit = STATIC_LIMIT if opted is None else opted
    if dynamic > limit:
        raise SharedMemoryError(
            f"launch of {fn.__name__} with {dynamic} B of dynamic shared memory: the kernel may "
            f"use {limit} B"
            + ("" if opted else " without an opt-in")
            + " (CUDA_ERROR_INVALID_VALUE)"
        )


def check_block(fn, opted: int | None, static: int, dynamic: int) -> None:
    """When a block declares a static array: ``static`` bytes within 48 KiB (ptxas); without
    an opt-in ``static + dynamic`` within 48 KiB (the launch), with one ``static`` plus the
    opted-in size within the architecture's limit (the attribute)."""
    if static > STATIC_LIMIT:
        raise SharedMemoryError(
            f"{fn.__name__} uses too much shared data ({static} B of static shared memory, "
            f"{STATIC_LIMIT} B max): ptxas refuses it; use dynamic shared memory"
        )
    if opted is None and static + dynamic > STATIC_LIMIT:
        raise SharedMemoryError(
            f"launch of {fn.__name__}: {static} B of static and {dynamic} B of dynamic shared "
            f"memory need an opt-in over {STATIC_LIMIT} B (CUDA_ERROR_INVALID_VALUE)"
        )
    if opted is not None and static + opted > block_limit(_arch()):
        raise SharedMemoryError(
            f"{fn.__name__}: {static} B of static shared memory and an opt-in of {opted} B "
            f"pass {_arch()}'s {block_limit(_arch())} B per block (CUDA_ERROR_INVALID_VALUE)"
        )
