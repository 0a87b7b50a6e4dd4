"""float32 flash attention on the SIMT cores: ``o = softmax(q @ k^T * scale) @ v``, never
writing the ``Sq x Sk`` score matrix.

:func:`simt_attention` makes the kernel ``kernel(q, k, v, o, scale_log2)`` of one head
dimension, causal flag, load path and :class:`SimtAttentionConfig` (memoised):

* ``q``: float32 ``(Z, Sq, D)``, ``k`` and ``v``: float32 ``(Z, Sk, D)``, ``o``: float32
  ``(Z, Sq, D)``; any strides (a batch stride of 0 broadcasts); ``aligned=True`` promises a
  contiguous inner dimension and 16-byte aligned row starts (16-byte ``cp.async`` and stores),
  ``aligned=False`` takes any strides (4-byte ``cp.async`` of single elements, scalar stores);
* ``scale_log2``: float32, ``scale * log2(e)``: scores are ``s = (q . k) * scale_log2`` and the
  weights ``p = exp2(s - max)`` (one ``MUFU.EX2`` each, :func:`exp2_approx`);
* launch ``grid = (ceil(Sq / block_q), Z)`` blocks of ``config.threads`` threads (compiled
  with that block size as its launch bound: no other block size) with
  ``config.shared_bytes(D)`` bytes of dynamic shared memory.

A block owns ``block_q`` query rows and streams the keys in tiles of ``block_kv`` (FlashAttention-2
order, online softmax)::

    prologue    cp.async Q tile, K tile 0                                  (one group)
    per tile t  wait; barrier    K t landed; every thread done with V t-1 and P
                cp.async V t                                   (lands during the scores)
                S = Q K^T        register micro-tile, rows x keys per thread
                online softmax   row max over the 8 lanes of a row (3 shuffles per row),
                                 rescale O and the partial row sums, P = exp2(S - max) -> shared
                wait; barrier    V t landed, P visible, every thread done with K t
                cp.async K t+1                                 (lands during P @ V)
                O += P V         register micro-tile, rows x head columns per thread
    epilogue    row sums over the 8 lanes, O / sum (0 for a row with no allowed key), one store

Threads: 8 lanes per row group (``tx``, the key / head-column index) and ``threads / 8`` row
groups (``ty``). A thread holds rows ``ty + (threads / 8) * i`` (``i < rows_per_thread``), keys
``tx + 8 j`` of each K tile and head columns ``tx * w + 8 w h + (0 .. w-1)`` (``w = min(4, D/8)``).
The row max is all-reduced over the 8 lanes per tile; each lane keeps a partial row sum over its
own keys (rescaled with the row's max like O), reduced once at the end.

Shared memory (all conflict free, the simulator's profiler counts 0 bank conflicts):

* Q ``(block_q, D)`` unpadded: a quarter-warp reads one row (one broadcast ``LDS.128``);
* K ``(block_kv, D + 4)``: a quarter-warp reads 8 consecutive rows at one column, which the pad
  of 4 floats spreads over the 8 16-byte bank groups; the cp.async copies of a quarter-warp go
  to one column of 8 consecutive rows too (a "banded" order), so they are conflict free as well;
* V ``(block_kv, D)`` unpadded: a quarter-warp reads consecutive vectors of one row;
* P ``(block_q, block_kv + 8)``: the 4 row groups of a warp write 4 rows, 8 consecutive words
  each; a row pitch of 8 or 24 words (mod 32) puts them in 32 distinct banks.

K and V each have one buffer: the copy of V t overlaps the scores of tile t, the copy of K t+1
the ``P @ V`` of tile t (two barriers per tile). The four tiles are carved out of one dynamic
shared array (``config.shared_bytes(D)`` bytes, opted in past 48 KiB by
:func:`tessera_tile.dynamic_shared.launch`): D = 128 takes 64 x 32 tiles in 74.5 KiB.

Cost per K/V tile and thread (default configs, 16-byte copies, static SASS of sm_90, the masking
branch counted as if it ran): ``tm * tn * D`` FFMA for the scores and ``tm * (D/8) * block_kv``
for ``P @ V`` (2 D per score), 9.2 FFMA per shared load for D = 32 and 64 (5.8 for D = 16, 7.5
for D = 128 with the 32 x 16 tiles of 48 KiB of static shared memory); in all 57 / 95 / 183 /
386 instructions per score for D = 16 / 32 / 64 / 128 (of which 32 / 64 / 128 / 256 FFMA), one
``MUFU.EX2`` per score plus one per row (measured before D = 128's 64 x 32 default). Registers
96-170, no spills, no local memory.

Masking: keys ``>= Sk`` and, when ``causal``, keys ``j > i + Sk - Sq`` (bottom-right aligned, as
FlashAttention 2.1+) get ``s = -inf``. Tiles past the last key any row of the block may see
are never loaded (:func:`kv_rows` gives the rows a block reads); only tiles that straddle the
diagonal or ``Sk`` are masked element by element. Rows past ``Sk``/``Sq`` are zero-filled by the
copies (``cp.async`` with 0 source bytes: nothing is read). A row whose keys are all masked gets
0 (as PyTorch's math backend), not NaN: its running max stays ``-inf``, the exponent uses 0
instead, so every weight is ``exp2(-inf) = 0``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from numba import cuda, float32, int32, uint32

from ... import dynamic_shared
from ..._device.numerics import exp2_approx, max_nan, rcp_approx
from ..._runtime import config as _config
from ...memory import carve, load16_shared, store16
from ...pipeline import (
    SHARED_ALIGN,
    cp_async_4_zfill,
    cp_async_cg_16_zfill,
    cp_async_commit_group,
    cp_async_wait_group,
)
from .._named import NamedKernels
from .tc import kv_rows  # the same traffic rule

__all__ = [
    "HEAD_DIMS",
    "SimtAttentionConfig",
    "default_config",
    "kv_rows",
    "simt_attention",
    "threads",
]

HEAD_DIMS = (16, 32, 64, 128)
LANES = 8  # lanes per row group: the keys / head columns of one row are split over them
FULL_MASK = 0xFFFFFFFF
K_PAD = 4  # floats of padding per K row (see the module doc)
P_PAD = 8  # floats of padding per P row
ZERO = float32(0.0)
NEG_INF = float32(-math.inf)


class SimtAttentionConfig(NamedTuple):
    """One kernel configuration (hashable; see the module doc for the thread layout)."""

    block_q: int = 64  # query rows per block
    block_kv: int = 32  # keys per K/V tile
    threads: int = 128  # threads per block (8 lanes per row group)

    @property
    def row_groups(self) -> int:
        return self.threads // LANES

    @property
    def rows_per_thread(self) -> int:
        return self.block_q // self.row_groups

    @property
    def keys_per_thread(self) -> int:
        return self.block_kv // LANES

    def shared_bytes(self, head_dim: int) -> int:
        """Dynamic shared memory of the kernel for ``head_dim`` (Q, K, V and P tiles)."""
        floats = (
            self.block_q * head_dim
            + self.block_kv * (head_dim + K_PAD)
            + self.block_kv * head_dim
            + self.block_q * (self.block_kv + P_PAD)
        )
        return 4 * floats

    def validate(self, head_dim: int) -> None:
        """Raise ``ValueError`` unless this config makes a kernel for ``head_dim``."""
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
        if self.threads <= 0 or self.threads % 32:
            raise ValueError(f"threads must be a positive multiple of 32, got {self.threads}")
        if self.block_q <= 0 or self.block_q % self.row_groups:
            raise ValueError(
                f"block_q ({self.block_q}) must be a positive multiple of threads / {LANES} "
                f"({self.row_groups})"
            )
        if self.block_kv <= 0 or self.block_kv % 16:
            # 16: 4-key vectors of P per lane row, and a P pitch of 8 or 24 words mod 32
            raise ValueError(f"block_kv must be a positive multiple of 16, got {self.block_kv}")
        nbytes, allowed = self.shared_bytes(head_dim), dynamic_shared.limit()
        if nbytes > allowed:
            raise ValueError(
                f"{self} needs {nbytes} B of shared memory for head_dim {head_dim}; a block "
                f"may use {allowed} B on {dynamic_shared.arch()}"
            )


_DEFAULTS = {
    16: SimtAttentionConfig(64, 64, 128),
    32: SimtAttentionConfig(64, 64, 128),
    64: SimtAttentionConfig(64, 32, 128),
    128: SimtAttentionConfig(64, 32, 128),  # 74.5 KiB: within every architecture's limit
}


def default_config(head_dim: int) -> SimtAttentionConfig:
    """The config the ops use for this head dimension."""
    if head_dim not in _DEFAULTS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    return _DEFAULTS[head_dim]


def threads(config: SimtAttentionConfig) -> int:
    """Threads per block of the kernel of ``config`` (the launch's block size)."""
    return config.threads


# ---------------------------------------------------------------------------------------------
# Shared-memory reads: one LDS.128 / LDS.64 each in compiled code
# ---------------------------------------------------------------------------------------------

if _config.SIMULATED:

    @cuda.jit(device=True)
    def read4(tile, row, col):
        # The twin of the one 16-byte shared load the compiled code makes: the profiler records
        # it as such (alignment checked, bank conflicts of LDS.128).
        return load16_shared(tile, (row, col))

else:

    @cuda.jit(device=True)
    def read4(tile, row, col):
        # Plain reads at unsigned indices: LLVM sees the 16-byte alignment and merges them into
        # one LDS.128 with a 32-bit shared address (as kernels/matmul/simt.py's read16_shared).
        return (
            tile[row, col],
            tile[row, col + uint32(1)],
            tile[row, col + uint32(2)],
            tile[row, col + uint32(3)],
        )


@cuda.jit(device=True)
def read2(tile, row, col):
    # Two reads that LLVM merges into one LDS.64 (head_dim 16: 2 columns per lane); the
    # simulator records two conflict-free scalar requests.
    return tile[row, col], tile[row, col + uint32(1)]


def _tile_loader(rows: int, width: int, vec: int, nthreads: int, banded: bool, unroll: bool):
    """``load(dst, src, row0, tid)``: cp.async rows ``row0 .. row0 + rows - 1`` of the 2-d
    ``src`` (``width`` columns) into ``dst[:rows, :width]``, ``vec`` floats per copy; rows past
    ``src``'s end are zero-filled without a read. ``banded``: a quarter-warp copies one column
    chunk of 8 consecutive rows (conflict free into a padded tile), else consecutive chunks of
    a row (conflict free into an unpadded one). ``unroll``: straight-line copies when a thread
    makes at most 8 (the K and V tiles, every iteration), else a loop (the Q tile, once, with
    fewer live addresses; and the 4-byte copies of D = 128, 32 per thread)."""
    per_row = width // vec
    total = rows * per_row
    trips = -(-total // nthreads)
    unroll = unroll and trips <= 8
    exact = total % nthreads == 0
    nbytes = 4 * vec
    copy = cp_async_cg_16_zfill if vec == 4 else cp_async_4_zfill

    @cuda.jit(device=True)
    def copy_one(dst, src, row0, n, idx):
        # unsigned 32-bit index math: shifts and masks (signed 64-bit // and % need fix-ups)
        idx = uint32(idx)
        if banded:
            rest = idx // uint32(LANES)
            c = (rest % uint32(per_row)) * uint32(vec)
            r = (rest // uint32(per_row)) * uint32(LANES) + idx % uint32(LANES)
        else:
            r = idx // uint32(per_row)
            c = (idx % uint32(per_row)) * uint32(vec)
        gr = row0 + r
        inside = gr < n
        # a row past the end reads nothing (0 bytes): any in-bounds address will do
        copy(dst, (r, c), src, (gr if inside else 0, c), nbytes if inside else 0)

    if unroll:

        @cuda.jit(device=True)
        def load(dst, src, row0, tid):
            n = src.shape[0]
            for it in range(trips):
                idx = tid + it * nthreads
                if exact or idx < total:
                    copy_one(dst, src, row0, n, idx)

    else:

        @cuda.jit(device=True)
        def load(dst, src, row0, tid):
            n = src.shape[0]
            idx = tid
            while idx < total:
                copy_one(dst, src, row0, n, idx)
                idx += nthreads

    return load


# ---------------------------------------------------------------------------------------------
# The kernel factory
# ---------------------------------------------------------------------------------------------


def simt_attention(
    head_dim: int, causal: bool, aligned: bool, config: SimtAttentionConfig | None = None
):
    """The kernel ``kernel(q, k, v, o, scale_log2)`` (memoised; see the module doc).

    ``config`` defaults to :func:`default_config` of ``head_dim`` (the same kernel object as
    passing that config). Launch: ``grid = (ceil(Sq / config.block_q), Z)``,
    ``block = config.threads``.
    """
    config = default_config(head_dim) if config is None else SimtAttentionConfig(*config)
    return _simt_attention(int(head_dim), bool(causal), bool(aligned), config)


@functools.cache
def _simt_attention(head_dim: int, causal: bool, aligned: bool, config: SimtAttentionConfig):
    config.validate(head_dim)
    d = head_dim
    block_q, block_kv, nthreads = config.block_q, config.block_kv, config.threads
    groups = config.row_groups
    tm = config.rows_per_thread
    tn = config.keys_per_thread
    w = min(4, d // LANES)  # head columns per vector of a lane
    dn = d // LANES  # head columns per lane
    nh = dn // w  # vectors of head columns per lane
    span = LANES * w  # distance between a lane's vectors
    vec = 4 if aligned else 1
    q_shape = (block_q, d)
    k_shape = (block_kv, d + K_PAD)
    v_shape = (block_kv, d)
    p_shape = (block_q, block_kv + P_PAD)
    k_at = block_q * d
    v_at = k_at + block_kv * (d + K_PAD)
    p_at = v_at + block_kv * d
    load_q = _tile_loader(block_q, d, vec, nthreads, banded=False, unroll=False)
    load_k = _tile_loader(block_kv, d, vec, nthreads, banded=True, unroll=True)
    load_v = _tile_loader(block_kv, d, vec, nthreads, banded=False, unroll=True)
    store_vector = aligned and w == 4
    read_v = read4 if w == 4 else read2

    def kernel(q, k, v, o, scale_log2):
        # One dynamic array (config.shared_bytes(d), opted in past 48 KiB) carved into the
        # tiles; each starts on 16 bytes (every row length is a multiple of 4 floats).
        smem = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)
        qs = carve(smem, 0, q_shape)
        ks = carve(smem, k_at, k_shape)
        vs = carve(smem, v_at, v_shape)
        ps = carve(smem, p_at, p_shape)
        # Local arrays indexed only by constants (unrolled loops) live in registers: the
        # compile tier checks there is no local memory.
        s = cuda.local.array((tm, tn), float32)
        acc = cuda.local.array((tm, dn), float32)
        qv = cuda.local.array((tm, 4), float32)
        pv = cuda.local.array((tm, 4), float32)
        vv = cuda.local.array(dn, float32)
        m_run = cuda.local.array(tm, float32)
        l_run = cuda.local.array(tm, float32)
        tid = cuda.threadIdx.x
        tx = tid % LANES
        ty = tid // LANES
        z = cuda.blockIdx.y
        m0 = cuda.blockIdx.x * block_q
        qz = q[z]
        kz = k[z]
        vz = v[z]
        oz = o[z]
        sq = qz.shape[0]
        sk = kz.shape[0]
        off = sk - sq  # key j is allowed for query i iff j <= i + off (causal)
        kv_end = sk
        if causal:
            kv_end = min(max(m0 + block_q + off, 0), sk)
        n_tiles = (kv_end + block_kv - 1) // block_kv
        scale = float32(scale_log2)
        urow = uint32(ty)  # unsigned shared indices: see read4
        ukey = uint32(tx)
        ucol = uint32(tx * w)
        for i in range(tm):
            m_run[i] = NEG_INF
            l_run[i] = ZERO
            for j in range(dn):
                acc[i, j] = ZERO

        load_q(qs, qz, m0, tid)
        if n_tiles > 0:
            load_k(ks, kz, 0, tid)
        cp_async_commit_group()

        t = 0
        while t < n_tiles:  # a run-time bound: `while`, not range()
            kv0 = t * block_kv
            cp_async_wait_group(0)
            cuda.syncthreads()  # K t landed; every thread is done with V t-1 and P
            load_v(vs, vz, kv0, tid)
            cp_async_commit_group()

            # S = Q K^T: per 4 head columns, tm + tn LDS.128 feed 4 tm tn FFMA
            for i in range(tm):
                for j in range(tn):
                    s[i, j] = ZERO
            for d0 in range(int32(0), int32(d), int32(4)):  # a 32-bit loop counter
                for i in range(tm):
                    a = read4(qs, urow + uint32(i * groups), uint32(d0))
                    for c in range(4):
                        qv[i, c] = a[c]
                for j in range(tn):
                    b = read4(ks, ukey + uint32(j * LANES), uint32(d0))
                    for i in range(tm):
                        for c in range(4):
                            s[i, j] += qv[i, c] * b[c]
            for i in range(tm):
                for j in range(tn):
                    s[i, j] *= scale
            # Element masks only on tiles that straddle Sk or the causal diagonal
            if kv0 + block_kv > sk or (causal and kv0 + block_kv - 1 > m0 + off):
                for i in range(tm):
                    limit = sk
                    if causal:
                        limit = min(m0 + ty + i * groups + off + 1, sk)
                    for j in range(tn):
                        if kv0 + tx + j * LANES >= limit:
                            s[i, j] = NEG_INF

            # Online softmax: the row max over the row group's 8 lanes, rescale, P -> shared
            for i in range(tm):
                mx = m_run[i]  # NaN-propagating: a NaN score makes its row NaN, as in NumPy
                for j in range(tn):
                    mx = max_nan(mx, s[i, j])
                mx = max_nan(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
                mx = max_nan(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
                mx = max_nan(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 4))
                base = mx if mx != NEG_INF else ZERO  # no key yet: every weight is 0
                alpha = exp2_approx(m_run[i] - base)
                m_run[i] = mx
                total = l_run[i] * alpha
                for j in range(dn):
                    acc[i, j] *= alpha
                for j in range(tn):
                    p = exp2_approx(s[i, j] - base)
                    total += p
                    ps[urow + uint32(i * groups), ukey + uint32(j * LANES)] = p
                l_run[i] = total

            cp_async_wait_group(0)
            cuda.syncthreads()  # V t landed, P visible, every thread is done with K t
            if t + 1 < n_tiles:
                load_k(ks, kz, kv0 + block_kv, tid)
            cp_async_commit_group()

            # O += P V: per 4 keys, tm + 4 nh shared loads feed 4 tm dn FFMA
            for k0 in range(int32(0), int32(block_kv), int32(4)):
                for i in range(tm):
                    a = read4(ps, urow + uint32(i * groups), uint32(k0))
                    for c in range(4):
                        pv[i, c] = a[c]
                for c in range(4):
                    for h in range(nh):
                        b = read_v(vs, uint32(k0 + c), ucol + uint32(h * span))
                        for e in range(w):
                            vv[h * w + e] = b[e]
                    for i in range(tm):
                        for j in range(dn):
                            acc[i, j] += pv[i, c] * vv[j]
            t += 1
        cp_async_wait_group(0)  # Q's copies when no tile ran

        for i in range(tm):
            total = l_run[i]
            total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
            total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
            total += cuda.shfl_xor_sync(FULL_MASK, total, 4)
            inv = ZERO if total == ZERO else rcp_approx(total)  # no visible key: 0
            row = m0 + ty + i * groups
            if row < sq:
                for h in range(nh):
                    col = tx * w + h * span
                    if store_vector:
                        store16(
                            oz,
                            (row, col),
                            (
                                acc[i, h * w] * inv,
                                acc[i, h * w + 1] * inv,
                                acc[i, h * w + 2] * inv,
                                acc[i, h * w + 3] * inv,
                            ),
                        )
                    else:
                        for e in range(w):
                            oz[row, col + e] = acc[i, h * w + e] * inv

    kernel.__name__ = kernel.__qualname__ = (
        f"attention_simt_d{d}_{block_q}x{block_kv}_t{nthreads}"
        f"{'_causal' if causal else ''}{'' if aligned else '_strided'}"
    )
    # The block size as a launch bound (.maxntid): ptxas then allocates registers for it
    # (the simulator refuses the option). Lazy: an eager signature would ask for a GPU.
    return cuda.jit(kernel, **({} if _config.SIMULATED else {"launch_bounds": (nthreads,)}))


def signature(aligned: bool) -> str:
    """The kernel signature for the compile tier (``aligned``: contiguous inner dimension)."""
    a = "float32[:, :, ::1]" if aligned else "float32[:, :, :]"
    return f"void({a}, {a}, {a}, {a}, float32)"


# The default configs' kernels by name: the compile tier builds each of them
# (tests/compile/cases.py), and the ops get the same objects from the memoised factory.
NAMED = NamedKernels(
    __name__,
    {
        f"attention_simt_d{d}{'_causal' if causal else ''}{'' if aligned else '_strided'}": (
            lambda d=d, causal=causal, aligned=aligned: simt_attention(d, causal, aligned)
        )
        for d in (16, 32, 64, 128)
        for causal in (False, True)
        for aligned in (True, False)
    },
)
__getattr__ = NAMED.module_getattr
