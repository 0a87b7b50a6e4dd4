"""tessera_tile.memory compiled for real: 128-bit global accesses, no spills, no local memory."""

import functools

import numpy as np
import pytest
from helpers import load_example
from numba import cuda, float32
from numba.np import numpy_support

from tessera_tile import inspect
from tessera_tile.memory import Tile, make_stager

ARCHS = ("sm_80", "sm_90")
FLOAT64_OPCODES = ("DADD", "DMUL", "DFMA", "DSETP", "DMNMX", "MUFU.RCP64H", "F2F.F64")


def no_float64(report) -> bool:
    return all(report.count(op) == 0 for op in FLOAT64_OPCODES)


def clean(report) -> None:
    assert report.spill_stores == 0 and report.spill_loads == 0, report
    assert not report.uses_local_memory, report


@functools.cache
def copy_kernel(dtype):
    """A 32 x 32 tile copy through shared memory with 16-byte aligned rows."""
    tile = Tile((32, 32), dtype)
    stage = make_stager(tile)
    SHAPE = tile.padded_shape
    NB = numpy_support.from_dtype(np.dtype(dtype))

    @cuda.jit
    def copy(src, dst):
        s = cuda.shared.array(SHAPE, NB, alignment=16)
        row0 = cuda.blockIdx.y * 32
        col0 = cuda.blockIdx.x * 32
        stage.global_to_shared(src, row0, col0, s, 0)
        cuda.syncthreads()
        stage.shared_to_global(s, dst, row0, col0)

    return copy


SUB_TILE = Tile((16, 16), np.float32, pad="auto")
sub_stage = make_stager(SUB_TILE)
SUB_SHAPE = SUB_TILE.padded_shape


@cuda.jit
def sub_tile_scale(src, dst, alpha):
    s = cuda.shared.array(SUB_SHAPE, float32)
    sub_stage.global_to_shared(src, 0, 0, s, float32(0.0))
    cuda.syncthreads()
    t = cuda.threadIdx.x
    regs = cuda.local.array((2, 4), float32)
    sub_stage.shared_to_registers(s, (t // 4) * 2, (t % 4) * 4, regs)
    for a in range(2):
        for b in range(4):
            regs[a, b] *= alpha
    sub_stage.registers_to_shared(regs, s, (t // 4) * 2, (t % 4) * 4)
    cuda.syncthreads()
    sub_stage.shared_to_global(s, dst, 0, 0)


F32_2D = "float32[:, ::1]"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["transpose_padded", "transpose_unpadded"])
def test_example_transpose_uses_128_bit_global_accesses(name, arch):
    kernel = getattr(load_example("transpose"), name)
    report = inspect.compile(kernel, f"void({F32_2D}, {F32_2D})", arch=arch)
    print(report)
    clean(report)
    assert report.count("LDG.E.128") >= 1 and report.count("STG.E.128") >= 1, report
    assert no_float64(report), report
    assert report.count("MUFU") == 0, report  # no division by a run-time thread count


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_aligned_copy_is_128_bit_on_both_sides(dtype, arch):
    t = numpy_support.from_dtype(np.dtype(dtype))
    report = inspect.compile(copy_kernel(dtype), f"void({t}[:, ::1], {t}[:, ::1])", arch=arch)
    print(report)
    clean(report)
    for op in ("LDG.E.128", "STG.E.128", "STS.128", "LDS.128"):
        assert report.count(op) >= 1, f"no {op}:\n{report}"
    if dtype != np.float64:
        assert no_float64(report), report


@pytest.mark.parametrize("arch", ARCHS)
def test_sub_tile_lives_in_registers(arch):
    report = inspect.compile(sub_tile_scale, f"void({F32_2D}, {F32_2D}, float32)", arch=arch)
    print(report)
    clean(report)
    assert report.count("LDG.E.128") >= 1, report
    assert no_float64(report), report
