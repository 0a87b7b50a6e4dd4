"""tessera_tile.warp compiled for real: shuffles in the SASS, no spills, no local memory, and no
float64 instructions in float32 kernels (an uncast Python float literal would bring them)."""

import pytest
from numba import cuda, float32

from tessera_tile import inspect
from tessera_tile.warp import (
    FULL_MASK,
    add,
    make_block_allreduce,
    make_block_argmax,
    make_block_reduce,
    make_warp_exclusive_scan,
    maximum,
    prefix_mask,
    warp_allmax,
    warp_argmin,
    warp_inclusive_sum,
    warp_sum,
)

ARCHS = ("sm_80", "sm_90")
SIGNATURE = "void(float32[::1], float32[::1])"

block_sum = make_block_reduce(add, float32)
block_allmax = make_block_allreduce(maximum, float32)
block_argmax = make_block_argmax(float32)
block_argmax_all = make_block_argmax(float32, broadcast=True)
exclusive_max = make_warp_exclusive_scan(maximum, float32)
half_block_sum = make_block_reduce(add, "float16")  # float16 data, float32 accumulator


@cuda.jit
def warp_sum_kernel(x, out):
    i = cuda.grid(1)
    n = x.shape[0]
    # A partial last warp names only its existing lanes.
    mask = prefix_mask(n - (i - cuda.laneid))
    if i < n:
        s = warp_sum(x[i], mask)
        if cuda.laneid == 0:
            out[i // 32] = s


@cuda.jit
def warp_allmax_kernel(x, out):
    i = cuda.grid(1)
    out[i] = warp_allmax(x[i], FULL_MASK)


@cuda.jit
def block_sum_kernel(x, out):
    i = cuda.grid(1)
    s = block_sum(x[i])
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = s


@cuda.jit
def block_allmax_kernel(x, out):
    i = cuda.grid(1)
    out[i] = x[i] - block_allmax(x[i])


@cuda.jit
def block_argmax_kernel(x, out):
    i = cuda.grid(1)
    v, j = block_argmax(x[i], i)
    if cuda.threadIdx.x == 0:
        out[2 * cuda.blockIdx.x] = v
        out[2 * cuda.blockIdx.x + 1] = float32(j)


@cuda.jit
def block_argmax_all_kernel(x, out):
    i = cuda.grid(1)
    v, j = block_argmax_all(x[i], i)
    out[i] = v + float32(j)


@cuda.jit
def warp_argmin_kernel(x, out):
    i = cuda.grid(1)
    v, j = warp_argmin(x[i], i, FULL_MASK)
    out[i] = v + float32(j)


@cuda.jit
def warp_scans_kernel(x, out):
    i = cuda.grid(1)
    out[i] = warp_inclusive_sum(x[i], FULL_MASK) + exclusive_max(x[i], float32(-1e30), FULL_MASK)


@cuda.jit
def half_block_sum_kernel(x, out):
    i = cuda.grid(1)
    s = half_block_sum(x[i])
    if cuda.threadIdx.x == 0:
        out[cuda.blockIdx.x] = s


KERNELS = {
    "warp_sum": (warp_sum_kernel, SIGNATURE),
    "warp_allmax": (warp_allmax_kernel, SIGNATURE),
    "warp_argmin": (warp_argmin_kernel, SIGNATURE),
    "warp_scans": (warp_scans_kernel, SIGNATURE),
    "block_sum": (block_sum_kernel, SIGNATURE),
    "block_allmax": (block_allmax_kernel, SIGNATURE),
    "block_argmax": (block_argmax_kernel, SIGNATURE),
    "block_argmax_all": (block_argmax_all_kernel, SIGNATURE),
    "block_sum_float16": (half_block_sum_kernel, "void(float16[::1], float32[::1])"),
}


def float64_opcodes(report):
    """Double-precision SASS: DADD, DMUL, DFMA, DSETP... and the float64 reciprocal."""
    return {op: n for op, n in report.histogram.items() if op[0] == "D" or "RCP64" in op}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_warp_primitives_compile_to_shuffles_without_spills_or_float64(name, arch):
    kernel, signature = KERNELS[name]
    report = inspect.compile(kernel, signature, arch=arch)
    assert report.count("SHFL") >= 5, report.histogram
    assert report.spill_stores == 0 and report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    assert not float64_opcodes(report), float64_opcodes(report)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_warp_reductions_use_the_butterfly(arch):
    report = inspect.compile(warp_allmax_kernel, SIGNATURE, arch=arch)
    assert report.count("SHFL.BFLY") >= 5, report.histogram


@pytest.mark.parametrize("arch", ARCHS)
def test_block_reduce_shared_scratch_is_33_slots(arch):
    report = inspect.compile(block_sum_kernel, SIGNATURE, arch=arch)
    assert report.shared_bytes == 33 * 4
    assert report.count("BAR") >= 2


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_block_sum_accumulates_in_float32(arch):
    report = inspect.compile(half_block_sum_kernel, "void(float16[::1], float32[::1])", arch=arch)
    assert report.shared_bytes == 33 * 4  # float32 partials, not float16
    assert report.count("FADD") >= 5
