"""float16 (or bfloat16) flash attention ``O = softmax(Q @ K^T * scale) @ V`` on the tensor
cores: the score matrix never leaves the chip. With ``bf16=True`` the arrays are bfloat16 as
their ``uint16`` bits, the products ``mma .bf16`` and P and O rounded to bfloat16; the loop is
the same.

:func:`flash_attention` makes the kernel ``kernel(q, k, v, o, scale_log2)`` of one head size:

* ``q``, ``o``: float16 ``(Z, Sq, D)``; ``k``, ``v``: float16 ``(Z, Sk, D)``; any strides
  (a batch stride of 0 broadcasts) unless ``aligned`` (then every row starts 16-byte aligned
  on a contiguous inner axis: ``cp.async`` copies);
* ``scale_log2 = scale * log2(e)`` as float32: scores are ``s = q . k`` and probabilities
  ``exp2(s * scale_log2 - max)``, one FFMA and one ``MUFU.EX2`` each;
* launch ``grid = (ceil(Sq / block_q), Z)`` blocks of ``32 * num_warps`` threads, ``block_q =
  16 * num_warps`` query rows per block (:func:`plan`).

Each warp owns 16 query rows. Per K/V tile of ``block_kv`` keys (FlashAttention-2's loop)::

    cp.async.wait_group(stages - 2); __syncthreads()    1 barrier: tile t landed, and every
    cp.async K, V tile t + stages - 1 into the freed stage   warp is done with tile t - 1
    S = Q K^T     Q's A fragments stay in registers (loaded once); K by ldmatrix.x4
    (diagonal or last tile only) masked scores = -inf
    m' = max(m, rowmax(S) * c); alpha = exp2(m - m'); l = l * alpha; O = O * alpha
    P = exp2(S * c - m'); l += rowsum(P)               (c = |scale_log2|, one FFMA + EX2 each)
    O += P V      P's accumulators repacked as A fragments in registers; V by ldmatrix.x4.trans

    D = 64, 64-key tiles, per warp: 64 mma.sync, 32 ldmatrix, 34 ex2 (32 scores + 2 rescales
    per lane): the hand-written CUDA C++ anchor's counts.

The row statistics live in registers: a lane holds rows ``g`` and ``g + 8`` of its warp's 16
(``g = lane >> 2``), the quad of lanes ``4g .. 4g + 3`` shares them (two shuffles per max);
the row sum stays a per-lane partial until the end, where ``O / l`` is applied once. A row
with no key (``Sk = 0``, or causal with ``Sq > Sk``) gets 0, as PyTorch's math backend.

Causal (``key j <= i + Sk - Sq``, aligned to the bottom right): a block stops at its last
visible key (:func:`kv_rows`: fully masked tiles are neither loaded nor computed), and only the
tiles that cross the diagonal, or the end of K, are masked element by element. Block ``x``
takes the query rows of block ``gridDim.x - 1 - x``, so the longest blocks start first.

A negative scale is folded into Q's fragments (their sign bits flipped once), so that
``max(s) * c`` is the row maximum of the scaled scores; ``c`` is clamped at the smallest
normal float32 so that ``scale = 0`` gives the uniform average rather than ``0 * inf``.

Shared memory: the Q tile and ``num_stages`` K and V tiles, rows of ``D`` float16 with their
16-byte chunks XOR-swizzled as in :mod:`tessera_tile.kernels.matmul_tc` (0 bank conflicts for
ldmatrix and cp.async). ``D = 64``, 64-key tiles, 2 stages: 40 KiB, as the CUDA C++ anchor.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import boolean, cuda, float32, int32, uint16, uint32
from numba.types import float16

from .._fusion.device import exp2_approx, max_nan, rcp_approx
from ..bfloat16 import f32_to_bf16, pack_bf16x2
from ..memory import store16_shared
from ..mma import (
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k16,
    mma_m16n8k16_bf16,
    pack_f16x2,
    store_bf16x2,
    store_f16x2,
)
from ..pipeline import (
    SHARED_ALIGN,
    cp_async_cg_16_zfill,
    cp_async_commit_group,
    cp_async_wait_group,
)
from .tc_tiles import CHUNK, INLINE, MAX_STATIC_SHARED, tile_copies

__all__ = [
    "HEAD_DIMS",
    "AttentionConfig",
    "default_config",
    "flash_attention",
    "kv_rows",
]

WARP_SIZE = 32
HEAD_DIMS = (16, 32, 64, 128)
ZERO = float32(0.0)
NEG_INF = float32(-np.inf)
FLT_MIN = float32(np.finfo(np.float32).tiny)
SIGN_BITS = uint32(0x80008000)  # the sign bits of both float16 halves of a register


class AttentionConfig(NamedTuple):
    """One schedule: keys per K/V tile, warps (16 query rows each), pipeline stages."""

    block_kv: int = 64
    num_warps: int = 4
    num_stages: int = 2

    @property
    def block_q(self) -> int:
        return 16 * self.num_warps

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.num_warps

    def shared_bytes(self, head_dim: int) -> int:
        return 2 * head_dim * (self.block_q + 2 * self.num_stages * self.block_kv)

    def validate(self, head_dim: int) -> None:
        """Raise ``ValueError`` unless this config makes a kernel for ``head_dim``."""
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        if self.block_kv not in (16, 32, 64, 128):
            raise ValueError(f"block_kv must be 16, 32, 64 or 128, got {self.block_kv}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")
        if self.num_stages not in (2, 3):
            raise ValueError(f"num_stages must be 2 or 3, got {self.num_stages}")
        if self.shared_bytes(head_dim) > MAX_STATIC_SHARED:
            raise ValueError(
                f"{self} needs {self.shared_bytes(head_dim)} B of shared memory for head_dim "
                f"{head_dim}; the static limit is {MAX_STATIC_SHARED} B"
            )
        for rows in (self.block_q, self.block_kv):
            tile_copies(rows, head_dim // CHUNK, self.threads)  # raises if the copy does not split


def default_config(head_dim: int) -> AttentionConfig:
    """The anchor's schedule (4 warps, 64-key tiles, 2 stages); D = 128 takes 32-key tiles
    so that Q and two stages of K and V fit the 48 KiB of static shared memory."""
    return AttentionConfig(32 if head_dim > 64 else 64, 4, 2)


def kv_rows(m0: int, sq: int, sk: int, causal: bool, cfg) -> int:
    """Rows of K (and of V) the block of query rows ``m0 ..`` reads, once each: whole tiles up
    to its last visible key, none past ``Sk`` (``cfg``: any config with ``block_q`` and
    ``block_kv``; the float32 kernel follows the same rule)."""
    end = sk if not causal else min(sk, max(0, m0 + cfg.block_q + sk - sq))
    tiles = -(-end // cfg.block_kv)
    return min(sk, tiles * cfg.block_kv)


def flash_attention(head_dim: int, causal: bool, aligned: bool, config=None, bf16: bool = False):
    """The ``cuda.jit`` kernel ``kernel(q, k, v, o, scale_log2)`` (module doc), memoised;
    ``bf16``: q, k, v and o are bfloat16 (their ``uint16`` bits), on the ``.bf16`` mma."""
    cfg = default_config(head_dim) if config is None else AttentionConfig(*config)
    cfg.validate(head_dim)
    return _build(head_dim, bool(causal), bool(aligned), cfg, bool(bf16))


@cuda.jit(device=True)
def _reverse3(v):
    return ((v & 1) << 2) | (v & 2) | ((v >> 2) & 1)


@functools.cache
def _build(d: int, causal: bool, aligned: bool, cfg: AttentionConfig, bf16: bool = False):
    block_q, block_kv, stages, threads = cfg.block_q, cfg.block_kv, cfg.num_stages, cfg.threads
    ahead, lag = stages - 1, stages - 2
    kd = d // 16  # k16 steps of Q K^T; also pairs of n8 tiles of P V
    nt = block_kv // 8  # n8 score tiles per warp
    kk_steps = block_kv // 16  # k16 steps of P V
    dt = d // 8  # n8 output tiles per warp
    tile = block_kv * d  # one stage of K (or V)
    q_size, ring = block_q * d, stages * tile  # shared shapes must be constants
    cq, ckv = tile_copies(block_q, d // CHUNK, threads), tile_copies(block_kv, d // CHUNK, threads)
    lines, period, shift = cq.lines, cq.period, 3 - cq.bits  # the same rows of D for all
    q_per, kv_per = cq.chunks // cq.per_row, ckv.chunks // ckv.per_row
    q_threads, q_step, q_passes, q_exact = cq.per_row, cq.row_step, cq.passes, cq.exact
    kv_threads, kv_row_step, kv_passes, kv_exact = ckv.per_row, ckv.row_step, ckv.passes, ckv.exact
    # float16, or bfloat16 as its bits: the same tiles, the .bf16 mma, P and O rounded to it
    elem = uint16 if bf16 else float16
    mma = mma_m16n8k16_bf16 if bf16 else mma_m16n8k16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    store_pair = store_bf16x2 if bf16 else store_f16x2

    @cuda.jit(device=True)
    def chunk_at(r, c):
        """Physical 16-byte chunk of logical chunk ``c`` in tile row ``r`` (the swizzle)."""
        return c ^ (_reverse3((r // lines) % period) >> shift)

    @cuda.jit(device=True, **INLINE)
    def copy_chunk(dst, offset, src, bz, row, col, ok):
        """``src[bz, row, col:col + 8]`` -> ``dst[offset:offset + 8]``, zeros unless ``ok``."""
        if aligned:  # a copy of 0 source bytes reads nothing: its address may be outside src
            cp_async_cg_16_zfill(dst, offset, src, (bz, row, col), 16 if ok else 0)
        else:
            z = elem(0)
            x0 = src[bz, row, col] if ok else z
            x1 = src[bz, row, col + 1] if ok else z
            x2 = src[bz, row, col + 2] if ok else z
            x3 = src[bz, row, col + 3] if ok else z
            x4 = src[bz, row, col + 4] if ok else z
            x5 = src[bz, row, col + 5] if ok else z
            x6 = src[bz, row, col + 6] if ok else z
            x7 = src[bz, row, col + 7] if ok else z
            store16_shared(dst, offset, (x0, x1, x2, x3, x4, x5, x6, x7))

    @cuda.jit(device=True, **INLINE)
    def load_kv(sk, sv, k, v, bz, kt, stage, dst, r0, c0, sk_len):
        """This thread's chunks of K/V tile ``kt`` into ``stage``."""
        for p in range(kv_passes):
            r = r0 + p * kv_row_step
            if kv_exact or r < block_kv:
                row = kt * block_kv + r
                ok = row < sk_len
                for i in range(kv_per):
                    col = (c0 + kv_threads * i) * CHUNK
                    copy_chunk(sk, stage * tile + dst[p, i], k, bz, row, col, ok)
                    copy_chunk(sv, stage * tile + dst[p, i], v, bz, row, col, ok)

    @cuda.jit(device=True)
    def commit():
        if aligned:
            cp_async_commit_group()

    @cuda.jit(device=True, **INLINE)
    def mma_into(acc, j, a, b0, b1):
        """``acc[j] += a @ (b0, b1)``: one mma.sync on accumulator tile ``j`` (a constant)."""
        d = mma(a, (b0, b1), (acc[j, 0], acc[j, 1], acc[j, 2], acc[j, 3]))
        for q in range(4):
            acc[j, q] = d[q]

    @cuda.jit(device=True, **INLINE)
    def kv_step(sk, sv, k, v, bz, kt, tiles, s, masked, qf, sacc, oacc, row_max, row_sum, lim, c,
                off_k, off_v, dst, r0, c0, sk_len, lane):  # fmt: skip
        """K/V tile ``kt`` in stage ``s``: wait, refill, S, (``masked``: mask), softmax, O += P V.
        ``s`` and ``masked`` are constants in the main loop (stage offsets are immediates and
        the mask is compiled out), run-time values in the tail."""
        if aligned:
            cp_async_wait_group(lag)
        cuda.syncthreads()  # tile kt landed; every warp is done with tile kt - 1
        if int32(kt + ahead) < tiles:
            load_kv(sk, sv, k, v, bz, kt + ahead, (s + ahead) % stages, dst, r0, c0, sk_len)
        commit()
        k_base = s * tile
        # S = Q K^T: B fragments of two n8 key tiles per ldmatrix.x4 (keys are K's rows)
        for j in range(nt):
            for q in range(4):
                sacc[j, q] = ZERO
        for ks in range(kd):
            for j2 in range(nt // 2):
                f = ldmatrix_x4(sk, k_base + off_k[ks] + 16 * j2 * d)
                a = (qf[ks, 0], qf[ks, 1], qf[ks, 2], qf[ks, 3])
                mma_into(sacc, 2 * j2, a, f[0], f[1])
                mma_into(sacc, 2 * j2 + 1, a, f[2], f[3])
        if masked:  # the diagonal, or keys past the end of K
            key0 = int32(kt * block_kv + 2 * (lane & 3))
            for j in range(nt):
                for q in range(4):
                    if int32(key0 + 8 * j + (q & 1)) >= lim[q >> 1]:
                        sacc[j, q] = NEG_INF
        # Online softmax, per row h of the lane's two (its quad holds the row's 64 scores).
        for h in range(2):
            mx = sacc[0, 2 * h]
            for j in range(nt):
                mx = max_nan(mx, sacc[j, 2 * h])
                mx = max_nan(mx, sacc[j, 2 * h + 1])
            mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
            mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
            m_new = max_nan(row_max[h], mx * c)
            m_use = ZERO if m_new == NEG_INF else m_new  # no key yet: p = exp2(-inf) = 0
            alpha = exp2_approx(row_max[h] - m_use)
            row_max[h] = m_new
            total = row_sum[h] * alpha
            for j in range(dt):
                oacc[j, 2 * h] *= alpha
                oacc[j, 2 * h + 1] *= alpha
            for j in range(nt):
                p0 = exp2_approx(sacc[j, 2 * h] * c - m_use)
                p1 = exp2_approx(sacc[j, 2 * h + 1] * c - m_use)
                sacc[j, 2 * h] = p0
                sacc[j, 2 * h + 1] = p1
                total += p0 + p1
            row_sum[h] = total
        # O += P V: the accumulators of n8 tiles 2kk and 2kk + 1 are the A fragment of keys
        # 16kk .. 16kk + 15 (layout C of two tiles = layout A of one k16 step).
        for kk in range(kk_steps):
            a = (
                pack(sacc[2 * kk, 0], sacc[2 * kk, 1]),
                pack(sacc[2 * kk, 2], sacc[2 * kk, 3]),
                pack(sacc[2 * kk + 1, 0], sacc[2 * kk + 1, 1]),
                pack(sacc[2 * kk + 1, 2], sacc[2 * kk + 1, 3]),
            )
            for j2 in range(kd):
                f = ldmatrix_x4_trans(sv, k_base + off_v[j2] + 16 * kk * d)
                mma_into(oacc, 2 * j2, a, f[0], f[1])
                mma_into(oacc, 2 * j2 + 1, a, f[2], f[3])

    def kernel(q, k, v, o, scale_log2):
        sq = cuda.shared.array(q_size, elem, alignment=SHARED_ALIGN)
        sk = cuda.shared.array(ring, elem, alignment=SHARED_ALIGN)
        sv = cuda.shared.array(ring, elem, alignment=SHARED_ALIGN)
        # Local arrays indexed only by constants (loops over constants, unrolled): registers.
        qf = cuda.local.array((kd, 4), uint32)
        sacc = cuda.local.array((nt, 4), float32)
        oacc = cuda.local.array((dt, 4), float32)
        row_max = cuda.local.array(2, float32)  # FlashAttention's m and l, scaled by c
        row_sum = cuda.local.array(2, float32)
        lim = cuda.local.array(2, int32)
        off_k = cuda.local.array(kd, int32)
        off_v = cuda.local.array(kd, int32)
        dst = cuda.local.array((kv_passes, kv_per), int32)
        ok_q = cuda.local.array(q_passes, boolean)
        tid = cuda.threadIdx.x
        lane = tid % WARP_SIZE
        warp = tid // WARP_SIZE
        bz = cuda.blockIdx.y
        m0 = cuda.blockIdx.x * block_q
        if causal:  # the blocks with the most tiles first: the light ones fill the last wave
            m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * block_q
        sq_len = int32(q.shape[1])
        sk_len = int32(k.shape[1])
        shift_keys = sk_len - sq_len  # causal: key j is visible to query i iff j <= i + shift
        kv_end = sk_len
        mask_from = sk_len  # keys from here on are masked for some row of the block
        if causal:
            kv_end = min(sk_len, max(0, m0 + block_q + shift_keys))
            mask_from = min(sk_len, m0 + shift_keys + 1)
        tiles = int32((kv_end + block_kv - 1) // block_kv)

        # Q: one cp.async group of its own, then the first stages - 1 K/V tiles.
        qr0, qc0 = tid // q_threads, tid % q_threads
        for p in range(q_passes):
            r = qr0 + p * q_step
            ok_q[p] = m0 + r < sq_len
            if q_exact or r < block_q:
                for i in range(q_per):
                    c = qc0 + q_threads * i
                    copy_chunk(sq, r * d + chunk_at(r, c) * CHUNK, q, bz, m0 + r, c * CHUNK,
                               ok_q[p])  # fmt: skip
        commit()
        r0, c0 = tid // kv_threads, tid % kv_threads
        for p in range(kv_passes):
            r = r0 + p * kv_row_step
            for i in range(kv_per):
                dst[p, i] = r * d + chunk_at(r, c0 + kv_threads * i) * CHUNK
        for kt in range(ahead):
            if kt < tiles:
                load_kv(sk, sv, k, v, bz, kt, kt, dst, r0, c0, sk_len)
            commit()
        if aligned:
            cp_async_wait_group(ahead)  # Q's group
        cuda.syncthreads()

        # Q's A fragments, once: rows 16 warp + lane % 16, logical chunk 2 ks + lane // 16.
        c = abs(scale_log2)
        c = max(c, FLT_MIN)
        flip = scale_log2 < ZERO
        r = 16 * warp + lane % 16
        for ks in range(kd):
            f = ldmatrix_x4(sq, r * d + chunk_at(r, 2 * ks + lane // 16) * CHUNK)
            for i in range(4):
                qf[ks, i] = f[i] ^ SIGN_BITS if flip else f[i]
        # This lane's ldmatrix rows in a K/V stage: K rows (keys) lane % 8 + 8 (lane // 16),
        # chunk 2 ks + lane // 8 % 2; V rows lane % 8 + 8 (lane // 8 % 2), chunk 2 j + lane //
        # 16. The swizzle repeats every 8 rows: the 16-key steps are constant offsets.
        r = lane % 8 + 8 * (lane // 16)
        for ks in range(kd):
            off_k[ks] = r * d + chunk_at(r, 2 * ks + lane // 8 % 2) * CHUNK
        r = lane % 8 + 8 * (lane // 8 % 2)
        for j in range(kd):
            off_v[j] = r * d + chunk_at(r, 2 * j + lane // 16) * CHUNK
        row0 = m0 + 16 * warp + (lane >> 2)
        for h in range(2):
            row_max[h] = NEG_INF
            row_sum[h] = ZERO
            lim[h] = sk_len
            if causal:
                lim[h] = min(sk_len, max(0, row0 + 8 * h + shift_keys + 1))
        for j in range(dt):
            for i in range(4):
                oacc[j, i] = ZERO

        # Tiles before mask_from need no mask: the steady state, unrolled over the stages so
        # that stage offsets are constants. The masked tail (the diagonal, the end of K) runs
        # one body with run-time stage offsets.
        full = min(tiles, int32(mask_from // block_kv))
        kt = int32(0)
        while kt < full:  # a run-time bound: `while`, not range()
            kv_step(sk, sv, k, v, bz, kt, tiles, 0, False, qf, sacc, oacc, row_max, row_sum,
                    lim, c, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
            kt = int32(kt + 1)
            if kt < full:
                kv_step(sk, sv, k, v, bz, kt, tiles, 1, False, qf, sacc, oacc, row_max,
                        row_sum, lim, c, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
                kt = int32(kt + 1)
                if stages > 2 and kt < full:
                    kv_step(sk, sv, k, v, bz, kt, tiles, 2, False, qf, sacc, oacc, row_max,
                            row_sum, lim, c, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
                    kt = int32(kt + 1)
        while kt < tiles:
            kv_step(sk, sv, k, v, bz, kt, tiles, kt % stages, True, qf, sacc, oacc, row_max,
                    row_sum, lim, c, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
            kt = int32(kt + 1)

        # O / l, once per row (l is the quad's sum of per-lane partials); no key: 0.
        col = 2 * (lane & 3)
        for h in range(2):
            total = row_sum[h]
            total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 1)
            total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 2)
            inv = ZERO if total == ZERO else rcp_approx(total)
            row = row0 + 8 * h
            if row < sq_len:
                for j in range(dt):
                    x0 = oacc[j, 2 * h] * inv
                    x1 = oacc[j, 2 * h + 1] * inv
                    if aligned:
                        store_pair(o, (bz, row, 8 * j + col), x0, x1)
                    elif bf16:
                        o[bz, row, 8 * j + col] = f32_to_bf16(x0)
                        o[bz, row, 8 * j + col + 1] = f32_to_bf16(x1)
                    else:
                        o[bz, row, 8 * j + col] = x0
                        o[bz, row, 8 * j + col + 1] = x1

    kernel.__name__ = kernel.__qualname__ = (
        f"flash_attention{'_bf16' if bf16 else ''}_d{d}{'_causal' if causal else ''}"
        f"_kv{block_kv}_w{cfg.num_warps}"
        f"_s{stages}{'' if aligned else '_sync'}"
    )
    return cuda.jit(kernel)


# The configurations the compile tier builds (module-level kernels: one compile case each).
flash_attention_d64 = flash_attention(64, False, True)
flash_attention_d64_causal = flash_attention(64, True, True)
flash_attention_d128 = flash_attention(128, False, True)
flash_attention_d16_sync = flash_attention(16, True, False)
flash_attention_bf16_d64 = flash_attention(64, False, True, bf16=True)
