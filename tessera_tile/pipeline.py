"""Multi-stage shared-memory ring buffers for K-loops, fed by ``cp.async`` (or plain copies).

Two layers, both usable from any ``@cuda.jit`` kernel:

**cp.async intrinsics** (sm_80+, inline PTX; each has a simulator twin):

=========================================================  =======================================
``cp_async_4/8/16(dst, dst_index, src, src_index)``        copy 4/8/16 bytes global -> shared,
                                                           ``.ca`` (cached in L1 and L2)
``cp_async_cg_16(dst, dst_index, src, src_index)``         16 bytes, ``.cg`` (L2 only, bypasses L1)
``cp_async_4/8/16_zfill(..., src_bytes)``                  copy the first ``src_bytes`` bytes and
``cp_async_cg_16_zfill(..., src_bytes)``                   zero the rest (0 reads nothing)
``cp_async_cg_16_zfill_at(..., src_offset, src_bytes)``    the same, from an element offset
``cp_async_commit_group()``                                close this thread's pending copies into
                                                           a group
``cp_async_wait_group(n)``                                 wait until at most ``n`` (a compile-time
                                                           constant) of this thread's committed
                                                           groups are still in flight
``cp_async_wait_all()``                                    commit, then wait for everything
=========================================================  =======================================

``dst`` is a shared array, ``src`` a global array of the same dtype; the copy covers the
``bytes // itemsize`` consecutive elements starting at ``dst[dst_index]`` / ``src[src_index]``
(an int, or a tuple with one index per dimension). Both addresses must be aligned to the copy
size: allocate the shared array with ``alignment=SHARED_ALIGN``. A wait only covers the calling
thread's copies: follow it with ``cuda.syncthreads()`` before reading what other threads copied.

``cp_async_cg_16_zfill_at`` names the source by an element offset from ``src[0, ..., 0]``
instead of an index: an integer, or a pair ``(base, step)`` added in that order, so that the
compiler forms the address of a ``base`` shared by many copies once and adds each ``step`` (2
instructions). From an index it rebuilds the address from every index and stride, and under
register pressure does so per copy: the wgmma GEMM's one-warpgroup loop (128 x 128 x 64) went
from 195 to 144 instructions per k-tile with offsets. Like an address, an offset may cross rows
and leave the view; the twin checks that the bytes read lie inside the array's allocation.

In the simulator the copies are *really* asynchronous as far as a program can tell: a copy is
recorded in the thread's pending group; ``cp_async_commit_group`` closes the group;
``cp_async_wait_group(n)`` lands all but the ``n`` most recent committed groups (global read and
shared write, counted by :func:`tessera_tile.sim.profile`); a copy that is never waited for
never lands. A missing wait or commit therefore shows up as a wrong result (shared memory starts
as NaN / -1 bytes in the simulator) instead of passing by luck. The twins also raise
:class:`tessera_tile.sim.SimulationError` on misaligned or out-of-bounds copies.

**Ring buffers** (:func:`ring_buffer`): tile ``k`` of a K-loop lives in stage ``k % STAGES``;
while the block consumes tile ``k``, the copies of tiles ``k+1 .. k+STAGES-1`` are in flight::

    STAGES = 3                  stage 0     stage 1     stage 2
    iteration k = 3:          +-----------+-----------+-----------+
                              | tile 3    | tile 4    | tile 5    |
                              | consumed  | in flight | issued now|  <- load_tile(ring, src, 5)
                              +-----------+-----------+-----------+     refills the stage that
                                ^ wait_tile(3) returns 0                tile 2 freed

    prologue:   load_tile(0) commit | load_tile(1) commit         (STAGES - 1 groups)
    iteration:  s = wait_tile(k)    -> cp.async.wait_group(STAGES - 2) + syncthreads
                load_tile(k + STAGES - 1); commit               (every thread, every step)
                ... read ring[s, ...] ...

Single operand::

    from numba import cuda, float32
    from tessera_tile import pipeline

    TILE = 256
    A = pipeline.ring_buffer(stages=3, tile=(TILE,), dtype=float32)
    A_SHAPE = A.shape  # numba needs module-level constants for shared shapes
    ALIGN = pipeline.SHARED_ALIGN

    @cuda.jit
    def total(x, out):
        ring = cuda.shared.array(A_SHAPE, float32, alignment=ALIGN)
        A.fill(ring, x)                          # prologue: tiles 0 .. STAGES-2
        acc = float32(0)
        for k in range(A.num_tiles(x)):
            s = A.wait_tile(k)                   # tile k has landed, block-wide
            A.load_tile(ring, x, k + A.stages - 1)   # refill (past the end: no copy)
            A.commit()
            acc += ring[s, cuda.threadIdx.x]
        ...

Several operands (``A`` and ``B`` of a matmul) share the cp.async groups: issue every
operand's ``load_tile`` and then call ``commit()`` once per step, prologue included
(``for k in range(STAGES - 1): A.load_tile(ra, a, k); B.load_tile(rb, b, k); A.commit()``);
``fill`` is the one-operand shortcut. All rings of one loop need the same ``stages``.

With ``async_copy=False`` the same functions copy synchronously (loads then stores, for targets
older than sm_80); ``commit`` is a no-op and ``wait_tile`` only synchronises the block.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic

from ._device import twins
from ._device.intrinsics import (
    check_index,
    element_pointer,
    integer_count,
    shared_address,
    thread_rank,
    void_asm,
)
from ._runtime import config as _config
from ._runtime.compat import NumbaTypeError, as_dtype, cgutils

if _config.SIMULATED:  # the twins, the simulator's (not imported outside it)
    from .sim.cp_async_twins import _commit_twin, _copy_twin, _wait_all_twin, _wait_group_twin
else:
    _commit_twin = _wait_all_twin = _wait_group_twin = None
    _copy_twin = twins.absent

__all__ = [
    "SHARED_ALIGN",
    "RingBuffer",
    "cp_async_16",
    "cp_async_16_zfill",
    "cp_async_4",
    "cp_async_4_zfill",
    "cp_async_8",
    "cp_async_8_zfill",
    "cp_async_cg_16",
    "cp_async_cg_16_zfill",
    "cp_async_cg_16_zfill_at",
    "cp_async_commit_group",
    "cp_async_wait_all",
    "cp_async_wait_group",
    "ring_buffer",
]

SHARED_ALIGN = 16  # bytes; pass as ``alignment=`` to cuda.shared.array for cp.async targets

# --------------------------------------------------------------------------------------------
# Intrinsics (inline PTX)
# --------------------------------------------------------------------------------------------


def _make_copy(size: int, cache: str, zfill: bool, at: bool = False) -> Any:
    """The intrinsic; ``at``: the source is an element offset from ``src[0, ..., 0]``."""
    name = f"cp_async{'_cg' if cache == 'cg' else ''}_{size}{'_zfill' if zfill else ''}"
    name += "_at" if at else ""
    operands = "[$0], [$1], " + (f"{size}, $2" if zfill else f"{size}")
    asm = f"cp.async.{cache}.shared.global {operands};"
    constraints = "r,l,r,~{memory}" if zfill else "r,l,~{memory}"

    def typer(typingctx, dst, dst_index, src, src_index, *rest):
        check_index(name, dst, dst_index)
        if not at:
            check_index(name, src, src_index)
        elif not isinstance(src, types.Array) or integer_count(src_index) not in (1, 2):
            raise NumbaTypeError(
                f"{name} takes an array and an element offset: an integer or a pair"
            )
        if dst.dtype != src.dtype:
            raise NumbaTypeError(f"{name}: shared {dst.dtype} and global {src.dtype} differ")
        item = dst.dtype.bitwidth // 8
        if size % item:
            raise NumbaTypeError(f"{name}: {size} bytes is not a whole number of {dst.dtype}")
        args = [dst, types.unliteral(dst_index), src, types.unliteral(src_index)]
        if zfill:
            if len(rest) != 1 or not isinstance(rest[0], types.Integer):
                raise NumbaTypeError(f"{name} takes src_bytes, an integer, last")
            args.append(types.unliteral(rest[0]))
        elif rest:
            raise NumbaTypeError(f"{name} takes (dst, dst_index, src, src_index)")

        def codegen(context, builder, sig, llargs):
            dst_t, dst_it, src_t, src_it = sig.args[:4]
            dptr = element_pointer(context, builder, dst_t, llargs[0], dst_it, llargs[1])
            if at:  # the data pointer moved by the offset (a pair: in two steps)
                sptr = context.make_array(src_t)(context, builder, value=llargs[2]).data
                if isinstance(src_it, types.BaseTuple):
                    parts = zip(cgutils.unpack_tuple(builder, llargs[3]), src_it, strict=True)
                else:
                    parts = [(llargs[3], src_it)]
                for value, typ in parts:
                    sptr = builder.gep(sptr, [context.cast(builder, value, typ, types.intp)])
            else:
                sptr = element_pointer(context, builder, src_t, llargs[2], src_it, llargs[3])
            byte = ir.IntType(8)
            sglobal = builder.addrspacecast(
                builder.bitcast(sptr, byte.as_pointer()), byte.as_pointer(1)
            )
            operands = [shared_address(builder, dptr), builder.ptrtoint(sglobal, ir.IntType(64))]
            if zfill:
                operands.append(context.cast(builder, llargs[4], sig.args[4], types.uint32))
            void_asm(builder, asm, operands, constraints)
            return context.get_dummy_value()

        return types.void(*args), codegen

    if zfill:

        def impl(typingctx, dst, dst_index, src, src_index, src_bytes):
            return typer(typingctx, dst, dst_index, src, src_index, src_bytes)

    else:

        def impl(typingctx, dst, dst_index, src, src_index):
            return typer(typingctx, dst, dst_index, src, src_index)

    impl.__name__ = impl.__qualname__ = name
    source = "src_offset" if at else "src_index"
    origin = (
        "the address ``src_offset`` elements (an integer, or a pair added) past ``src[0, ..., 0]``"
        if at
        else "``src[src_index]``"
    )
    impl.__doc__ = (
        f"``{name}(dst, dst_index, src, {source}{', src_bytes' if zfill else ''})``: "
        f"cp.async.{cache} of {size} bytes from {origin} (global) to ``dst[dst_index]`` (shared)"
        + (", reading only ``src_bytes`` bytes and zeroing the rest." if zfill else ".")
    )
    twin_fn = _copy_twin(size, zfill, at)
    if twin_fn is not None:  # (none outside the simulator)
        twin_fn.__name__ = twin_fn.__qualname__ = f"{name}_twin"
    return twins.twin(twin_fn)(intrinsic(impl))


cp_async_4 = _make_copy(4, "ca", zfill=False)
cp_async_8 = _make_copy(8, "ca", zfill=False)
cp_async_16 = _make_copy(16, "ca", zfill=False)
cp_async_cg_16 = _make_copy(16, "cg", zfill=False)
cp_async_4_zfill = _make_copy(4, "ca", zfill=True)
cp_async_8_zfill = _make_copy(8, "ca", zfill=True)
cp_async_16_zfill = _make_copy(16, "ca", zfill=True)
cp_async_cg_16_zfill = _make_copy(16, "cg", zfill=True)
cp_async_cg_16_zfill_at = _make_copy(16, "cg", zfill=True, at=True)


@twins.twin(_commit_twin)
@intrinsic
def cp_async_commit_group(typingctx):
    """``cp.async.commit_group``: close this thread's pending copies into one group."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "cp.async.commit_group;")
        return context.get_dummy_value()

    return types.void(), codegen


@twins.twin(_wait_group_twin)
@intrinsic  # tried with a literal n after the non-literal typing fails
def cp_async_wait_group(typingctx, n):
    """``cp.async.wait_group n``: at most ``n`` (a compile-time constant) groups stay in flight."""
    if not isinstance(n, types.IntegerLiteral):
        raise NumbaTypeError(f"cp_async_wait_group needs a compile-time constant, got {n}")
    pending = n.literal_value
    if not 0 <= pending <= 7:
        raise NumbaTypeError(f"cp_async_wait_group: n must be in 0..7, got {pending}")

    def codegen(context, builder, sig, args):
        void_asm(builder, f"cp.async.wait_group {pending};")
        return context.get_dummy_value()

    return types.void(n), codegen


@twins.twin(_wait_all_twin)
@intrinsic
def cp_async_wait_all(typingctx):
    """``cp.async.wait_all``: commit the pending copies and wait for every group."""

    def codegen(context, builder, sig, args):
        void_asm(builder, "cp.async.wait_all;")
        return context.get_dummy_value()

    return types.void(), codegen


_COPY = {
    (4, False): cp_async_4_zfill,
    (8, False): cp_async_8_zfill,
    (16, False): cp_async_16_zfill,
    (16, True): cp_async_cg_16_zfill,
}

# --------------------------------------------------------------------------------------------
# Ring buffers
# --------------------------------------------------------------------------------------------


class RingBuffer(NamedTuple):
    """Compile-time description and device functions of one ring buffer (see the module doc).

    Use it from a kernel as a module-level global (``A = ring_buffer(...)``, then
    ``A.load_tile(...)`` in the kernel), and copy ``A.shape`` to a module-level constant for
    ``cuda.shared.array(A_SHAPE, dtype, alignment=SHARED_ALIGN)``.

    Device functions (every thread of the block calls each one, with the same arguments):

    ``load_tile(ring, src, k)``
        Copy tile ``k`` of ``src`` into stage ``k % stages``; elements outside ``src`` become 0;
        nothing is copied when ``k >= num_tiles(src)``. Async: issues copies, does not commit.
    ``commit()``
        Close this step's copies into one cp.async group (no-op when synchronous).
    ``wait_tile(k) -> int``
        Wait until tile ``k`` has landed (``cp.async.wait_group(stages - 2)``), then
        ``cuda.syncthreads()``; returns its stage ``k % stages``. Needs one ``commit`` per
        tile step, ``stages - 1`` of them before the loop.
    ``fill(ring, src)``
        The prologue for one operand: ``load_tile`` + ``commit`` for tiles ``0 .. stages-2``.
    ``num_tiles(src) -> int``
        Tiles along the K axis: ``ceil(src.shape[k_axis] / tile[k_axis])``.
    ``drain()``
        Wait for every copy in flight (``cp.async.wait_all``) and synchronise the block; only
        needed when leaving the loop early and reusing the shared memory.
    """

    shape: tuple[int, ...]  # (stages, *tile)
    stages: int
    tile: tuple[int, ...]
    k_axis: int
    copy_bytes: int
    async_copy: bool
    load_tile: Any
    commit: Any
    wait_tile: Any
    fill: Any
    num_tiles: Any
    drain: Any


def ring_buffer(
    stages: int,
    tile: tuple[int, ...] | int,
    dtype: Any,
    *,
    k_axis: int | None = None,
    async_copy: bool = True,
    copy_bytes: int = 16,
    on_load=None,
) -> RingBuffer:
    """A ``stages``-deep shared-memory ring of ``tile``-shaped tiles for K-loops (memoised).

    Parameters
    ----------
    stages:
        2, 3 or 4 (tiles in flight + the one being read).
    tile:
        ``(T,)`` for a 1-d ``src`` (tile ``k`` is ``src[k*T : (k+1)*T]``) or ``(R, C)`` for a
        2-d row-major ``src`` (tile ``k`` is ``src[:R, k*C:(k+1)*C]`` when ``k_axis=1``,
        ``src[k*R:(k+1)*R, :C]`` when ``k_axis=0``). Pass a view (``a[m0:m0 + R, :]``) to
        stream another panel.
    dtype:
        The element type (``numba.float32``, ``np.float32``, ``"float16"``...).
    k_axis:
        The axis tiles advance along (default: 1 for 2-d tiles, 0 for 1-d).
    async_copy:
        ``cp.async`` (sm_80+) when True; synchronous loads and stores when False.
    copy_bytes:
        4, 8 or 16 bytes per copy (16-byte copies use ``.cg``, which bypasses L1). The last
        tile dimension must hold a whole number of copies, and ``src`` rows (its pitch and the
        view's start) must be aligned to ``copy_bytes``: for arbitrary widths use
        ``copy_bytes = itemsize`` (4 for float32, 8 for float64; float16 needs even widths).
    on_load:
        With ``async_copy=False``: a device function applied to each element loaded inside
        ``src`` before it is stored (the fill past ``src`` stays 0); ``src`` may then have
        another dtype than the ring (a cast on the way in).

    Launch with any block shape; the threads are linearised (x fastest).
    """
    tile_t = (tile,) if isinstance(tile, int) else tuple(int(t) for t in tile)
    np_dtype = np.dtype(as_dtype(dtype) if isinstance(dtype, types.Type) else dtype)
    if k_axis is None:
        k_axis = 1 if len(tile_t) == 2 else 0
    if on_load is not None and async_copy:
        raise ValueError("on_load applies to synchronous loads: pass async_copy=False")
    if on_load is not None and not callable(on_load):
        raise TypeError(f"on_load must be a device function, got {type(on_load).__name__}")
    return _ring_buffer(
        int(stages), tile_t, np_dtype, int(k_axis), bool(async_copy), copy_bytes, on_load
    )


@cuda.jit(device=True)
def _unchanged(v):
    return v


@functools.cache
def _ring_buffer(
    stages: int, tile: tuple[int, ...], dtype: np.dtype, k_axis: int, async_copy: bool, nbytes,
    on_load=None,
) -> RingBuffer:  # fmt: skip
    if stages not in (2, 3, 4):
        raise ValueError(f"stages must be 2, 3 or 4, got {stages}")
    if len(tile) not in (1, 2) or any(t <= 0 for t in tile):
        raise ValueError(f"tile must be (T,) or (R, C) with positive sizes, got {tile}")
    if not 0 <= k_axis < len(tile):
        raise ValueError(f"k_axis must be an axis of a {len(tile)}-d tile, got {k_axis}")
    if nbytes not in (4, 8, 16):
        raise ValueError(f"copy_bytes must be 4, 8 or 16, got {nbytes}")
    if dtype.kind not in "fiu" or nbytes % dtype.itemsize:
        raise ValueError(f"copy_bytes {nbytes} must hold whole {dtype} elements")
    vec = nbytes // dtype.itemsize
    if tile[-1] % vec:
        raise ValueError(
            f"the last tile dimension ({tile[-1]}) must be a multiple of copy_bytes/itemsize "
            f"({vec}); lower copy_bytes"
        )
    copy = _COPY[(nbytes, nbytes == 16)]
    zero = dtype.type(0)
    load = _unchanged if on_load is None else on_load
    item = dtype.itemsize
    lag = stages - 2  # groups still allowed in flight when tile k must have landed
    prologue = stages - 1
    tile_k = tile[k_axis]

    @cuda.jit(device=True)
    def num_tiles(src):
        return (src.shape[k_axis] + tile_k - 1) // tile_k

    if len(tile) == 1:
        (width,) = tile
        vectors = width // vec

        @cuda.jit(device=True)
        def load_tile(ring, src, k):
            if k >= num_tiles(src):
                return
            stage = k % stages
            tid, nthreads = thread_rank()
            n = src.shape[0]
            v = tid
            while v < vectors:  # not range(): its trip count costs a 64-bit division
                c = v * vec
                g = k * width + c
                valid = min(vec, max(n - g, 0))
                if async_copy:
                    copy(ring, (stage, c), src, (min(g, max(n - 1, 0)),), valid * item)
                else:
                    for j in range(vec):
                        ring[stage, c + j] = load(src[g + j]) if j < valid else zero
                v += nthreads

    else:
        rows, cols = tile
        per_row = cols // vec
        vectors = rows * per_row

        @cuda.jit(device=True)
        def load_tile(ring, src, k):
            if k >= num_tiles(src):
                return
            stage = k % stages
            tid, nthreads = thread_rank()
            n_rows, n_cols = src.shape
            row0 = k * rows if k_axis == 0 else 0
            col0 = k * cols if k_axis == 1 else 0
            v = tid
            while v < vectors:
                r = v // per_row
                c = (v - r * per_row) * vec
                gr = row0 + r
                gc = col0 + c
                valid = min(vec, max(n_cols - gc, 0)) if gr < n_rows else 0
                if async_copy:
                    if valid == 0:  # reads nothing: any in-bounds address will do
                        gr = 0
                        gc = 0
                    copy(ring, (stage, r, c), src, (gr, gc), valid * item)
                else:
                    for j in range(vec):
                        ring[stage, r, c + j] = load(src[gr, gc + j]) if j < valid else zero
                v += nthreads

    if async_copy:

        @cuda.jit(device=True)
        def commit():
            cp_async_commit_group()

        @cuda.jit(device=True)
        def wait_tile(k):
            cp_async_wait_group(lag)
            cuda.syncthreads()
            return k % stages

        @cuda.jit(device=True)
        def drain():
            cp_async_wait_all()
            cuda.syncthreads()

    else:

        @cuda.jit(device=True)
        def commit():
            pass

        @cuda.jit(device=True)
        def wait_tile(k):
            cuda.syncthreads()
            return k % stages

        @cuda.jit(device=True)
        def drain():
            cuda.syncthreads()

    @cuda.jit(device=True)
    def fill(ring, src):
        for k in range(prologue):
            load_tile(ring, src, k)
            commit()

    return RingBuffer(
        shape=(stages, *tile),
        stages=stages,
        tile=tile,
        k_axis=k_axis,
        copy_bytes=nbytes,
        async_copy=async_copy,
        load_tile=load_tile,
        commit=commit,
        wait_tile=wait_tile,
        fill=fill,
        num_tiles=num_tiles,
        drain=drain,
    )
