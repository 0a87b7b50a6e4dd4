"""The warpgroup-MMA flash attention (kernels.attention.wgmma) compiled for sm_90 (numba-cuda's
sm_90a): both products on HGMMA in the K/V loop, Q, K and V read by the tensor cores through
descriptors (no LDS or LDSM), no mma.sync, one barrier per tile, 0 spills, no local memory, no
wgmma advisory from ptxas; refused, with our message, for sm_80; and ``ops.attention`` inspected
for sm_90 is this kernel.

The figures per K/V tile are recorded beside the hand-written CUDA C++ mma.sync anchor (D = 64,
4 warps x 16 rows, 64-key tiles, sm_80: 350 instructions per tile, 10.9 per score, 1.06 EX2 per
score, 2.0 HMMA per LDSM); static counts from ptxas and nvdisasm, not timings. The steady-state
loop holds the unmasked tiles, two per pass. By default the scores of the next tile are computed
while the softmax of this one runs (FlashAttention-3's overlap within a warpgroup); the SASS
shows it: the scores' HGMMAs, then EX2s, then the wait.
"""

import ml_dtypes
import numpy as np
import pytest
from test_wgmma_sass import ptxas_advisories

from tessera_tile import inspect, ops
from tessera_tile.kernels.attention import wgmma as aw

SIG = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
BF16_SIG = "void({0}, {0}, {0}, {0}, float32)".format("uint16[:, :, ::1]")  # bfloat16 bits
ANCHOR = "CUDA C++ mma.sync anchor (D=64, sm_80): 350 instr per tile, 10.9 per score, 1.06 EX2"
IN_TURN = aw.WgmmaAttentionConfig(64, 8, 2, False)  # S, softmax, P V in turn
CASES = [(64, False, False, None), (64, True, False, None), (128, False, False, None),
         (128, True, True, None), (64, False, True, None), (64, False, False, IN_TURN),
         (128, False, False, IN_TURN)]  # fmt: skip


def build(d: int, causal: bool, bf16: bool, cfg=None):
    cfg = cfg or aw.default_config(d)
    kernel = aw.wgmma_attention(d, causal, cfg, bf16)
    report = inspect.compile(
        kernel, BF16_SIG if bf16 else SIG, arch="sm_90", block=cfg.threads,
        dynamic_shared=cfg.shared_bytes(d),
    )  # fmt: skip
    return cfg, report


def loop_opcodes(report, loop) -> list[tuple[str, str]]:
    """``(opcode, operands)`` of the loop's instructions, in listing order."""
    (function,) = [f for f in report.functions if f.name == loop.function]
    return [(i.opcode, i.operands) for i in function.instructions if i.offset in loop]


@pytest.mark.parametrize(
    ("d", "causal", "bf16", "cfg"), CASES,
    ids=[f"d{d}{'-causal' * c}{'-bf16' * b}{'-in-turn' * bool(g)}" for d, c, b, g in CASES],
)  # fmt: skip
def test_both_products_are_hgmma_on_descriptors(d, causal, bf16, cfg, record_property):
    cfg, report = build(d, causal, bf16, cfg)
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    loop = report.loop_with("HGMMA")
    kind = ".BF16" if bf16 else ""
    s_shape = f"HGMMA.64x{cfg.block_kv}x16.F32{kind}"
    o_shape = f"HGMMA.64x{d}x16.F32{kind}"
    per_tile = d // 16 + cfg.block_kv // 16  # k16 steps of Q K^T and of P V
    tiles = loop.count("HGMMA") // per_tile  # the steady-state loop takes two tiles a pass
    assert tiles == 2 and loop.count("HGMMA") == tiles * per_tile, loop.histogram
    if s_shape == o_shape:
        assert loop.count(s_shape) == tiles * per_tile, loop.histogram
    else:
        assert loop.count(s_shape) == tiles * d // 16, loop.histogram
        assert loop.count(o_shape) == tiles * cfg.block_kv // 16, loop.histogram
    for opcode in ("HMMA", "LDS", "LDSM"):
        assert loop.count(opcode) == 0, (opcode, loop.histogram)
    assert report.count("HMMA") == 0 and report.count("LDSM") == 0, report.histogram
    # K and V by cp.async (2 chunks per thread and row pass), one barrier and one async-proxy
    # fence per tile, two wgmma groups (S, then O)
    chunks = 2 * cfg.block_kv * d // 8 // cfg.threads
    assert loop.count("LDGSTS") == tiles * chunks, loop.histogram
    for opcode, count in (("BAR.SYNC", 1), ("FENCE.VIEW.ASYNC.S", 1), ("WARPGROUP.ARRIVE", 2)):
        assert loop.count(opcode) == tiles * count, (opcode, loop.histogram)
    assert ptxas_advisories(report) == []
    # Overlapped, the scores' HGMMAs (A through a descriptor: no .tnspB) are in flight while
    # the softmax runs: an EX2 comes after them before any wait; in turn, a wait comes first.
    ops = loop_opcodes(report, loop)
    first_s = next(i for i, (op, args) in enumerate(ops) if op.startswith("HGMMA") and
                   "tnspB" not in args)  # fmt: skip
    after = [op for op, _ in ops[first_s:]]
    ex2 = next(i for i, op in enumerate(after) if op.startswith("MUFU.EX2"))
    wait = next(i for i, op in enumerate(after) if op.startswith("WARPGROUP.DEPBAR"))
    assert (ex2 < wait) == cfg.overlap, (ex2, wait)
    scores = 64 * cfg.block_kv // 128  # one warpgroup's scores of a tile, per thread
    per = loop.instructions / tiles
    record_property(
        "resources",
        f"{report.name} sm_90: regs {report.registers}, {report.instructions} instr; per K/V "
        f"tile of {cfg.block_kv}: {per_tile} HGMMA per warpgroup, {per:.0f} instr "
        f"({per / scores:.1f} per score), {loop.count('MUFU.EX2') / tiles / scores:.2f} EX2 "
        f"per score | {ANCHOR}",
    )


WS_CASES = [(64, False, False, aw.WgmmaAttentionConfig(64, 8, 3, True, True)),
            (128, False, False, aw.WgmmaAttentionConfig(64, 8, 3, True, True)),
            (64, False, False, aw.WgmmaAttentionConfig(64, 8, 2, False, True))]  # fmt: skip


@pytest.mark.parametrize(
    ("d", "causal", "bf16", "cfg"), WS_CASES,
    ids=[f"d{d}{'-causal' * c}{'-bf16' * b}{'-in-turn' * (not g.overlap)}"
         for d, c, b, g in WS_CASES],
)  # fmt: skip
def test_warp_specialised_loops(d, causal, bf16, cfg, record_property):
    """With a producer warpgroup the consumers' loop holds both products and the softmax, waits
    on the tiles' full mbarriers and releases their stages (no copy, no __syncthreads); the
    producer's loop holds the K/V copies and their mbarrier arrival."""
    cfg, report = build(d, causal, bf16, cfg)
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert ptxas_advisories(report) == []
    consumer, producer = report.loop_with("HGMMA"), report.loop_with("LDGSTS")
    assert consumer is not producer
    per_tile = d // 16 + cfg.block_kv // 16
    tiles = consumer.count("HGMMA") // per_tile
    assert tiles == 2 and consumer.count("HGMMA") == tiles * per_tile, consumer.histogram
    for opcode in ("LDGSTS", "BAR.SYNC", "LDS", "LDSM", "HMMA"):
        assert consumer.count(opcode) == 0, (opcode, consumer.histogram)
    for opcode in ("SYNCS.PHASECHK", "SYNCS.ARRIVE", "FENCE.VIEW.ASYNC.S"):
        assert consumer.count(opcode) >= tiles, (opcode, consumer.histogram)
    chunks = 2 * cfg.block_kv * d // 8 // cfg.copiers
    produced = producer.count("ARRIVES.LDGSTSBAR")  # tiles a pass (ptxas may unroll)
    assert produced and producer.count("LDGSTS.E.BYPASS.128") == produced * chunks
    assert producer.count("HGMMA") == producer.count("BAR.SYNC") == 0, producer.histogram
    scores = 64 * cfg.block_kv // 128
    per = consumer.instructions / tiles
    record_property(
        "resources",
        f"{report.name} sm_90: regs {report.registers}; per K/V tile of {cfg.block_kv}: "
        f"consumer {per:.0f} instr ({per / scores:.1f} per score), producer "
        f"{producer.instructions / produced:.0f} ({chunks} LDGSTS) | {ANCHOR}",
    )


def test_without_a_producer_no_mbarrier_is_emitted():
    """The barriers a producer needs are declared in every kernel and dropped where unused."""
    _, report = build(64, True, False)
    assert report.shared_bytes == 0, report  # static, from ptxas
    assert report.count("SYNCS") == 0, report.histogram


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


EDGES = [(64, aw.WgmmaAttentionConfig(128, 8)), (64, aw.WgmmaAttentionConfig(128, 4)),
         (64, aw.WgmmaAttentionConfig(32, 8)), (128, aw.WgmmaAttentionConfig(32, 4)),
         (64, aw.WgmmaAttentionConfig(128, 8, 2, False)),
         (128, aw.WgmmaAttentionConfig(64, 4, 3, False))]  # fmt: skip


@pytest.mark.parametrize(("d", "cfg"), EDGES, ids=[f"d{d}-{tuple(c)}" for d, c in EDGES])
def test_the_configs_it_allows_compile_without_spills(d, cfg, record_property):
    """The largest accumulators ``validate`` allows (128-key tiles at D = 64, overlapped: two
    score accumulators of 64 float32 beside O's 32) and the smallest tiles, causal."""
    _, report = build(d, True, False, cfg)
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert ptxas_advisories(report) == []
    record_property("resources", f"{report.name} sm_90: regs {report.registers}, 0 spills")
