"""bfloat16 conversions (tessera_tile.bfloat16) in SASS, sm_80 and sm_90: widening is a shift
(no conversion instruction), narrowing one F2FP per value or per packed pair, no spills."""

import pytest
from numba import cuda

from tessera_tile import bfloat16 as bf
from tessera_tile import inspect

ARCHS = ("sm_80", "sm_90")


@cuda.jit
def widen(bits, out):
    i = cuda.grid(1)
    if i < bits.size:
        out[i] = bf.bf16_to_f32(bits[i]) * 2


@cuda.jit
def narrow_and_pack(x, out16, out32):
    i = cuda.grid(1)
    if i < x.size:
        out16[i] = bf.f32_to_bf16(x[i])
        out32[i] = bf.pack_bf16x2(x[i], x[i] + 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_widening_converts_nothing(arch):
    report = inspect.compile(widen, "void(uint16[::1], float32[::1])", arch=arch, block=256)
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, report
    for op in ("F2F", "F2FP", "I2F"):
        assert report.count(op) == 0, f"{op}\n{report}"


@pytest.mark.parametrize("arch", ARCHS)
def test_narrowing_is_one_f2fp_per_conversion(arch):
    sig = "void(float32[::1], uint16[::1], uint32[::1])"
    report = inspect.compile(narrow_and_pack, sig, arch=arch, block=256)
    assert report.spill_stores == report.spill_loads == report.stack_bytes == 0, report
    assert report.count("F2FP") == 2, report  # one for the value, one for the packed pair
