"""The warpgroup-MMA flash attention (kernels.attention_wgmma) compiled for sm_90 (numba-cuda's
sm_90a): both products on HGMMA in the K/V loop, Q, K and V read by the tensor cores through
descriptors (no LDS or LDSM), no mma.sync, one barrier per tile, 0 spills, no local memory, no
wgmma advisory from ptxas; refused, with our message, for sm_80; and ``ops.attention`` inspected
for sm_90 is this kernel.

The figures per K/V tile are recorded beside the hand-written CUDA C++ mma.sync anchor (D = 64,
4 warps x 16 rows, 64-key tiles, sm_80: 350 instructions per tile, 10.9 per score, 1.06 EX2 per
score, 2.0 HMMA per LDSM); static counts from ptxas and nvdisasm, not timings. The steady-state
loop holds the unmasked tiles, one tile per pass.
"""

import ml_dtypes
import numpy as np
import pytest
from test_wgmma_sass import ptxas_advisories

from tessera_tile import inspect, ops
from tessera_tile.kernels import attention_wgmma as aw

SIG = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
BF16_SIG = "void({0}, {0}, {0}, {0}, float32)".format("uint16[:, :, ::1]")  # bfloat16 bits
ANCHOR = "CUDA C++ mma.sync anchor (D=64, sm_80): 350 instr per tile, 10.9 per score, 1.06 EX2"
CASES = [(64, False, False), (64, True, False), (128, False, False), (128, True, True),
         (64, False, True)]  # fmt: skip


def build(d: int, causal: bool, bf16: bool, cfg=None):
    cfg = cfg or aw.default_config(d)
    kernel = aw.wgmma_attention(d, causal, cfg, bf16)
    report = inspect.compile(
        kernel, BF16_SIG if bf16 else SIG, arch="sm_90", block=cfg.threads,
        dynamic_shared=cfg.shared_bytes(d),
    )  # fmt: skip
    return cfg, report


@pytest.mark.parametrize(
    ("d", "causal", "bf16"), CASES, ids=[f"d{d}{'-causal' * c}{'-bf16' * b}" for d, c, b in CASES]
)
def test_both_products_are_hgmma_on_descriptors(d, causal, bf16, record_property):
    cfg, report = build(d, causal, bf16)
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    loop = report.loop_with("HGMMA")
    kind = ".BF16" if bf16 else ""
    s_shape = f"HGMMA.64x{cfg.block_kv}x16.F32{kind}"
    o_shape = f"HGMMA.64x{d}x16.F32{kind}"
    # one tile per pass: D / 16 k-steps of Q K^T, block_kv / 16 of P V
    if s_shape == o_shape:
        assert loop.count(s_shape) == d // 16 + cfg.block_kv // 16, loop.histogram
    else:
        assert loop.count(s_shape) == d // 16, loop.histogram
        assert loop.count(o_shape) == cfg.block_kv // 16, loop.histogram
    assert loop.count("HGMMA") == d // 16 + cfg.block_kv // 16, loop.histogram
    for opcode in ("HMMA", "LDS", "LDSM"):
        assert loop.count(opcode) == 0, (opcode, loop.histogram)
    assert report.count("HMMA") == 0 and report.count("LDSM") == 0, report.histogram
    # K and V by cp.async (2 chunks per thread and row pass), one barrier and one async-proxy
    # fence per tile, two wgmma groups (S, then O)
    assert loop.count("LDGSTS") == 2 * cfg.block_kv * d // 8 // cfg.threads, loop.histogram
    for opcode, count in (("BAR.SYNC", 1), ("FENCE.VIEW.ASYNC.S", 1), ("WARPGROUP.ARRIVE", 2)):
        assert loop.count(opcode) == count, (opcode, loop.histogram)
    assert ptxas_advisories(report) == []
    scores = 64 * cfg.block_kv // 128  # one warpgroup's scores of a tile, per thread
    record_property(
        "resources",
        f"{report.name} sm_90: regs {report.registers}, {report.instructions} instr; per K/V "
        f"tile of {cfg.block_kv}: {loop.count('HGMMA')} HGMMA per warpgroup, "
        f"{loop.instructions} instr ({loop.instructions / scores:.1f} per score), "
        f"{loop.count('MUFU.EX2') / scores:.2f} EX2 per score | {ANCHOR}",
    )


def test_sm80_is_refused_with_our_message():
    kernel = aw._build.__wrapped__(64, False, aw.default_config(64), False)  # a fresh build
    with pytest.raises(Exception, match="wgmma needs compute capability 9.0") as info:
        inspect.compile(kernel, SIG, arch="sm_80", block=256)
    assert "ptxas" not in str(info.value)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_ops_attention_inspected_for_sm90_is_this_kernel(dtype):
    """``ops.attention.inspect(arch="sm_90")`` plans what a GPU of compute capability 9.0 runs;
    ``arch="sm_80"`` the mma.sync kernel; ``explain(arch=...)`` says which."""
    q = np.zeros((2, 300, 128), dtype)
    (hopper,) = ops.attention.inspect(q, q, q, causal=True, arch="sm_90")
    (ampere,) = ops.attention.inspect(q, q, q, causal=True, arch="sm_80")
    assert hopper.name.startswith("flash_attention_wgmma"), hopper.name
    assert hopper.count("HGMMA") > 0 and hopper.count("HMMA") == 0, hopper.histogram
    assert hopper.spill_stores == hopper.spill_loads == 0 and not hopper.uses_local_memory
    assert ampere.count("HMMA") > 0 and ampere.count("HGMMA") == 0
    assert "warpgroup MMA" in str(ops.attention.explain(q, q, q, arch="sm_90"))
    assert "warpgroup MMA" not in str(ops.attention.explain(q, q, q, arch="sm_80"))
