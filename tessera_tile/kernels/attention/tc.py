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
  warp_rows * num_warps`` query rows per block, with ``AttentionConfig.shared_bytes(D)`` of
  dynamic shared memory (:func:`tessera_tile.dynamic_shared.launch`: past 48 KiB it opts in).

Each warp owns ``warp_rows`` query rows: 32 by default for D <= 64 (two m16 tiles, as
FlashAttention-2), so that every ``ldmatrix.x4`` of K or V feeds 4 mma.sync instead of 2 (half
the shared-memory traffic per mma). Per K/V tile of ``block_kv`` keys (FlashAttention-2's loop)::

    cp.async.wait_group(stages - 2); __syncthreads()    1 barrier: tile t landed, and every
    cp.async K, V tile t + stages - 1 into the freed stage   warp is done with tile t - 1
    S = Q K^T     Q's A fragments in registers (loaded once, or per tile where they do not
                  fit); K by ldmatrix.x4, each shared by the warp's m16 tiles
    (diagonal or last tile only) masked scores = -inf
    m' = max(m, rowmax(S) * c); alpha = exp2(m - m'); l = l * alpha; O = O * alpha
    P = exp2(S * c - m'); l += rowsum(P)               (c = |scale_log2|, one FFMA + EX2 each)
    O += P V      P packed into A fragments as it is made; V by ldmatrix.x4.trans

    D = 64, 32-row warps, 64-key tiles, per warp: 128 mma.sync, 32 ldmatrix (4 mma each), 68
    ex2 (64 scores + 4 rescales per lane); the hand-written CUDA C++ anchor (16-row warps):
    64 mma.sync, 32 ldmatrix, 34 ex2.

D = 128 keeps 16-row warps: with 32 a thread would hold 128 O and 64 S accumulators beside
Q's fragments, past the 255 registers ptxas allows it (it spills); 64-key tiles there take 80
KiB of shared memory.

The row statistics live in registers: a lane holds rows ``g`` and ``g + 8`` of each of its
warp's m16 tiles (``g = lane >> 2``), the quad of lanes ``4g .. 4g + 3`` shares them (two
shuffles per max); the row sum stays a per-lane partial until the end, where ``O / l`` is
applied once. A row with no key (``Sk = 0``, or causal with ``Sq > Sk``) gets 0, as PyTorch's
math backend.

Causal (``key j <= i + Sk - Sq``, aligned to the bottom right): a block stops at its last
visible key (:func:`kv_rows`: fully masked tiles are neither loaded nor computed), and only the
tiles that cross the diagonal, or the end of K, are masked element by element. Block ``x``
takes the query rows of block ``gridDim.x - 1 - x``, so the longest blocks start first.

A negative scale is folded into Q once (each thread flips the sign bits of the chunks it
copied into shared memory), so that ``max(s) * c`` is the row maximum of the scaled scores;
``c`` is clamped at the smallest normal float32 so that ``scale = 0`` gives the uniform
average rather than ``0 * inf``.

Shared memory, one dynamic array: the Q tile and ``num_stages`` K and V tiles, rows of ``D``
float16 with their 16-byte chunks XOR-swizzled as in :mod:`tessera_tile.kernels.matmul.tc` (0
bank conflicts for ldmatrix and cp.async). 64-key tiles, 2 stages: 48 KiB for D = 64 (128
query rows), 80 KiB for D = 128 (64 rows).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import boolean, cuda, float32, int32, uint16, uint32
from numba.types import float16

from ... import dynamic_shared
from ..._device.numerics import exp2_approx, max_nan, rcp_approx
from ...bfloat16 import f32_to_bf16, pack_bf16x2
from ...memory import load16_shared, store16_shared
from ...mma import (
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_m16n8k16,
    mma_m16n8k16_bf16,
    pack_f16x2,
    store_bf16x2,
    store_f16x2,
)
from ...pipeline import (
    SHARED_ALIGN,
    cp_async_cg_16_zfill,
    cp_async_commit_group,
    cp_async_wait_group,
)
from .._named import NamedKernels
from ..tc_tiles import CHUNK, INLINE, tile_copies

__all__ = [
    "HEAD_DIMS",
    "AttentionConfig",
    "block_span",
    "default_config",
    "flash_attention",
    "kv_rows",
    "negate_chunk",
]

WARP_SIZE = 32
HEAD_DIMS = (16, 32, 64, 128)
ZERO = float32(0.0)
NEG_INF = float32(-np.inf)
FLT_MIN = float32(np.finfo(np.float32).tiny)
SPAN = 8 * CHUNK  # elements of 8 chunks
SIGN = uint16(0x8000)  # the sign bit of a float16 or bfloat16


class AttentionConfig(NamedTuple):
    """One schedule: keys per K/V tile, warps, pipeline stages, query rows per warp (16 or 32:
    with 32, two m16 tiles per warp share every K and V fragment)."""

    block_kv: int = 64
    num_warps: int = 4
    num_stages: int = 2
    warp_rows: int = 32

    @property
    def block_q(self) -> int:
        return self.warp_rows * self.num_warps

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.num_warps

    def shared_bytes(self, head_dim: int) -> int:
        """Dynamic shared memory a block launches with: the Q tile, the K and V rings."""
        return 2 * head_dim * (self.block_q + 2 * self.num_stages * self.block_kv)

    def q_in_registers(self, head_dim: int) -> bool:
        """Q's fragments stay in registers across K/V tiles unless, beside the S and O
        accumulators, they would pass ~160 of the 255 registers a thread may hold (D = 128
        with 32 rows per warp: 64 + 64 + 128): then each tile reloads them from shared."""
        m = self.warp_rows // 16
        return 4 * m * (self.block_kv // 8 + head_dim // 8 + head_dim // 16) <= 160

    def validate(self, head_dim: int) -> None:
        """Raise ``ValueError`` unless this config makes a kernel for ``head_dim`` that a block
        of this device (:func:`tessera_tile.dynamic_shared.limit`) may launch."""
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        if self.block_kv not in (16, 32, 64, 128):
            raise ValueError(f"block_kv must be 16, 32, 64 or 128, got {self.block_kv}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")
        if self.num_stages not in (2, 3):
            raise ValueError(f"num_stages must be 2 or 3, got {self.num_stages}")
        if self.warp_rows not in (16, 32):
            raise ValueError(f"warp_rows must be 16 or 32, got {self.warp_rows}")
        nbytes, allowed = self.shared_bytes(head_dim), dynamic_shared.limit()
        if nbytes > allowed:
            raise ValueError(
                f"{self} needs {nbytes} B of shared memory for head_dim {head_dim}; a block may "
                f"use {allowed} B on {dynamic_shared.arch()}"
            )
        for rows in (self.block_q, self.block_kv):
            tile_copies(rows, head_dim // CHUNK, self.threads)  # raises if the copy does not split


def default_config(head_dim: int, sq: int | None = None) -> AttentionConfig:
    """64-key tiles, 2 stages, 4 warps: of 32 query rows for D <= 64 (FlashAttention-2's
    128-row blocks; 48 KiB of shared memory at D = 64), of 16 for D = 128 (80 KiB): 32 rows
    there would hold 128 O, 64 S accumulators and Q's fragments, more than the 255 registers
    a thread may have (ptxas spills). ``sq`` (the query length), when given, halves the warps
    (down to 2) while half the block would cover it: the other warps would idle."""
    rows = 32 if head_dim <= 64 else 16
    warps = 4
    while sq is not None and warps > 2 and sq <= rows * warps // 2:
        warps //= 2
    return AttentionConfig(64, warps, 2, rows)


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


@cuda.jit(device=True, **INLINE)
def negate_chunk(bits, offset):
    """Flip the sign bits of the 8 float16 or bfloat16 at ``bits[offset:offset + 8]`` (their
    ``uint16`` view in shared memory): a negative scale folded into Q."""
    x = load16_shared(bits, offset)
    store16_shared(bits, offset, (
        uint16(x[0] ^ SIGN), uint16(x[1] ^ SIGN), uint16(x[2] ^ SIGN), uint16(x[3] ^ SIGN),
        uint16(x[4] ^ SIGN), uint16(x[5] ^ SIGN), uint16(x[6] ^ SIGN), uint16(x[7] ^ SIGN),
    ))  # fmt: skip


@functools.cache
def block_span(block_q: int, block_kv: int, causal: bool):
    """``span(q, k) -> (m0, sq_len, sk_len, shift_keys, tiles, full)`` of the block a flash
    kernel runs: its first query row (causal: the blocks with the most tiles first, so the
    light ones fill the last wave), the lengths, the causal shift (key ``j`` is visible to
    query ``i`` iff ``j <= i + shift_keys``), the K/V tiles it reads (up to its last visible
    key) and how many of them need no mask (before the diagonal and the end of K)."""

    @cuda.jit(device=True, **INLINE)
    def span(q, k):
        m0 = cuda.blockIdx.x * block_q
        if causal:
            m0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * block_q
        sq_len = int32(q.shape[1])
        sk_len = int32(k.shape[1])
        shift_keys = sk_len - sq_len
        kv_end = sk_len
        mask_from = sk_len  # keys from here on are masked for some row of the block
        if causal:
            kv_end = min(sk_len, max(0, m0 + block_q + shift_keys))
            mask_from = min(sk_len, m0 + shift_keys + 1)
        tiles = int32((kv_end + block_kv - 1) // block_kv)
        full = min(tiles, int32(mask_from // block_kv))
        return m0, sq_len, sk_len, shift_keys, tiles, full

    return span


@functools.cache
def _build(d: int, causal: bool, aligned: bool, cfg: AttentionConfig, bf16: bool = False):
    block_q, block_kv, stages, threads = cfg.block_q, cfg.block_kv, cfg.num_stages, cfg.threads
    warp_rows, mt = cfg.warp_rows, cfg.warp_rows // 16  # m16 tiles per warp
    q_regs = cfg.q_in_registers(d)
    ahead, lag = stages - 1, stages - 2
    kd = d // 16  # k16 steps of Q K^T; also pairs of n8 tiles of P V
    nt = block_kv // 8  # n8 score tiles per m16 tile
    kk_steps = block_kv // 16  # k16 steps of P V
    dt = d // 8  # n8 output tiles per m16 tile
    qk = kd if q_regs else 1  # Q fragments held: all k16 steps, or the current one
    lane_rows = 2 * mt  # rows a lane holds statistics of
    tile = block_kv * d  # one stage of K (or V)
    # The swizzle XORs the low 3 bits of a chunk index: chunks 8 apart lie SPAN elements
    # apart in every row, so offsets are kept for the first 8 chunks of a row only.
    ko = min(kd, 4)  # k16 steps (two chunks each) in the first 8 chunks
    q_size, ring = block_q * d, stages * tile
    k_at, v_at = q_size, q_size + ring  # the K and V rings in the dynamic shared array
    cq, ckv = tile_copies(block_q, d // CHUNK, threads), tile_copies(block_kv, d // CHUNK, threads)
    lines, period, shift = cq.lines, cq.period, 3 - cq.bits  # the same rows of D for all
    q_per, kv_per = cq.chunks // cq.per_row, ckv.chunks // ckv.per_row
    q_threads, q_step, q_passes, q_exact = cq.per_row, cq.row_step, cq.passes, cq.exact
    kv_threads, kv_row_step, kv_passes, kv_exact = ckv.per_row, ckv.row_step, ckv.passes, ckv.exact
    dst_n = min(kv_per, max(1, 8 // kv_threads))  # a thread's K/V chunks in the first 8
    # float16, or bfloat16 as its bits: the same tiles, the .bf16 mma, P and O rounded to it
    elem = uint16 if bf16 else float16
    mma = mma_m16n8k16_bf16 if bf16 else mma_m16n8k16
    pack = pack_bf16x2 if bf16 else pack_f16x2
    store_pair = store_bf16x2 if bf16 else store_f16x2
    span = block_span(block_q, block_kv, causal)

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
    def load_kv(smem, k, v, bz, kt, stage, dst, r0, c0, sk_len):
        """This thread's chunks of K/V tile ``kt`` into ``stage``."""
        for p in range(kv_passes):
            r = r0 + p * kv_row_step
            if kv_exact or r < block_kv:
                row = kt * block_kv + r
                ok = row < sk_len
                for i in range(kv_per):
                    col = (c0 + kv_threads * i) * CHUNK
                    at = stage * tile + dst[p, i % dst_n] + (i // dst_n) * SPAN
                    copy_chunk(smem, k_at + at, k, bz, row, col, ok)
                    copy_chunk(smem, v_at + at, v, bz, row, col, ok)

    @cuda.jit(device=True)
    def commit():
        if aligned:
            cp_async_commit_group()

    @cuda.jit(device=True, **INLINE)
    def mma_into(acc, m, j, a, b0, b1):
        """``acc[m, j] += a @ (b0, b1)``: one mma.sync on accumulator tile ``m, j`` (constants)."""
        d = mma(a, (b0, b1), (acc[m, j, 0], acc[m, j, 1], acc[m, j, 2], acc[m, j, 3]))
        for q in range(4):
            acc[m, j, q] = d[q]

    @cuda.jit(device=True, **INLINE)
    def qk_step(smem, k_base, ks, qf, sacc, off_q, wq, off_k):
        """k16 step ``ks`` (a constant) of S = Q K^T: each ldmatrix.x4 of K holds the B
        fragments of two n8 key tiles, which every m16 tile of the warp uses (2 mt mma)."""
        qi = ks if q_regs else 0
        if not q_regs:
            for m in range(mt):
                f = ldmatrix_x4(smem, off_q[ks % 4] + wq + (ks // 4) * SPAN + 16 * m * d)
                for i in range(4):
                    qf[m, 0, i] = f[i]
        for j2 in range(nt // 2):
            f = ldmatrix_x4(smem, k_base + off_k[ks % 4] + (ks // 4) * SPAN + 16 * j2 * d)
            for m in range(mt):
                a = (qf[m, qi, 0], qf[m, qi, 1], qf[m, qi, 2], qf[m, qi, 3])
                mma_into(sacc, m, 2 * j2, a, f[0], f[1])
                mma_into(sacc, m, 2 * j2 + 1, a, f[2], f[3])

    @cuda.jit(device=True, **INLINE)
    def pv_step(smem, v_base, kk, pf, oacc, off_v):
        """k16 step ``kk`` (a constant) of O += P V: each ldmatrix.x4.trans of V feeds 2 mt
        mma."""
        for j2 in range(kd):
            f = ldmatrix_x4_trans(smem, v_base + off_v[j2 % 4] + (j2 // 4) * SPAN + 16 * kk * d)
            for m in range(mt):
                a = (pf[m, kk, 0], pf[m, kk, 1], pf[m, kk, 2], pf[m, kk, 3])
                mma_into(oacc, m, 2 * j2, a, f[0], f[1])
                mma_into(oacc, m, 2 * j2 + 1, a, f[2], f[3])

    @cuda.jit(device=True, **INLINE)
    def kv_step(smem, k, v, bz, kt, tiles, s, masked, qf, pf, sacc, oacc, row_max, row_sum, lim,
                c, wq, off_k, off_v, dst, r0, c0, sk_len, lane):  # fmt: skip
        """K/V tile ``kt`` in stage ``s``: wait, refill, S, (``masked``: mask), softmax, O += P V.
        ``s`` and ``masked`` are constants in the main loop (stage offsets are immediates and
        the mask is compiled out), run-time values in the tail."""
        if aligned:
            cp_async_wait_group(lag)
        cuda.syncthreads()  # tile kt landed; every warp is done with tile kt - 1
        if int32(kt + ahead) < tiles:
            load_kv(smem, k, v, bz, kt + ahead, (s + ahead) % stages, dst, r0, c0, sk_len)
        commit()
        k_base, v_base = k_at + s * tile, v_at + s * tile
        for m in range(mt):
            for j in range(nt):
                for q in range(4):
                    sacc[m, j, q] = ZERO
        # The k16 steps written out (LLVM does not unroll loops this large), so that the
        # fragments and accumulators stay constant-indexed registers.
        qk_step(smem, k_base, 0, qf, sacc, off_v, wq, off_k)
        if kd > 1:
            qk_step(smem, k_base, 1, qf, sacc, off_v, wq, off_k)
        if kd > 2:
            qk_step(smem, k_base, 2, qf, sacc, off_v, wq, off_k)
            qk_step(smem, k_base, 3, qf, sacc, off_v, wq, off_k)
        if kd > 4:
            qk_step(smem, k_base, 4, qf, sacc, off_v, wq, off_k)
            qk_step(smem, k_base, 5, qf, sacc, off_v, wq, off_k)
            qk_step(smem, k_base, 6, qf, sacc, off_v, wq, off_k)
            qk_step(smem, k_base, 7, qf, sacc, off_v, wq, off_k)
        if masked:  # the diagonal, or keys past the end of K
            key0 = int32(kt * block_kv + 2 * (lane & 3))
            for m in range(mt):
                for h in range(2):
                    end = sk_len  # keys from end on are masked for row 16 m + 8 h
                    if causal:
                        end = min(sk_len, max(0, lim + 16 * m + 8 * h))
                    for j in range(nt):
                        for q in range(2 * h, 2 * h + 2):
                            if int32(key0 + 8 * j + (q & 1)) >= end:
                                sacc[m, j, q] = NEG_INF
        # Online softmax, per row h of the lane's two in each m16 tile (its quad holds the
        # row's scores). P is packed as it is made: the accumulators of n8 tiles 2kk and
        # 2kk + 1 are the A fragment of keys 16kk .. 16kk + 15 (layout C of two tiles =
        # layout A of one k16 step).
        for m in range(mt):
            for h in range(2):
                mx = sacc[m, 0, 2 * h]
                for j in range(nt):
                    mx = max_nan(mx, sacc[m, j, 2 * h])
                    mx = max_nan(mx, sacc[m, j, 2 * h + 1])
                mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max_nan(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                r = 2 * m + h
                m_new = max_nan(row_max[r], mx * c)
                m_use = ZERO if m_new == NEG_INF else m_new  # no key yet: p = exp2(-inf) = 0
                alpha = exp2_approx(row_max[r] - m_use)
                row_max[r] = m_new
                total = row_sum[r] * alpha
                for j in range(dt):
                    oacc[m, j, 2 * h] *= alpha
                    oacc[m, j, 2 * h + 1] *= alpha
                for j in range(nt):
                    p0 = exp2_approx(sacc[m, j, 2 * h] * c - m_use)
                    p1 = exp2_approx(sacc[m, j, 2 * h + 1] * c - m_use)
                    pf[m, j // 2, 2 * (j % 2) + h] = pack(p0, p1)
                    total += p0 + p1
                row_sum[r] = total
        pv_step(smem, v_base, 0, pf, oacc, off_v)
        if kk_steps > 1:
            pv_step(smem, v_base, 1, pf, oacc, off_v)
        if kk_steps > 2:
            pv_step(smem, v_base, 2, pf, oacc, off_v)
            pv_step(smem, v_base, 3, pf, oacc, off_v)
        if kk_steps > 4:
            pv_step(smem, v_base, 4, pf, oacc, off_v)
            pv_step(smem, v_base, 5, pf, oacc, off_v)
            pv_step(smem, v_base, 6, pf, oacc, off_v)
            pv_step(smem, v_base, 7, pf, oacc, off_v)

    def kernel(q, k, v, o, scale_log2):
        # One dynamic array (sized at launch: AttentionConfig.shared_bytes): Q, then the K
        # ring, then the V ring.
        smem = cuda.shared.array(0, elem, alignment=SHARED_ALIGN)
        # the same memory (dynamic arrays alias), as bits
        bits = cuda.shared.array(0, uint16, alignment=SHARED_ALIGN)
        # Local arrays indexed only by constants (loops over constants, unrolled): registers.
        qf = cuda.local.array((mt, qk, 4), uint32)
        pf = cuda.local.array((mt, kk_steps, 4), uint32)  # P as A fragments
        sacc = cuda.local.array((mt, nt, 4), float32)
        oacc = cuda.local.array((mt, dt, 4), float32)
        row_max = cuda.local.array(lane_rows, float32)  # FlashAttention's m and l, scaled by c
        row_sum = cuda.local.array(lane_rows, float32)
        off_k = cuda.local.array(ko, int32)
        off_v = cuda.local.array(ko, int32)
        dst = cuda.local.array((kv_passes, dst_n), int32)
        ok_q = cuda.local.array(q_passes, boolean)
        tid = cuda.threadIdx.x
        lane = tid % WARP_SIZE
        warp = tid // WARP_SIZE
        bz = cuda.blockIdx.y
        m0, sq_len, sk_len, shift_keys, tiles, full = span(q, k)

        # Q: one cp.async group of its own, then the first stages - 1 K/V tiles.
        qr0, qc0 = tid // q_threads, tid % q_threads
        for p in range(q_passes):
            r = qr0 + p * q_step
            ok_q[p] = m0 + r < sq_len
            if q_exact or r < block_q:
                for i in range(q_per):
                    c = qc0 + q_threads * i
                    copy_chunk(smem, r * d + chunk_at(r, c) * CHUNK, q, bz, m0 + r, c * CHUNK,
                               ok_q[p])  # fmt: skip
        commit()
        r0, c0 = tid // kv_threads, tid % kv_threads
        for p in range(kv_passes):
            r = r0 + p * kv_row_step
            for i in range(dst_n):
                dst[p, i] = r * d + chunk_at(r, c0 + kv_threads * i) * CHUNK
        for kt in range(ahead):
            if kt < tiles:
                load_kv(smem, k, v, bz, kt, kt, dst, r0, c0, sk_len)
            commit()
        if aligned:
            cp_async_wait_group(ahead)  # Q's group
        # A negative scale is folded into Q once: each thread flips the chunks it copied.
        c = abs(scale_log2)
        c = max(c, FLT_MIN)
        if scale_log2 < ZERO:
            for p in range(q_passes):
                r = qr0 + p * q_step
                if q_exact or r < block_q:
                    for i in range(q_per):
                        negate_chunk(bits, r * d + chunk_at(r, qc0 + q_threads * i) * CHUNK)
        cuda.syncthreads()

        # This lane's ldmatrix rows: K rows (keys) lane % 8 + 8 (lane // 16), chunk 2 ks +
        # lane // 8 % 2; V rows lane % 8 + 8 (lane // 8 % 2) = lane % 16, chunk 2 j + lane //
        # 16; Q rows the same as V's plus wq, the warp's first (+ 16 per m16 tile). The swizzle
        # repeats every 8 rows: 16-row steps are constant offsets.
        r = lane % 8 + 8 * (lane // 16)
        for ks in range(ko):
            off_k[ks] = r * d + chunk_at(r, 2 * ks + lane // 8 % 2) * CHUNK
        r = lane % 16
        for j in range(ko):
            off_v[j] = r * d + chunk_at(r, 2 * j + lane // 16) * CHUNK
        wq = warp_rows * warp * d
        if q_regs:  # Q's A fragments, once
            for ks in range(kd):
                for m in range(mt):
                    f = ldmatrix_x4(smem, off_v[ks % 4] + wq + (ks // 4) * SPAN + 16 * m * d)
                    for i in range(4):
                        qf[m, ks, i] = f[i]
        row0 = m0 + warp_rows * warp + (lane >> 2)
        lim = row0 + shift_keys + 1  # causal: the first key masked for the lane's first row
        for h in range(lane_rows):
            row_max[h] = NEG_INF
            row_sum[h] = ZERO
        for m in range(mt):
            for j in range(dt):
                for i in range(4):
                    oacc[m, j, i] = ZERO

        # Tiles before the mask (full) need none: the steady state, unrolled over the stages
        # so that stage offsets are constants. The masked tail (the diagonal, the end of K)
        # runs one body with run-time stage offsets.
        kt = int32(0)
        while kt < full:  # a run-time bound: `while`, not range()
            kv_step(smem, k, v, bz, kt, tiles, 0, False, qf, pf, sacc, oacc, row_max, row_sum,
                    lim, c, wq, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
            kt = int32(kt + 1)
            if kt < full:
                kv_step(smem, k, v, bz, kt, tiles, 1, False, qf, pf, sacc, oacc, row_max,
                        row_sum, lim, c, wq, off_k, off_v, dst, r0, c0, sk_len,
                        lane)  # fmt: skip
                kt = int32(kt + 1)
                if stages > 2 and kt < full:
                    kv_step(smem, k, v, bz, kt, tiles, 2, False, qf, pf, sacc, oacc, row_max,
                            row_sum, lim, c, wq, off_k, off_v, dst, r0, c0, sk_len,
                            lane)  # fmt: skip
                    kt = int32(kt + 1)
        while kt < tiles:
            kv_step(smem, k, v, bz, kt, tiles, kt % stages, True, qf, pf, sacc, oacc, row_max,
                    row_sum, lim, c, wq, off_k, off_v, dst, r0, c0, sk_len, lane)  # fmt: skip
            kt = int32(kt + 1)

        # O / l, once per row (l is the quad's sum of per-lane partials); no key: 0.
        col = 2 * (lane & 3)
        for m in range(mt):
            for h in range(2):
                total = row_sum[2 * m + h]
                total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 1)
                total += cuda.shfl_xor_sync(0xFFFFFFFF, total, 2)
                inv = ZERO if total == ZERO else rcp_approx(total)
                row = row0 + 16 * m + 8 * h
                if row < sq_len:
                    for j in range(dt):
                        x0 = oacc[m, j, 2 * h] * inv
                        x1 = oacc[m, j, 2 * h + 1] * inv
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
        f"_kv{block_kv}_w{cfg.num_warps}x{warp_rows}"
        f"_s{stages}{'' if aligned else '_sync'}"
    )
    return cuda.jit(kernel)


# The configurations the compile tier builds (one compile case each), built on first use.
NAMED = NamedKernels(
    __name__,
    {
        "flash_attention_d64": lambda: flash_attention(64, False, True),
        "flash_attention_d64_causal": lambda: flash_attention(64, True, True),
        "flash_attention_d128": lambda: flash_attention(128, False, True),
        "flash_attention_d16_sync": lambda: flash_attention(16, True, False),
        "flash_attention_bf16_d64": lambda: flash_attention(64, False, True, bf16=True),
    },
)
__getattr__ = NAMED.module_getattr
