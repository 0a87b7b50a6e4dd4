"""Shared tensor-core tile helpers of :mod:`.matmul_tc`, :mod:`.matmul_tf32` and
:mod:`.attention`: the 16-byte chunk and shared-memory limits, the inlining option of their
main loops, how a block's threads split a tile's ``cp.async`` copies (with the swizzle's
parameters, :func:`tile_copies`), and the matmul kernels' configuration
(:class:`TensorCoreConfig`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._runtime import compat
from .._runtime import config as _config
from ..dynamic_shared import MAX_BLOCK_LIMIT as MAX_SHARED
from .epilogue import ElementEpilogue

__all__ = [
    "CHUNK",
    "INLINE",
    "MAX_SHARED",
    "WARP_SIZE",
    "TensorCoreConfig",
    "entry_point",
    "TileCopies",
    "swizzled_copies",
    "tile_copies",
]

WARP_SIZE = 32
CHUNK = 8  # float16 per 16-byte chunk (one cp.async, one ldmatrix row)

# The main loop's pieces are inlined so that fragments and accumulators stay constant-indexed
# registers and stage offsets constants: by NVVM (alwaysinline: each piece is typed once) when
# compiling, by Numba's IR inliner in the simulator (which has no forceinline).
INLINE = {"inline": "always"} if _config.SIMULATED else {"forceinline": True}


class TileCopies(NamedTuple):
    """How a block's threads copy one operand's tile: thread ``t`` takes rows
    ``t // per_row + p * row_step`` (``p < passes``) and, in each, chunks
    ``t % per_row + per_row * i`` (``i < chunks // per_row``): one global row pointer per pass,
    its chunks at constant offsets."""

    rows: int
    chunks: int  # 16-byte chunks per row
    per_row: int  # threads per row
    row_step: int
    passes: int
    exact: bool  # every pass is full
    lines: int  # rows per 128-byte line (swizzle)
    period: int  # XOR period in chunks (swizzle)
    bits: int  # log2(period)


def entry_point(body, extras: bool, dual: bool = False):
    """The kernel function of a matmul ``body(a, b, bias, c, extra_args, b2)`` (a device
    function, inlined): ``kernel(a, b, bias, c, extra_args)`` for an ElementEpilogue's extras
    (``dual``: ``b2`` is their first), else ``kernel(a, b, bias, c)`` passing ``()``; ``b2`` is
    ``b`` where there is none (never read)."""
    if dual:

        def kernel(a, b, bias, c, extra_args):
            body(a, b, bias, c, extra_args, extra_args[0])

    elif extras:

        def kernel(a, b, bias, c, extra_args):
            body(a, b, bias, c, extra_args, b)

    else:

        def kernel(a, b, bias, c):
            body(a, b, bias, c, (), b)

    return kernel


def swizzled_copies(rows: int, cols: int, chunk: int, threads: int) -> TileCopies:
    """:func:`tile_copies` of a ``rows`` x ``cols`` tile of ``chunk`` elements per 16 bytes,
    whose rows the XOR swizzle needs to be a power of two of chunks (else ``ValueError``)."""
    chunks = cols // chunk
    if chunks & (chunks - 1):
        raise ValueError(
            f"a shared tile row of {cols} elements must be {chunk} times a power of two (swizzle)"
        )
    return tile_copies(rows, chunks, threads)


def tile_copies(rows: int, chunks: int, threads: int) -> TileCopies:
    """The copies of a ``rows``-row tile of ``chunks`` 16-byte chunks per row by ``threads``
    threads; ``ValueError`` when the chunks do not split evenly over a row's threads."""
    per_row = max(1, threads // rows)
    if chunks % per_row:
        raise ValueError(
            f"a {rows}-row tile of {chunks} 16-byte chunks per row cannot be split over "
            f"{threads} threads ({per_row} per row); use a wider tile or fewer warps"
        )
    step = threads // per_row
    period = min(chunks, 8)
    return TileCopies(
        rows, chunks, per_row, step, -(-rows // step), rows % step == 0,
        max(1, 8 // chunks), period, period.bit_length() - 1,
    )  # fmt: skip


class TensorCoreConfig(NamedTuple):
    """One kernel configuration (block tile, warps, stages, epilogue, load path, and the
    operands: float16 with ``mma.m16n8k16``, or float32 read as TF32 with ``mma.m16n8k8``,
    :mod:`tessera_tile.kernels.matmul.tf32`)."""

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 32
    num_warps: int = 4
    num_stages: int = 3
    has_bias: bool = False
    async_copy: bool = True
    tf32: bool = False
    bf16: bool = False  # bfloat16 operands (their uint16 bits) with mma .bf16, else float16
    # two products of one A, ``a @ b`` and ``a @ b2`` (b2 the first of the epilogue's extras):
    # each A fragment feeds both, a second B ring and accumulator
    dual: bool = False
    # operands read transposed (module .tc_staging): A as a (K, M) view, B as an (N, K) one
    trans_a: bool = False
    trans_b: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes per element of A, B, C and the shared tiles."""
        return 4 if self.tf32 else 2

    @property
    def chunk(self) -> int:
        """Elements per 16-byte chunk (one cp.async, one ldmatrix row)."""
        return 16 // self.itemsize

    @property
    def mma_k(self) -> int:
        """The k of one mma: 16 (m16n8k16, float16) or 8 (m16n8k8, TF32)."""
        return 8 if self.tf32 else 16

    @property
    def warps_m(self) -> int:
        """Warp rows: the arrangement whose warp tiles are the squarest (each fragment loaded
        feeds the most mma: 256 x 128 with 8 warps is 4 x 2 warps of 64 x 64), ties to 2 rows
        where they split (128 x 128 with 8 warps: 2 x 4 of 64 x 32)."""
        usual = 2 if self.num_warps >= 2 and self.tile_m // 2 >= 16 else 1
        fits = [
            w for w in (1, 2, 4, 8)
            if self.num_warps % w == 0 and self.tile_m % (16 * w) == 0
            and self.tile_n % (16 * (self.num_warps // w)) == 0
        ]  # fmt: skip
        shortest = {w: min(self.tile_m // w, self.tile_n * w // self.num_warps) for w in fits}
        return max(fits, key=lambda w: (shortest[w], w == usual), default=usual)

    @property
    def warps_n(self) -> int:
        return self.num_warps // self.warps_m

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.num_warps

    @property
    def mma_per_k_tile(self) -> int:
        """mma.sync instructions a warp issues per k-tile (its 16 x 8 tiles x k16 steps)."""
        tiles = (self.tile_m // self.warps_m // 16) * (self.tile_n // self.warps_n // 8)
        return tiles * (self.tile_k // self.mma_k)

    @property
    def shared_bytes(self) -> int:
        b_tiles = 2 if self.dual else 1
        ring = self.num_stages * (self.tile_m * self.tile_k + b_tiles * self.tile_k * self.tile_n)
        return self.itemsize * ring

    def validate(self, activation=None) -> None:
        """Raise ``ValueError`` unless this config makes a kernel, ``TypeError`` unless
        ``activation`` is ``None`` or a CUDA device function."""
        for name in ("tile_m", "tile_n", "tile_k", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")
        if self.num_stages not in (2, 3, 4):
            raise ValueError(f"num_stages must be 2, 3 or 4, got {self.num_stages}")
        k_tiles = (8, 16, 32) if self.tf32 else (16, 32, 64)  # 2 to 8 chunks of 16 bytes per row
        if self.tile_k not in k_tiles:
            raise ValueError(f"tile_k must be one of {k_tiles}, got {self.tile_k}")
        wm, wn = self.tile_m // self.warps_m, self.tile_n // self.warps_n
        if self.tile_m % self.warps_m or wm % 16:
            raise ValueError(
                f"tile_m {self.tile_m} must split into {self.warps_m} warp rows of a multiple of 16"
            )
        if self.tile_n % self.warps_n or wn % 16:
            raise ValueError(
                f"tile_n {self.tile_n} must split into {self.warps_n} warp columns of a multiple "
                "of 16"
            )
        chunks_n = self.tile_n // self.chunk
        if chunks_n & (chunks_n - 1):
            raise ValueError(
                f"tile_n must be {self.chunk} times a power of two (swizzle), got {self.tile_n}"
            )
        if self.tf32 and chunks_n < 8:
            # B fragments are LDS.64 of 4 k-rows x 16 columns: conflict free when the
            # swizzle spreads each row's 8 chunks over a whole 128-byte line (matmul_tf32's doc)
            raise ValueError(f"tile_n must be at least 32 for TF32 tiles, got {self.tile_n}")
        if self.tf32 and self.trans_a and self.tile_m < 32:
            # its fragments are scalar loads of 4 k-rows x 8 columns: conflict free when the
            # swizzle spreads each row's 8 chunks over a whole line (kernels.matmul.tc_tf32)
            raise ValueError(f"a transposed TF32 A needs tile_m of at least 32, got {self.tile_m}")
        transposed = [(self.tile_k, self.tile_m)] if self.trans_a else []
        transposed += [(self.tile_n, self.tile_k)] if self.trans_b else []
        for rows, cols in transposed:  # a transposed operand's staged tile (k rows for A)
            swizzled_copies(rows, cols, self.chunk, self.threads)
        if self.shared_bytes > MAX_SHARED:
            what = "float32" if self.tf32 else "float16"
            raise ValueError(
                f"{self.num_stages} stages of {self.tile_m}x{self.tile_k} + "
                f"{self.tile_k}x{self.tile_n} {what} tiles need {self.shared_bytes} B of shared "
                f"memory; no architecture gives a block more than {MAX_SHARED} B"
            )
        if self.dual and not isinstance(activation, ElementEpilogue):
            raise ValueError("a dual product needs an ElementEpilogue (b2 is its first extra)")
        fn = activation.fn if isinstance(activation, ElementEpilogue) else activation
        if activation is not None and not compat.is_device_function(fn):
            raise TypeError(
                "activation must be a numba CUDA device function (cuda.jit(device=True)) taking "
                f"and returning float32, or None; got {activation!r}"
            )
