"""The prebuilt ops, measured without a GPU, printed as tables (never asserted in tests).

    python benchmarks/ops.py traffic   # simulator: measured global bytes vs minimum vs unfused
    python benchmarks/ops.py sass      # real compilation for sm_90: registers, spills, SASS
    python benchmarks/ops.py           # both

``traffic`` runs in the simulator (the script re-executes itself with NUMBA_ENABLE_CUDASIM=1);
``sass`` needs the real compiler and no GPU. The peer kernels' figures are the project's anchors
(hand-written CUDA C++ and Triton 3.9, ptxas 13.5, static counts, not timings).
"""

import re

import numpy as np
from _steady_state import marginal, row_loop
from _steps import run
from rich.console import Console
from rich.table import Table

console = Console(width=160)

# Peer kernels (static SASS, sm_90 / sm_90a, ptxas 13.5, 2026-11-22): regs, instructions, opcodes.
ANCHORS = {
    "softmax": "CUDA C++ 1 warp/row: 48 regs, 354 instr; Triton 4 warps: 21 regs, 173 instr",
    "layer_norm": "CUDA C++ 4096/row: 44 regs, 175 instr; Triton: 40 regs, 241 instr",
    "rms_norm": "Triton 4096 f32/row: 38 regs, 141 instr (sm_80)",
    "cross_entropy": "Triton [N, 32768] f32: 32 regs, 286 instr (sm_80)",
    "transpose": "CUDA C++ 32x33 tile: 30 regs, 147 instr; Triton: 25 regs, 103 instr",
}


def cases(rows: int, cols: int):
    """(label, op, args, kwargs) for every op on float32 rows of ``cols``."""
    from tessera_tile import ops

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    t = rng.integers(0, cols, rows)
    return [
        ("softmax", ops.softmax, (x,), {}),
        ("log_softmax", ops.log_softmax, (x,), {}),
        ("layer_norm (weight, bias)", ops.layer_norm, (x, w, w), {}),
        ("rms_norm (weight)", ops.rms_norm, (x, w), {}),
        ("cross_entropy none", ops.cross_entropy, (x, t), {"reduction": "none"}),
        ("cross_entropy mean", ops.cross_entropy, (x, t), {}),
        ("sum axis=-1", ops.sum, (x,), {"axis": -1}),
        ("mean axis=0", ops.mean, (x,), {"axis": 0}),
        ("var (all)", ops.var, (x,), {}),
        ("argmax axis=-1", ops.argmax, (x,), {"axis": -1}),
        ("transpose", ops.transpose, (x,), {}),
    ]


def traffic() -> None:
    from tessera_tile import sim

    for rows, cols in ((32, 512), (4, 8192)):
        table = Table(title=f"global traffic, float32 ({rows} rows of {cols}), simulator profiler")
        headers = ("op", "kernels", "measured B", "planned B", "minimum B", "vs min",
                   "weights read", "unfused B", "unfused / measured", "bank conflicts")  # fmt: skip
        for col in headers:
            table.add_column(col, justify="left" if col == "op" else "right")
        for label, op, args, kwargs in cases(rows, cols):
            ex = op.explain(*args, **kwargs)
            with sim.profile() as prof:
                result = op(*args, **kwargs)
            measured = prof.bytes_read + prof.bytes_written
            minimum = sum(a.nbytes for a in args) + np.asarray(result).nbytes
            # the norms' weights (arguments after x): how often each was read, against the
            # blocks of the launch (the bar: at most once per block)
            weights = [f"in{i}" for i in range(1, len(args))] if "norm" in label else []
            reads = "-"
            if weights:
                read = sum(r for (_, arg), (r, _) in prof.traffic.items() if arg in weights)
                blocks = re.search(r"(\d+) block\(s\)", ex.stages[0]).group(1)
                reads = f"{read // args[1].nbytes // len(weights)} / {blocks} blocks"
            table.add_row(
                label,
                str(ex.kernels),
                str(measured),
                str(ex.bytes_fused),
                str(minimum),
                f"{measured / minimum:.3f}x",
                reads,
                str(ex.bytes_unfused),
                f"{ex.bytes_unfused / measured:.2f}x",
                str(prof.bank_conflicts),
            )
        console.print(table)
    console.print(
        "minimum: each input (weights included) read once, each output written once; weights "
        "read: times each norm weight was read, against the launch's blocks; "
        "unfused: one kernel per op of the CuPy-style chain, each reading its operands and "
        "writing its result."
    )


def sass() -> None:
    from tessera_tile import ops

    rng = np.random.default_rng(0)
    rows = 4096
    x1k = np.zeros((rows, 1024), np.float32)
    x4k = np.zeros((rows, 4096), np.float32)
    w4k = np.zeros(4096, np.float32)
    t = rng.integers(0, 1024, rows)
    x512 = np.zeros((rows, 512), np.float32)
    runs = [
        ("softmax", "softmax 4096 x 1024", ops.softmax.inspect(x1k)),
        ("softmax", "log_softmax 4096 x 1024", ops.log_softmax.inspect(x1k)),
        ("layer_norm", "layer_norm 4096 x 4096 (w, b)", ops.layer_norm.inspect(x4k, w4k, w4k)),
        ("rms_norm", "rms_norm 4096 x 4096 (w)", ops.rms_norm.inspect(x4k, w4k)),
        (
            "cross_entropy",
            "cross_entropy 4096 x 1024 none",
            ops.cross_entropy.inspect(x1k, t, reduction="none"),
        ),  # fmt: skip
        ("", "softmax backward 4096 x 1024", ops.softmax.inspect(x1k, backward=True)),
        (
            "",
            "layer_norm backward 4096 x 4096 (w, b)",
            ops.layer_norm.inspect(x4k, w4k, w4k, backward=True),
        ),
        ("", "rms_norm backward 4096 x 4096 (w)", ops.rms_norm.inspect(x4k, w4k, backward=True)),
        ("transpose", "transpose 4096 x 1024", ops.transpose.inspect(x1k)),
        ("", "sum axis=-1 4096 x 1024", ops.sum.inspect(x1k, axis=-1)),
    ]
    # steady-state instructions per element, for rows kept in registers: softmax (no loop) as
    # the peers measure it, the growth from 512 to 1,024 columns per element a lane gains; the
    # norms (a block per row at a time, 16 elements a thread, the weights held across the row
    # loop), the row loop's instructions per element, and in brackets the same at 8,192 columns
    # (a block of 512)
    x8k, w8k = np.zeros((rows, 8192), np.float32), np.zeros(8192, np.float32)
    ln8k = ops.layer_norm.inspect(x8k, w8k, w8k)[0]
    rms8k = ops.rms_norm.inspect(x8k, w8k)[0]
    (sm,), (lsm,), (ln,), (rms,) = (runs[k][2] for k in range(4))
    sm512, lsm512 = ops.softmax.inspect(x512)[0], ops.log_softmax.inspect(x512)[0]
    per_element = {
        "softmax 4096 x 1024": f"{marginal(sm, sm512, 16):.2f}",
        "log_softmax 4096 x 1024": f"{marginal(lsm, lsm512, 16):.2f}",
        "layer_norm 4096 x 4096 (w, b)": f"{row_loop(ln):.2f} ({row_loop(ln8k):.2f})",
        "rms_norm 4096 x 4096 (w)": f"{row_loop(rms):.2f} ({row_loop(rms8k):.2f})",
    }
    # the norms' backward: its row loop over the 8 elements a thread holds
    for label, reports in ((r[1], r[2]) for r in runs if "norm backward" in r[1]):
        per_element[label] = f"{row_loop(reports[0], 8):.2f}"
    keys = ("LDG", "STG", "SHFL", "MUFU", "BAR", "LDS", "STS")
    table = Table(title="prebuilt ops compiled offline for sm_90 (float32; static SASS)")
    cols = ("op", "regs", "spills", "smem B", "instr", "instr/elem", "occupancy", "key opcodes",
            "peers")  # fmt: skip
    for col in cols:
        table.add_column(col)
    for anchor, label, reports in runs:
        for k, r in enumerate(reports):
            ipe = per_element.get(label) if k == 0 else None
            table.add_row(
                label if k == 0 else f"  + kernel {k}",
                str(r.registers),
                str(r.spill_stores + r.spill_loads),
                str(r.shared_bytes),
                str(r.instructions),
                ipe or "-",
                f"{r.occupancy:.0%}",
                r.key_opcodes(keys),
                ANCHORS.get(anchor, "") if k == 0 else "",
            )
    console.print(table)
    console.print(
        "Static counts from ptxas/nvdisasm (no GPU): not timings. instr/elem: steady state "
        "(peers: softmax 9.5-9.7 CUDA C++, 13-13.75 Triton; layer norm 6.75 CUDA C++; "
        "rms norm 7.3 Triton fp16)."
    )


if __name__ == "__main__":
    run(__doc__, {"traffic": traffic, "sass": sass}, frozenset({"traffic"}))
