"""float16 (or bfloat16: ``bf16=True``, every array its ``uint16`` bits) matmul
``C = act(A @ B + bias)`` on Hopper's warpgroup MMA (``wgmma``, sm_90a): ``cp.async`` copies
into 128-byte-swizzled shared tiles that the tensor cores read through matrix descriptors, a
multi-stage ring, float32 accumulators in registers.

:func:`wgmma_matmul` makes the kernel ``kernel(a, b, bias, c)`` of one configuration, with the
interface of :func:`.matmul_tc.tensor_core_matmul`'s kernels:

* ``a``: ``(batch, M, K)``, ``b``: ``(batch, K, N)``, ``c``: ``(batch, M, N)``, float16 (or
  bfloat16 bits), the inner dimension contiguous, rows 16-byte aligned (:func:`aligned_rows`:
  K and N multiples of 8, aligned bases and strides), any batch strides;
* ``bias``: ``(N,)``, added to every row (ignored unless ``has_bias``: pass a 1-element array);
  with an :class:`~.epilogue.ElementEpilogue` as ``activation``, ``kernel(a, b, bias, c,
  extras)``;
* launch ``grid = (ceil(N / tile_n), ceil(M / tile_m), batch)`` blocks of
  :attr:`WgmmaConfig.threads` with ``Plan.shared`` bytes of dynamic shared memory (:func:`plan`;
  ``plan(...).launch(kernel, a, b, bias, c)`` opts in past 48 KiB and launches). It needs a
  device of compute capability 9.0 (numba-cuda compiles for sm_90a there); building it for an
  older target is refused with the wgmma intrinsics' message.

Each block computes a ``tile_m x tile_n`` tile; its warpgroups (4 warps each) split the rows:
warpgroup ``g`` owns rows ``g * tile_m / warpgroups ..`` in 1 or 2 blocks of 64, each an
``m64 n{tile_n} k16`` wgmma accumulator of ``tile_n / 2`` float32 per thread. Default: 128 x 128
x 64, 2 warpgroups of 64 x 128, 4 stages::

    per k-tile kt (stage s = kt % stages, D = stages - 2 tiles of copies ahead):
      cp.async.wait_group(D - 1)          this thread's copies of tile kt landed
      fence.proxy.async.shared::cta       ... and are visible to the tensor cores (async proxy)
      __syncthreads()                     every thread's copies landed; every warpgroup has
                                          retired its wgmma of tile kt - 2 (see below)
      cp.async tile kt + D                into the stage tile kt - 2 used; commit
      wgmma.fence
      wgmma.mma_async x (tile_k / 16) x m-blocks, chained on the accumulators (descriptors)
      wgmma.commit_group
      wgmma.wait_group 1                  tile kt - 1's MMAs retired, tile kt's in flight

    -> per warpgroup and k-tile of 64: 4 HGMMA.64x128x16, no shared loads; one barrier.

A stage is overwritten only after every warpgroup's MMAs that read it have retired: the wait
with one group in flight retires tile ``kt - 1`` at the end of k-tile ``kt``, and the barrier
of k-tile ``kt + 1`` is passed only when every warpgroup has done so, so the copies it issues
may refill the stage of ``kt - 1`` (``(kt + 1) + D`` with ``D = stages - 2``). Hence ``D`` is
two less than the stages (3 stages: one tile of copies ahead; 4: two). Keeping one group in
flight lets the tensor cores run k-tile ``kt`` while the warpgroup passes the next barrier and
issues k-tile ``kt + 1``.

Shared layout (dynamic shared memory, the stages one after another, each A then B; the ring
starts on a 1024-byte boundary, as the swizzle is a function of the address):

* A, K-major (``trans_a = 0``), one row of ``tile_k`` elements per M row: 128 bytes with
  ``tile_k = 64`` (128B swizzle: chunk ``c`` of row ``r`` at ``c ^ (r % 8)``), 64 bytes with
  ``tile_k = 32`` (64B swizzle: ``c ^ ((r // 2) % 4)``); descriptor SBO = 8 rows, a k16 step
  moves the start address 32 bytes;
* B, N-major (``trans_b = 1``: B's rows ``[k, n0:n0 + 64]`` as they are in global memory, no
  transpose on the way): blocks of 64 columns, each ``tile_k`` rows of 128 bytes, chunk ``c`` of
  row ``k`` at ``c ^ (k % 8)`` (128B swizzle); SBO = 1024 (8 rows of K), LBO = one block
  (``tile_k * 128`` bytes), a k16 step moves the start 16 rows.

A transposed A (``trans_a``: its ``(K, M)`` array) is staged as B is, MN-major with the
wgmma's ``trans_a = 1``, and a transposed B (``trans_b``: its ``(N, K)`` array) as A is,
K-major with ``trans_b = 0`` (:mod:`.wgmma_staging` makes both layouts' copies and descriptors).

Every ``cp.async`` moves one 16-byte chunk; the threads of a row take its chunks in order, so a
quarter-warp writes one whole 128-byte row (any chunk permutation inside it is conflict free)
and reads 128 contiguous global bytes. Rows past M, k-rows past K and columns past N are copies
of 0 source bytes: zero-filled. Each copy names its source by an element offset
(:func:`~tessera_tile.pipeline.cp_async_cg_16_zfill_at`), not an index: about 2 instructions of
address arithmetic per copy, where an index made the compiler rebuild the address from every
index and stride (128 x 128 x 64 with one warpgroup: 195 instructions per k-tile with indices,
144 with offsets; Triton's loop, 177). Shared memory above 48 KiB needs the opt-in
(:func:`tessera_tile.dynamic_shared.launch`). ``Plan.shared`` includes 1 KiB of slack to align
the ring: compiled, the dynamic array is declared ``.align 1024`` and the slack stays unused, but
the simulator's dynamic shared memory keeps no such alignment, so the kernel finds the boundary
itself (a few instructions, once).

Warp specialisation (``producer=True``): one more warpgroup, the block's first, issues every
copy, and the others only multiply. They hand the stages over through two
:mod:`tessera_tile.mbarrier` objects per stage::

    producer, per k-tile kt (stage s):        consumers, per k-tile kt (stage s):
      wait empty[s] (parity: pass ^ 1)          wait full[s] (parity: pass)
      cp.async tile kt into stage s             fence.proxy.async.shared::cta
      cp.async.mbarrier.arrive full[s]          wgmma.fence, the MMAs, commit
        (arrives when the copies land)          wgmma.wait_group 1 (tile kt - 1 retired)
                                                arrive empty[stage of kt - 1]

``full`` expects the producer's 128 copy arrivals, ``empty`` one arrival per consumer thread;
the producer's first pass waits on a fresh barrier's parity 1, which has completed, and after
the last tile it waits until every stage is released (no copy in flight at its exit). Every stage
is in use (the producer may be ``stages`` tiles ahead), no ``__syncthreads`` runs in the loop,
and the consumers' loop holds no copy and no address arithmetic. The consumer orders the landed
copies before the tensor cores' reads with its own proxy fence after the wait (the wait
acquires what the copies' arrival released); a GPU run has yet to confirm it. Which of the two
variants is faster is for a GPU to say: the tuner offers both (``TileConfig`` with 12 warps is
this variant) and times them there.

Epilogue: the wgmma D fragment is, per warp, :mod:`.matmul_tc`'s 16 x 8 C tiles side by side
(``docs/tensor_cores.md``), so the accumulators go through that module's generated epilogue
(``acc (+ bias) -> activation or ElementEpilogue -> paired stores``, masked at the edges), one
64-row block at a time.
"""

from __future__ import annotations

import functools

from numba import boolean, cuda, float32, int32, int64, uint16, uint64
from numba.types import float16

from ...mbarrier import mbarrier_arrive, mbarrier_init, mbarrier_wait
from ...mma import (
    fence_proxy_async,
    store_bf16x2,
    store_f16x2,
    wgmma_async,
    wgmma_async_bf16,
    wgmma_commit_group,
    wgmma_descriptor,
    wgmma_fence,
    wgmma_wait_group,
    wgmma_zeros,
)
from ...pipeline import (
    cp_async_commit_group,
    cp_async_wait_group,
)
from ..epilogue import ElementEpilogue, identity
from ..tc_tiles import INLINE, WARP_SIZE, entry_point
from ..wgmma_tiles import (
    ALIGN,
    WARPGROUP,
    producer_loop,
    stage_counter,
    swizzle_start,
    unpacker,
)
from .tc_epilogue import tensor_core_epilogue
from .tc_plan import Plan, aligned_rows, check_operands
from .tc_plan import plan as _tc_plan
from .wgmma_config import DEFAULT, WgmmaConfig
from .wgmma_staging import k_major, mn_major

__all__ = [
    "DEFAULT",
    "MIN_COMPUTE_CAPABILITY",
    "Plan",
    "WgmmaConfig",
    "aligned_rows",
    "build_kernel",
    "check_operands",
    "plan",
    "wgmma_matmul",
]

MIN_COMPUTE_CAPABILITY = (9, 0)  # wgmma: sm_90a
ZERO = float32(0.0)


def plan(batch: int, m: int, n: int, k: int, config: WgmmaConfig = DEFAULT) -> Plan:
    """Grid, block, dynamic shared memory and global bytes of a launch for ``(batch, m, n,
    k)``: :func:`.matmul_tc_plan.plan` on ``config`` (by default :data:`DEFAULT`)."""
    return _tc_plan(batch, m, n, k, config)


def wgmma_matmul(
    tile_m: int = 128,
    tile_n: int = 128,
    tile_k: int = 64,
    num_warps: int = 8,
    num_stages: int = 4,
    activation=None,
    has_bias: bool = False,
    *,
    bf16: bool = False,
    producer: bool = False,
    trans_a: bool = False,
    trans_b: bool = False,
):
    """The ``cuda.jit`` kernel ``kernel(a, b, bias, c)``: ``c = activation(a @ b + bias)`` in
    float16 (``bf16``: bfloat16, every array its ``uint16`` bits) with float32 accumulation on
    the warpgroup MMA of sm_90a (memoised per configuration); with an
    :class:`~.epilogue.ElementEpilogue` as ``activation``, ``kernel(a, b, bias, c, extras)``.

    ``num_warps``: 4 or 8 (one or two warpgroups that multiply). ``producer``: one more
    warpgroup, first in the block, issues every copy (warp specialisation; see the module doc).
    ``trans_a``/``trans_b``: the operand is passed transposed, A as ``(batch, K, M)`` and B as
    ``(batch, N, K)`` with contiguous last axes (the transposes of row-major arrays, read in
    place: :mod:`.wgmma_staging`). Operands need :func:`aligned_rows`. See the module doc for
    the launch and the layouts; :func:`plan` gives grid, block and shared bytes.
    """
    cfg = WgmmaConfig(
        tile_m, tile_n, tile_k, num_warps, num_stages, bool(has_bias), bool(bf16), bool(producer),
        bool(trans_a), bool(trans_b),
    )  # fmt: skip
    cfg.validate(activation)
    return build_kernel(cfg, activation)


@functools.cache
def build_kernel(cfg: WgmmaConfig, activation, module: str = __name__):
    """The kernel of ``cfg`` (check it first: :meth:`WgmmaConfig.validate`); ``module`` names
    the module that ships it (its ``__module__``)."""
    tile_m, tile_n, tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
    stages, copiers, producer = cfg.num_stages, cfg.copiers, cfg.producer
    consumers = WARP_SIZE * cfg.num_warps  # threads that multiply
    ahead = stages - 2  # k-tiles of copies in flight ahead of the one multiplied
    lag = ahead - 1  # cp.async groups a k-tile's wait leaves in flight
    wg_m, m_blocks = tile_m // cfg.warpgroups, cfg.m_blocks
    ksteps = tile_k // 16
    nt = tile_n // 8  # 16 x 8 accumulator tiles of a warp, per 64-row block
    elem = uint16 if cfg.bf16 else float16
    wgmma = wgmma_async_bf16 if cfg.bf16 else wgmma_async
    has_bias = cfg.has_bias
    extras = isinstance(activation, ElementEpilogue)
    act = identity if activation is None else activation.fn if extras else activation
    stores = not extras or activation.stores

    # Shared memory, in 16-bit elements from the aligned base: stage s at s * stage, A then B.
    a_stage, b_stage = tile_m * tile_k, tile_k * tile_n
    stage = a_stage + b_stage
    stage16 = 2 * stage // 16  # a stage in 16-byte units (a descriptor's address field)
    # Each operand's layout (module .wgmma_staging): A K-major, B MN-major as they usually
    # are; transposed, A MN-major and B K-major, read in place.
    lay_a = (mn_major if cfg.trans_a else k_major)(tile_m, tile_k, copiers)
    lay_b = (k_major if cfg.trans_b else mn_major)(tile_n, tile_k, copiers)
    plan_a, load_a, plan_b, load_b = lay_a.plan, lay_a.load, lay_b.plan, lay_b.load
    a_step16, b_step16, a_block16 = lay_a.step16, lay_b.step16, lay_a.block16
    a_lbo, a_sbo, a_swizzle = lay_a.lbo, lay_a.sbo, lay_a.swizzle
    b_lbo, b_sbo, b_swizzle = lay_b.lbo, lay_b.sbo, lay_b.swizzle
    trans_a, trans_b = lay_a.transposed, lay_b.transposed
    a_passes, b_passes = lay_a.passes, lay_b.passes

    store = store_bf16x2 if cfg.bf16 else store_f16x2
    epilogue = tensor_core_epilogue(
        1, nt, has_bias, True, act, store, bf16=cfg.bf16, extras=extras, stores=stores
    )
    unpack = unpacker(tile_n // 2)

    @cuda.jit(device=True, **INLINE)
    def load_tile(smem, a, b, kt, base, copies_a, copies_b):
        """This thread's chunks of k-tile ``kt`` of the A and B panels into the stage at
        ``smem[base:]``, zero-filled outside the operands (``copies_a``/``copies_b``: what
        :func:`plan_copies` planned)."""
        k0 = kt * tile_k
        k = a.shape[1] if trans_a else a.shape[2]
        load_a(smem, base, a, k, k0, *copies_a)
        load_b(smem, base + a_stage, b, k, k0, *copies_b)

    @cuda.jit(device=True, **INLINE)
    def multiply(desc_a, desc_b, acc0, acc1):
        """One k-tile's wgmma chain (descriptors of its stage): k16 steps, 1 or 2 row blocks."""
        acc0 = wgmma(desc_a, desc_b, acc0, 1, 1, 1, trans_a, trans_b)
        if m_blocks > 1:
            acc1 = wgmma(desc_a + uint64(a_block16), desc_b, acc1, 1, 1, 1, trans_a, trans_b)
        for kk in range(1, ksteps):  # constant trip count: unrolled
            da = desc_a + uint64(kk * a_step16)
            db = desc_b + uint64(kk * b_step16)
            acc0 = wgmma(da, db, acc0, 1, 1, 1, trans_a, trans_b)
            if m_blocks > 1:
                acc1 = wgmma(da + uint64(a_block16), db, acc1, 1, 1, 1, trans_a, trans_b)
        return acc0, acc1

    @cuda.jit(device=True, **INLINE)
    def tile_step(smem, pad, a, b, kt, tiles, s, desc_a, desc_b, acc0, acc1, copies):
        """k-tile ``kt`` in stage ``s`` (a constant): wait for it, refill the stage of tile
        ``kt - 2`` with tile ``kt + stages - 2``, issue tile ``kt``'s MMAs and retire those of
        tile ``kt - 1``."""
        cp_async_wait_group(lag)
        fence_proxy_async()  # the landed copies, visible to the wgmma reads (async proxy)
        cuda.syncthreads()
        if int32(kt + ahead) < tiles:
            base = pad + ((s + ahead) % stages) * stage
            load_tile(smem, a, b, kt + ahead, base, *copies)
        cp_async_commit_group()
        wgmma_fence()
        offset = uint64(s * stage16)
        acc0, acc1 = multiply(desc_a + offset, desc_b + offset, acc0, acc1)
        wgmma_commit_group()
        # One group left in flight (tile kt's): tile kt - 1's is retired. Its accumulators are
        # not passed through (they are in flight: reading them here would stall).
        wgmma_wait_group(1, (ZERO,))
        return acc0, acc1

    @cuda.jit(device=True, **INLINE)
    def plan_copies(a, b, tid, bz, m0, n0, m, n, arrays_a, arrays_b):
        """This thread's copies (thread ``tid`` of the copiers): sources at k-tile 0, targets
        (swizzled offsets inside a stage's A and B) and guards, into each operand's arrays;
        returns the ``copies`` that :func:`load_tile` takes."""
        a_r, a_c = plan_a(a, tid, bz, m0, m, *arrays_a)
        b_r, b_c = plan_b(b, tid, bz, n0, n, *arrays_b)
        return (*arrays_a, a_r, a_c), (*arrays_b, b_r, b_c)

    @cuda.jit(device=True, **INLINE)
    def load_stage(kt, s, payload):
        smem, pad, a, b, copies = payload
        load_tile(smem, a, b, kt, pad + s * stage, *copies)

    produce = producer_loop(load_stage, stages)
    advance = stage_counter(stages)

    @cuda.jit(device=True, **INLINE)
    def consume(full, empty, tiles, desc_a, desc_b, acc0, acc1):
        """A consumer warpgroup: for each k-tile, wait until its stage is full, order the
        copies before the tensor cores' reads (async proxy), issue the MMAs, retire those of
        the previous k-tile and release its stage."""
        kt = int32(0)
        s = int32(0)
        prev = int32(0)
        phase = int32(0)
        while kt < tiles:
            mbarrier_wait(full, s, phase)
            fence_proxy_async()
            wgmma_fence()
            offset = uint64(s) * uint64(stage16)
            acc0, acc1 = multiply(desc_a + offset, desc_b + offset, acc0, acc1)
            wgmma_commit_group()
            wgmma_wait_group(1, (ZERO,))  # tile kt - 1's MMAs retired: its stage is free
            if kt > 0:
                mbarrier_arrive(empty, prev)
            prev = s
            s, phase = advance(s, phase)
            kt = int32(kt + 1)
        acc0 = wgmma_wait_group(0, acc0)
        if tiles > 0:  # the last tile's stage, released for the producer's tail
            mbarrier_arrive(empty, prev)
        return acc0, acc1

    @cuda.jit(device=True, **INLINE)
    def body(a, b, bias, c, extra_args, b2):
        smem = cuda.shared.array(0, elem, alignment=ALIGN)
        pad = swizzle_start(smem)  # the ring starts at the first 1024-byte boundary
        accl = cuda.local.array((1, nt, 4), float32)
        # each operand's copy sources, targets, guards and k rows (wgmma_staging's plan)
        arrays_a = (
            cuda.local.array(a_passes, int64), cuda.local.array(a_passes, int32),
            cuda.local.array(a_passes, boolean), cuda.local.array(a_passes, int32),
        )  # fmt: skip
        arrays_b = (
            cuda.local.array(b_passes, int64), cuda.local.array(b_passes, int32),
            cuda.local.array(b_passes, boolean), cuda.local.array(b_passes, int32),
        )  # fmt: skip
        tid = cuda.threadIdx.x
        lane = tid % WARP_SIZE
        warp = tid // WARP_SIZE
        # the warpgroup, from lane 0: warp-uniform for the compiler too, so that descriptors
        # built from it live in uniform registers (no R2UR per wgmma)
        group = cuda.shfl_sync(0xFFFFFFFF, warp // WARPGROUP, 0)
        bz = cuda.blockIdx.z
        m0 = cuda.blockIdx.y * tile_m
        n0 = cuda.blockIdx.x * tile_n
        m = c.shape[1]
        n = c.shape[2]
        k = a.shape[1] if trans_a else a.shape[2]  # A read as (K, M) or (M, K)
        tiles = int32((k + tile_k - 1) // tile_k)  # 32-bit loop control

        if producer:
            full = cuda.shared.array(stages, uint64)
            empty = cuda.shared.array(stages, uint64)
            if tid == 0:
                for s in range(stages):
                    mbarrier_init(full, s, copiers)  # a copy arrival per producer thread
                    mbarrier_init(empty, s, consumers)  # an arrival per consumer thread
            cuda.syncthreads()  # the barriers' initialisation, visible to every thread
            if group == 0:
                copies = plan_copies(a, b, tid, bz, m0, n0, m, n, arrays_a, arrays_b)
                produce(full, empty, tiles, (smem, pad, a, b, copies))
                return
            group -= 1  # the warpgroups that multiply, numbered after the producer
            warp -= WARPGROUP

        # Stage 0's descriptors: this warpgroup's rows of A, all of B.
        # (a warpgroup's rows of A start wg_m rows, or wg_m / 64 column blocks, in: the same)
        desc_a = wgmma_descriptor(smem, pad + group * wg_m * tile_k, a_lbo, a_sbo, a_swizzle)
        desc_b = wgmma_descriptor(smem, pad + a_stage, b_lbo, b_sbo, b_swizzle)
        acc0 = wgmma_zeros(tile_n)
        acc1 = wgmma_zeros(tile_n)
        if producer:
            acc0, acc1 = consume(full, empty, tiles, desc_a, desc_b, acc0, acc1)
        else:
            copies = plan_copies(a, b, tid, bz, m0, n0, m, n, arrays_a, arrays_b)
            for kt in range(ahead):  # prologue: tiles 0 .. stages - 3 in flight, a group each
                if kt < tiles:
                    load_tile(smem, a, b, kt, pad + kt * stage, *copies)
                cp_async_commit_group()

            # Steady state, unrolled over the stages so that every stage offset is a constant.
            kt = int32(0)
            while kt < tiles:  # a run-time bound: `while`, not range()
                acc0, acc1 = tile_step(
                    smem, pad, a, b, kt, tiles, 0, desc_a, desc_b, acc0, acc1, copies
                )
                kt = int32(kt + 1)
                if kt < tiles:
                    acc0, acc1 = tile_step(
                        smem, pad, a, b, kt, tiles, 1, desc_a, desc_b, acc0, acc1, copies
                    )
                    kt = int32(kt + 1)
                    if kt < tiles:
                        acc0, acc1 = tile_step(
                            smem, pad, a, b, kt, tiles, 2, desc_a, desc_b, acc0, acc1, copies
                        )
                        kt = int32(kt + 1)
                        if stages > 3 and kt < tiles:
                            acc0, acc1 = tile_step(
                                smem, pad, a, b, kt, tiles, 3, desc_a, desc_b, acc0, acc1,
                                copies,
                            )  # fmt: skip
                            kt = int32(kt + 1)

        # Epilogue: warp w of the warpgroup holds rows 16 w + g (+ 8) of each 64-row block,
        # columns 8 j + 2 t (+ 1): matmul_tc's 16 x 8 tiles, nt of them.
        acc0 = wgmma_wait_group(0, acc0)
        row_base = m0 + group * wg_m + 16 * (warp % WARPGROUP) + (lane >> 2)
        col_base = n0 + 2 * (lane & 3)
        unpack(acc0, accl)
        epilogue(accl, accl, c, bias, bz, row_base, col_base, m, n, extra_args)
        if m_blocks > 1:
            acc1 = wgmma_wait_group(0, acc1)
            unpack(acc1, accl)
            epilogue(accl, accl, c, bias, bz, row_base + 64, col_base, m, n, extra_args)

    kernel = entry_point(body, extras)
    kernel.__module__ = module
    kernel.__name__ = kernel.__qualname__ = (
        f"matmul_wgmma{'_bf16' if cfg.bf16 else ''}_{tile_m}x{tile_n}x{tile_k}"
        f"_w{cfg.num_warps}{'_ws' if producer else ''}_s{stages}{'_bias' if has_bias else ''}"
        f"{'_' + activation.name if extras else ''}"
        f"{'_at' if cfg.trans_a else ''}{'_bt' if cfg.trans_b else ''}"
    )
    return cuda.jit(kernel)
