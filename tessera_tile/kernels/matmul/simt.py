"""float32 SIMT matmul kernels with a fused epilogue: ``C = activation(A @ B + bias)``.

:func:`simt_matmul` makes one kernel per (config, copy widths, activation, bias, store kind)
and memoises it. Every kernel has the signature the float16 tensor-core factory shares::

    kernel(a, b, bias, c)    a: (batch, M, K)   b: (batch, K, N)   bias: (N,) or a 1-element
                             dummy   c: (batch, M, N)
    grid  = (tiles over N, tiles over M, batch)      block = config.threads

Batch strides are arbitrary (0 for a broadcast operand: nothing is copied). A block computes a
``tile_m x tile_n`` tile of C; each thread a ``thread_m x thread_n`` register tile (8 x 8 in
the default configs). The K axis streams through two :func:`tessera_tile.pipeline.ring_buffer`
rings of ``num_stages`` stages::

    prologue      tiles 0 .. stages-2 of A and B in flight (cp.async, one group per tile)
    main loop     wait for tile k; issue tile k + stages - 1; multiply tile k from shared memory
    epilogue      acc += bias[col]; acc = activation(acc); one store of each C element

Main loop, per 4 k values: ``thread_m`` ``LDS.128`` of A (a row of the A tile, 4 consecutive
k) and ``thread_n`` ``LDS.128`` of B (4 rows of the B tile, ``thread_n / 4`` vectors each) feed
``4 * thread_m * thread_n`` FFMA: 16 FFMA per shared load at 8 x 8 (the expert hand-written
CUDA C++ SIMT GEMM's ratio; Triton's exact-fp32 GEMM has 12.8). Both reads are conflict free
without padding: a quarter-warp (8 lanes) lies within one row of the thread grid, so its A
reads are one broadcast vector and its B reads consecutive vectors.

Staging: 16-byte ``cp.async.cg`` copies (``copy_bytes=16``) when an operand's rows and batches
are 16-byte aligned with a contiguous inner axis, else 4-byte ``cp.async`` of single elements
(``copy_bytes=4``), which take any strides, so a non-contiguous device input is read in place.
Elements outside A and B are zero-filled (partial tiles multiply zeros): any M, N, K, K = 0
included (the epilogue then sees zeros: ``linear`` gives ``activation(bias)``). float16 inputs
(a float32 TileConfig, or a strided inner axis) take synchronous staging (``async_copy=False``) that
widens each element to float32 on its way into shared memory; the accumulator is float32 and C
is rounded to float16 once, at the store.

The epilogue is any device function ``f(float32) -> float32`` (:mod:`.epilogue`): the bias row
of the block's tile is staged into shared memory once per block (read from global memory once
per block) and added in registers before the activation, then each C element is stored once,
16 bytes at a time where C's rows allow it (``vector_store``).
"""

from __future__ import annotations

import functools
import operator

from numba import cuda, float32, int32, uint32

from ..._runtime import config as _config
from ...dynamic_shared import STATIC_LIMIT
from ...memory import aligned16, carve, load16_shared, store16, store16_shared
from ...pipeline import SHARED_ALIGN, ring_buffer
from ...tile_config import CANDIDATES, TileConfig
from .._named import NamedKernels
from ..epilogue import ACTIVATIONS, ElementEpilogue, identity
from ..tc_tiles import INLINE, entry_point
from .prologue import name_of

__all__ = ["KV", "activation_name", "simt_matmul"]

KV = 4  # k values per LDS.128 of A
ZERO = float32(0.0)


def activation_name(fn) -> str:
    """A short name of an epilogue device function (for kernel names)."""
    if isinstance(fn, ElementEpilogue):
        return fn.name
    if fn is identity:
        return "none"
    for name, known in ACTIVATIONS.items():
        if fn is known:
            return name
    return getattr(getattr(fn, "py_func", fn), "__name__", "custom")


if _config.SIMULATED:

    @cuda.jit(device=True)
    def read16_shared(tile, stage, row, col):
        # The twin of the one 16-byte shared access the compiled code makes (below): the
        # profiler records it as such (alignment checked, bank conflicts of LDS.128).
        return load16_shared(tile, (stage, row, col))

    @cuda.jit(device=True)
    def write16_shared(tile, stage, row, col, v):
        store16_shared(tile, (stage, row, col), v)

else:

    @cuda.jit(device=True)
    def read16_shared(tile, stage, row, col):
        # Four plain reads at unsigned indices: without Numba's negative-index wraparound LLVM
        # sees the 16-byte alignment and merges them into one LDS.128 with a 32-bit shared
        # address (load16_shared's inline PTX takes a 64-bit generic pointer: two more integer
        # instructions per load, and 164 instead of 128 registers on sm_90). The compile tier
        # checks the merge (32 LDS.128 per k-tile).
        return (
            tile[stage, row, col],
            tile[stage, row, col + uint32(1)],
            tile[stage, row, col + uint32(2)],
            tile[stage, row, col + uint32(3)],
        )

    @cuda.jit(device=True)
    def write16_shared(tile, stage, row, col, v):
        # As read16_shared: four plain stores that LLVM merges into one STS.128.
        tile[stage, row, col] = v[0]
        tile[stage, row, col + uint32(1)] = v[1]
        tile[stage, row, col + uint32(2)] = v[2]
        tile[stage, row, col + uint32(3)] = v[3]


def _prologue_pass(fn, rows: int, cols: int, threads: int, k_axis: int):
    """``apply(ring, stage, k0, k, tid)``: an operand prologue's ``fn`` (module .prologue) on
    every element of ``ring[stage]`` (a float32 ``rows x cols`` tile whose k index along
    ``k_axis`` starts at ``k0``), the elements at k index ``k`` or more left as they are.
    Thread ``tid`` of ``threads`` takes the 16-byte vectors ``tid, tid + threads, ...``
    (consecutive threads, consecutive vectors: conflict free), one LDS.128 and STS.128 each.
    ``fn=None``: a function that does nothing."""
    if fn is None:

        @cuda.jit(device=True)
        def skip(ring, stage, k0, k, tid):
            pass

        return skip
    per_row = cols // 4
    size = rows * per_row
    per_thread = -(-size // threads)
    exact = size % threads == 0

    @cuda.jit(device=True)
    def one(v, kk, k):
        return float32(fn(v)) if kk < k else v

    @cuda.jit(device=True)
    def apply(ring, stage, k0, k, tid):
        left = int32(min(k - k0, rows if k_axis == 0 else cols))  # k indices inside K
        for j in range(per_thread):
            e = uint32(tid + j * threads)
            if exact or e < size:
                r = e // uint32(per_row)
                c = (e - r * uint32(per_row)) * uint32(4)
                v = read16_shared(ring, stage, r, c)
                kk = int32(c) if k_axis == 1 else int32(r)
                step = 1 if k_axis == 1 else 0  # k along the row: each element its own guard
                v = (one(v[0], kk, left), one(v[1], kk + step, left),
                     one(v[2], kk + 2 * step, left), one(v[3], kk + 3 * step, left))  # fmt: skip
                write16_shared(ring, stage, r, c, v)

    return apply


def _unrolled_epilogue(
    fn, tm: int, tn: int, threads_m: int, span_n: int, has_bias: bool, dual: bool
):
    """``finish(acc, acc2, bv, z, m0, n0, ty, tx, extra_args)``: an ElementEpilogue's ``fn`` on
    every accumulator (plus the bias; ``dual``: and the second product's), written out
    statement by statement (generated source, inlined): as a loop around a large ``fn``, LLVM
    keeps it rolled and the accumulators go through local memory."""
    lines = ["def finish(acc, acc2, bv, z, m0, n0, ty, tx, extra_args):"]
    for i in range(tm):
        for j in range(tn):
            x = f"acc[{i}, {j}]" + (f" + bv[{j}]" if has_bias else "")
            x += f", acc2[{i}, {j}]" if dual else ""
            row, col = f"m0 + ty + {i * threads_m}", f"n0 + tx * 4 + {(j // 4) * span_n + j % 4}"
            lines.append(f"    acc[{i}, {j}] = fn({x}, z, {row}, {col}, extra_args)")
    namespace = {"fn": fn}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own generated code
    return cuda.jit(device=True, **INLINE)(namespace["finish"])


def _shared_arrays(config: TileConfig, has_bias: bool, dual: bool) -> list[tuple]:
    """The kernel's shared arrays, in order: the A ring, the B ring, B2's (one element without
    a second product), the bias row (one element without a bias); float32 elements each."""
    stages, tile_m, tile_n, tile_k = (
        config.num_stages, config.tile_m, config.tile_n, config.tile_k
    )  # fmt: skip
    b_shape = (stages, tile_k, tile_n)
    return [
        (stages, tile_m, tile_k),
        b_shape,
        b_shape if dual else (1, 1, 1),
        (tile_n if has_bias else 1,),
    ]


def _aligned_sizes(config: TileConfig, has_bias: bool, dual: bool) -> list[int]:
    """Elements of each shared array, rounded up to 16-byte multiples (each starts aligned).
    Not ``math.prod``: while this module's kernel runs in the simulator, its ``math`` is CUDA's,
    which refuses ``prod``, and a call on another host thread would see it."""
    per = SHARED_ALIGN // 4
    sizes = [functools.reduce(operator.mul, s, 1) for s in _shared_arrays(config, has_bias, dual)]
    return [-(-n // per) * per for n in sizes]


def dynamic_bytes(config: TileConfig, has_bias: bool = False, dual: bool = False) -> int:
    """Bytes of dynamic shared memory the kernel launches with: 0 where its arrays fit the 48
    KiB of static shared memory (static arrays, as always), else all of them, carved from
    dynamic shared memory, which the launch opts in to past 48 KiB (as the tensor-core
    kernels')."""
    total = 4 * sum(_aligned_sizes(config, has_bias, dual))
    return total if total > STATIC_LIMIT else 0


def _shared_allocator(config: TileConfig, has_bias: bool, dual: bool):
    """The device function giving the kernel's shared arrays (:func:`_shared_arrays`): static
    arrays, or views carved from dynamic shared memory (:func:`dynamic_bytes`)."""
    a_shape, b_shape, b2_shape, bias_shape = _shared_arrays(config, has_bias, dual)
    if not dynamic_bytes(config, has_bias, dual):

        @cuda.jit(device=True, **INLINE)
        def static_arrays():
            sa = cuda.shared.array(a_shape, float32, alignment=SHARED_ALIGN)
            sb = cuda.shared.array(b_shape, float32, alignment=SHARED_ALIGN)
            sb2 = cuda.shared.array(b2_shape, float32, alignment=SHARED_ALIGN)
            sbias = cuda.shared.array(bias_shape, float32, alignment=SHARED_ALIGN)
            return sa, sb, sb2, sbias

        return static_arrays
    sizes = _aligned_sizes(config, has_bias, dual)
    at_b, at_b2, at_bias = sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2]

    @cuda.jit(device=True, **INLINE)
    def carved_arrays():
        smem = cuda.shared.array(0, float32, alignment=SHARED_ALIGN)
        sa = carve(smem, 0, a_shape)
        sb = carve(smem, at_b, b_shape)
        sb2 = carve(smem, at_b2, b2_shape)
        sbias = carve(smem, at_bias, bias_shape)
        return sa, sb, sb2, sbias

    return carved_arrays


@functools.cache
def simt_matmul(
    config: TileConfig,
    activation=identity,
    has_bias: bool = False,
    copy_a: int = 16,
    copy_b: int = 16,
    async_copy: bool = True,
    vector_store: bool = True,
    dual: bool = False,
    prologue: tuple = (None, None),
):
    """The kernel ``kernel(a, b, bias, c)`` for these choices (memoised; see the module doc);
    with an :class:`~.epilogue.ElementEpilogue` as ``activation``, ``kernel(a, b, bias, c,
    extras)``; ``dual``: also ``a @ b2``, ``b2`` the first of ``extras`` (B's layout), staged in
    a second ring and fed by the same A values (the epilogue's ``fn(x, x2, z, row, col,
    extras)``).

    ``copy_a`` / ``copy_b``: bytes per ``cp.async`` of each operand (16 needs 16-byte aligned
    rows and batches and a contiguous inner axis; 4 takes any strides). ``async_copy=False``
    stages synchronously, converting to float32 (float16 inputs). ``vector_store``: C's rows
    have a contiguous inner axis and are float32 (16-byte stores where aligned).
    ``prologue``: an :class:`~.prologue.ElementPrologue` (or None) for A and for B, applied to
    each element as its tile is staged (:mod:`.prologue`; with ``async_copy=False`` the arrays
    may have another dtype: a cast on the way in).
    """
    if config.dtype != "float32":
        raise ValueError(f"the SIMT kernel stages float32 tiles; config has {config.dtype}")
    tile_m, tile_n, tile_k = config.tile_m, config.tile_n, config.tile_k
    tm, tn = config.register_tile
    threads = config.threads
    threads_m = tile_m // tm  # a thread owns rows ty + threads_m * i of the C tile
    threads_n = tile_n // tn
    span_n = threads_n * 4  # ... and columns h * span_n + 4 * tx + (0..3)
    stages = config.num_stages
    # operand prologues (module .prologue): on the way into the tile where the staging is
    # synchronous, else a pass over each landed tile
    fn_a, fn_b = (p.fn if p else None for p in prologue)
    sync_a, sync_b = (None if async_copy else fn for fn in (fn_a, fn_b))
    ring_a = ring_buffer(
        stages, (tile_m, tile_k), float32, k_axis=1,
        async_copy=async_copy, copy_bytes=copy_a if async_copy else 4, on_load=sync_a,
    )  # fmt: skip
    ring_b = ring_buffer(
        stages, (tile_k, tile_n), float32, k_axis=0,
        async_copy=async_copy, copy_bytes=copy_b if async_copy else 4, on_load=sync_b,
    )  # fmt: skip
    a_shape, b_shape, b2_shape, (bias_len,) = _shared_arrays(config, has_bias, dual)
    allocate = _shared_allocator(config, has_bias, dual)
    ahead = stages - 1
    extras = isinstance(activation, ElementEpilogue)  # kernel(a, b, bias, c, extras)
    if dual and not extras:
        raise ValueError("a dual product needs an ElementEpilogue (b2 is its first extra)")
    pass_a = _prologue_pass(fn_a if async_copy else None, tile_m, tile_k, threads, 1)
    pass_b = _prologue_pass(fn_b if async_copy else None, tile_k, tile_n, threads, 0)
    passes = async_copy and (fn_a is not None or fn_b is not None)
    acc2_shape = (tm, tn) if dual else (1, 1)
    # rows of C this thread stores: none where the epilogue writes every result itself
    stored_rows = tm if not extras or activation.stores else 0
    if extras:
        finish = _unrolled_epilogue(activation.fn, tm, tn, threads_m, span_n, has_bias, dual)
    else:
        act = activation

        @cuda.jit(device=True, **INLINE)
        def finish(acc, acc2, bv, z, m0, n0, ty, tx, extra_args):
            for i in range(tm):
                for j in range(tn):
                    x = acc[i, j]
                    if has_bias:
                        x += bv[j]
                    acc[i, j] = act(x)

    @cuda.jit(device=True)
    def store_row(c, row, col, n, acc, i, j0):
        # Four consecutive C elements of register-tile row i: 16 bytes at once where allowed.
        if vector_store and col + 4 <= n and aligned16(c, (row, col)):
            store16(c, (row, col), (acc[i, j0], acc[i, j0 + 1], acc[i, j0 + 2], acc[i, j0 + 3]))
        else:
            for j in range(4):
                if col + j < n:
                    c[row, col + j] = acc[i, j0 + j]

    @cuda.jit(device=True, **INLINE)
    def b_row(sb, s, k, bcol, av, q, bv, acc):
        """B[k, this thread's columns] (consecutive vectors) times column q of av into acc."""
        for h in range(tn // 4):
            v = read16_shared(sb, s, uint32(k), bcol + uint32(h * span_n))
            for j in range(4):
                bv[h * 4 + j] = v[j]
        for i in range(tm):
            for j in range(tn):
                acc[i, j] += av[i, q] * bv[j]

    @cuda.jit(device=True, **INLINE)
    def body(a, b, bias, c, extra_args, b2):
        sa, sb, sb2, sbias = allocate()
        # Local arrays indexed only by constants (loops over constants, which LLVM unrolls)
        # become registers: the compile tier checks there is no local memory.
        acc = cuda.local.array((tm, tn), float32)
        acc2 = cuda.local.array(acc2_shape, float32)
        av = cuda.local.array((tm, KV), float32)
        bv = cuda.local.array(tn, float32)
        z = cuda.blockIdx.z
        cz = c[z]
        m, n = cz.shape
        m0 = cuda.blockIdx.y * tile_m
        n0 = cuda.blockIdx.x * tile_n
        tid = cuda.threadIdx.x
        tx = tid % threads_n
        ty = tid // threads_n
        arow = uint32(ty)  # unsigned indices: see read16_shared
        bcol = uint32(tx) * uint32(4)
        for i in range(tm):
            for j in range(tn):
                acc[i, j] = ZERO
        for i in range(acc2_shape[0]):
            for j in range(acc2_shape[1]):
                acc2[i, j] = ZERO
        if has_bias:  # the block's bias row, once; the first wait_tile or the sync below orders it
            if threads >= tile_n:  # a compile-time choice: one element per thread, no loop
                if tid < tile_n:
                    sbias[tid] = float32(bias[n0 + tid]) if n0 + tid < n else ZERO
            else:
                t = tid
                while t < tile_n:
                    sbias[t] = float32(bias[n0 + t]) if n0 + t < n else ZERO
                    t += threads
        a_panel = a[z, m0 : m0 + tile_m, :]  # the rows of A this block needs
        b_panel = b[z, :, n0 : n0 + tile_n]  # the columns of B this block needs
        b2_panel = b2[z, :, n0 : n0 + tile_n]
        tiles = ring_a.num_tiles(a_panel)

        for k in range(ahead):  # prologue: one cp.async group per tile, A and B together
            ring_a.load_tile(sa, a_panel, k)
            ring_b.load_tile(sb, b_panel, k)
            if dual:
                ring_b.load_tile(sb2, b2_panel, k)
            ring_a.commit()

        kt = 0
        while kt < tiles:  # a run-time bound: `while`, not range()
            # tile kt has landed and every thread is done with kt - 1
            s = uint32(ring_a.wait_tile(kt))
            ring_a.load_tile(sa, a_panel, kt + ahead)  # refill the stage kt - 1 used
            ring_b.load_tile(sb, b_panel, kt + ahead)  # (no copy past the last tile)
            if dual:
                ring_b.load_tile(sb2, b2_panel, kt + ahead)
            ring_a.commit()
            if passes:  # the prologues on tile kt, in place (module .prologue)
                pass_a(sa, s, kt * tile_k, a_panel.shape[1], tid)
                pass_b(sb, s, kt * tile_k, b_panel.shape[0], tid)
                cuda.syncthreads()
            for kk in range(0, tile_k, KV):
                for i in range(tm):  # A[row, kk .. kk+3]: a quarter-warp reads one vector
                    v = read16_shared(sa, s, arow + uint32(i * threads_m), uint32(kk))
                    for q in range(KV):
                        av[i, q] = v[q]
                for q in range(KV):
                    b_row(sb, s, kk + q, bcol, av, q, bv, acc)
                    if dual:  # B2's row kk + q, on the same A values
                        b_row(sb2, s, kk + q, bcol, av, q, bv, acc2)
            kt += 1
        # Copies past the last tile were never issued: nothing to drain.

        if has_bias:
            cuda.syncthreads()  # the bias row is visible even when K = 0 (no wait_tile ran)
            for h in range(tn // 4):
                v = load16_shared(sbias, h * span_n + tx * 4)
                for j in range(4):
                    bv[h * 4 + j] = v[j]
        finish(acc, acc2, bv, z, m0, n0, ty, tx, extra_args)
        for i in range(stored_rows):
            row = m0 + ty + i * threads_m
            if row < m:
                for h in range(tn // 4):
                    store_row(cz, row, n0 + h * span_n + tx * 4, n, acc, i, h * 4)

    kernel = entry_point(body, extras, dual)

    parts = [
        f"matmul_{tile_m}x{tile_n}x{tile_k}_w{config.num_warps}_s{stages}",
        f"c{copy_a}{copy_b}" if async_copy else "sync",
        activation_name(activation),
    ]
    if has_bias:
        parts.append("bias")
    if dual:
        parts.append("dual")
    if not vector_store:
        parts.append("scalar_store")
    if any(prologue):
        parts.append(name_of(prologue)[1:])
    kernel.__module__ = __name__
    kernel.__name__ = kernel.__qualname__ = "_".join(parts)
    return cuda.jit(kernel)  # lazy: an eager signature would ask for a GPU at import time


def signature(dtype: str = "float32", layout: str = "C") -> str:
    """The kernel signature for contiguous (``"C"``) or strided (``"A"``) operands of
    ``dtype`` with a bias of that dtype."""
    abc = f"{dtype}[:, :, ::1]" if layout == "C" else f"{dtype}[:, :, :]"
    return f"void({abc}, {abc}, {dtype}[::1], {abc})"


# The default configs' kernels by name: the compile tier builds each of them
# (tests/compile/cases.py), and the ops get the same objects from the memoised factory.
NAMED = NamedKernels(
    __name__,
    {
        "matmul_f32_default_128x128": lambda: simt_matmul(CANDIDATES[0]),
        "matmul_f32_default_128x64": lambda: simt_matmul(CANDIDATES[1]),
        "matmul_f32_default_64x128": lambda: simt_matmul(CANDIDATES[2]),
        "matmul_f32_default_64x64": lambda: simt_matmul(CANDIDATES[3]),
        "linear_f32_gelu_bias_128x128": (
            lambda: simt_matmul(CANDIDATES[0], ACTIVATIONS["gelu"], True)
        ),
        "matmul_f16_sync_128x128": (
            lambda: simt_matmul(CANDIDATES[0], async_copy=False, vector_store=False)
        ),
        # 72 KiB of rings: carved from dynamic shared memory, the launch opted in past 48 KiB
        "linear_f32_gelu_bias_dynamic_128x64x32": (
            lambda: simt_matmul(TileConfig(128, 64, 32, 4, 3), ACTIVATIONS["gelu"], True)
        ),
    },
)
__getattr__ = NAMED.module_getattr
