"""Compile tier: the float16 flash-attention kernel's K/V loop, read from its SASS.

The bar (issue "kernels at the hardware's limits"), beside the hand-written CUDA C++ and Triton
3.9 flash kernels compiled offline with ptxas 13.5 (D = 64, sm_80: CUDA C++ 4 warps x 16 rows
2.0 HMMA per ldmatrix, 10.9 instructions per score; Triton 8 warps 1.78 HMMA per ldmatrix):

* D = 64, warps of 32 query rows, 64-key tiles: every ``ldmatrix.x4`` of K or V feeds 4 HMMA
  (two m16 tiles share it), at most 11 instructions and 1.1 MUFU.EX2 per score;
* D = 128, 64-key tiles, warps of 16 rows (32 would need more than 255 registers): 2 HMMA per
  ldmatrix, at most 15.5 instructions per score (16-row, 32-key tiles before: 19);
* 0 spills, no local memory, one barrier per tile, on sm_80 and sm_90.

The steady-state loop holds the unmasked tiles only (the masked tail, the diagonal and the end of
K, is a second loop), unrolled over the pipeline's stages: its figures are divided by the tiles
one pass of it processes (its HMMA over those of one tile).
"""

import pytest

from tessera_tile import inspect, ops
from tessera_tile.kernels.attention import tc as fa

ARCHS = ("sm_80", "sm_90")
SIG = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
BF16_SIG = "void({0}, {0}, {0}, {0}, float32)".format("uint16[:, :, ::1]")  # bfloat16 bits
ANCHORS = "anchors D=64: CUDA C++ 2.0 HMMA per LDSM, 10.9 instr per score; Triton (8 warps) 1.78"
# head dim -> (least HMMA per ldmatrix.x4 of K or V, most instructions per score). D = 64: the
# bar asked for (4 HMMA per ldmatrix, 11 instructions per score). D = 128 does not reach it: its
# mma alone cost 4 instructions per score, and 32-row warps there pass 255 registers and spill
# (docs/attention.md); these hold today's figures (2.0, 15.0 / 15.1) against regressions.
BAR = {64: (4.0, 11.0), 128: (2.0, 15.5)}


def default_kernel(d: int, causal: bool, arch: str):
    """``(config, compile report)`` of D's default kernel, launched as the op launches it."""
    cfg = fa.default_config(d)
    kernel = fa.flash_attention(d, causal, True)
    report = inspect.compile(
        kernel, SIG, arch=arch, block=cfg.threads, dynamic_shared=cfg.shared_bytes(d)
    )
    return cfg, report


def kv_loop_figures(d: int, causal: bool, arch: str):
    """The default config's kernel and its K/V loop, per tile of ``block_kv`` keys."""
    cfg, report = default_kernel(d, causal, arch)
    loop = report.loop_with("HMMA")
    m16 = cfg.warp_rows // 16
    hmma = 2 * m16 * (cfg.block_kv // 8) * (d // 16)  # Q K^T and P V of one tile
    tiles = loop.count("HMMA") / hmma
    per_tile = {op: loop.count(op) / tiles for op in ("HMMA", "LDSM", "MUFU.EX2", "BAR", "LDGSTS")}
    q_loads = 0 if cfg.q_in_registers(d) else m16 * d // 16  # Q's fragments reloaded per tile
    scores = cfg.warp_rows * cfg.block_kv // 32  # one warp's scores of a tile, per lane
    return (
        cfg,
        report,
        per_tile,
        {
            "hmma_per_kv_ldsm": hmma / (per_tile["LDSM"] - q_loads),
            "instr_per_score": loop.instructions / tiles / scores,
            "ex2_per_score": per_tile["MUFU.EX2"] / scores,
        },
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_kv_loop_is_the_float16_loop(arch, record_property):
    """Issue 22's bar: bfloat16 attention runs its float16 twin's K/V loop, HMMA .BF16, within
    5% of its instructions, 0 spills."""
    cfg = fa.default_config(64)
    bf16 = inspect.compile(fa.flash_attention_bf16_d64, BF16_SIG, arch=arch, block=cfg.threads)
    f16 = inspect.compile(fa.flash_attention_d64, SIG, arch=arch, block=cfg.threads)
    assert bf16.spill_stores == bf16.spill_loads == 0 and not bf16.uses_local_memory
    loop, f16_loop = bf16.loop_with("HMMA"), f16.loop_with("HMMA")
    assert loop.count("HMMA.16816.F32.BF16") == loop.count("HMMA") == f16_loop.count("HMMA")
    per, f16_per = loop.instructions, f16_loop.instructions
    record_property("resources", f"{arch} K/V loop: bfloat16 {per} instr, float16 {f16_per}")
    assert per <= 1.05 * f16_per, (per, f16_per)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_kv_loop_against_the_anchors(d, causal, arch, record_property):
    cfg, report, per_tile, fig = kv_loop_figures(d, causal, arch)
    record_property(
        "resources",
        f"flash attention D={d}{' causal' if causal else ''} {arch}, {cfg.num_warps} warps x "
        f"{cfg.warp_rows} rows, {cfg.block_kv}-key tiles: regs {report.registers}, spills "
        f"{report.spill_stores}, smem {report.dynamic_shared_bytes} B dynamic, occupancy "
        f"{report.occupancy:.3f}; per K/V tile "
        + ", ".join(f"{k} {v:.0f}" for k, v in per_tile.items())
        + f"; {fig['hmma_per_kv_ldsm']:.2f} HMMA per LDSM of K/V, "
        f"{fig['instr_per_score']:.2f} instr and {fig['ex2_per_score']:.3f} EX2 per score "
        f"({ANCHORS})",
    )
    least_hmma, most_instr = BAR[d]
    assert fig["hmma_per_kv_ldsm"] >= least_hmma, fig
    assert fig["instr_per_score"] <= most_instr and fig["ex2_per_score"] <= 1.1, fig
    assert per_tile["BAR"] == 1 and per_tile["LDGSTS"] >= 1, per_tile
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_every_head_dim_compiles_without_spills(d, arch, record_property):
    """All shared memory is dynamic (D = 128: 80 KiB, past the 48 KiB of static memory)."""
    cfg, report = default_kernel(d, True, arch)
    record_property(
        "resources",
        f"flash attention D={d} causal {arch}: regs {report.registers}, smem "
        f"{report.dynamic_shared_bytes} B dynamic, {report.key_opcodes()}",
    )
    assert report.count("HMMA.16816.F32") > 0 and report.count("MUFU.EX2") > 0
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert report.shared_bytes == 0 and report.dynamic_shared_bytes == cfg.shared_bytes(d)


def test_32_row_warps_reuse_every_fragment_four_times():
    """32-row warps at any D <= 64: each ldmatrix.x4 of K or V feeds 4 HMMA (Q stays in
    registers, so every ldmatrix of the loop is one of K or V)."""
    for d in (16, 32, 64):
        cfg = fa.default_config(d)
        assert cfg.warp_rows == 32 and cfg.q_in_registers(d)
        report = inspect.compile(fa.flash_attention(d, False, True), SIG, block=cfg.threads)
        loop = report.loop_with("HMMA")
        assert loop.count("HMMA") == 4 * loop.count("LDSM"), (d, loop.key_opcodes())


def test_inspect_compiles_what_explain_launches():
    import numpy as np

    q = np.zeros((2, 100, 32), np.float16)
    kv = np.zeros((2, 80, 32), np.float16)
    reports = ops.attention.inspect(q, kv, kv, causal=True, arch="sm_90")
    (name,) = [r.name for r in reports]
    explained = ops.attention.explain(q, kv, kv, causal=True).stages[0]
    assert explained.startswith(name)
    assert reports[0].count("HMMA.16816.F32") > 0
    nbytes = fa.default_config(32, 100).shared_bytes(32)
    assert reports[0].dynamic_shared_bytes == nbytes and f"{nbytes} B of dynamic" in explained
