"""Shared-memory ``mbarrier`` objects (sm_80+, inline PTX; each has a simulator twin).

An mbarrier is a 64-bit word of shared memory that counts arrivals: :func:`mbarrier_init` sets
its expected count; each arrival takes one off the pending count, and the arrival that brings it
to zero completes the current *phase*: the phase number goes up by one and the pending count
starts again from the expected count. A thread waits for a phase by its parity (0 for even
phases, 1 for odd): :func:`mbarrier_wait` returns once the phase of that parity, the current one
or the one just before it, has completed. A fresh barrier is in phase 0, so waiting on parity 1
returns at once (the phase "before" it counts as completed), which lets a producer start with
its empty buffers.

Unlike ``__syncthreads``, only the threads that arrive and the threads that wait take part, so
one warpgroup can copy tiles while others multiply: the producer waits on a stage's *empty*
barrier, issues its copies and makes their completion an arrival on the stage's *full* barrier
(:func:`cp_async_mbarrier_arrive`); a consumer waits on *full*, reads the stage and arrives on
*empty*.

==================================================  ===========================================
``mbarrier_init(bars, index, count)``               ``bars[index]`` (a shared uint64 array)
                                                    expects ``count`` arrivals a phase (1 to
                                                    2**20 - 1); publish it with a
                                                    ``cuda.syncthreads()`` before other threads
                                                    use it
``mbarrier_arrive(bars, index)``                    one arrival (release semantics: this
                                                    thread's earlier writes are visible to whoever
                                                    waits for the phase)
``mbarrier_wait(bars, index, parity)``              wait until the phase of ``parity`` (0 or 1)
                                                    has completed (acquire semantics)
``cp_async_mbarrier_arrive(bars, index)``           one arrival, made when all of this thread's
                                                    earlier ``cp.async`` copies have landed
                                                    (``.noinc``: it counts among the expected
                                                    arrivals)
==================================================  ===========================================

``mbarrier_wait`` spins on ``mbarrier.try_wait.parity`` (sm_90: the hardware suspends the thread
for a while on each try) or ``mbarrier.test_wait.parity`` (sm_80).

In the simulator a barrier's state lives beside the shared word (the hardware's encoding is
opaque): using a barrier that was never initialised, or before the ``cuda.syncthreads()`` that
follows its initialisation by another thread, a count or parity out of range, a barrier outside
shared memory or misaligned, all raise :class:`tessera_tile.sim.SimulationError`. A waiting thread
is suspended until its phase completes. The copies tracked by a
:func:`cp_async_mbarrier_arrive` land as late as a GPU could land them: when a thread waits on
that barrier and no thread can run any more; a missing wait shows up as a wrong result (shared
memory starts as NaN in the simulator), a wait that can never complete as a deadlock report.
"""

from __future__ import annotations

from numba import types
from numba.cuda.extending import intrinsic

from ._device import twins
from ._device.intrinsics import (
    check_index,
    element_pointer,
    shared_address,
    target_compute_capability,
    void_asm,
)
from ._runtime import config as _config
from ._runtime.compat import NumbaTypeError

if _config.SIMULATED:  # what the twins below use, run in the simulator only
    from . import sim
    from .sim.cp_async_twins import issued_copies

__all__ = ["cp_async_mbarrier_arrive", "mbarrier_arrive", "mbarrier_init", "mbarrier_wait"]

MAX_COUNT = 2**20 - 1  # PTX ISA: the expected arrival count of mbarrier.init
_STATE_KEY = "tessera_tile.mbarrier"

# --------------------------------------------------------------------------------------------
# Simulator twins
# --------------------------------------------------------------------------------------------


class _Barrier:
    """One simulated mbarrier: expected and pending counts, phase, deferred arrivals."""

    __slots__ = ("expected", "pending", "phase", "published", "owner", "deferred")

    def __init__(self, count: int, owner, epoch: int) -> None:
        self.expected = self.pending = count
        self.phase = 0
        self.owner = owner  # the initialising thread: others may use it after a barrier
        self.published = epoch + 1  # the block's barrier epoch from which all threads may
        self.deferred: list = []  # arrivals waiting for their copies: land() functions

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.expected

    def completed(self, parity: int) -> bool:
        """Whether the phase of ``parity`` (the current one or the one before) completed."""
        return (self.phase & 1) != parity

    def land_deferred(self) -> None:
        deferred, self.deferred = self.deferred, []
        for land in deferred:
            land()
            self.arrive()


def _barrier(bars, index, what: str, init_count=None) -> _Barrier:
    if bars.dtype.itemsize != 8 or bars.dtype.kind not in "iu":
        raise sim.SimulationError(f"{what}: an mbarrier is a 64-bit integer, not {bars.dtype}")
    if not sim.in_shared_memory(bars):
        raise sim.SimulationError(f"{what}: an mbarrier lives in shared memory")
    key = index if isinstance(index, tuple) else (index,)
    key = tuple(int(i) for i in key)
    if len(key) != bars.ndim or not all(0 <= i < n for i, n in zip(key, bars.shape, strict=True)):
        raise sim.SimulationError(f"{what}: index {key} out of bounds for {tuple(bars.shape)}")
    address = sim.element_address(bars, key)
    if address % 8:
        raise sim.SimulationError(f"{what}: the mbarrier is not 8-byte aligned")
    t = sim.current_thread()
    barriers = t.block.state.setdefault(_STATE_KEY, {})
    if init_count is not None:
        barriers[address] = _Barrier(init_count, t, t.block.barrier_epoch)
        return barriers[address]
    barrier = barriers.get(address)
    if barrier is None:
        raise sim.SimulationError(f"{what}: the mbarrier was never initialised (mbarrier_init)")
    if barrier.owner is not t and t.block.barrier_epoch < barrier.published:
        raise sim.SimulationError(
            f"{what}: the mbarrier's initialisation by another thread is not visible yet: "
            "cuda.syncthreads() after mbarrier_init, before other threads use it"
        )
    return barrier


def _init_twin(bars, index, count) -> None:
    count = int(count)
    if not 1 <= count <= MAX_COUNT:
        raise sim.SimulationError(f"mbarrier_init: count {count} is not in 1..{MAX_COUNT}")
    _barrier(bars, index, "mbarrier_init", init_count=count)


def _arrive_twin(bars, index) -> None:
    _barrier(bars, index, "mbarrier_arrive").arrive()


def _wait_twin(bars, index, parity) -> None:
    parity = int(parity)
    if parity not in (0, 1):
        raise sim.SimulationError(f"mbarrier_wait: parity must be 0 or 1, got {parity}")
    barrier = _barrier(bars, index, "mbarrier_wait")

    def ready(force: bool) -> bool:
        if not barrier.completed(parity) and force:
            barrier.land_deferred()
        return barrier.completed(parity)

    sim.block_until(ready, "mbarrier_wait")


def _cp_async_arrive_twin(bars, index) -> None:
    barrier = _barrier(bars, index, "cp_async_mbarrier_arrive")
    barrier.deferred.append(issued_copies())


# --------------------------------------------------------------------------------------------
# Intrinsics (inline PTX)
# --------------------------------------------------------------------------------------------


def _check(name: str, bars, index) -> None:
    check_index(name, bars, index)
    if not isinstance(bars.dtype, types.Integer) or bars.dtype.bitwidth != 64:
        raise NumbaTypeError(f"{name}: an mbarrier is a 64-bit integer, not {bars.dtype}")


def _barrier_address(context, builder, sig, args):
    """The shared-window address of ``bars[index]`` (the first two arguments)."""
    ptr = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
    return shared_address(builder, ptr)


@twins.twin(_init_twin)
@intrinsic
def mbarrier_init(typingctx, bars, index, count):
    """``mbarrier.init.shared.b64``: ``bars[index]`` expects ``count`` arrivals a phase."""
    _check("mbarrier_init", bars, index)
    if not isinstance(count, types.Integer):
        raise NumbaTypeError(f"mbarrier_init: count must be an integer, got {count}")

    def codegen(context, builder, sig, args):
        count32 = context.cast(builder, args[2], sig.args[2], types.uint32)
        address = _barrier_address(context, builder, sig, args)
        void_asm(builder, "mbarrier.init.shared.b64 [$0], $1;", [address, count32], "r,r,~{memory}")
        return context.get_dummy_value()

    return types.void(bars, types.unliteral(index), types.unliteral(count)), codegen


def _arrival(name: str, text: str, doc: str):
    """The typing of an intrinsic ``name(bars, index)`` whose PTX ``text`` takes the barrier's
    shared address as ``$0``."""

    def impl(typingctx, bars, index):
        _check(name, bars, index)

        def codegen(context, builder, sig, args):
            void_asm(builder, text, [_barrier_address(context, builder, sig, args)], "r,~{memory}")
            return context.get_dummy_value()

        return types.void(bars, types.unliteral(index)), codegen

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = doc
    return intrinsic(impl)


mbarrier_arrive = twins.twin(_arrive_twin)(
    _arrival(
        "mbarrier_arrive",
        "{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [$0]; }",
        "``mbarrier.arrive.shared.b64``: one arrival on ``bars[index]`` (release).",
    )
)


@twins.twin(_wait_twin)
@intrinsic
def mbarrier_wait(typingctx, bars, index, parity):
    """Wait until the phase of ``parity`` of ``bars[index]`` has completed (acquire): a loop
    on ``mbarrier.try_wait.parity`` (sm_90+) or ``mbarrier.test_wait.parity`` (sm_80)."""
    _check("mbarrier_wait", bars, index)
    if not isinstance(parity, types.Integer):
        raise NumbaTypeError(f"mbarrier_wait: parity must be an integer, got {parity}")

    def codegen(context, builder, sig, args):
        cc = target_compute_capability()
        test = "try_wait" if cc is not None and cc >= (9, 0) else "test_wait"
        parity32 = context.cast(builder, args[2], sig.args[2], types.uint32)
        address = _barrier_address(context, builder, sig, args)
        text = (
            "{ .reg .pred done; WAIT: "
            f"mbarrier.{test}.parity.shared.b64 done, [$0], $1; "
            "@!done bra WAIT; }"
        )
        void_asm(builder, text, [address, parity32], "r,r,~{memory}")
        return context.get_dummy_value()

    return types.void(bars, types.unliteral(index), types.unliteral(parity)), codegen


cp_async_mbarrier_arrive = twins.twin(_cp_async_arrive_twin)(
    _arrival(
        "cp_async_mbarrier_arrive",
        "cp.async.mbarrier.arrive.noinc.shared.b64 [$0];",
        "``cp.async.mbarrier.arrive.noinc.shared.b64``: an arrival on ``bars[index]`` once this "
        "thread's earlier ``cp.async`` copies have landed; counted among the expected arrivals.",
    )
)
