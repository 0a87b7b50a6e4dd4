"""The one place a matmul-family call's kernel is chosen (:func:`choose_kernel`): the SIMT,
TF32, tensor-core (mma.sync) or warpgroup-MMA kernel, its tile and why, for a
:class:`~.matmul_plan.Product`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ... import dynamic_shared
from ...tile_config import (
    CANDIDATES,
    WARP_SPECIALISED,
    TileConfig,
)
from ...tile_ir import BFLOAT16
from . import simt, tc, tf32
from . import wgmma as wg


@dataclass(frozen=True)
class KernelChoice:
    kernel: object
    config: TileConfig
    threads: int
    signature: str
    reasons: tuple[str, ...]
    shared: int = 0  # bytes of dynamic shared memory (the tensor-core kernels' rings)
    bias_reads: int | None = None  # per row of C tiles, where a tensor-core epilogue reads it
    wgmma: bool = False  # the warpgroup-MMA kernel (sm_90a)

    def grid(self, m: int, n: int, z: int) -> tuple[int, int, int]:
        c = self.config
        return (-(-n // c.tile_n), -(-m // c.tile_m), z)


# float16 operands whose rows are not 16-byte aligned: the tensor-core kernel's synchronous
# variant, with 8 warps and 2 stages (with 4 warps its guarded loads spill)
TC_UNALIGNED = TileConfig(128, 128, 32, 8, 2, dtype="float16")
# float16 or precision="tf32" on operands the tensor-core kernels cannot take (a strided inner
# axis; for TF32 also rows not 16-byte aligned): the float32 SIMT kernel's shipped default tile
SIMT_FALLBACK = CANDIDATES[0]
# Two products of one A in a kernel (a gated MLP's x @ w1 and x @ w3, a composer's stage): the
# accumulators double, so the tiles give each thread half the usual count (tensor cores: 8
# warps of 64 x 32; SIMT: 4 warps of 8 x 8 per thread over 128 x 64); one tile per kind, not
# tuned (the compile tier checks each keeps to registers).
DUAL = {
    "float16": TileConfig(128, 128, 32, 8, 3, dtype="float16"),
    "tf32": TileConfig(128, 128, 16, 8, 3, dtype="tf32"),
    "float32": TileConfig(128, 64, 8, 4, 3),
}


def warp_specialised_refusal(config: TileConfig, why: str) -> ValueError:
    """The error of a 12-warp ``config`` (the warp-specialised wgmma kernel's) where it cannot
    run, saying ``why``."""
    return ValueError(
        f"config {config} is the warp-specialised warpgroup-MMA kernel's (a producer warpgroup "
        f"and two that multiply), which runs only on sm_90a, on one product whose rows are "
        f"16-byte aligned; {why}: give 4 or 8 warps"
    )


def as_wgmma(
    c: TileConfig, has_bias: bool = False, bf16: bool = False, transposed=(False, False)
) -> wg.WgmmaConfig:
    """The warpgroup-MMA kernel's config of a float16 ``c`` (not validated): 12 warps are a
    producer warpgroup and two that multiply."""
    producer = c.num_warps == WARP_SPECIALISED
    warps = 8 if producer else c.num_warps
    return wg.WgmmaConfig(
        c.tile_m, c.tile_n, c.tile_k, warps, c.num_stages, has_bias, bf16, producer, *transposed
    )


def wgmma_config(
    config: TileConfig, dtype, has_bias: bool, dual: bool, transposed=(False, False)
) -> wg.WgmmaConfig | None:
    """The warpgroup-MMA kernel's config for a float16 ``config`` where it runs (sm_90a: a GPU
    of compute capability 9.0, or the simulator standing for one) and takes the tile;
    else None (the mma.sync kernels)."""
    if dual or config.dtype != "float16" or not dynamic_shared.wgmma():
        return None
    cfg = as_wgmma(config, has_bias, dtype == BFLOAT16, transposed)
    try:
        cfg.validate()
    except ValueError:
        return None
    return cfg


def transposable(config: TileConfig, transposed: tuple[bool, bool]) -> TileConfig:
    """``config``, or where its tiles cannot be staged transposed (a warp-specialised tile, a
    tile_m not a power of two times a chunk, a TF32 tile_m under 32) the mma.sync anchor tile
    of its dtype, warps and stages."""
    tf32 = config.dtype == "tf32"
    try:
        if config.num_warps == WARP_SPECIALISED:
            raise ValueError
        tc.TensorCoreConfig(
            config.tile_m, config.tile_n, config.tile_k, config.num_warps, config.num_stages,
            tf32=tf32, trans_a=transposed[0], trans_b=transposed[1],
        ).validate()  # fmt: skip
        return config
    except ValueError:
        warps = 8 if config.num_warps == WARP_SPECIALISED else config.num_warps
        return TileConfig(128, 128, 16 if tf32 else 32, warps, config.num_stages,
                          dtype=config.dtype)  # fmt: skip


def transposed_reasons(config: TileConfig, staged: TileConfig, names, transposed) -> list:
    """What ``explain`` says of operands read transposed, and of a tile replaced for them."""
    names_t = " and ".join(n for n, t in zip(names, transposed, strict=True) if t)
    reasons = [
        f"{names_t} transposed in memory (the transpose of a row-major array): read in place, "
        "each tile staged as it lies"
    ]
    if staged != config:
        reasons.append(
            f"tile {config} cannot stage a transposed operand (a staged row must be a power of "
            f"two times 16 bytes, its copies split evenly over the block): {staged}"
        )
    return reasons


def choose_kernel(
    dtype: np.dtype, config: TileConfig, activation, has_bias: bool, copy_a: int, copy_b: int,
    vector_store: bool, types: tuple, names: tuple[str, str] = ("a", "b"),
    tensor_rows: str | None = None, dual: bool = False, prologue: tuple = (None, None),
    convert: bool = False, transposed: tuple[bool, bool] = (False, False),
) -> KernelChoice:  # fmt: skip
    """The kernel and launch of one call.

    float16 with a float16 ``config`` goes to the tensor cores when ``tensor_rows`` allows it
    (``"aligned"``: every row of A, B and C 16-byte aligned on a contiguous inner axis, the
    ``cp.async`` kernel; ``"contiguous"``: inner axes contiguous, the synchronous variant with
    :data:`TC_UNALIGNED`); otherwise, and for a float32 ``config``, to the SIMT kernel, which
    widens float16 into float32 tiles. float32 runs on the SIMT kernel, with 16-byte copies
    where ``copy_a``/``copy_b`` say the rows allow them; with a tf32 ``config``
    (``precision="tf32"``) on the TF32 tensor-core kernel where ``tensor_rows`` is
    ``"aligned"``, else exactly on the SIMT kernel with :data:`SIMT_FALLBACK` (a reason says so);
    float16 with a float16 ``config`` on a strided inner axis runs on that tile too. ``dual``:
    the kernels' two-product variant (:data:`DUAL` in place of the SIMT fallback's tile).
    ``prologue``: the A and B :class:`.prologue.ElementPrologue` (or None each), run
    by the mma.sync and SIMT kernels (not the wgmma kernel: a reason says so); ``convert``: an
    operand's array has another dtype than the operands (a prologue's cast), so the tiles are
    staged synchronously, converted in registers (``tensor_rows`` at most ``"contiguous"``).
    ``transposed``: A and/or B are passed to the kernel transposed (a row-major ``x`` of
    ``x.T @ dy``, ``w`` of ``dy @ w.T``; ``tensor_rows`` is about those views), which the
    tensor-core kernels read in place (:mod:`.tc_staging`, :mod:`.wgmma_staging`).
    """
    reasons = []
    simt_fallback = DUAL["float32"] if dual else SIMT_FALLBACK

    def ring_bytes(c: TileConfig) -> int:  # the tensor-core kernels' dynamic shared memory
        b2 = c.num_stages * c.tile_k * c.tile_n * c.staged_itemsize if dual else 0
        return c.shared_bytes + b2

    if config.dtype == "tf32":
        if tensor_rows == "aligned" and not convert:
            reasons.append(
                "precision='tf32': float32 on TF32 tensor cores (mma m16n8k8; each input read "
                "with 10 mantissa bits, the low 13 ignored; float32 accumulation)"
            )
            if any(transposed):
                staged = transposable(config, transposed)
                reasons += transposed_reasons(config, staged, names, transposed)
                config = staged
            c = config
            kernel = tf32.tf32_matmul(
                c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages, activation, has_bias,
                dual, prologue, trans_a=transposed[0], trans_b=transposed[1],
            )  # fmt: skip
            signature = f"void({', '.join(types)})"
            return KernelChoice(
                kernel, config, config.threads, signature, tuple(reasons), ring_bytes(config)
            )
        reasons.append(
            "precision='tf32' asked for, but "
            + ("an operand is cast on its way in (the TF32 kernel copies its tiles as they "
               "are)" if convert else
               "an operand's inner axis is strided" if tensor_rows is None else
               "rows are not 16-byte aligned (K or N not a multiple of 4, or an offset view)")
            + ": the exact float32 SIMT kernel instead (TF32 is an opt-in to speed; the "
            f"fallback computes exactly, tile {simt_fallback})"
        )  # fmt: skip
        config = simt_fallback
    if dtype == BFLOAT16 and tensor_rows is None:
        raise ValueError(
            "bfloat16 runs on the tensor cores only, which need every operand's last axis "
            "contiguous: a device operand (or out=) here has a strided last axis"
        )
    if dtype in (np.float16, BFLOAT16) and config.dtype == "float16" and tensor_rows is not None:
        if tensor_rows == "contiguous":
            reasons.append(
                ("an operand cast on its way in (converted in registers)" if convert else
                 "rows not 16-byte aligned (K or N not a multiple of 8, or an offset view)")
                + ": the tensor-core kernel's synchronous variant, 8 warps, 2 stages"
            )  # fmt: skip
            config = TC_UNALIGNED
        c = config
        signature = f"void({', '.join(types)})"
        warpgroups = None
        if tensor_rows == "aligned":
            warpgroups = wgmma_config(c, dtype, has_bias, dual, transposed)
        if warpgroups is not None and any(prologue):
            reasons.append(
                "an operand prologue: the mma.sync kernel (the wgmma kernel's tensor cores read "
                "its tiles through the async proxy as they land, with no pass over them)"
            )
            warpgroups = None
            if c.num_warps == WARP_SPECIALISED:  # the tuner's producer tile: its 8-warp twin
                c = config = dataclasses.replace(c, num_warps=8)
        if warpgroups is not None:
            if any(transposed):  # the wgmma kernel stages any tile transposed
                reasons += transposed_reasons(config, config, names, transposed)
            kernel = wg.wgmma_matmul(
                *warpgroups[:5], activation, has_bias, bf16=warpgroups.bf16,
                producer=warpgroups.producer, trans_a=warpgroups.trans_a,
                trans_b=warpgroups.trans_b,
            )  # fmt: skip
            reasons.append(
                "sm_90a: the warpgroup-MMA (wgmma) kernel, operands read by the tensor cores "
                "from shared memory through descriptors"
                + (", a producer warpgroup copying for two that multiply (mbarriers)"
                   if warpgroups.producer else "")
            )  # fmt: skip
            return KernelChoice(
                kernel, config, warpgroups.threads, signature, tuple(reasons),
                warpgroups.shared_bytes, warpgroups.warps_m, wgmma=True,
            )  # fmt: skip
        if any(transposed):  # the mma.sync kernel's tiles
            staged = transposable(config, transposed)
            reasons += transposed_reasons(config, staged, names, transposed)
            c = config = staged
        if c.num_warps == WARP_SPECIALISED:
            raise warp_specialised_refusal(c, "here two products share A" if dual else
                                           "here the tensor-core kernels run")  # fmt: skip
        kernel = tc.tensor_core_matmul(
            c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.num_stages, activation, has_bias,
            async_copy=tensor_rows == "aligned", bf16=dtype == BFLOAT16, dual=dual,
            prologue=prologue, trans_a=transposed[0], trans_b=transposed[1],
        )  # fmt: skip
        return KernelChoice(
            kernel, config, config.threads, signature, tuple(reasons), ring_bytes(config)
        )
    if dtype == np.float16:
        reasons.append(
            "float16 on the float32 SIMT kernel (staged and accumulated in float32, rounded "
            "once at the store): "
            + ("a float32 TileConfig was given" if config.dtype == "float32" else
               "an operand's inner axis is strided, which the tensor-core kernel cannot take "
               f"(tile {simt_fallback})")
        )  # fmt: skip
        if config.dtype != "float32":
            config = simt_fallback
        kernel = simt.simt_matmul(
            config,
            activation,
            has_bias,
            4,
            4,
            async_copy=False,
            vector_store=False,
            dual=dual,
            prologue=prologue,
        )
    else:
        for name, width in zip(names, (copy_a, copy_b), strict=True):
            if width == 4 and not convert:
                reasons.append(
                    f"{name}'s rows are not 16-byte aligned and contiguous: 4-byte cp.async "
                    "copies, read in place"
                )
        if convert:
            reasons.append(
                "an operand cast on its way in: staged synchronously, converted in registers"
            )
        kernel = simt.simt_matmul(
            config, activation, has_bias, copy_a, copy_b, async_copy=not convert,
            vector_store=vector_store, dual=dual, prologue=prologue,
        )  # fmt: skip
    signature = f"void({', '.join(types)})"
    shared = simt.dynamic_bytes(config, has_bias, dual)  # past 48 KiB: carved, opted in
    return KernelChoice(kernel, config, config.threads, signature, tuple(reasons), shared)
