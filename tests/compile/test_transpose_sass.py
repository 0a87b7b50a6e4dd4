"""Compile tier: the transpose kernels' tile loops, instructions per tile on sm_80 and sm_90.

The bar (issue "kernels at the hardware's limits"): a tile loop runs at most 1.2x the
instructions of an expert CUDA C++ 32 x 32 float32 transpose through a padded 32 x 33 shared
tile, 147 SASS instructions for its tile (LDG.32:4 STG.32:4 LDS.32:4 STS.32:4 BAR:1, 30
registers; compiled offline with ptxas 13.5). Triton's kernel for the same tile runs 103
(LDG.128:2 STG.128:2 LDS.32:8 STS.32:8). Before this test the float32 tile loop ran 333
(sm_80): the stager's guards and 64-bit index arithmetic per element.

Each kernel has three tile loops (two barriers each): whole tiles with 16-byte chunks, whole
tiles one element per lane (any strides or alignment), and the guarded edge tiles. A loop
iteration moves one tile, so ``loop.instructions`` (both sides of any branch counted) is the
per-thread figure per tile, comparable with the CUDA kernel's 4 elements per thread.
"""

import numpy as np
import pytest

from tessera_tile import inspect
from tessera_tile.kernels import transpose

ARCHS = ("sm_80", "sm_90")
CUDA_CPP, TRITON = 147, 103
BAR = int(1.2 * CUDA_CPP)  # 176

KERNELS = {
    np.float16: ("transpose_f16", "float16"),
    np.float32: ("transpose_f32", "float32"),
    np.float64: ("transpose_f64", "float64"),
}


def tile_loops(report) -> dict:
    """The loops that move a tile (two barriers, outermost), by kind: "vector" (16-byte global
    accesses), "element" (whole tiles, no guard on any global load), "edge" (guarded loads)."""
    code = {f.name: f.instructions for f in report.functions}
    found = {}
    for loop in report.loops:
        if loop.depth != 1 or loop.count("BAR") != 2:
            continue
        body = [ins for ins in code[loop.function] if ins.offset in loop]
        loads = [i for i in body if i.opcode.startswith(("LDG.", "LD."))]
        assert loads, loop.key_opcodes()
        if loop.count("LDG.E.128") or loop.count("STG.E.128"):
            kind = "vector"
        elif any(i.predicate for i in loads):
            kind = "edge"
        else:
            kind = "element"
        assert kind not in found, f"two {kind} loops: {found[kind]} and {loop}"
        found[kind] = loop
    return found


def compiled(dtype, arch, src_layout="C"):
    name, t = KERNELS[dtype]
    src = f"{t}[:, ::1]" if src_layout == "C" else f"{t}[:, :]"
    report = inspect.compile(
        getattr(transpose, name), f"void({src}, {t}[:, ::1])", arch=arch, block=transpose.THREADS
    )
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    return report


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_tile_loop_within_the_bar(arch, record_property):
    """The steady state of a C-contiguous float32 array: whole tiles, one 16-byte load and
    one 16-byte store per thread, 4 shared stores and loads, 2 barriers, no division."""
    report = compiled(np.float32, arch)
    loops = tile_loops(report)
    assert set(loops) == {"vector", "element", "edge"}, loops
    vector = loops["vector"]
    figures = ", ".join(f"{k} {loop.instructions}" for k, loop in sorted(loops.items()))
    line = (
        f"transpose float32 {arch}: {vector.instructions} instructions per tile "
        f"({vector.key_opcodes()}; regs {report.registers}); bar {BAR} = 1.2 x CUDA C++ "
        f"{CUDA_CPP}, Triton {TRITON}; all tile loops: {figures}"
    )
    print(line)
    record_property("transpose", line)
    assert vector.instructions <= BAR, line
    for opcode, n in (("LDG.E.128", 1), ("STG.E.128", 1), ("LDS", 4), ("STS", 4), ("BAR", 2)):
        assert vector.count(opcode) == n, f"{opcode}: {vector.key_opcodes()}"
    assert vector.count("CALL") == 0, vector.key_opcodes()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layout", ["C", "A"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_tile_loop_within_the_bar(dtype, layout, arch, record_property):
    """Every tile loop, any dtype, contiguous or strided source: 4 elements per thread a tile
    for float32 and float64 (float16: 4 loads, 1 x 8 halves stored by half the threads); the
    whole tiles without a guard, none with a division."""
    report = compiled(dtype, arch, layout)
    loops = tile_loops(report)
    assert "element" in loops and "edge" in loops, loops
    line = ", ".join(
        f"{k} {loop.instructions} ({loop.key_opcodes()})" for k, loop in sorted(loops.items())
    )
    record_property("transpose", f"{np.dtype(dtype)} {layout} {arch}: {line}")
    for loop in loops.values():  # the guarded edge tiles too: no division per tile anywhere
        assert loop.instructions <= BAR and loop.count("CALL") == 0, line
