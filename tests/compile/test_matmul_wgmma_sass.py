"""The warpgroup-MMA matmul (kernels.matmul.wgmma) compiled for sm_90a: HGMMA only for the math
in the main loop, operands read through descriptors (no LDS or LDSM), cp.async copies, one
barrier per k-tile, no spills, no local memory, no wgmma advisory from ptxas; and refused, with
our message, for sm_80.

The instructions per k-tile are recorded beside Triton's for the same tile. The expert anchors
give Triton 3.9's whole kernel only (fp16 GEMM 128 x 128 x 32, 3-stage, 8 warps: 2
HGMMA.64x128x16 per k-tile, no shared loads, 101 registers, 514 SASS instructions; 4 warps: 4
HGMMA per k-tile, 200 registers, 757). Its loop was counted here from Triton 3.5.1's tutorial
matmul (``tl.dot`` over 128 x 128 tiles, 3 stages, pointers and strides divisible by 16),
compiled offline for sm_90a (its own ptxas 12.8; 519 instructions in the 8-warp kernel): per
k-tile 76 instructions with 8 warps and tile_k 32, 107 with 4 warps, 122 and 177 with tile_k
64. Ours must not issue more per k-tile for the same tile (the issue's bar). Static counts from
ptxas and nvdisasm, not timings.
"""

import ml_dtypes
import numpy as np
import pytest
from test_wgmma_sass import ptxas_advisories

from tessera_tile import inspect
from tessera_tile.kernels import epilogue
from tessera_tile.kernels.matmul import wgmma as wg

F16 = "void(float16[:, :, ::1], float16[:, :, ::1], float32[::1], float16[:, :, ::1])"
BF16 = "void(uint16[:, :, ::1], uint16[:, :, ::1], uint16[::1], uint16[:, :, ::1])"  # bits
ANCHOR = {  # Triton 3.9 sm_90a, 128 x 128 x 32: warps -> (HGMMA per k-tile, registers, instr)
    8: (2, 101, 514),
    4: (4, 200, 757),
}
# Triton 3.5.1's loop, 128 x 128 tiles (module doc): (tile_k, warps) -> instructions per k-tile
TRITON_PER_K_TILE = {(32, 8): 76, (32, 4): 107, (64, 8): 122, (64, 4): 177}
GELU = epilogue.ACTIVATIONS["gelu"]


def build(cfg: wg.WgmmaConfig, activation=None):
    kernel = wg.wgmma_matmul(
        *cfg[:5], activation=activation, has_bias=cfg.has_bias, bf16=cfg.bf16,
        producer=cfg.producer, trans_a=cfg.trans_a, trans_b=cfg.trans_b,
    )  # fmt: skip
    return inspect.compile(
        kernel,
        BF16 if cfg.bf16 else F16,
        arch="sm_90a",
        block=cfg.threads,
        dynamic_shared=cfg.shared_bytes,
    )


CASES = [
    ("f16", wg.DEFAULT, None),
    ("bf16", wg.DEFAULT._replace(bf16=True), None),
    ("f16 bias gelu", wg.DEFAULT._replace(has_bias=True), GELU),
    ("bf16 bias gelu", wg.DEFAULT._replace(has_bias=True, bf16=True), GELU),
    ("f16 128x128x32", wg.DEFAULT._replace(tile_k=32), None),  # the anchor's k-tile
    ("f16 128x256x64 3 stages", wg.WgmmaConfig(128, 256, 64, 8, 3), None),
    # the tuner's own tiles for this kernel (tile_config.WGMMA_CANDIDATES)
    ("f16 128x256x64 4 stages", wg.WgmmaConfig(128, 256, 64, 8, 4), None),
    ("f16 128x128x64 3 stages", wg.WgmmaConfig(128, 128, 64, 8, 3), None),
    # Triton's tiles: 8 warps, 3 stages; one warpgroup (4 warps), tile_k 32 and 64
    ("f16 128x128x32 3 stages", wg.WgmmaConfig(128, 128, 32, 8, 3), None),
    ("f16 128x128x32 one warpgroup", wg.WgmmaConfig(128, 128, 32, 4, 3), None),
    ("f16 128x128x64 one warpgroup", wg.WgmmaConfig(128, 128, 64, 4, 3), None),
    # the backward GEMMs' transposed operands, read in place: A MN-major, B K-major
    ("f16 A transposed", wg.DEFAULT._replace(trans_a=True), None),
    ("bf16 B transposed", wg.DEFAULT._replace(trans_b=True, bf16=True), None),
]


@pytest.mark.parametrize(("what", "cfg", "activation"), CASES, ids=[c[0] for c in CASES])
def test_main_loop_is_hgmma_on_descriptors(what, cfg, activation, record_property):
    report = build(cfg, activation)
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    loop = report.loop_with("HGMMA")
    per_tile = cfg.hgmma_per_k_tile
    # the body holds one k-tile per stage (unrolled so that stage offsets are constants)
    assert loop.count("HGMMA") == cfg.num_stages * per_tile, loop.histogram
    shape = f"HGMMA.64x{cfg.tile_n}x16.F32{'.BF16' if cfg.bf16 else ''}"
    assert loop.count(shape) == loop.count("HGMMA"), loop.histogram
    # the math is HGMMA only; the operands reach it through descriptors, never LDS or LDSM
    for opcode in ("HMMA", "FFMA", "LDS", "LDSM"):
        assert loop.count(opcode) == 0, (opcode, loop.histogram)
    assert report.count("HMMA") == 0 and report.count("LDSM") == 0, report.histogram
    # every chunk by cp.async, one barrier, one fence and one wait per k-tile
    chunks = (cfg.tile_m + cfg.tile_n) * cfg.tile_k // 8 // cfg.threads
    assert loop.count("LDGSTS") == cfg.num_stages * chunks, loop.histogram
    for opcode in ("BAR.SYNC", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "FENCE.VIEW.ASYNC.S"):
        assert loop.count(opcode) == cfg.num_stages, (opcode, loop.histogram)
    assert ptxas_advisories(report) == []
    tiles = loop.count("HGMMA") / per_tile
    per_k_tile = loop.instructions / tiles
    triton = (
        TRITON_PER_K_TILE.get((cfg.tile_k, cfg.num_warps))
        if cfg.tile_m == cfg.tile_n == 128
        else None
    )
    if triton is not None:
        assert per_k_tile <= triton, (per_k_tile, triton)
    hgmma, regs, instr = ANCHOR[cfg.num_warps]
    record_property(
        "resources",
        f"{report.name} sm_90a ({what}): regs {report.registers}, {report.instructions} instr; "
        f"per k-tile of {cfg.tile_k}: {per_tile} HGMMA per warpgroup, {per_k_tile:.1f} instr "
        f"({loop.instructions / loop.count('HGMMA'):.1f} per HGMMA)"
        + (f", Triton 3.5.1 {triton}" if triton is not None else "")
        + f" | Triton 3.9 sm_90a anchor, 128x128x32, {cfg.num_warps} warps: {hgmma} "
        f"HGMMA.64x128x16 per k-tile of 32, no shared loads, regs {regs}, {instr} instr",
    )


WS_CASES = [
    ("f16", wg.DEFAULT._replace(producer=True), None),
    ("bf16 bias gelu", wg.DEFAULT._replace(producer=True, has_bias=True, bf16=True), GELU),
    ("f16 128x256x64 3 stages", wg.WgmmaConfig(128, 256, 64, 8, 3, producer=True), None),
    ("f16 128x128x64 one warpgroup", wg.WgmmaConfig(128, 128, 64, 4, 3, producer=True), None),
    ("f16 both transposed", wg.DEFAULT._replace(producer=True, trans_a=True, trans_b=True), None),
]


@pytest.mark.parametrize(("what", "cfg", "activation"), WS_CASES, ids=[c[0] for c in WS_CASES])
def test_warp_specialised_loops(what, cfg, activation, record_property):
    """With a producer warpgroup the consumers' loop is the MMAs, a wait on the stage's full
    mbarrier and an arrival on the previous stage's empty one (no copy, no __syncthreads); the
    producer's is the copies, a wait on the empty mbarrier and the copies' arrival."""
    report = build(cfg, activation)
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    assert ptxas_advisories(report) == []
    consumer, producer = report.loop_with("HGMMA"), report.loop_with("LDGSTS")
    assert consumer is not producer
    assert consumer.count("HGMMA") == cfg.hgmma_per_k_tile, consumer.histogram
    for opcode in ("LDGSTS", "BAR.SYNC", "LDS", "LDSM", "HMMA"):
        assert consumer.count(opcode) == 0, (opcode, consumer.histogram)
    for opcode in ("SYNCS.PHASECHK", "SYNCS.ARRIVE", "FENCE.VIEW.ASYNC.S", "WARPGROUP.ARRIVE"):
        assert consumer.count(opcode) >= 1, (opcode, consumer.histogram)
    chunks = (cfg.tile_m + cfg.tile_n) * cfg.tile_k // 8 // cfg.copiers
    produced = producer.count("ARRIVES.LDGSTSBAR")  # tiles a pass (ptxas may unroll)
    assert produced and producer.count("LDGSTS.E.BYPASS.128") == produced * chunks
    assert producer.count("SYNCS.PHASECHK") >= produced, producer.histogram
    assert producer.count("HGMMA") == producer.count("BAR.SYNC") == 0, producer.histogram
    per_copier = producer.instructions / produced
    warps = cfg.num_warps * consumer.instructions + 4 * per_copier
    record_property(
        "resources",
        f"{report.name} sm_90a ({what}): regs {report.registers}; per k-tile of {cfg.tile_k}: "
        f"consumer {consumer.instructions} instr ({cfg.hgmma_per_k_tile} HGMMA), producer "
        f"{per_copier:.0f} ({chunks} LDGSTS); {warps:.0f} warp-instructions a block",
    )


def test_sm80_is_refused_with_our_message():
    # A fresh build (not the memoised kernel): numba-cuda lowers a device function once and
    # reuses it for every target, so the wgmma intrinsics inside the kernel's device functions
    # check the target only where they are first lowered.
    kernel = wg.build_kernel.__wrapped__(wg.DEFAULT, None)
    with pytest.raises(Exception, match="wgmma needs compute capability 9.0") as info:
        inspect.compile(kernel, F16, arch="sm_80", block=256)
    assert "ptxas" not in str(info.value)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_the_ops_inspected_for_sm90_are_the_wgmma_kernels(dtype, record_property):
    """``inspect(arch="sm_90")`` (or ``"sm_90a"``) plans what a GPU of compute capability 9.0
    runs: the matmul ops and a GEMM stage on the warpgroup-MMA kernel, compiled for sm_90a
    (numba-cuda's target there); ``"sm_80"`` the mma.sync kernels. ``explain(arch=...)`` says
    the same."""
    import tessera_tile as tt
    from tessera_tile import ops

    x, w, b = np.zeros((512, 256), dtype), np.zeros((256, 512), dtype), np.zeros(512, dtype)
    block = tt.fuse(lambda x, w, b: tt.gelu(x @ w + b))
    calls = [
        ("ops.matmul", ops.matmul, (x, w)),
        ("ops.linear gelu", ops.linear, (x, w, b, "gelu")),
        ("gelu(x @ w + b)", block, (x, w, b)),
    ]
    if dtype != np.float16:  # bfloat16 takes the same paths: its dispatch, checked once
        calls = calls[:1]
    for label, op, args in calls:
        (hopper,) = op.inspect(*args, arch="sm_90")
        (named_a,) = op.inspect(*args, arch="sm_90a")
        (ampere,) = op.inspect(*args, arch="sm_80")
        assert hopper.name.startswith("matmul_wgmma") and named_a.name == hopper.name
        assert hopper.count("HGMMA") > 0 and hopper.count("HMMA") == 0, hopper.histogram
        assert hopper.spill_stores == hopper.spill_loads == 0 and hopper.stack_bytes == 0
        assert ampere.count("HMMA") > 0 and ampere.count("HGMMA") == 0
        assert "warpgroup MMA" in str(op.explain(*args, arch="sm_90"))
        assert "warpgroup MMA" not in str(op.explain(*args, arch="sm_80"))
        # no architecture named: explain and inspect plan for one target, offline an sm_90
        (default,) = op.inspect(*args)
        assert default.arch == "sm_90" and default.name == hopper.name
        assert "warpgroup MMA" in str(op.explain(*args))
        record_property(
            "resources",
            f"sm_90 {label} {np.dtype(dtype)}: {hopper.name}, {hopper.registers} registers, "
            f"{hopper.count('HGMMA')} HGMMA",
        )
