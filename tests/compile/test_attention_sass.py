"""Compile tier: the float16 flash-attention kernel's K/V loop, read from its SASS.

Per K/V tile of 64 keys, per warp of 16 query rows (D = 64), the issue's bar beside the
hand-written CUDA C++ and Triton flash kernels (sm_80 builds, ptxas 13.5): 64 HMMA (both), at
most 36 ldmatrix (CUDA C++ 32, Triton 36: it reloads Q), at most 1.1 MUFU.EX2 per score (CUDA
C++ 1.06) and at most 12 instructions per score (CUDA C++ 10.9); 0 spills, no local memory.

The steady-state loop holds the unmasked tiles only (the masked tail, the diagonal and the end of
K, is a second loop), unrolled over the pipeline's stages: its figures are divided by the tiles
one pass of it processes (its HMMA over the 64 of one tile).
"""

import pytest

from tessera_tile import inspect, ops
from tessera_tile.kernels import attention as fa

ARCHS = ("sm_80", "sm_90")
SIG = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
BF16_SIG = "void({0}, {0}, {0}, {0}, float32)".format("uint16[:, :, ::1]")  # bfloat16 bits
SCORES_PER_LANE = 16 * 64 // 32  # one warp's 16 x 64 scores of a tile, per lane


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
def test_kv_loop_against_the_anchors(causal, arch, record_property):
    cfg = fa.default_config(64)
    kernel = fa.flash_attention(64, causal, True)
    report = inspect.compile(kernel, SIG, arch=arch, block=cfg.threads)
    loop = report.loop_with("HMMA")
    tiles = loop.count("HMMA") / 64
    per_tile = {op: loop.count(op) / tiles for op in ("HMMA", "LDSM", "MUFU.EX2", "BAR", "LDGSTS")}
    per_score = loop.instructions / tiles / SCORES_PER_LANE
    ex2_per_score = per_tile["MUFU.EX2"] / SCORES_PER_LANE
    record_property(
        "resources",
        f"flash attention D=64{' causal' if causal else ''} {arch}: regs {report.registers}, "
        f"smem {report.shared_bytes} B, occupancy {report.occupancy:.3f}; per K/V tile "
        + ", ".join(f"{k} {v:.0f}" for k, v in per_tile.items())
        + f"; {per_score:.2f} instr and {ex2_per_score:.3f} EX2 per score",
    )
    assert per_tile["HMMA"] == 64 and per_tile["LDSM"] <= 36, per_tile
    assert ex2_per_score <= 1.1 and per_score <= 12, (ex2_per_score, per_score)
    assert per_tile["BAR"] == 1 and per_tile["LDGSTS"] >= 1, per_tile
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_every_head_dim_compiles_without_spills(d, arch, record_property):
    cfg = fa.default_config(d)
    report = inspect.compile(fa.flash_attention(d, True, True), SIG, arch=arch, block=cfg.threads)
    record_property(
        "resources",
        f"flash attention D={d} causal {arch}: regs {report.registers}, smem "
        f"{report.shared_bytes} B, {report.key_opcodes()}",
    )
    assert report.count("HMMA.16816.F32") > 0 and report.count("MUFU.EX2") > 0
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert report.shared_bytes == cfg.shared_bytes(d)


def test_inspect_compiles_what_explain_launches():
    import numpy as np

    q = np.zeros((2, 100, 32), np.float16)
    kv = np.zeros((2, 80, 32), np.float16)
    reports = ops.attention.inspect(q, kv, kv, causal=True, arch="sm_90")
    (name,) = [r.name for r in reports]
    assert ops.attention.explain(q, kv, kv, causal=True).stages[0].startswith(name)
    assert reports[0].count("HMMA.16816.F32") > 0
