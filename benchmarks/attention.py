"""Flash attention: the roofline model, the K/V loop's SASS beside expert kernels, and the traffic
the simulator measures next to a naive three-kernel version. Prints tables; asserts nothing.

    python benchmarks/attention.py model     # predicted bytes, FLOPs, H100 roofline bound
    python benchmarks/attention.py sass      # compiled offline for sm_80 and sm_90 (no GPU),
                                             # the mma.sync and the wgmma kernels
    python benchmarks/attention.py traffic   # simulator: measured bytes, S = 64 and 256
    python benchmarks/attention.py gpu       # a GPU: ms and TFLOP/s vs CuPy's three kernels
                                             # (on sm_90a also wgmma in turn, and mma.sync)
    python benchmarks/attention.py           # all of them

The roofline figures are a MODEL, not a measurement: time >= max(FLOPs / peak, bytes / 3.35
TB/s) on an H100 SXM (989 TFLOP/s dense float16 on tensor cores, 67 TFLOP/s float32 SIMT). The
peers' figures are static SASS counts of a hand-written CUDA C++ flash kernel and Triton 3.9's
tutorial kernel, compiled offline for sm_80 with ptxas/nvdisasm 13.5 (not timings).
"""

import numpy as np
from _steps import run
from rich.console import Console
from rich.table import Table

console = Console(width=170)

BANDWIDTH = 3.35e12
PEAK = {np.dtype(np.float16): 989e12, np.dtype(np.float32): 67e12}
# (kernel, warps, regs, spills, smem B, per K/V tile: HMMA, LDSM, EX2, instructions) at D = 64,
# 64-key tiles, sm_80 builds (2026-11-22). Per warp of 16 query rows (Triton: 8 warps of 16).
PEERS = [
    ("CUDA C++", 4, 166, 0, 40960, 64, 32, 34, 350),
    ("Triton 3.9", 8, 166, 0, 49152, 64, 36, None, 351),
]
SCORES_PER_LANE = 16 * 64 // 32


def model() -> None:
    from tessera_tile import ops, profiling

    table = Table(title="flash attention, roofline MODEL on an H100 (not a measurement)")
    for col in ("call", "FLOPs", "global B", "compulsory B", "naive 3-kernel B", "FLOP/B",
                "time >= (all from DRAM)", "time >= (K/V re-reads in L2)"):  # fmt: skip
        table.add_column(col, justify="left" if col == "call" else "right")
    for b, h, s, d, dtype, causal in (
        (4, 16, 4096, 64, np.float16, False),
        (4, 16, 4096, 64, np.float16, True),
        (4, 16, 4096, 128, np.float16, False),
        (4, 16, 1024, 64, np.float32, False),
    ):
        q = np.zeros((b, h, s, d), dtype)
        ex = ops.attention.explain(q, q, q, causal=causal)
        flops = profiling.explain_flops(ops.attention, q, q, q, causal=causal)
        compulsory = 4 * q.nbytes  # Q, K, V read once, O written once
        compute = flops / PEAK[q.dtype]
        table.add_row(
            f"{b}x{h} heads, S {s}, D {d}, {q.dtype}{', causal' if causal else ''}",
            f"{flops:.3g}", f"{ex.bytes_fused:.3g}", f"{compulsory:.3g}",
            f"{ex.bytes_unfused:.3g}", f"{flops / compulsory:.0f}",
            f"{max(compute, ex.bytes_fused / BANDWIDTH) * 1e3:.3f} ms",
            f"{max(compute, compulsory / BANDWIDTH) * 1e3:.3f} ms",
        )  # fmt: skip
    console.print(table)
    console.print(
        "global B: what the kernel requests (K and V once per block of query rows, as the "
        "simulator measures); one head's K and V (at most 2 MiB here) stay in the 50 MiB L2, so "
        "DRAM sees about the compulsory bytes and the last column is the likelier bound."
    )


def sass() -> None:
    from tessera_tile import inspect
    from tessera_tile.kernels.attention import tc as fa

    signature = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
    for arch in ("sm_80", "sm_90"):
        table = Table(title=f"flash attention, K/V loop per 64-key tile per warp ({arch})")
        for col in ("kernel", "warps x rows", "regs", "spills", "smem B", "occupancy", "HMMA",
                    "LDSM", "EX2/score", "instr", "instr/score"):  # fmt: skip
            table.add_column(col, justify="left" if col == "kernel" else "right")
        for d, causal in ((64, False), (64, True), (128, False)):
            cfg = fa.default_config(d)
            r = inspect.compile(fa.flash_attention(d, causal, True), signature, arch=arch,
                                block=cfg.threads, dynamic_shared=cfg.shared_bytes(d))  # fmt: skip
            loop = r.loop_with("HMMA")
            m16 = cfg.warp_rows // 16  # 16-row mma tiles per warp
            tiles = loop.count("HMMA") / (2 * m16 * (cfg.block_kv // 8) * (d // 16))
            scores = cfg.warp_rows * cfg.block_kv // 32  # a warp's scores of a tile, per lane
            table.add_row(
                f"tessera_tile D = {d}{' causal' if causal else ''}",
                f"{cfg.num_warps} x {cfg.warp_rows}", str(r.registers),
                str(r.spill_stores + r.spill_loads),
                str(r.shared_bytes + r.dynamic_shared_bytes), f"{r.occupancy:.2f}",
                f"{loop.count('HMMA') / tiles:.0f}", f"{loop.count('LDSM') / tiles:.0f}",
                f"{loop.count('MUFU.EX2') / tiles / scores:.3f}",
                f"{loop.instructions / tiles:.0f}", f"{loop.instructions / tiles / scores:.2f}",
            )  # fmt: skip
        for name, warps, regs, spills, smem, hmma, ldsm, ex2, instr in PEERS:
            table.add_row(
                f"{name} D = 64 (sm_80 build)", f"{warps} x 16", str(regs), str(spills), str(smem),
                "",
                str(hmma), str(ldsm), "" if ex2 is None else f"{ex2 / SCORES_PER_LANE:.3f}",
                str(instr), f"{instr / SCORES_PER_LANE:.2f}", style="dim",
            )  # fmt: skip
        console.print(table)
    wgmma_sass(signature)
    console.print(
        "Static counts of the steady-state loop (unmasked tiles; the masked diagonal is a "
        "loop of its own), divided by the tiles one pass of it processes. Not timings."
    )


def wgmma_sass(signature: str) -> None:
    """The warpgroup-MMA kernel (what a GPU of compute capability 9.0 runs), per warpgroup."""
    from tessera_tile import inspect
    from tessera_tile.kernels.attention import wgmma as aw

    table = Table(title="flash attention on wgmma, K/V loop per 64-key tile per warpgroup (sm_90)")
    for col in ("kernel", "regs", "spills", "smem B", "HGMMA", "LDS+LDSM", "EX2/score", "instr",
                "instr/score"):  # fmt: skip
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for d in (64, 128):
        for cfg in (aw.default_config(d), aw.WgmmaAttentionConfig(64, 8, 2, False)):
            r = inspect.compile(aw.wgmma_attention(d, False, cfg), signature, arch="sm_90",
                                block=cfg.threads, dynamic_shared=cfg.shared_bytes(d))  # fmt: skip
            loop = r.loop_with("HGMMA")
            tiles = loop.count("HGMMA") / (d // 16 + cfg.block_kv // 16)
            scores = 64 * cfg.block_kv // 128  # a warpgroup's scores of a tile, per thread
            table.add_row(
                f"D = {d}, {'overlapped' if cfg.overlap else 'in turn'}, {cfg.num_stages} "
                "stages", str(r.registers), str(r.spill_stores + r.spill_loads),
                str(r.dynamic_shared_bytes), f"{loop.count('HGMMA') / tiles:.0f}",
                str(loop.count("LDS") + loop.count("LDSM")),
                f"{loop.count('MUFU.EX2') / tiles / scores:.3f}",
                f"{loop.instructions / tiles:.0f}", f"{loop.instructions / tiles / scores:.2f}",
            )  # fmt: skip
    console.print(table)


def traffic() -> None:
    from tessera_tile import ops, sim
    from tessera_tile.kernels.attention import tc as fa

    table = Table(title="simulator profile, float16, D = 64, one head (measured global bytes)")
    for col in ("S", "causal", "measured B", "predicted B", "K/V B", "naive 3-kernel B",
                "K/V tiles run", "bank conflicts"):  # fmt: skip
        table.add_column(col, justify="right")
    rng = np.random.default_rng(0)
    for s in (64, 256):
        q, k, v = (rng.standard_normal((1, s, 64)).astype(np.float16) for _ in range(3))
        for causal in (False, True):
            with sim.profile() as prof:
                ops.attention(q, k, v, causal=causal)
            ex = ops.attention.explain(q, k, v, causal=causal)
            kv = prof.bytes_read - s * 64 * 2  # all but Q
            cfg = fa.default_config(64, s)
            tiles = -(-s // cfg.block_q) * -(-s // cfg.block_kv)  # K/V tiles without skipping
            table.add_row(
                str(s), str(causal), str(prof.bytes_read + prof.bytes_written),
                str(ex.bytes_fused), str(kv), str(ex.bytes_unfused),
                f"{kv // (2 * 64 * 64 * 2)} of {tiles}", str(prof.bank_conflicts),
            )  # fmt: skip
    console.print(table)


def naive(xp, q, k, v, scale):
    """Three kernels' worth of ``xp`` (CuPy): the S x S scores written, a float32 softmax,
    P @ V."""
    s = (q @ k.swapaxes(-1, -2)).astype(xp.float32) * scale
    p = xp.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p.astype(q.dtype) @ v


def gpu() -> None:
    from numba import cuda

    if not cuda.is_available():
        console.print("gpu: skipped, no CUDA GPU on this machine (nothing was timed)")
        return
    import cupy as cp

    from tessera_tile import dynamic_shared, ops
    from tessera_tile.cli.bench_ref import time_ms
    from tessera_tile.kernels.attention import tc as fa
    from tessera_tile.kernels.attention import wgmma as aw

    in_turn = aw.WgmmaAttentionConfig(64, 8, 2, False)
    producer = aw.WgmmaAttentionConfig(64, 8, 3, True, True)

    for s, d in ((1024, 64), (4096, 64), (4096, 128)):
        q, k, v = (cp.random.standard_normal((4, 16, s, d)).astype(cp.float16) for _ in range(3))
        flops = 4 * 4 * 16 * s * s * d
        scale = d**-0.5
        configs = [("tessera_tile", None)]
        if dynamic_shared.wgmma():  # the default is the overlapped wgmma kernel: the others
            configs += [
                ("wgmma in turn", in_turn),
                ("wgmma, producer warpgroup", producer),
                ("mma.sync", fa.default_config(d, s)),
            ]
        calls = [("cupy, 3 kernels", lambda q=q, k=k, v=v, c=scale: naive(cp, q, k, v, c))]
        calls += [
            (label, lambda q=q, k=k, v=v, c=c: ops.attention(q, k, v, config=c))
            for label, c in configs
        ]
        reference = calls[0][1]()
        for label, fn in calls:
            diff = float(cp.abs(fn() - reference).max())
            seconds = time_ms(fn) / 1e3
            console.print(
                f"{label:16} 4 x 16 heads, S {s}, D {d}, float16: {seconds * 1e3:.3f} ms, "
                f"{flops / seconds / 1e12:.1f} TFLOP/s (largest difference from CuPy's "
                f"{diff:.2e})"
            )


if __name__ == "__main__":
    run(
        __doc__,
        {"model": model, "sass": sass, "traffic": traffic, "gpu": gpu},
        frozenset({"traffic"}),
    )
