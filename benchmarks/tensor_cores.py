"""The float16 tensor-core matmul in SASS, next to expert CUDA C++ and Triton kernels of the same
shape, and the TF32 matmul (float32 with ``precision="tf32"``) next to Triton's TF32 GEMM (static
counts from real compilation, no GPU; printed, never asserted).

    python benchmarks/tensor_cores.py           # sm_80 and sm_90
    python benchmarks/tensor_cores.py sm_80

Columns: registers, spills, shared memory (the kernels' rings are dynamic shared memory, given at
launch), and per k-tile of the main loop (the SASS loop
holding the HMMAs, unrolled over the pipeline's stages): HMMA, LDSM, HMMA per LDSM,
instructions per HMMA and barriers (TF32: also the scalar shared loads of B, LDS).
"""

import sys

from rich.console import Console
from rich.table import Table

from tessera_tile import inspect
from tessera_tile.kernels.matmul import tc
from tessera_tile.kernels.matmul import tf32 as tf

console = Console(width=150)
SIGNATURE = "void(float16[:, :, ::1], float16[:, :, ::1], float32[::1], float16[:, :, ::1])"
TF32_SIGNATURE = "void(float32[:, :, ::1], float32[:, :, ::1], float32[::1], float32[:, :, ::1])"

# Peers: fp16 GEMM 128x128x32, mma.sync m16n8k16 + ldmatrix + 3-stage cp.async, hand-written CUDA
# C++ and Triton 3.9, compiled offline with ptxas 13.5 for sm_80 on 2026-11-22 (static counts).
# (name, warps, regs, spills, smem, HMMA/k-tile, LDSM/k-tile, instructions/k-tile, BAR/k-tile)
ANCHORS = [
    ("CUDA C++", 4, 220, 0, 49152, 64, 16, 130, 1),
    ("CUDA C++", 8, 124, 0, 49152, 32, 12, 77, 1),
    ("Triton 3.9", 4, 254, 0, 32768, 64, 16, 183, 3),
    ("Triton 3.9", 8, 174, 0, 32768, 32, 12, 123, 3),
]

OURS = [
    ("tessera_tile (cp.async)", tc.matmul_tc_anchor, tc.ANCHOR),
    ("tessera_tile (cp.async)", tc.matmul_tc_8warps, tc.ANCHOR._replace(num_warps=8)),
    ("tessera_tile (sync fallback)", tc.matmul_tc_sync,
     tc.ANCHOR._replace(num_warps=8, num_stages=2, async_copy=False)),
    ("tessera_tile 256x128x64 (cp.async)", tc.matmul_tc_256x128x64,
     tc.TensorCoreConfig(256, 128, 64, 8, 3)),
    ("tessera_tile 128x256x32 (cp.async)", tc.matmul_tc_128x256,
     tc.TensorCoreConfig(128, 256, 32, 8, 3)),
]  # fmt: skip


# Peer: f32 GEMM via TF32 tensor cores, 128x128x32, Triton, sm_80 (same builds): whole-kernel
# counts only. (name, regs, spills, smem, HMMA, LDSM, instructions)
TF32_ANCHORS = [("Triton 3.9", 158, 0, 65536, 64, 20, 648)]

OURS_TF32 = [
    ("tessera_tile (cp.async)", tf.matmul_tf32_anchor, tf.ANCHOR),
    ("tessera_tile (cp.async)", tf.matmul_tf32_4warps,
     tf.ANCHOR._replace(tile_n=64, num_warps=4)),
    ("tessera_tile (+ bias, exact gelu)", tf.linear_tf32_gelu_bias, tf.ANCHOR),
    ("tessera_tile (cp.async)", tf.matmul_tf32_wide,
     tf.ANCHOR._replace(tile_k=32, num_warps=4)),
]  # fmt: skip


def tf32_table(arch: str) -> Table:
    table = Table(title=f"f32 GEMM on TF32 tensor cores, main loop per k-tile ({arch})")
    for col in ("kernel", "tile", "warps", "regs", "spills", "smem B", "HMMA", "LDSM", "LDS",
                "HMMA/LDSM", "instr", "instr/HMMA", "BAR"):  # fmt: skip
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for name, kernel, cfg in OURS_TF32:
        r = inspect.compile(
            kernel, TF32_SIGNATURE, arch, block=cfg.threads, dynamic_shared=cfg.shared_bytes
        )
        loop = r.loop_with("HMMA")
        hmma, ldsm = loop.count("HMMA"), loop.count("LDSM")
        lds = sum(
            1 for fn in r.functions if fn.name == loop.function for i in fn.instructions
            if i.offset in loop and i.opcode.split(".")[0] == "LDS" and "@!PT" not in i.predicate
        )  # fmt: skip
        tiles = hmma / cfg.mma_per_k_tile
        table.add_row(
            name, f"{cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k}", str(cfg.num_warps), str(r.registers),
            str(r.spill_stores + r.spill_loads), str(r.shared_bytes + r.dynamic_shared_bytes),
            f"{hmma / tiles:.0f}",
            f"{ldsm / tiles:.0f}", f"{lds / tiles:.0f}", f"{hmma / ldsm:.2f}",
            f"{loop.instructions / tiles:.0f}", f"{loop.instructions / hmma:.2f}",
            f"{loop.count('BAR.SYNC') / tiles:.0f}",
        )  # fmt: skip
    for name, regs, spills, smem, hmma, ldsm, instr in TF32_ANCHORS:
        table.add_row(
            f"{name} (sm_80 build, whole kernel)", "128x128x32", "4", str(regs), str(spills),
            str(smem), str(hmma), str(ldsm), "-", f"{hmma / ldsm:.2f}", str(instr), "-", "-",
            style="dim",
        )  # fmt: skip
    return table


def main(archs) -> None:
    for arch in archs:
        table = Table(title=f"fp16 GEMM, main loop per k-tile ({arch})")
        for col in ("kernel", "warps", "regs", "spills", "smem B", "HMMA", "LDSM",
                    "HMMA/LDSM", "instr", "instr/HMMA", "BAR"):  # fmt: skip
            table.add_column(col, justify="left" if col == "kernel" else "right")
        for name, kernel, cfg in OURS:
            r = inspect.compile(
                kernel, SIGNATURE, arch, block=cfg.threads, dynamic_shared=cfg.shared_bytes
            )
            loop = r.loop_with("HMMA")
            hmma, ldsm = loop.count("HMMA"), loop.count("LDSM")
            tiles = hmma / cfg.mma_per_k_tile  # k-tiles in one pass of the loop body
            table.add_row(
                name, str(cfg.num_warps), str(r.registers), str(r.spill_stores + r.spill_loads),
                str(r.shared_bytes + r.dynamic_shared_bytes), f"{hmma / tiles:.0f}",
                f"{ldsm / tiles:.0f}",
                f"{hmma / ldsm:.2f}", f"{loop.instructions / tiles:.0f}",
                f"{loop.instructions / hmma:.2f}", f"{loop.count('BAR.SYNC') / tiles:.0f}",
            )  # fmt: skip
        for name, warps, regs, spills, smem, hmma, ldsm, instr, bar in ANCHORS:
            table.add_row(
                f"{name} (sm_80 build)", str(warps), str(regs), str(spills), str(smem),
                str(hmma), str(ldsm), f"{hmma / ldsm:.2f}", str(instr), f"{instr / hmma:.2f}",
                str(bar), style="dim",
            )  # fmt: skip
        console.print(table)
        console.print(tf32_table(arch))
    console.print(
        "Static counts from one compilation each (ptxas of the toolchain `inspect` reports), not "
        "timings; the peers' rows come from sm_80 builds (on sm_90a Triton uses wgmma instead)."
    )


if __name__ == "__main__":
    main(sys.argv[1:] or ["sm_80", "sm_90"])
