"""float16 (or bfloat16: ``bf16=True``, every array its ``uint16`` bits) tensor-core matmul
``C = act(A @ B + bias)``: ``mma.sync.m16n8k16``, ``ldmatrix`` from swizzled shared tiles, a
multi-stage ``cp.async`` pipeline.

:func:`tensor_core_matmul` makes the kernel ``kernel(a, b, bias, c)`` of one configuration:

* ``a``: float16 ``(batch, M, K)``, ``b``: float16 ``(batch, K, N)``, ``c``: float16
  ``(batch, M, N)``, the inner dimension contiguous (``[:, :, ::1]``), any batch strides
  (0 broadcasts one matrix over the batch);
* ``bias``: float32 ``(N,)``, added to every row (ignored unless ``has_bias``: pass any
  1-element float32 array);
* launch ``grid = (ceil(N / tile_n), ceil(M / tile_m), batch)`` blocks of ``32 * num_warps``
  threads with ``Plan.shared`` bytes of dynamic shared memory (:func:`plan` gives them and the
  global bytes the launch moves, ``plan(...).launch(kernel, a, b, bias, c)`` launches;
  :func:`check_operands` validates the arguments and says whether the cp.async kernel fits).

Each block computes a ``tile_m x tile_n`` tile of one batch's ``C``; its warps split it in a
``warps_m x warps_n`` grid of warp tiles (128 x 128 with 4 warps: 2 x 2 warps of 64 x 64)::

    per k-tile (tile_k = 32, 4 warps of 64 x 64):
      cp.async.wait_group(stages - 2); __syncthreads()     1 barrier: tile k landed, and every
      cp.async tile k + stages - 1 into the freed stage     warp is done with tile k - 1
      for each k16 step (2):
        A: 4 ldmatrix.x4         (a 16 x 16 fragment each)
        B: 4 ldmatrix.x4.trans   (the fragments of two n8 tiles each)
        32 mma.sync.m16n8k16     (4 x 8 tiles of 16 x 8, float32 accumulators in registers)

    -> 64 HMMA per 16 LDSM (4.0 per shared load), no scalar shared loads.

Shared tiles are flat rings (stage, then a row-major tile) in dynamic shared memory, the A
ring then the B ring (``Plan.shared`` bytes, opted in past 48 KiB: :meth:`Plan.launch`), with
16-byte chunks XOR-swizzled within each 128-byte line (no padding: it would cost a sixteenth
more shared memory per stage). With ``C`` chunks per row, chunk ``c`` of row ``r``
lives at chunk ``c ^ (reverse3((r // L) % P) >> (3 - log2 P))`` (``L = max(1, 8 // C)`` rows
per line, ``P = min(C, 8)``, ``reverse3`` the 3-bit bit reversal): the 8 rows an ldmatrix
phase reads (8 consecutive rows, one logical chunk) and the chunks a quarter-warp of cp.async
writes (a few consecutive rows, a run of chunks each) land in the 8 distinct 16-byte bank
groups of a line, so both are conflict free (the simulator's profiler counts 0 bank conflicts;
``docs/tensor_cores.md`` says why). The main loop is written out once per stage, so stage
offsets are constants in every ldmatrix and cp.async address.

Epilogue: ``x = acc (+ bias[col])``, ``x = activation(x)`` (a ``float32 -> float32`` device
function), rounded to float16 once and stored two columns at a time (``store_f16x2``), masked
at the edges. ``K = 0`` gives ``activation(0 + bias)``, NumPy's ``act(a @ b + bias)`` for an
empty inner dimension.

Edges: any M, N, K. Rows and k-columns outside A and B are zero-filled (``cp.async`` with 0
source bytes) and C is stored only inside its bounds. The ``cp.async`` path needs 16-byte
aligned rows (:func:`aligned_rows`: K and N multiples of 8, 16-byte aligned bases and batch
strides); ``async_copy=False`` makes the fallback for any layout: synchronous, guarded loads of
single elements (any alignment, any K and N), one 16-byte shared store per chunk, scalar C
stores. Use the fallback with 8 warps and 2 stages (``matmul_tc_sync``, no spills): with 4
warps its 128 accumulators per thread and the guarded loads in flight spill (~90 B).

The same builder makes the float32 TF32 kernel of :mod:`tessera_tile.kernels.matmul.tf32`
(``TensorCoreConfig(..., tf32=True)``): float32 tiles (4 per 16-byte chunk), ``mma.m16n8k8``
k steps of 8 run with the operands swapped (``C^T = B^T A^T``: B by two ``LDS.64`` per 16
columns as the mma's A, A by ``ldmatrix`` as its B) from a B tile swizzled for them, float32
pair stores (``store_f32x2``); that module's doc says why.

Shared with that kernel: :class:`TensorCoreConfig`, the copy split (:mod:`.tc_tiles`, also
used by :mod:`.attention`) and, re-exported here, :mod:`.matmul_tc_plan`'s plan and checks.
"""

from __future__ import annotations

import functools

from numba import boolean, cuda, float32, int32, uint16, uint32
from numba.types import float16

from ...mma import (
    mma_m16n8k16,
    mma_m16n8k16_bf16,
    store_bf16x2,
    store_f16x2,
    store_f32x2,
)
from ...pipeline import (
    SHARED_ALIGN,
    cp_async_commit_group,
    cp_async_wait_group,
)
from .._named import NamedKernels
from ..epilogue import ElementEpilogue, identity
from ..tc_tiles import INLINE, WARP_SIZE, TensorCoreConfig, entry_point
from . import tc_tf32
from .prologue import chunk_pass, name_of, on_load
from .tc_epilogue import tensor_core_epilogue
from .tc_plan import Plan, aligned_rows, check_operands, plan
from .tc_staging import b_fragments_step, stage_functions, staging, sync_chunk

__all__ = [
    "ANCHOR",
    "Plan",
    "TensorCoreConfig",
    "aligned_rows",
    "build_kernel",
    "check_operands",
    "plan",
    "tensor_core_matmul",
]

ZERO = float32(0.0)
ANCHOR = TensorCoreConfig()  # 128 x 128 x 32, 4 warps of 64 x 64, 3 stages


def tensor_core_matmul(
    tile_m: int = 128,
    tile_n: int = 128,
    tile_k: int = 32,
    num_warps: int = 4,
    num_stages: int = 3,
    activation=None,
    has_bias: bool = False,
    *,
    async_copy: bool = True,
    bf16: bool = False,
    dual: bool = False,
    prologue: tuple = (None, None),
    trans_a: bool = False,
    trans_b: bool = False,
):
    """The ``cuda.jit`` kernel ``kernel(a, b, bias, c)``: ``c = activation(a @ b + bias)`` in
    float16 (or, with ``bf16``, bfloat16, every array its ``uint16`` bits) with float32
    accumulation on the tensor cores (memoised per configuration); with an
    :class:`~.epilogue.ElementEpilogue` as ``activation``, ``kernel(a, b, bias, c, extras)``.

    ``async_copy=True`` (default): ``cp.async`` pipeline of ``num_stages`` stages, which needs
    :func:`aligned_rows`; ``False``: synchronous guarded loads, any layout. See the module doc
    for the launch and the layouts; :func:`plan` gives grid, block and global bytes.

    ``dual=True`` (with an ElementEpilogue): two products of A in one kernel, ``a @ b`` and
    ``a @ b2``, ``b2`` the first of ``extras`` (B's shape and layout): every A fragment
    feeds both, and the epilogue's function takes both accumulators,
    ``fn(x, x2, z, row, col, extras)``.

    ``prologue``: an :class:`~.prologue.ElementPrologue` (or None) for A and for B, applied to
    each element as its tile is staged (:mod:`.prologue`).

    ``trans_a``/``trans_b``: the operand is passed transposed, A as ``(batch, K, M)`` and B as
    ``(batch, N, K)``, each with a contiguous last axis (the transpose of a row-major array,
    read in place: :mod:`.tc_staging`).
    """
    cfg = TensorCoreConfig(
        tile_m, tile_n, tile_k, num_warps, num_stages, bool(has_bias), bool(async_copy),
        bf16=bool(bf16), dual=bool(dual), trans_a=bool(trans_a), trans_b=bool(trans_b),
    )  # fmt: skip
    cfg.validate(activation)
    return build_kernel(cfg, activation, prologue=tuple(prologue))


@functools.cache
def build_kernel(
    cfg: TensorCoreConfig, activation, module: str = __name__, prologue: tuple = (None, None)
):
    """The kernel of ``cfg``, float16 or TF32 (check it first: :meth:`TensorCoreConfig.validate`);
    ``module`` names the module that ships it (its ``__module__``); ``prologue`` the A and B
    :class:`~.prologue.ElementPrologue` (or None each)."""
    tile_m, tile_n, tile_k = cfg.tile_m, cfg.tile_n, cfg.tile_k
    stages, threads = cfg.num_stages, cfg.threads
    warps_n = cfg.warps_n
    wm_tile, wn_tile = tile_m // cfg.warps_m, tile_n // warps_n
    mt, nt = wm_tile // 16, wn_tile // 8  # mma tiles per warp
    nt2 = nt // 2  # 16-column blocks of B per k16 step: the fragments of two n8 tiles each
    ksteps = tile_k // cfg.mma_k
    tf32 = cfg.tf32
    CHUNK = cfg.chunk  # noqa: N806 - tc_tiles.CHUNK's name, this element size's value
    elem = float32 if tf32 else (uint16 if cfg.bf16 else float16)
    ahead = stages - 1
    lag = stages - 2
    has_bias, async_copy = cfg.has_bias, cfg.async_copy
    extras = isinstance(activation, ElementEpilogue)  # kernel(a, b, bias, c, extras)
    act = identity if activation is None else activation.fn if extras else activation
    stores = not extras or activation.stores
    dual = cfg.dual
    # Flat shared rings of each operand's tile (module .tc_staging: k along the columns or
    # the rows, as the operand lies in memory), one stage after another.
    st_a = staging(cfg.trans_a, tile_m, tile_k, threads, CHUNK)
    st_b = staging(not cfg.trans_b, tile_n, tile_k, threads, CHUNK)
    a_stage, b_stage = tile_m * tile_k, tile_k * tile_n
    a_ring, b_ring = stages * a_stage, stages * b_stage
    acc2_shape = (mt, nt, 4) if dual else (1, 1, 1)  # the second product's accumulators
    passes_a, per_a, passes_b, per_b = st_a.copies.passes, st_a.per, st_b.copies.passes, st_b.per
    q_a, q_b = st_a.copies.per_row, st_b.copies.per_row
    n_off_a = mt if cfg.trans_a else ksteps
    guards_a, guards_b, trans_a = st_a.guards, st_b.guards, cfg.trans_a
    n_off_b = ksteps if cfg.trans_b else nt2

    # operand prologues (module .prologue): on the way into the tile where the staging is
    # synchronous, else a pass over each landed tile
    fn_a, fn_b = (p.fn if p else None for p in prologue)
    pass_a, pass_b = (chunk_pass(fn if async_copy else None, CHUNK) for fn in (fn_a, fn_b))
    pro_a, pro_b = (async_copy and fn is not None for fn in (fn_a, fn_b))

    swizzle_a, swizzle_b = tc_tf32.swizzles(cfg) if tf32 else (None, None)
    chunk_a, targets_a, load_a, transform_a, offsets_a, block_a = stage_functions(
        st_a, False, tile_k, n_off_a, async_copy, sync_chunk(elem, CHUNK, on_load(fn_a)), pass_a,
        swizzle_a,
    )  # fmt: skip
    chunk_b, targets_b, load_b, transform_b, offsets_b, block_b = stage_functions(
        st_b, True, tile_k, n_off_b, async_copy, sync_chunk(elem, CHUNK, on_load(fn_b)), pass_b,
        swizzle_b,
    )  # fmt: skip
    # TF32: the swapped mma's fragment reads, offsets and types (module .tc_tf32)
    frags = tc_tf32.fragments(cfg, mt, nt, chunk_a, chunk_b, block_a, block_b)
    offsets_tf32 = frags.offsets
    frag_a, frag_b = uint32, uint32
    if tf32:
        n_off_a, n_off_b, frag_a, frag_b = frags[:2] + frags[5:]
        block_a = frags.a_block

    store = store_bf16x2 if cfg.bf16 else store_f32x2 if tf32 else store_f16x2
    epilogue = tensor_core_epilogue(
        mt, nt, has_bias, async_copy, act, store, bf16=cfg.bf16, swapped=tf32, extras=extras,
        stores=stores, dual=dual,
    )  # fmt: skip

    @cuda.jit(device=True, **INLINE)
    def load_tile(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, stage, a_dst, a_ok, b_dst, b_ok,
                  a_r, a_c, b_r, b_c):  # fmt: skip
        """This thread's chunks of k-tile ``kt`` of the A and B (and B2) panels into
        ``stage``."""
        k0 = kt * tile_k
        load_a(sa, stage * a_stage, a, bz, m0, k0, k, a_dst, a_ok, a_r, a_c)
        load_b(sb, stage * b_stage, b, bz, n0, k0, k, b_dst, b_ok, b_r, b_c)
        if dual:  # B2 has B's shape and layout: the same chunks
            load_b(sb2, stage * b_stage, b2, bz, n0, k0, k, b_dst, b_ok, b_r, b_c)

    @cuda.jit(device=True)
    def commit():
        if async_copy:
            cp_async_commit_group()

    @cuda.jit(device=True)
    def wait_tile():
        if async_copy:
            cp_async_wait_group(lag)
        cuda.syncthreads()

    @cuda.jit(device=True, **INLINE)
    def transform(sa, sb, k, kt, s, a_dst, b_dst, a_r, a_c, b_r, b_c):
        """The prologue on this thread's chunks of k-tile ``kt`` (landed in stage ``s``), the
        ones it copied (:mod:`.prologue`: chunks past K stay 0), then a barrier."""
        if pro_a:
            transform_a(sa, s * a_stage, k, kt * tile_k, a_dst, a_r, a_c)
        if pro_b:
            transform_b(sb, s * b_stage, k, kt * tile_k, b_dst, b_r, b_c)
        cuda.syncthreads()

    mma = mma_m16n8k16_bf16 if cfg.bf16 else mma_m16n8k16

    @cuda.jit(device=True, **INLINE)
    def multiply(fa, fb, acc):
        """The warp tile's mt x nt mma of one k-step on its A and B fragments."""
        for i in range(mt):
            for j in range(nt):
                d = mma(
                    (fa[i, 0], fa[i, 1], fa[i, 2], fa[i, 3]),
                    (fb[j, 0], fb[j, 1]),
                    (acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3]),
                )
                for q in range(4):
                    acc[i, j, q] = d[q]

    # B fragments of one k16 step (16-column blocks: two n8 tiles each), then mt x nt mma
    b_step = frags.b_step if tf32 else b_fragments_step(block_b, nt2, multiply)

    @cuda.jit(device=True, **INLINE)
    def k_step(sa, sb, sb2, a_base, b_base, ks, fa, fb, acc, acc2, a_off, b_off):
        """One k step of the warp tile: A fragments (TF32: per 16 rows, two 8 x 8 B fragments
        of the swapped mma), then B's fragments and their mma (dual: B2's too, on the same A
        fragments)."""
        for i in range(mt):
            f = block_a(sa, a_base, a_off, ks, i)
            for q in range(4):
                fa[i, q] = f[q]
        b_step(sb, b_base, ks, fa, fb, acc, b_off)
        if dual:
            b_step(sb2, b_base, ks, fa, fb, acc2, b_off)

    @cuda.jit(device=True, **INLINE)
    def tile_step(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, tiles, s, fa, fb, acc, acc2, a_off,
                  b_off, a_dst, a_ok, b_dst, b_ok, a_r, a_c, b_r, b_c):  # fmt: skip
        """k-tile ``kt`` (in stage ``s``, a constant): wait for it, refill the stage tile
        ``kt - 1`` used with tile ``kt + stages - 1``, multiply tile ``kt``."""
        wait_tile()  # tile kt landed; every warp is done with kt - 1
        if int32(kt + ahead) < tiles:
            load_tile(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt + ahead, (s + ahead) % stages,
                      a_dst, a_ok, b_dst, b_ok, a_r, a_c, b_r, b_c)  # fmt: skip
        commit()
        if pro_a or pro_b:
            transform(sa, sb, k, kt, s, a_dst, b_dst, a_r, a_c, b_r, b_c)
        # The k steps written out (LLVM does not unroll a loop this large) and inlined, so
        # the fragments and accumulators stay constant-indexed registers.
        a_base = s * a_stage
        b_base = s * b_stage
        k_step(sa, sb, sb2, a_base, b_base, 0, fa, fb, acc, acc2, a_off, b_off)
        if ksteps > 1:
            k_step(sa, sb, sb2, a_base, b_base, 1, fa, fb, acc, acc2, a_off, b_off)
        if ksteps > 2:
            k_step(sa, sb, sb2, a_base, b_base, 2, fa, fb, acc, acc2, a_off, b_off)
        if ksteps > 3:
            k_step(sa, sb, sb2, a_base, b_base, 3, fa, fb, acc, acc2, a_off, b_off)

    @cuda.jit(device=True, **INLINE)
    def body(a, b, bias, c, extra_args, b2):
        # Dynamic shared memory (the launch gives both rings: Plan.shared), so
        # that tiles may pass the 48 KiB static arrays are held to.
        smem = cuda.shared.array(0, elem, alignment=SHARED_ALIGN)
        sa = smem[:a_ring]
        sb = smem[a_ring : a_ring + b_ring]
        sb2 = smem[a_ring + b_ring :] if dual else sb
        # Local arrays indexed only by constants (loops over constants, unrolled): registers.
        acc = cuda.local.array((mt, nt, 4), float32)
        acc2 = cuda.local.array(acc2_shape, float32)
        fa = cuda.local.array((mt, 4), frag_a)
        fb = cuda.local.array((nt, 2), frag_b)
        a_off = cuda.local.array(n_off_a, int32)
        b_off = cuda.local.array(n_off_b, int32)
        a_dst = cuda.local.array((passes_a, per_a), int32)
        b_dst = cuda.local.array((passes_b, per_b), int32)
        a_ok = cuda.local.array(guards_a, boolean)
        b_ok = cuda.local.array(guards_b, boolean)
        tid = cuda.threadIdx.x
        lane = tid % WARP_SIZE
        warp = tid // WARP_SIZE
        wm0 = (warp // warps_n) * wm_tile
        wn0 = (warp % warps_n) * wn_tile
        bz = cuda.blockIdx.z
        m0 = cuda.blockIdx.y * tile_m
        n0 = cuda.blockIdx.x * tile_n
        m = c.shape[1]
        k = a.shape[1] if trans_a else a.shape[2]  # A read as (K, M) or (M, K)
        tiles = int32((k + tile_k - 1) // tile_k)  # 32-bit loop control
        for i in range(mt):
            for j in range(nt):
                for q in range(4):
                    acc[i, j, q] = ZERO
        for i in range(acc2_shape[0]):
            for j in range(acc2_shape[1]):
                for q in range(acc2_shape[2]):
                    acc2[i, j, q] = ZERO

        # This thread's copy targets (swizzled offsets inside a stage) and bounds guards, and
        # this lane's ldmatrix offsets.
        a_r = tid // q_a
        a_c = tid % q_a
        b_r = tid // q_b
        b_c = tid % q_b
        targets_a(tid, m0, m, a_dst, a_ok)
        targets_b(tid, n0, c.shape[2], b_dst, b_ok)
        if tf32:
            offsets_tf32(lane, wm0, wn0, a_off, b_off)
        else:
            offsets_a(lane, wm0, a_off)
            offsets_b(lane, wn0, b_off)

        for kt in range(ahead):  # prologue: tiles 0 .. stages-2 in flight, a group each
            if kt < tiles:
                load_tile(
                    sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, kt, a_dst, a_ok, b_dst, b_ok, a_r,
                    a_c, b_r, b_c,
                )  # fmt: skip
            commit()

        # Steady state, unrolled over the stages so that every stage offset is a constant
        # (ldmatrix and cp.async addresses become register + immediate).
        kt = int32(0)
        while kt < tiles:  # a run-time bound: `while`, not range()
            tile_step(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, tiles, 0, fa, fb, acc, acc2,
                      a_off, b_off, a_dst, a_ok, b_dst, b_ok, a_r, a_c, b_r, b_c)  # fmt: skip
            kt = int32(kt + 1)
            if kt < tiles:
                tile_step(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, tiles, 1, fa, fb, acc, acc2,
                          a_off, b_off, a_dst, a_ok, b_dst, b_ok, a_r, a_c, b_r, b_c)  # fmt: skip
                kt = int32(kt + 1)
                if stages > 2 and kt < tiles:
                    tile_step(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, tiles, 2, fa, fb, acc,
                              acc2, a_off, b_off, a_dst, a_ok, b_dst, b_ok, a_r, a_c, b_r,
                              b_c)  # fmt: skip
                    kt = int32(kt + 1)
                    if stages > 3 and kt < tiles:
                        tile_step(sa, sb, sb2, a, b, b2, bz, m0, n0, k, kt, tiles, 3, fa, fb,
                                  acc, acc2, a_off, b_off, a_dst, a_ok, b_dst, b_ok, a_r, a_c,
                                  b_r, b_c)  # fmt: skip
                        kt = int32(kt + 1)

        # Epilogue: lane (g, t) holds rows g, g + 8 and columns 2t, 2t + 1 of each 16 x 8 tile
        # (TF32, swapped: rows 2t, 2t + 1 and columns 2g, 2g + 1).
        col_base = n0 + wn0 + 2 * ((lane >> 2) if tf32 else (lane & 3))
        row_base = m0 + wm0 + (2 * (lane & 3) if tf32 else (lane >> 2))
        epilogue(acc, acc2, c, bias, bz, row_base, col_base, m, c.shape[2], extra_args)

    kernel = entry_point(body, extras, dual)

    kernel.__module__ = module
    kernel.__name__ = kernel.__qualname__ = (
        f"matmul_{'tf32' if tf32 else 'bf16' if cfg.bf16 else 'tc'}_{tile_m}x{tile_n}x{tile_k}"
        f"_w{cfg.num_warps}_s{stages}"
        f"{'_bias' if has_bias else ''}{'' if async_copy else '_sync'}"
        f"{'_dual' if dual else ''}{'_' + activation.name if extras else ''}"
        f"{'_at' if cfg.trans_a else ''}{'_bt' if cfg.trans_b else ''}"
        f"{name_of(prologue)}"
    )
    return cuda.jit(kernel)


# The configurations the compile tier builds (one compile case each), built on first use.
NAMED = NamedKernels(
    __name__,
    {
        "matmul_tc_anchor": lambda: tensor_core_matmul(),  # 128 x 128 x 32, 4 warps, 3 stages
        "matmul_tc_8warps": lambda: tensor_core_matmul(128, 128, 32, 8, 3),
        # Synchronous loads gain nothing from a third stage; with 4 warps this variant spills.
        "matmul_tc_sync": lambda: tensor_core_matmul(128, 128, 32, 8, 2, async_copy=False),
        "matmul_tc_small_bias": lambda: tensor_core_matmul(32, 32, 16, 1, 2, has_bias=True),
        "matmul_bf16_anchor": lambda: tensor_core_matmul(bf16=True),  # the anchor's tile
        # The larger tiles of tile_config.TENSOR_CORE_CANDIDATES (dynamic shared memory past
        # 48 KiB): CUTLASS's Ampere tile, the model's choice at 4096^3 on sm_80 and sm_90
        # (144 KiB), and the 72 KiB one where that does not fit (sm_86, sm_89); both 8 warps
        # of 64 x 64.
        "matmul_tc_256x128x64": lambda: tensor_core_matmul(256, 128, 64, 8, 3),
        "matmul_tc_128x256": lambda: tensor_core_matmul(128, 256, 32, 8, 3),
        # the backward GEMMs' operands, read transposed: x.T of dw = x.T @ dy, w.T of dy @ w.T
        "matmul_tc_at": lambda: tensor_core_matmul(trans_a=True),
        "matmul_tc_bt": lambda: tensor_core_matmul(trans_b=True),
    },
)
__getattr__ = NAMED.module_getattr
