"""tessera_tile.inspect on small known kernels."""

import pytest
from numba import cuda, float32

from tessera_tile import inspect


@cuda.jit
def padded_tile(x, y):
    tile = cuda.shared.array((32, 33), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = x[ty, tx]
    cuda.syncthreads()
    y[ty, tx] = tile[tx, ty]


@cuda.jit(device=True)
def halve(v):
    return v * float32(0.5)


@cuda.jit
def shuffle_down(x, y):
    i = cuda.grid(1)
    y[i] = halve(cuda.shfl_down_sync(0xFFFFFFFF, x[i], 1))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_static_shared_memory_of_a_padded_tile(arch):
    report = inspect.compile(padded_tile, "void(float32[:, ::1], float32[:, ::1])", arch=arch)
    assert report.shared_bytes == 32 * 33 * 4 == 4224
    assert report.count("BAR") >= 1 and report.count("LDS") >= 1


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_shuffle_and_device_function(arch):
    report = inspect.compile(shuffle_down, "void(float32[::1], float32[::1])", arch=arch)
    assert report.count("SHFL") >= 1, report.histogram
    assert ".target " + arch in report.ptx
    assert report.cubin[:4] == b"\x7fELF"
    assert report.registers > 0 and 0 < report.occupancy <= 1
    assert "registers" in str(report) and arch in str(report)


def test_plain_python_function_compiles():
    report = inspect.compile(shuffle_down.py_func, "void(float32[::1], float32[::1])")
    assert report.arch == "sm_90" and report.count("SHFL") >= 1


def test_occupancy_model():
    # 32 registers x 256 threads: 64 warps resident, the full sm_90 SM.
    assert inspect.occupancy("sm_90", 32, 0, 256) == 1.0
    # 64 registers: 65536 / (64*32) = 32 warps -> 50 %.
    assert inspect.occupancy("sm_90", 64, 0, 256) == 0.5
    # 100 KiB of shared memory per block: two blocks of 8 warps on sm_90 -> 25 %.
    assert inspect.occupancy("sm_90", 16, 100 * 1024, 256) == 0.25


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown target 'sm_70'"):
        inspect.compile(shuffle_down, "void(float32[::1], float32[::1])", arch="sm_70")
    with pytest.raises(TypeError, match="expected a @cuda.jit kernel"):
        inspect.compile(42, "void()")
    with pytest.raises(TypeError, match="device function"):
        inspect.compile(halve, "float32(float32)")
    with pytest.raises(TypeError, match="shuffle_down"):
        inspect.compile(shuffle_down, "void(float32[::1], int32)")
    with pytest.raises(ValueError, match="block"):
        inspect.compile(shuffle_down, "void(float32[::1], float32[::1])", block=0)
