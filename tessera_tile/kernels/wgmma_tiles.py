"""The pieces the wgmma kernels share (:mod:`.matmul_wgmma`, :mod:`.attention_wgmma`): the
swizzled tiles' alignment, unpacking an accumulator tuple, a ring's stage counter and a producer
warpgroup's copy loop over full/empty mbarriers."""

from __future__ import annotations

from numba import cuda, int32, uint64

from ..mbarrier import cp_async_mbarrier_arrive, mbarrier_wait
from ..mma import wgmma_descriptor
from .tc_tiles import INLINE

WARPGROUP = 4  # warps
ALIGN = 1024  # bytes: a 128B swizzle atom (8 rows of 128 bytes)
CHUNK = 8  # 16-bit elements per 16-byte chunk (one cp.async)


@cuda.jit(device=True, **INLINE)
def swizzle_start(smem):
    """Elements from the start of the 16-bit dynamic shared array ``smem`` to its first
    1024-byte boundary, where a kernel's swizzled tiles start (the swizzle is a function of the
    address): the address bits 4..9 of the start are its descriptor's low 6 bits. Compiled,
    the array is declared ``.align 1024`` and this is 0; the simulator keeps no such
    alignment."""
    probe = wgmma_descriptor(smem, 0, 16, 16, 0)
    return int32(((uint64(64) - (probe & uint64(63))) & uint64(63)) * uint64(CHUNK))


def unpacker(count: int):
    """``unpack(acc, out)``: the ``count`` float32 of a wgmma accumulator tuple into ``out[0, j,
    q]`` (``j = i // 4``, ``q = i % 4``: the 16 x 8 tiles :mod:`.matmul_tc`'s epilogue reads),
    statement by statement so that every index is a constant (registers, no local memory)."""
    lines = ["def unpack(acc, out):"]
    lines += [f"    out[0, {i // 4}, {i % 4}] = acc[{i}]" for i in range(count)]
    namespace: dict = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own generated code
    return cuda.jit(device=True, **INLINE)(namespace["unpack"])


def stage_counter(stages: int):
    """``advance(s, phase)``: the next stage of a ring of ``stages``, and the parity its
    mbarrier waits take (it flips at each wrap)."""

    @cuda.jit(device=True, **INLINE)
    def advance(s, phase):
        s = int32(s + 1)
        if s == stages:
            return int32(0), int32(phase ^ 1)
        return s, int32(phase)

    return advance


def producer_loop(load, stages: int):
    """``produce(full, empty, tiles, payload)``: a producer warpgroup's loop over ``tiles``
    tiles in a ring of ``stages``: wait until the tile's stage is empty (every consumer has
    released it; on the first pass a fresh barrier's parity 1, which has completed), issue its
    copies with ``load(kt, stage, payload)``, and make their landing the producer's arrival on
    the stage's full barrier; then wait until the consumers have released every stage, so
    that no copy is in flight when the producer exits (the consumers must release each tile's
    stage, the last included). ``full`` and ``empty`` hold an mbarrier per stage."""

    advance = stage_counter(stages)

    @cuda.jit(device=True, **INLINE)
    def produce(full, empty, tiles, payload):
        kt = int32(0)
        s = int32(0)
        phase = int32(1)
        while kt < tiles:
            mbarrier_wait(empty, s, phase)
            load(kt, s, payload)
            cp_async_mbarrier_arrive(full, s)
            s, phase = advance(s, phase)
            kt = int32(kt + 1)
        for _ in range(stages):  # the tail: a stage never filled passes at once
            mbarrier_wait(empty, s, phase)
            s, phase = advance(s, phase)

    return produce
