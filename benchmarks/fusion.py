"""What @tt.fuse buys, measured without a GPU, printed as tables (never asserted in tests).

    python benchmarks/fusion.py traffic   # simulator: measured global bytes vs one kernel per op
    python benchmarks/fusion.py sass      # real compilation: ours next to expert CUDA and Triton
    python benchmarks/fusion.py compile   # cold compile time of a fused kernel, cache-hit cost
    python benchmarks/fusion.py           # all three

``traffic`` runs in the simulator (the script re-executes itself with NUMBA_ENABLE_CUDASIM=1);
``sass`` and ``compile`` need the real compiler and no GPU.
"""

import time

import ml_dtypes
import numpy as np
from _steady_state import marginal, streamed, whole
from _steps import run
from rich.console import Console
from rich.table import Table

console = Console(width=150)

# Peer kernels from the project's anchors table: hand-written CUDA C++ and Triton 3.9, compiled
# offline with ptxas 13.5 for sm_90 / sm_90a on 2026-11-22. Static SASS counts, not timings.
ANCHORS = {
    "chain": [
        ("CUDA C++ (IEEE div)", 34, 322, "LDG.128:3 STG.128:1 FFMA:82 MUFU.EX2:10 MUFU.RCP:14"),
        ("CUDA C++ fast math", 31, 81, "LDG.128:3 STG.128:1 FFMA:15 MUFU.TANH:10"),
        ("Triton", 32, 276, "LDG.128:6 STG.128:2 FFMA:64 MUFU.EX2:16 MUFU.RCP:16"),
    ],
    "layer_norm": [
        ("CUDA C++ (256 threads/row)", 44, 175, "LDG.128:12 STG.128:4 SHFL:16 BAR:2 MUFU.RSQ:1"),
        ("Triton", 40, 241, "LDG.128:12 STG.128:4 SHFL:16 BAR:3 FFMA:41"),
    ],
    "softmax": [
        ("CUDA C++ (1 warp/row)", 48, 354, "LDG.128:8 STG.128:8 SHFL:10 MUFU.EX2:32 MUFU.RCP:1"),
        ("Triton (1 warp)", 60, 476, "LDG.128:8 STG.128:8 SHFL:10 MUFU.EX2:32 MUFU.RCP:1"),
        ("Triton (4 warps)", 21, 173, "LDG.128:2 STG.128:2 SHFL:14 BAR:3 MUFU.EX2:8"),
    ],
}


# Steady-state instructions per element of the same peers (marginal cost between two row
# lengths), from the same offline builds.
PER_ELEMENT = {"CUDA C++ (1 warp/row)": "9.5-9.7", "Triton (1 warp)": "13-13.75",
               "Triton (4 warps)": "13-13.75", "CUDA C++ (256 threads/row)": "6.75"}  # fmt: skip


def chains():
    import tessera_tile as tt

    def chain5(a, b):
        return tt.tanh(a * b + 1.5) * tt.sigmoid(a - b) - a

    def softmax(x):
        m = tt.max(x, axis=-1, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=-1, keepdims=True)

    def layer_norm(x):
        mu = tt.mean(x, axis=-1, keepdims=True)
        return (x - mu) * tt.rsqrt(tt.var(x, axis=-1, keepdims=True) + 1e-5)

    def row_dot(x, y):
        return tt.sum(x * y, axis=-1)

    def column_mean(x):
        return tt.mean(x, axis=0)

    def variance(x):
        return tt.var(x)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    y = rng.standard_normal((32, 512)).astype(np.float32)
    return [
        ("5-op chain tanh(a*b+1.5)*sigmoid(a-b)-a", chain5, (x.ravel(), y.ravel())),
        ("softmax, rows of 512", softmax, (x,)),
        ("layer norm, rows of 512", layer_norm, (x,)),
        ("sum(x*y, axis=-1)", row_dot, (x, y)),
        ("column mean, mean(x, axis=0)", column_mean, (x,)),
        ("variance of all, var(x)", variance, (x,)),
    ]


def traffic() -> None:
    import tessera_tile as tt
    from tessera_tile import sim

    table = Table(title="global memory traffic (float32, measured by the simulator profiler)")
    for col in ("chain", "kernels", "unfused B", "fused B (plan)", "measured B", "ratio", "min?"):
        table.add_column(col, justify="right" if col not in ("chain", "min?") else "left")
    for name, fn, args in chains():
        fused = tt.fuse(fn)
        ex = fused.explain(*args)
        with sim.profile() as prof:
            result = fused(*args)
        results = result if isinstance(result, tuple) else (result,)
        measured = prof.bytes_read + prof.bytes_written
        minimum = sum(a.nbytes for a in args) + sum(np.asarray(r).nbytes for r in results)
        table.add_row(
            name,
            str(ex.kernels),
            str(ex.bytes_unfused),
            str(ex.bytes_fused),
            str(measured),
            f"{ex.bytes_unfused / ex.bytes_fused:.2f}x",
            "yes" if measured == minimum else f"no ({measured / minimum:.2f}x min)",
        )
    console.print(table)
    console.print(
        "unfused: one kernel per op, each reading its operands and writing its result; "
        "min: each input read once and each output written once."
    )


SASS_CASES = (("chain", np.float32), ("chain", np.float16), ("softmax", np.float32),
              ("softmax", np.float16), ("softmax", ml_dtypes.bfloat16),
              ("layer_norm", np.float32))  # fmt: skip


def sass_figures() -> list[dict]:
    """Each SASS case compiled for sm_90: ``op``, ``dtype``, the ``report``, its steady-state
    ``per_element`` instructions and ``in_flight`` bytes, and the table's ``title``. What the
    ``sass`` step prints and docs/fusion.md quotes (tests/compile/test_docs.py compares them)."""
    import tessera_tile as tt

    def chain(a, b, c):
        t = a * b + c
        return tt.tanh(t) * tt.sigmoid(t) - a

    def softmax(x):
        m = tt.max(x, axis=-1, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=-1, keepdims=True)

    def layer_norm(x):
        mu = tt.mean(x, axis=-1, keepdims=True)
        var = tt.mean(tt.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * tt.rsqrt(var + 1e-5)

    v = np.zeros(1 << 20, np.float32)
    figures = []
    for op, dtype in SASS_CASES:
        name = np.dtype(dtype).name
        if op == "chain":
            x = v.astype(dtype)
            report = tt.fuse(chain).inspect(x, x, x, arch="sm_90")[0]
            per_element, in_flight = streamed(report, 3, 16 // np.dtype(dtype).itemsize)
            title = f"elementwise tanh(a*b+c)*sigmoid(a*b+c)-a, {name}, sm_90"
        elif op == "softmax":  # the row is in registers: no loop; the marginal cost per element
            report = tt.fuse(softmax).inspect(np.zeros((4096, 1024), dtype), arch="sm_90")[0]
            half = tt.fuse(softmax).inspect(np.zeros((4096, 512), dtype), arch="sm_90")[0]
            per_element = marginal(report, half, 16)  # 16 more per lane
            in_flight = report.bytes_in_flight()
            title = f"row softmax, 1024 {name} per row, sm_90"
        else:
            # a block per row, 16 elements per thread in registers: every instruction of the
            # kernel per element (an upper bound; no loops)
            report = tt.fuse(layer_norm).inspect(np.zeros((4096, 4096), dtype), arch="sm_90")[0]
            per_element, in_flight = whole(report, 16), report.bytes_in_flight()
            title = f"layer norm (no weights), 4096 {name} per row, a block per row, sm_90"
        figures.append(
            {"op": op, "dtype": name, "report": report, "per_element": per_element,
             "in_flight": in_flight, "title": title}
        )  # fmt: skip
    return figures


def sass() -> None:
    keys = ("LDG", "STG", "FFMA", "MUFU", "SHFL", "BAR", "LDS", "STS")
    for figure in sass_figures():
        report = figure["report"]
        table = Table(title=figure["title"])
        cols = ("kernel", "regs", "spills", "smem (B)", "instr", "instr/element",
                "B in flight", "key opcodes")  # fmt: skip
        for col in cols:
            table.add_column(col)
        table.add_row(
            "tessera_tile @tt.fuse",
            str(report.registers),
            str(report.spill_stores + report.spill_loads),
            str(report.shared_bytes),
            str(report.instructions),
            f"{figure['per_element']:.2f}",
            str(figure["in_flight"]),
            report.key_opcodes(keys),
        )
        if figure["dtype"] == "float32":
            for peer, regs, instr, opcodes in ANCHORS[figure["op"]]:
                table.add_row(peer, str(regs), "0", "-", str(instr), PER_ELEMENT.get(peer, "-"),
                              "-", opcodes)  # fmt: skip
        console.print(table)
    console.print(
        "Static SASS counts from ptxas/nvdisasm 13.5 (no GPU): not timings. instr/element: the "
        "16-byte loop's instructions per element (chain); the kernel's growth from 512 to 1024 "
        "per row over the 16 elements a lane gains (softmax, whose row is in registers); all "
        "the kernel's instructions over a thread's 16 elements (layer norm). B in flight: "
        "independent global load bytes per thread before the first use (tessera_tile.inspect)."
    )


def compile_time() -> None:
    from numba import cuda

    import tessera_tile as tt
    from tessera_tile.fusion import kernel_cache

    def chain(a, b):
        return tt.tanh(a * b + 1.5) * tt.sigmoid(a - b) - a

    v = np.zeros(1 << 16, np.float32)
    cuda.compile_ptx(lambda x: None, "void(float32[::1])", cc=(9, 0))  # warm Numba up
    kernel_cache.clear()
    fused = tt.fuse(chain)

    start = time.perf_counter()
    ex = fused.explain(v, v)  # trace, plan, generate source
    traced = time.perf_counter()
    fused.inspect(v, v, arch="sm_90")  # NVVM -> PTX, ptxas -> cubin, nvdisasm
    compiled = time.perf_counter()

    t0 = time.perf_counter()
    for _ in range(100):
        fused.explain(v, v)
    hit = (time.perf_counter() - t0) / 100

    table = Table(title="cold compile of a fused 5-op chain (float32), this machine")
    table.add_column("step")
    table.add_column("seconds", justify="right")
    table.add_row("trace + plan + generate source", f"{traced - start:.3f}")
    table.add_row("NVVM -> PTX -> cubin -> SASS for sm_90", f"{compiled - traced:.3f}")
    table.add_row("cold total", f"{compiled - start:.3f}")
    table.add_row("cache hit (signature lookup + plan for new sizes)", f"{hit:.5f}")
    console.print(table)
    console.print(
        f"{ex.kernels} kernel; on a GPU the driver then loads the PTX (not measured here)."
    )


if __name__ == "__main__":
    run(
        __doc__, {"traffic": traffic, "sass": sass, "compile": compile_time}, frozenset({"traffic"})
    )
