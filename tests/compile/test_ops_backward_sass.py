"""The prebuilt ops' backward as a GPU plans and compiles it: the op's
``inspect(..., backward=True)`` is the hand-written kernels of tessera_tile.kernels.norm_backward
and cross_entropy_backward (their budgets: tests/compile/cases.py), and the bytes a GPU's grid
moves against the minimum and against the composer's differentiation of the same definition."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tessera_tile import ops

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from _steady_state import row_loop  # noqa: E402

ARCHS = ("sm_80", "sm_90")
SHAPES = [(4096, 768), (4096, 4096), (2048, 8192)]


def call(kind, rows, n, dtype):
    x, v = np.zeros((rows, n), dtype), np.zeros(n, dtype)
    return (ops.layer_norm, (x, v, v)) if kind == "layer" else (ops.rms_norm, (x, v))


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_gpu_plans_move_their_minimum_with_partials_as_small_as_the_grid(kind, record_property):
    """x and dy read once and dx written once (the minimum), the weight once per group of
    threads and the blocks' float32 partials written and read once: the figures printed beside
    the composer's (a layer norm's group of 1,024, past 4,096 elements, reads its weight for
    each row). Rows past 8,192 elements (a thread's 8 of a group of 1,024) take the composer's
    backward."""
    for dtype in (np.float32, np.float16):
        for rows, n in SHAPES:
            op, args = call(kind, rows, n, dtype)
            report = op.explain(*args, backward=True)
            minimum = 3 * rows * n * np.dtype(dtype).itemsize
            hand_written = "hand-written" in report.stages[0]
            assert hand_written == (n <= 8192), report.stages
            line = f"{kind} norm backward {rows} x {n} {np.dtype(dtype)}: {report.kernels} kernels"
            line += f", {report.bytes_fused / minimum:.3f}x x, dy and dx"
            if hand_written:
                assert report.kernels == 2
                line += f"; {report.reasons[1]}"
                composer = float(report.reasons[1].rsplit(", ", 1)[1].removesuffix(" B"))
                assert report.bytes_fused < composer
            record_property("resources", line)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_ops_backward_inspected_is_the_hand_written_kernels(arch, record_property):
    """ops.layer_norm's and ops.rms_norm's pullbacks compile to the row kernel and the fold:
    no spills, no local memory, 16-byte loads; the row loop's instructions per element printed
    beside the forward's."""
    for kind in ("layer", "rms"):
        op, args = call(kind, 4096, 4096, np.float32)
        (forward,) = op.inspect(*args, arch=arch)
        main, fold = op.inspect(*args, arch=arch, backward=True)
        assert main.name.startswith(f"{kind}_norm_backward") and "fold" in fold.name
        for report in (main, fold):
            assert report.spill_stores == report.spill_loads == 0, report
            assert not report.uses_local_memory, report
        assert main.count("LDG.E.128") >= 2 and main.count("STG.E.128") >= 1
        record_property(
            "resources",
            f"{arch} {kind} norm 4096 x 4096 float32: forward {row_loop(forward):.2f} "
            f"instructions per element in its row loop, backward {row_loop(main, 8):.2f} "
            f"({main.registers} registers, 8 elements a thread)",
        )


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_entropy_backward_inspected_is_one_row_kernel(arch, record_property):
    """The logits' gradient: one row kernel reading the logits once (the mean adds its fused
    scale), no spills, 16-byte accesses."""
    x, t = np.zeros((4096, 32000), np.float16), np.zeros(4096, np.int64)
    reports = ops.cross_entropy.inspect(x, t, arch=arch, backward=True)
    main = reports[0]
    assert main.name.startswith("cross_entropy_backward") and len(reports) == 2
    for report in reports:
        assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert main.count("LDG.E.128") >= 1 and main.count("STG.E.128") >= 1
    loop = main.hottest_loop
    record_property(
        "resources",
        f"{arch} cross_entropy backward float16 4096 x 32000: {main.registers} registers, "
        f"{main.instructions_per_element(8, loop):.2f} instructions per logit in its chunk loop",
    )


def per_element(op, x, arch, **kwargs) -> tuple:
    """(report, instructions per element) of a row op's one kernel (no row loop: the whole
    kernel over the elements a thread holds, a warp's or a block's share of the row)."""
    (report,) = op.inspect(x, arch=arch, **kwargs)
    (stage,) = op.explain(x, **kwargs).stages
    lanes = 32 if "rows reduced by a warp" in stage else report.block
    return report, report.instructions / (x.shape[1] // lanes)


@pytest.mark.parametrize("arch", ARCHS)
def test_softmax_backward_per_element_beside_the_forward(arch, record_property):
    """ops.softmax's and ops.log_softmax's backward: one row kernel with the row in registers
    (softmax's y and dy at 1,024 float32 columns: a block per row), 16-byte loads, 0 spills; the
    instructions per element printed beside the forward's."""
    for n in (1024, 4096):
        x = np.zeros((4096, n), np.float32)
        for name in ("softmax", "log_softmax"):
            op = getattr(ops, name)
            forward, f_per = per_element(op, x, arch)
            backward, b_per = per_element(op, x, arch, backward=True)
            assert backward.spill_stores == backward.spill_loads == 0, backward
            assert not backward.uses_local_memory and backward.count("LDG.E.128") >= 2, backward
            record_property(
                "resources",
                f"{arch} {name} 4096 x {n} float32: forward {f_per:.2f} instructions per "
                f"element, backward {b_per:.2f} ({backward.registers} registers)",
            )
