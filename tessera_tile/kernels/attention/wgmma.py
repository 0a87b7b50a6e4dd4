"""float16 (or bfloat16: ``bf16=True``, every array its ``uint16`` bits) flash attention
``O = softmax(Q @ K^T * scale) @ V`` on Hopper's warpgroup MMA (``wgmma``, sm_90a): both
products on the tensor cores, Q and K read by them from shared memory through matrix
descriptors, P from registers. The score matrix never leaves the chip.

:func:`wgmma_attention` makes the kernel ``kernel(q, k, v, o, scale_log2)`` of one head size,
with the interface and launch of :mod:`.attention`'s (``q``, ``o``: ``(Z, Sq, D)``; ``k``,
``v``: ``(Z, Sk, D)``; ``scale_log2 = scale * log2(e)``; ``grid = (ceil(Sq / block_q), Z)``
blocks of :attr:`WgmmaAttentionConfig.threads` with its
:meth:`~WgmmaAttentionConfig.shared_bytes` of dynamic shared memory), for head sizes 64 and 128
and rows that ``cp.async`` can copy (every row 16-byte aligned on a contiguous inner axis): the
ops run :mod:`.attention`'s kernels otherwise.
It needs a device of compute capability 9.0 (numba-cuda compiles for sm_90a there).

Each warpgroup (4 warps, 128 threads) owns 64 query rows: one ``m64`` accumulator of the scores
(``block_kv / 2`` float32 per thread) and one of the output (``D / 2``). The default schedule
(``overlap``, 3 stages) computes the scores of tile ``t + 1`` while the softmax of tile ``t``
runs, FlashAttention-3's overlap within a warpgroup; per K/V tile ``t`` of ``block_kv`` keys,
with ``S_t`` retired::

    cp.async.wait_group 0; fence.proxy.async; __syncthreads()
                              tile t + 1 landed and is visible to the tensor cores; every
                              warpgroup has retired its MMAs of tile t - 1
    cp.async K, V tile t + 2 into the stage of tile t - 1; commit
    wgmma.fence
    S_t+1 = Q K_t+1^T         D / 16 wgmma m64n{block_kv}k16, Q and K through descriptors;
                              commit, not waited for: the tensor cores run it during
    (diagonal or last tile only) masked S_t = -inf
    m' = max(m, rowmax(S_t) * c); alpha = exp2(m - m'); l = l * alpha
    P = exp2(S_t * c - m'), packed as it is made; l += rowsum(P)
    O = O * alpha; wgmma.fence
    O += P V_t                block_kv / 16 wgmma m64n{D}k16, P from registers, V through a
                              descriptor (N-major: V's rows as they are in global memory)
    commit; wait_group 0      S_t+1 and O retired

    D = 64, 64-key tiles, per warpgroup and tile: 4 HGMMA.64x64x16 for S, 4 for P V, no
    shared-memory loads; 64 ex2 per lane's 2 rows.

Three stages, because tile ``t``'s V, tile ``t + 1``'s K and the copies of tile ``t + 2`` are
in shared memory at once. Past the last tile the loop computes the last tile's scores again
(discarded): a product issued on every path, where a branch around it would cost a null
``HGMMA`` from ptxas. ``overlap=False`` runs the tile in turn (the scores, waited for, then the
softmax, then ``P V``; 2 or 3 stages, the wait leaving ``stages - 2`` copy groups in flight).
The steady-state loop takes two tiles a pass and counts the stage instead of taking ``kt %
stages`` (a 64-bit modulo by 3 is a dozen instructions).

The accumulators are, per warp, :mod:`.matmul_tc`'s 16 x 8 C tiles side by side (the wgmma
D layout), so the online softmax is :mod:`.attention`'s with one m16 tile per warp: a lane
holds rows ``g`` and ``g + 8`` of its warp's 16 (``g = lane >> 2``), its quad shares them
(two shuffles per maximum), and the accumulators of n8 tiles ``2kk`` and ``2kk + 1`` are the A
registers of k16 step ``kk`` of ``P V`` (layout C of two tiles = layout A of one step, as the
wgmma A-from-registers fragment is mma.sync's per warp). Masking, the causal block order, the
negative-scale fold into Q, ``scale = 0`` and rows with no key follow :mod:`.attention`.

Warp specialisation (``producer=True``): one more warpgroup, the block's first, copies Q
(folding a negative scale into it, then arriving on Q's mbarrier) and every K/V tile, handed to
the warpgroups that compute through a full and an empty :mod:`tessera_tile.mbarrier` per stage,
as in :mod:`.matmul_wgmma`: a consumer waits on a tile's full barrier before the product that
first reads it (overlapped: before issuing the next tile's scores), fences the async proxy, and
releases the stage once the tile's ``P V`` has retired. No ``__syncthreads`` in the loop. Not
here: FlashAttention-3's ping-pong between warpgroups (named barriers ordering one warpgroup's
softmax against the other's products), TMA copies and ``setmaxnreg``.

Shared memory (dynamic, one array starting on a 1024-byte boundary as the swizzle is a function
of the address): the Q tile, then ``num_stages`` K tiles, then ``num_stages`` V tiles. Every
tile stores its ``[rows, D]`` as ``D / 64`` column blocks of ``rows`` x 128 bytes, chunk ``c``
of row ``r`` at ``c ^ (r % 8)`` (the 128-byte swizzle). Q is A and K is B in K-major form (a
row of 128 bytes per query or key; SBO = 8 rows; a k16 step moves the start 32 bytes, the
fifth the next column block); V is B in N-major form (SBO = 8 keys, LBO = a column block, a
k16 step moves 16 rows). The same layout for all three: one copy routine.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, uint16, uint32, uint64
from numba.types import float16

from ... import dynamic_shared
from ..._device.numerics import exp2_approx, max_nan, rcp_approx
from ...bfloat16 import pack_bf16x2
from ...mbarrier import mbarrier_arrive, mbarrier_init, mbarrier_wait
from ...mma import (
    SWIZZLE_128B,
    fence_proxy_async,
    pack_f16x2,
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
    cp_async_cg_16_zfill,
    cp_async_cg_16_zfill_at,
    cp_async_commit_group,
    cp_async_wait_group,
)
from ..tc_tiles import CHUNK, INLINE, WARP_SIZE
from ..wgmma_tiles import ALIGN, WARPGROUP, producer_loop, swizzle_start, unpacker
from .tc import block_span, negate_chunk

__all__ = [
    "HEAD_DIMS",
    "WgmmaAttentionConfig",
    "default_config",
    "wgmma_attention",
]

HEAD_DIMS = (64, 128)  # whole 128-byte swizzle rows
ROWS = 64  # query rows per warpgroup (one m64 accumulator)
BLOCK = 64  # elements of one 128-byte column block
ZERO = float32(0.0)
NEG_INF = float32(-np.inf)
FLT_MIN = float32(np.finfo(np.float32).tiny)


class WgmmaAttentionConfig(NamedTuple):
    """One schedule: keys per K/V tile, warps (4 or 8: one or two warpgroups of 64 query rows),
    pipeline stages, whether the scores of the next tile are computed during the softmax of
    this one (``overlap``: 3 stages), and whether one more warpgroup issues every copy
    (``producer``: warp specialisation, stages handed over through mbarriers)."""

    block_kv: int = 64
    num_warps: int = 8
    num_stages: int = 3
    overlap: bool = True
    producer: bool = False

    @property
    def warpgroups(self) -> int:
        """The warpgroups that compute (the producer's is not one of them)."""
        return self.num_warps // WARPGROUP

    @property
    def block_q(self) -> int:
        return ROWS * self.warpgroups

    @property
    def threads(self) -> int:
        return WARP_SIZE * (self.num_warps + (WARPGROUP if self.producer else 0))

    @property
    def copiers(self) -> int:
        """Threads that issue the copies: the producer warpgroup's, else all."""
        return WARP_SIZE * WARPGROUP if self.producer else self.threads

    @property
    def static_bytes(self) -> int:
        """Static shared memory: with a producer, a full and an empty mbarrier per stage and
        one for Q."""
        return 8 * (2 * self.num_stages + 1) if self.producer else 0

    def shared_bytes(self, head_dim: int) -> int:
        """Dynamic shared memory a block launches with: Q, the K and V rings, and the slack
        that lets the kernel start them on a 1024-byte boundary."""
        return 2 * head_dim * (self.block_q + 2 * self.num_stages * self.block_kv) + ALIGN

    def validate(self, head_dim: int) -> None:
        """Raise ``ValueError`` unless this config makes a kernel for ``head_dim`` that a block
        of this device (:func:`tessera_tile.dynamic_shared.limit`) may launch."""
        if head_dim not in HEAD_DIMS:
            raise ValueError(
                f"head_dim must be one of {HEAD_DIMS} (whole 128-byte swizzled rows), got "
                f"{head_dim}"
            )
        for name in ("overlap", "producer"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.block_kv not in (32, 64, 128):
            raise ValueError(f"block_kv must be 32, 64 or 128, got {self.block_kv}")
        if self.num_warps not in (4, 8):
            raise ValueError(
                f"num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps}"
            )
        if self.num_stages not in (2, 3):
            raise ValueError(f"num_stages must be 2 or 3, got {self.num_stages}")
        if self.overlap and self.num_stages != 3:
            raise ValueError(
                "overlap needs num_stages=3: tile t's V, tile t + 1's K and tile t + 2's copies "
                f"are in shared memory at once; got {self.num_stages}"
            )
        if self.block_kv + head_dim > 192:
            raise ValueError(
                f"block_kv {self.block_kv} with head_dim {head_dim}: S and O accumulators of "
                f"{(self.block_kv + head_dim) // 2} float32 per thread, beside P's registers; "
                "at most 96 keep clear of spills (block_kv + head_dim <= 192)"
            )
        nbytes, allowed = self.shared_bytes(head_dim) + self.static_bytes, dynamic_shared.limit()
        if nbytes > allowed:
            raise ValueError(
                f"{self} needs {nbytes} B of shared memory for head_dim {head_dim}; a block may "
                f"use {allowed} B on {dynamic_shared.arch()}"
            )


def default_config(head_dim: int, sq: int | None = None) -> WgmmaAttentionConfig:
    """64-key tiles, overlapped in 3 stages, two warpgroups (128 query rows; 65 KiB of shared
    memory at D = 64, 129 KiB at D = 128); one warpgroup where ``sq`` (the query length, when
    given) fits in 64 rows."""
    warps = 4 if sq is not None and sq <= ROWS else 8
    return WgmmaAttentionConfig(64, warps, 3, True)


def wgmma_attention(head_dim: int, causal: bool, config=None, bf16: bool = False):
    """The ``cuda.jit`` kernel ``kernel(q, k, v, o, scale_log2)`` (module doc), memoised;
    ``bf16``: q, k, v and o are bfloat16 (their ``uint16`` bits)."""
    cfg = default_config(head_dim) if config is None else WgmmaAttentionConfig(*config)
    cfg.validate(head_dim)
    return _build(head_dim, bool(causal), cfg, bool(bf16))


def _rescaler(count: int):
    """``rescale(acc, a0, a1)``: the ``count`` float32 of a wgmma accumulator tuple, rows ``g``
    times ``a0`` and rows ``g + 8`` times ``a1``, written out so that every index is a constant
    (registers, no local memory)."""
    scaled = ", ".join(f"acc[{i}] * {'a0' if i % 4 < 2 else 'a1'}" for i in range(count))
    namespace: dict = {}
    exec(f"def rescale(acc, a0, a1):\n    return ({scaled},)\n", namespace)  # noqa: S102
    return cuda.jit(device=True, **INLINE)(namespace["rescale"])


@functools.cache
def _build(d: int, causal: bool, cfg: WgmmaAttentionConfig, bf16: bool):
    block_q, block_kv, stages = cfg.block_q, cfg.block_kv, cfg.num_stages
    overlap, producer, copiers = cfg.overlap, cfg.producer, cfg.copiers
    consumers = WARP_SIZE * cfg.num_warps  # threads that compute
    # Tiles of copies in flight ahead of the one whose P V runs; the copy groups a refill's
    # wait leaves in flight (overlapped: none, as tile kt + 1 is needed at once).
    ahead, lag = stages - 1, stages - 3 if overlap else stages - 2
    first_lag = ahead - 1
    kd = d // 16  # k16 steps of Q K^T
    nt = block_kv // 8  # n8 score tiles per warp
    kk_steps = block_kv // 16  # k16 steps of P V
    dt = d // 8  # n8 output tiles per warp
    tile = block_kv * d  # one stage of K (or V), in elements
    k_at = block_q * d
    v_at = k_at + stages * tile
    tile16 = 2 * tile // 16  # a stage in 16-byte units (a descriptor's address field)
    # Copies: the threads of a row take its chunks, one each; rows step by a multiple of 8,
    # so a thread's physical chunk (the swizzle) is the same in every row it copies.
    per_row = d // CHUNK
    row_step = copiers // per_row
    q_passes, kv_passes = block_q // row_step, block_kv // row_step
    elem = uint16 if bf16 else float16
    wgmma = wgmma_async_bf16 if bf16 else wgmma_async
    pack = pack_bf16x2 if bf16 else pack_f16x2
    store_pair = store_bf16x2 if bf16 else store_f16x2
    unpack_s, unpack_o = unpacker(block_kv // 2), unpacker(d // 2)
    rescale = _rescaler(d // 2)
    span = block_span(block_q, block_kv, causal)

    @cuda.jit(device=True)
    def k_step(w, rows):
        """Descriptor offset (16-byte units) of k16 step ``w`` in a K-major tile of ``rows``:
        32 bytes along the swizzled row, a column block of ``rows`` x 128 bytes per 4 steps."""
        return uint64((w // 4) * rows * 8 + (w % 4) * 2)

    @cuda.jit(device=True, **INLINE)
    def load_kv(smem, k, v, src, kt, base, dst, r0, sk_len):
        """This thread's chunks of K/V tile ``kt`` into the stage at ``base`` (K; V follows
        the K ring), zero-filled past ``Sk``. ``src``: this thread's first chunk of K and of
        V (elements from ``k[0, 0, 0]`` and ``v[0, 0, 0]``) and their row strides; a tile's
        chunks are offset pairs from its first row (see :mod:`.matmul_wgmma`)."""
        k_first, v_first, k_rows, v_rows = src
        k_base = k_first + int64(kt * block_kv) * k_rows
        v_base = v_first + int64(kt * block_kv) * v_rows
        for p in range(kv_passes):
            row = kt * block_kv + r0 + p * row_step
            n = 16 if row < sk_len else 0
            at = base + dst + p * row_step * BLOCK
            cp_async_cg_16_zfill_at(smem, at, k, (k_base, p * row_step * k_rows), n)
            cp_async_cg_16_zfill_at(smem, at + stages * tile, v, (v_base, p * row_step * v_rows), n)

    @cuda.jit(device=True, **INLINE)
    def scores(desc_q, desc_k):
        """Issue ``S = Q K^T`` on the K tile of ``desc_k`` (not waited for). The accumulator in
        is zeros with scale-d 0: ptxas reads ``RZ`` and moves nothing."""
        sacc = wgmma(desc_q, desc_k, wgmma_zeros(block_kv), 0, 1, 1, 0, 0)
        for w in range(1, kd):  # constant trip count: unrolled
            sacc = wgmma(
                desc_q + k_step(w, block_q), desc_k + k_step(w, block_kv), sacc, 1, 1, 1, 0, 0
            )  # fmt: skip
        return sacc

    @cuda.jit(device=True, **INLINE)
    def softmax(kt, masked, sl, pf, row_max, row_sum, lim, c, sk_len, lane):
        """The online softmax of tile ``kt``'s scores ``sl`` (``masked``: mask them first):
        the statistics updated, P packed into ``pf``; returns the rescale of each row."""
        if masked:  # the diagonal, or keys past the end of K
            key0 = int32(kt * block_kv + 2 * (lane & 3))
            for h in range(2):
                end = sk_len  # keys from end on are masked for row 8 h
                if causal:
                    end = min(sk_len, max(0, lim + 8 * h))
                for j in range(nt):
                    for q in range(2 * h, 2 * h + 2):
                        if int32(key0 + 8 * j + (q & 1)) >= end:
                            sl[0, j, q] = NEG_INF
        # Per row h of the lane's two (its quad holds the row's scores).
        alpha0 = ZERO
        alpha1 = ZERO
        for h in range(2):
            mx = sl[0, 0, 2 * h]
            for j in range(nt):
                mx = max_nan(mx, sl[0, j, 2 * h])
                mx = max_nan(mx, sl[0, j, 2 * h + 1])
            mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
            mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
            m_new = max_nan(row_max[h], mx * c)
            m_use = ZERO if m_new == NEG_INF else m_new  # no key yet: p = exp2(-inf) = 0
            alpha = exp2_approx(row_max[h] - m_use)
            row_max[h] = m_new
            total = row_sum[h] * alpha
            for j in range(nt):
                p0 = exp2_approx(sl[0, j, 2 * h] * c - m_use)
                p1 = exp2_approx(sl[0, j, 2 * h + 1] * c - m_use)
                pf[j // 2, 2 * (j % 2) + h] = pack(p0, p1)
                total += p0 + p1
            row_sum[h] = total
            if h == 0:
                alpha0 = alpha
            else:
                alpha1 = alpha
        return alpha0, alpha1

    @cuda.jit(device=True, **INLINE)
    def accumulate(oacc, pf, desc_v):
        """Issue ``O += P V`` on the V tile of ``desc_v`` (not waited for)."""
        for kk in range(kk_steps):  # constant trip count: unrolled
            oacc = wgmma(
                (pf[kk, 0], pf[kk, 1], pf[kk, 2], pf[kk, 3]),
                desc_v + uint64(kk * 16 * BLOCK // 8), oacc, 1, 1, 1, 0, 1,
            )  # fmt: skip
        return oacc

    @cuda.jit(device=True, **INLINE)
    def refill(smem, pad, k, v, src, kt, stage, tiles, dst, r0, sk_len):
        """Wait for this thread's copies of the next tile needed, publish every thread's (to
        the tensor cores too), and start the copies of tile ``kt + ahead`` (``stage``: tile
        ``kt``'s; tile ``kt + ahead`` goes to the one before it, ``ahead = stages - 1``)."""
        cp_async_wait_group(lag)
        fence_proxy_async()  # the landed copies, visible to the wgmma reads (async proxy)
        cuda.syncthreads()
        if int32(kt + ahead) < tiles:
            base = pad + k_at + (stage - 1 if stage > 0 else stages - 1) * tile
            load_kv(smem, k, v, src, kt + ahead, base, dst, r0, sk_len)
        cp_async_commit_group()

    @cuda.jit(device=True, **INLINE)
    def acquire(full, kt, stage):
        """With a producer: wait until K/V tile ``kt`` has landed in ``stage``, and order it
        before the tensor cores' reads (async proxy)."""
        mbarrier_wait(full, stage, (kt // stages) & 1)
        fence_proxy_async()

    @cuda.jit(device=True, **INLINE)
    def load_stage(kt, s, payload):
        smem, pad, k, v, src, dst, r0, sk_len = payload
        load_kv(smem, k, v, src, kt, pad + k_at + s * tile, dst, r0, sk_len)

    produce = producer_loop(load_stage, stages)

    @cuda.jit(device=True, **INLINE)
    def kv_step(smem, pad, k, v, src, kt, stage, tiles, masked, desc_q, desc_k, desc_v, sacc,
                oacc, sl, pf, row_max, row_sum, lim, c, dst, r0, sk_len, lane, full,
                empty):  # fmt: skip
        """K/V tile ``kt`` in ``stage``. In turn: refill, S, wait, softmax, O += P V, wait.
        Overlapped (``sacc``: tile ``kt``'s scores, retired): refill, S of tile ``kt + 1``
        issued, the softmax of tile ``kt`` while it runs, O += P V, wait for both; returns the
        scores of tile ``kt + 1`` and O. With a producer, waiting for the tile a product reads
        (``full``) replaces the refill, and the tile's stage is released at the end
        (``empty``)."""
        if not producer:
            refill(smem, pad, k, v, src, kt, stage, tiles, dst, r0, sk_len)
        elif not overlap:
            acquire(full, kt, stage)
        offset = uint64(stage * tile16)
        if overlap:
            unpack_s(sacc, sl)  # before the registers are handed to the next product
            # Tile kt + 1's scores; past the last tile, tile kt's again (discarded): one
            # product issued on every path (a branch around it costs ptxas a null HGMMA)
            nxt = stage + 1 if stage + 1 < stages else 0
            nxt = nxt if int32(kt + 1) < tiles else stage
            if producer and int32(kt + 1) < tiles:
                acquire(full, kt + 1, nxt)
            wgmma_fence()
            sacc = scores(desc_q, desc_k + uint64(nxt * tile16))
            wgmma_commit_group()
        else:
            wgmma_fence()
            sacc = scores(desc_q, desc_k + offset)
            wgmma_commit_group()
            sacc = wgmma_wait_group(0, sacc)
            unpack_s(sacc, sl)
        alpha0, alpha1 = softmax(kt, masked, sl, pf, row_max, row_sum, lim, c, sk_len, lane)
        oacc = rescale(oacc, alpha0, alpha1)
        wgmma_fence()  # O and P's registers written: ordered before the MMAs that read them
        oacc = accumulate(oacc, pf, desc_v + offset)
        wgmma_commit_group()
        if overlap:
            sacc = wgmma_wait_group(0, sacc)
        oacc = wgmma_wait_group(0, oacc)
        if producer:  # tile kt's K and V read: the stage is the producer's again
            mbarrier_arrive(empty, stage)
        return sacc, oacc

    @cuda.jit(device=True, **INLINE)
    def copy_q(smem, q, bz, m0, sq_len, q_dst, r0, col):
        """This thread's chunks of the block's Q rows, as one cp.async group."""
        for p in range(q_passes):
            row = m0 + r0 + p * row_step
            cp_async_cg_16_zfill(smem, q_dst + p * row_step * BLOCK, q, (bz, row, col),
                                 16 if row < sq_len else 0)  # fmt: skip
        cp_async_commit_group()

    @cuda.jit(device=True, **INLINE)
    def negate_q(bits, q_dst, scale_log2):
        """A negative scale is folded into Q once: each copier flips the chunks it copied
        (after they landed; published to the tensor cores by a fence and a barrier)."""
        if scale_log2 < ZERO:
            for p in range(q_passes):
                negate_chunk(bits, q_dst + p * row_step * BLOCK)

    def kernel(q, k, v, o, scale_log2):
        smem = cuda.shared.array(0, elem, alignment=ALIGN)
        bits = cuda.shared.array(0, uint16, alignment=ALIGN)  # the same memory, as bits
        # With a producer: K/V stage s landed (full) and released by every consumer (empty),
        # and Q landed; unused (and not emitted) without one.
        full = cuda.shared.array(stages, uint64)
        empty = cuda.shared.array(stages, uint64)
        q_ready = cuda.shared.array(1, uint64)
        # Local arrays indexed only by constants (loops over constants, unrolled): registers.
        sl = cuda.local.array((1, nt, 4), float32)  # the scores, as unpacked
        pf = cuda.local.array((kk_steps, 4), uint32)  # P as A registers
        ol = cuda.local.array((1, dt, 4), float32)
        row_max = cuda.local.array(2, float32)  # FlashAttention's m and l, scaled by c
        row_sum = cuda.local.array(2, float32)
        pad = swizzle_start(smem)  # the tiles start at the first 1024-byte boundary
        tid = cuda.threadIdx.x
        lane = tid % WARP_SIZE
        warp = tid // WARP_SIZE
        # the warpgroup, from lane 0: warp-uniform for the compiler too (uniform descriptors)
        group = cuda.shfl_sync(0xFFFFFFFF, warp // WARPGROUP, 0)
        bz = cuda.blockIdx.y
        m0, sq_len, sk_len, shift_keys, tiles, full_tiles = span(q, k)  # no mask in the first

        # This thread's chunk (as a copier): column block cb, physical chunk pc of rows r0 +
        # p * row_step.
        r0 = tid // per_row
        chunk = tid % per_row
        col = chunk * CHUNK
        cb, pc = chunk // 8, (chunk % 8) ^ (r0 % 8)
        q_dst = pad + cb * block_q * BLOCK + r0 * BLOCK + pc * CHUNK
        dst = cb * block_kv * BLOCK + r0 * BLOCK + pc * CHUNK
        k_rows, v_rows = k.strides[1] // 2, v.strides[1] // 2  # row strides, in elements
        src = (
            bz * (k.strides[0] // 2) + int64(r0) * k_rows + col,
            bz * (v.strides[0] // 2) + int64(r0) * v_rows + col,
            k_rows,
            v_rows,
        )
        if producer:
            if tid == 0:
                for s in range(stages):
                    mbarrier_init(full, s, copiers)  # a copy arrival per producer thread
                    mbarrier_init(empty, s, consumers)  # an arrival per consumer thread
                mbarrier_init(q_ready, 0, copiers)
            cuda.syncthreads()  # the barriers' initialisation, visible to every thread
            if group == 0:  # the producer: Q (landed, folded, released), then K/V tiles
                copy_q(smem, q, bz, m0, sq_len, q_dst, r0, col)
                cp_async_wait_group(0)
                negate_q(bits, q_dst, scale_log2)
                mbarrier_arrive(q_ready, 0)
                produce(full, empty, tiles, (smem, pad, k, v, src, dst, r0, sk_len))
                return
            group -= 1
            warp -= WARPGROUP
            mbarrier_wait(q_ready, 0, 0)
        else:
            # Q: one cp.async group of its own, then the first stages - 1 K/V tiles.
            copy_q(smem, q, bz, m0, sq_len, q_dst, r0, col)
            for kt in range(ahead):
                if kt < tiles:
                    load_kv(smem, k, v, src, kt, pad + k_at + kt * tile, dst, r0, sk_len)
                cp_async_commit_group()
            cp_async_wait_group(ahead)  # Q's group
            negate_q(bits, q_dst, scale_log2)
        c = abs(scale_log2)
        c = max(c, FLT_MIN)

        # Descriptors of this warpgroup's Q rows, and of stage 0's K and V.
        desc_q = wgmma_descriptor(smem, pad + group * ROWS * BLOCK, 16, 1024, SWIZZLE_128B)
        desc_k = wgmma_descriptor(smem, pad + k_at, 16, 1024, SWIZZLE_128B)
        desc_v = wgmma_descriptor(smem, pad + v_at, 2 * block_kv * BLOCK, 1024, SWIZZLE_128B)
        sacc = wgmma_zeros(block_kv)
        oacc = wgmma_zeros(d)
        row0 = m0 + group * ROWS + 16 * (warp % WARPGROUP) + (lane >> 2)
        lim = row0 + shift_keys + 1  # causal: the first key masked for the lane's first row
        for h in range(2):
            row_max[h] = NEG_INF
            row_sum[h] = ZERO

        if overlap and tiles > 0:  # tile 0's scores: the loop starts with them retired
            if producer:
                acquire(full, 0, 0)
            else:
                cp_async_wait_group(first_lag)  # Q and tile 0 landed
                fence_proxy_async()
                cuda.syncthreads()
            wgmma_fence()
            sacc = scores(desc_q, desc_k)
            wgmma_commit_group()
            sacc = wgmma_wait_group(0, sacc)
        kt = int32(0)
        stage = int32(0)  # kt % stages, counted (a 64-bit modulo costs a dozen instructions)
        while kt < full_tiles:  # a run-time bound: `while`, not range()
            # two tiles per pass: ptxas moves fewer of the scores' registers (overlapped, 19
            # instructions per tile fewer than with one, as measured)
            s2, oacc = kv_step(smem, pad, k, v, src, kt, stage, tiles, False, desc_q, desc_k,
                               desc_v, sacc, oacc, sl, pf, row_max, row_sum, lim, c, dst, r0,
                               sk_len, lane, full, empty)  # fmt: skip
            kt = int32(kt + 1)
            stage = int32(stage + 1 if stage + 1 < stages else 0)
            if kt < full_tiles:
                sacc, oacc = kv_step(smem, pad, k, v, src, kt, stage, tiles, False, desc_q,
                                     desc_k, desc_v, s2, oacc, sl, pf, row_max, row_sum, lim,
                                     c, dst, r0, sk_len, lane, full, empty)  # fmt: skip
                kt = int32(kt + 1)
                stage = int32(stage + 1 if stage + 1 < stages else 0)
            else:
                sacc = s2
        while kt < tiles:  # the diagonal and the end of K: masked
            sacc, oacc = kv_step(smem, pad, k, v, src, kt, stage, tiles, True, desc_q, desc_k,
                                 desc_v, sacc, oacc, sl, pf, row_max, row_sum, lim, c, dst, r0,
                                 sk_len, lane, full, empty)  # fmt: skip
            kt = int32(kt + 1)
            stage = int32(stage + 1 if stage + 1 < stages else 0)
        if not producer:
            cp_async_wait_group(0)  # no copy outlives the block (tiles past the last: empty)

        # O / l, once per row (l is the quad's sum of per-lane partials); no key: 0.
        unpack_o(oacc, ol)
        cols = 2 * (lane & 3)
        for h in range(2):
            total = row_sum[h]
            total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 1)
            total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 2)
            inv = ZERO if total == ZERO else rcp_approx(total)
            row = row0 + 8 * h
            if row < sq_len:
                for j in range(dt):
                    store_pair(o, (bz, row, 8 * j + cols), ol[0, j, 2 * h] * inv,
                               ol[0, j, 2 * h + 1] * inv)  # fmt: skip

    kernel.__name__ = kernel.__qualname__ = (
        f"flash_attention_wgmma{'_bf16' if bf16 else ''}_d{d}{'_causal' if causal else ''}"
        f"_kv{block_kv}_w{cfg.num_warps}{'_ws' if producer else ''}_s{stages}"
        f"{'_overlap' if overlap else ''}"
    )
    return cuda.jit(kernel)
