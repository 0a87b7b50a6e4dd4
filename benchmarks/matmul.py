"""matmul, linear and mlp: the roofline model, SASS beside the peer kernels, measured traffic,
and (on a GPU only) TFLOP/s against CuPy's matmul. Prints tables; asserts nothing.

    python benchmarks/matmul.py model     # predicted bytes, FLOPs, intensity, H100 roofline
    python benchmarks/matmul.py sass      # compiled offline for sm_80 and sm_90 (no GPU needed)
    python benchmarks/matmul.py traffic   # simulator: measured global bytes vs the prediction
    python benchmarks/matmul.py fused     # @tt.fuse GEMM stages: epilogue SASS beside ops.linear
    python benchmarks/matmul.py prologue  # @tt.fuse operand prologues: SASS per k-tile
    python benchmarks/matmul.py gpu       # a GPU: TFLOP/s vs cupy.matmul (cuBLAS), float32 and
                                          # float16 (each wgmma tile on sm_90a); else skipped
    python benchmarks/matmul.py           # all of them

The roofline figures are a MODEL, not a measurement: time >= max(FLOPs / peak, bytes / 3.35
TB/s) on an H100 SXM (67 TFLOP/s float32 SIMT FFMA; 989 TFLOP/s dense float16 on tensor cores).
The peer figures are static SASS counts of expert hand-written CUDA C++ kernels and Triton 3.9
kernels compiled offline with ptxas/nvdisasm 13.5 (not timings).
"""

import numpy as np
from _steps import run
from rich.console import Console
from rich.table import Table

console = Console(width=170)

BANDWIDTH = 3.35e12
PEAK = {"float32 SIMT": 67e12, "float16 tensor cores": 989e12}

# Peer kernels (static SASS, ptxas 13.5, 2026-11-22).
PEERS = [
    ("SIMT f32 GEMM 128x128x8, 8x8/thread, 3-stage cp.async", "CUDA C++", "sm_90",
     "123 regs, 0 spills, 24960 B smem, 800 instr, main loop 16 FFMA per LDS "
     "(LDGSTS.128:3 LDS.128:32 FFMA:512)"),
    ("same, exact fp32", "Triton 3.9", "sm_90a",
     "181 regs, 0 spills, 16384 B smem, 868 instr, main loop 12.8 FFMA per LDS (LDS.128:56)"),
    ("gelu(X@W+b) epilogue, exact erf, 8 warps (fp16 GEMM)", "CUDA C++", "sm_80",
     "128 regs, 0 spills, epilogue 25.3 instr per output element"),
    ("same, 4 / 8 warps", "Triton 3.9", "sm_80",
     "255 / 176 regs, 264 B spilled at 4 warps, epilogue 33.7 instr per output element"),
]  # fmt: skip


def problems():
    """(label, op, args, kwargs) at sizes of a transformer layer and a square GEMM."""
    from tessera_tile import ops

    f32, f16 = np.float32, np.float16
    z = np.zeros
    tokens, d, hidden = 4096, 1024, 4096
    return [
        ("matmul 4096^3 f32", ops.matmul, (z((4096, 4096), f32), z((4096, 4096), f32)), {}),
        ("matmul 4096^3 f16", ops.matmul, (z((4096, 4096), f16), z((4096, 4096), f16)), {}),
        (
            "matmul batch 32 x (512 x 64) @ (64 x 512) f32",
            ops.matmul,
            (z((32, 512, 64), f32), z((32, 64, 512), f32)),
            {},
        ),  # fmt: skip
        (
            f"linear gelu {tokens} x {d} -> {hidden} f32",
            ops.linear,
            (z((tokens, d), f32), z((d, hidden), f32), z(hidden, f32), "gelu"),
            {},
        ),  # fmt: skip
        (
            f"mlp gelu {tokens} x {d} -> {hidden} -> {d} f32",
            ops.mlp,
            (
                z((tokens, d), f32),
                z((d, hidden), f32),
                z(hidden, f32),
                z((hidden, d), f32),
                z(d, f32),
            ),
            {},
        ),  # fmt: skip
    ]


def flops_of(label: str, args) -> int:
    if label.startswith("mlp"):
        x, w1, _, w2, _ = args
        return (
            2 * x.shape[0] * w1.shape[0] * w1.shape[1] + 2 * x.shape[0] * w2.shape[0] * w2.shape[1]
        )
    a, b = args[0], args[1]
    batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])))
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def model() -> None:
    table = Table(title="roofline MODEL on an H100 SXM (not a measurement)")
    for col in ("op", "kernels", "predicted bytes", "FLOPs", "FLOP/byte", "bound (this kernel)",
                "bound if float16 on tensor cores", "unfused bytes"):  # fmt: skip
        table.add_column(col, justify="left" if col == "op" else "right")
    for label, op, args, kwargs in problems():
        ex = op.explain(*args, **kwargs)
        flops, nbytes = flops_of(label, args), ex.bytes_fused
        peak = PEAK["float32 SIMT"]
        seconds = max(flops / peak, nbytes / BANDWIDTH)
        tc = ""
        if "f16" in label:
            tc_s = max(flops / PEAK["float16 tensor cores"], nbytes / BANDWIDTH)
            tc = f"{tc_s * 1e6:.0f} us ({flops / tc_s / 1e12:.0f} TFLOP/s)"
        table.add_row(
            label, str(ex.kernels), f"{nbytes:,}", f"{flops:,}", f"{flops / nbytes:.0f}",
            f"{seconds * 1e6:.0f} us ({flops / seconds / 1e12:.1f} TFLOP/s, "
            f"{'compute' if flops / peak >= nbytes / BANDWIDTH else 'memory'})",
            tc, f"{ex.bytes_unfused:,}",
        )  # fmt: skip
    console.print(table)
    console.print(
        "predicted bytes: A read once per column of C tiles, B once per row of them, the bias "
        "once per row of them, C written once (the simulator measures exactly this); a MODEL "
        "of DRAM traffic that ignores L2 hits. float16 runs on the tensor cores (the last "
        "column's bound)."
    )


def sass() -> None:
    from tessera_tile import inspect
    from tessera_tile.kernels import epilogue
    from tessera_tile.kernels.matmul import simt as km
    from tessera_tile.kernels.matmul import tc
    from tessera_tile.tile_config import CANDIDATES

    table = Table(title="ours, compiled offline (static SASS, ptxas 13.5): not timings")
    for col in ("kernel", "arch", "regs", "spills", "smem B", "instr", "main loop",
                "FFMA / shared load", "epilogue instr / output element"):  # fmt: skip
        table.add_column(col)
    sig = km.signature()
    for arch in ("sm_80", "sm_90"):
        for cfg in CANDIDATES:
            r = inspect.compile(km.simt_matmul(cfg), sig, arch=arch, block=cfg.threads)
            loop = r.loop_with("FFMA")
            ratio = loop.count("FFMA") / loop.count("LDS")
            table.add_row(
                f"matmul {cfg.tile_m}x{cfg.tile_n}x{cfg.tile_k} w{cfg.num_warps}", arch,
                str(r.registers), str(r.spill_stores + r.spill_loads), str(r.shared_bytes),
                str(r.instructions), f"{loop.instructions} instr, {loop.count('FFMA')} FFMA",
                f"{ratio:.1f}", "",
            )  # fmt: skip
        for name, kernel, dtype, cfg in (
            ("tensor cores float16 128x128x32 w4", tc.matmul_tc_anchor, "float16", tc.ANCHOR),
            ("tensor cores bfloat16 128x128x32 w4", tc.matmul_bf16_anchor, "uint16", tc.ANCHOR),
            ("tensor cores float16 256x128x64 w8", tc.matmul_tc_256x128x64, "float16",
             tc.TensorCoreConfig(256, 128, 64, 8, 3)),
        ):  # fmt: skip
            t = f"{dtype}[:, :, ::1]"
            r = inspect.compile(
                kernel, f"void({t}, {t}, float32[::1], {t})", arch,
                block=cfg.threads, dynamic_shared=cfg.shared_bytes,
            )  # fmt: skip
            loop = r.loop_with("HMMA")
            hmma = loop.count("HMMA")
            table.add_row(
                name, arch, str(r.registers), str(r.spill_stores + r.spill_loads),
                str(r.shared_bytes + r.dynamic_shared_bytes), str(r.instructions),
                f"{loop.instructions} instr, {hmma} HMMA ({loop.instructions / hmma:.2f}/HMMA)",
                "", "",
            )  # fmt: skip
        plain = inspect.compile(km.simt_matmul(CANDIDATES[0]), sig, arch=arch)
        for name in ("gelu", "gelu_tanh", "silu", "relu"):
            k = km.simt_matmul(CANDIDATES[0], epilogue.ACTIVATIONS[name], True)
            r = inspect.compile(k, sig, arch=arch)
            per = (r.instructions - plain.instructions) / 64
            table.add_row(
                f"linear {name}+bias 128x128x8", arch, str(r.registers),
                str(r.spill_stores + r.spill_loads), str(r.shared_bytes), str(r.instructions),
                "", "", f"{per:.1f}",
            )  # fmt: skip
    console.print(table)
    peers = Table(title="peer kernels (static SASS, ptxas 13.5)")
    for col in ("kernel", "toolchain", "arch", "figures"):
        peers.add_column(col)
    for row in PEERS:
        peers.add_row(*row)
    console.print(peers)
    console.print(
        "shared loads: LDS executed in the loop (ptxas's never-true '@!PT LDS RZ, [RZ]' padding "
        "excluded); epilogue: (linear SASS - matmul SASS) / 64 elements of the 8x8 register tile."
    )


def traffic() -> None:
    from tessera_tile import TileConfig, ops, sim

    cfg = TileConfig(32, 32, 8, 1, 3)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((70, 40), np.float32), rng.standard_normal((40, 68), np.float32)
    bias = rng.standard_normal(68, np.float32)
    table = Table(title=f"simulator profile, (70 x 40) @ (40 x 68) float32, tile {cfg}")
    for col in ("op", "measured B", "predicted B", "bank conflicts"):
        table.add_column(col)
    for label, op, args in (
        ("matmul", ops.matmul, (a, b)),
        ("linear + bias, gelu", ops.linear, (a, b, bias, "gelu")),
    ):
        with sim.profile() as prof:
            op(*args, config=cfg)
        predicted = op.explain(*args, config=cfg).bytes_fused
        table.add_row(
            label, str(prof.bytes_read + prof.bytes_written), str(predicted),
            str(prof.bank_conflicts),
        )  # fmt: skip
    residual = rng.standard_normal((70, 68), np.float32)
    for label, fn, args in (  # fused functions: each on its own tile
        ("@tt.fuse gelu(x @ w + b) * s + r", _residual_block(), (a, b, bias, residual, 0.5)),
        ("@tt.fuse relu(x) @ w (a prologue)", _relu_in(), (a, b)),
    ):
        with sim.profile() as prof:
            fn(*args)
        table.add_row(
            label, str(prof.bytes_read + prof.bytes_written), str(fn.explain(*args).bytes_fused),
            str(prof.bank_conflicts),
        )  # fmt: skip
    console.print(table)


def _relu_in():
    import tessera_tile as tt

    return tt.fuse(lambda x, w: tt.relu(x) @ w)


def _residual_block():
    import tessera_tile as tt

    @tt.fuse
    def residual_block(x, w, b, r, scale):
        return tt.gelu(x @ w + b) * scale + r

    return residual_block


def fused() -> None:
    """Per output element, the SASS a GEMM stage's epilogue adds to the plain product: the
    composer's ``gelu(x @ w + b)`` beside ``ops.linear``'s and the anchors' (static counts,
    over the outputs each thread of the default tile stores)."""
    import tessera_tile as tt
    from tessera_tile import ops

    @tt.fuse
    def linear_gelu(x, w, b):
        return tt.gelu(x @ w + b)

    block = _residual_block()
    table = Table(
        title="GEMM stages in @tt.fuse: SASS instructions per output element (M 512, K 256, "
        "N 512), over the plain product's kernel"
    )
    for col in ("arch", "dtype", "tile", "gelu(x @ w + b)", "ops.linear gelu", "* s + r", "regs"):
        table.add_column(col)
    for dtype in (np.float16, np.float32):
        x, w, b, r = (np.zeros(s, dtype) for s in ((512, 256), (256, 512), (512,), (512, 512)))
        for arch in ("sm_80", "sm_90"):
            plain = sum(ops.matmul.inspect(x, w, arch=arch)[0].histogram.values())
            ours = linear_gelu.inspect(x, w, b, arch=arch)[0]
            theirs = ops.linear.inspect(x, w, b, "gelu", arch=arch)[0]
            with_r = block.inspect(x, w, b, r, 0.5, arch=arch)[0]
            cfg = ops.matmul._plan(x, w).tile_config()
            per = cfg.tile_m * cfg.tile_n // cfg.threads
            table.add_row(
                arch, np.dtype(dtype).name, ours.name.split("_epilogue")[0],
                f"{(sum(ours.histogram.values()) - plain) / per:.1f}",
                f"{(sum(theirs.histogram.values()) - plain) / per:.1f}",
                f"{(sum(with_r.histogram.values()) - plain) / per:.1f}", str(ours.registers),
            )  # fmt: skip
    console.print(table)
    console.print(
        "anchors (sm_80, fp16 GEMM, gelu, exact erf): CUDA C++ 25.3, Triton 3.9 33.7 per element"
    )


def prologue() -> None:
    """Per k-tile of the main loop, the SASS of ``tt.relu(x) @ w`` (a prologue on A: a pass
    over each landed tile, one more barrier) beside the plain product's (static counts of the
    loop, unrolled over the stages), and MMAs (FFMAs) per shared load beside the anchor's."""
    import tessera_tile as tt

    table = Table(title="operand prologues: main-loop SASS per k-tile (M 512, K 256, N 512)")
    for col in ("arch", "dtype", "kernel", "plain", "relu(x) @ w", "MMA per LDS", "regs (plain)"):
        table.add_column(col)
    relu_in, plain = _relu_in(), tt.fuse(lambda x, w: x @ w)

    def figures(loop, mma, barriers):
        loads = sum(v for op, v in loop.histogram.items() if op.startswith("LDS"))
        return loop.instructions / (loop.count("BAR.SYNC") / barriers), loop.count(mma) / loads

    for dtype in (np.float16, np.float32):
        x, w = np.zeros((512, 256), dtype), np.zeros((256, 512), dtype)
        mma = "HMMA" if dtype == np.float16 else "FFMA"
        for arch in ("sm_80", "sm_90"):
            ours = relu_in.inspect(x, w, arch=arch)[0]
            per_tile, ratio = figures(ours.loop_with(mma), mma, 2)
            base, regs = "-", str(ours.registers)
            if mma == "FFMA" or arch == "sm_80":  # float16 on sm_90: the plain plans wgmma
                theirs = plain.inspect(x, w, arch=arch)[0]
                plain_tile, plain_ratio = figures(theirs.loop_with(mma), mma, 1)
                base, regs = f"{plain_tile:.1f}", f"{regs} ({theirs.registers})"
                ratio = f"{ratio:.1f} (plain {plain_ratio:.1f})"
            else:
                ratio = f"{ratio:.1f}"
            table.add_row(
                arch, np.dtype(dtype).name, ours.name, base, f"{per_tile:.1f}", ratio, regs
            )
    console.print(table)
    console.print(
        "anchor (sm_90, the expert CUDA C++ SIMT GEMM 128x128x8, 8x8 per thread): 16 FFMA per "
        "shared load in its main loop"
    )


def gpu() -> None:
    from numba import cuda

    if not cuda.is_available():
        console.print("gpu: skipped, no CUDA GPU on this machine (nothing was timed)")
        return
    import cupy as cp

    from tessera_tile import ops
    from tessera_tile.cli.bench_ref import time_ms

    for n in (1024, 2048, 4096):
        a = cp.random.standard_normal((n, n), dtype=cp.float32)
        b = cp.random.standard_normal((n, n), dtype=cp.float32)
        calls = (
            ("tessera_tile", lambda a=a, b=b: ops.matmul(a, b)),
            ("tessera_tile tf32", lambda a=a, b=b: ops.matmul(a, b, precision="tf32")),
            ("cupy", lambda a=a, b=b: a @ b),
        )
        for label, fn in calls:
            seconds = time_ms(fn) / 1e3
            console.print(f"{label:17} {n}^3 float32: {2 * n**3 / seconds / 1e12:.1f} TFLOP/s")
    float16_tiles()
    prologue_times()


def float16_tiles(n: int = 4096) -> None:
    """float16 n^3: each warpgroup-MMA tile the tuner offers (the warp-specialised 12-warp ones
    included) where that kernel runs, else the tuner's choice, beside CuPy; with each result's
    largest difference from CuPy's float32 product, relative to its largest element."""
    import cupy as cp

    from tessera_tile import dynamic_shared, ops, tile_config
    from tessera_tile.cli.bench_ref import time_ms

    a = (cp.random.standard_normal((n, n), dtype=cp.float32) * 0.05).astype(cp.float16)
    b = (cp.random.standard_normal((n, n), dtype=cp.float32) * 0.05).astype(cp.float16)
    want = a.astype(cp.float32) @ b.astype(cp.float32)
    scale = float(cp.abs(want).max())
    configs = tile_config.WGMMA_CANDIDATES if dynamic_shared.wgmma() else (None,)
    calls = [(str(c) if c else "tuned", lambda c=c: ops.matmul(a, b, config=c)) for c in configs]
    for label, fn in [*calls, ("cupy", lambda: a @ b)]:
        err = float(cp.abs(fn().astype(cp.float32) - want).max()) / scale
        seconds = time_ms(fn) / 1e3
        console.print(
            f"{label:48} {n}^3 float16: {2 * n**3 / seconds / 1e12:.1f} TFLOP/s, "
            f"largest error {err:.1e}"
        )


def prologue_times(n: int = 4096) -> None:
    """float16 ``relu(x) @ w`` for M = n, K = n and N from one tile of C to n: the prologue (one
    kernel) beside relu written by a kernel of its own, then the product, and CuPy."""
    import cupy as cp

    import tessera_tile as tt
    from tessera_tile import ops
    from tessera_tile.cli.bench_ref import time_ms

    relu_in, relu = _relu_in(), tt.fuse(lambda x: tt.relu(x))
    x = (cp.random.standard_normal((n, n), dtype=cp.float32) * 0.05).astype(cp.float16)
    for cols in (128, 1024, n):
        w = (cp.random.standard_normal((n, cols), dtype=cp.float32) * 0.05).astype(cp.float16)
        calls = (
            ("prologue, one kernel", lambda w=w: relu_in(x, w)),
            ("relu kernel, then matmul", lambda w=w: ops.matmul(relu(x), w)),
            ("cupy", lambda w=w: cp.maximum(x, 0) @ w),
        )
        for label, fn in calls:
            console.print(f"relu(x) @ w, {n} x {n} @ {n} x {cols}, {label:25} {time_ms(fn):.3f} ms")


if __name__ == "__main__":
    run(
        __doc__,
        {
            "model": model,
            "sass": sass,
            "traffic": traffic,
            "fused": fused,
            "prologue": prologue,
            "gpu": gpu,
        },  # fmt: skip
        frozenset({"traffic"}),
    )
