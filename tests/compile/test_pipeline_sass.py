"""cp.async ring buffers compile to LDGSTS on sm_80 and sm_90; the synchronous path does not."""

import functools

import pytest
from numba import cuda, float32
from pipeline_kernels import stream_sum_kernel

from tessera_tile import inspect, pipeline

ARCHS = ("sm_80", "sm_90")
ALIGN = pipeline.SHARED_ALIGN
F32_1D = "float32[::1]"
F32_2D = "float32[:, ::1]"
REGISTER_BUDGET = 64  # measured 22..40; a blow-up (64-bit divisions, spills) shows here


@functools.cache
def panel_kernel(stages: int, async_copy: bool, copy_bytes: int):
    """Two operands sharing one group per step, as a matmul's A and B panels would."""
    tm, tk, tn = 32, 16, 32
    a_t = pipeline.ring_buffer(
        stages, (tm, tk), float32, k_axis=1, async_copy=async_copy, copy_bytes=copy_bytes
    )
    b_t = pipeline.ring_buffer(
        stages, (tk, tn), float32, k_axis=0, async_copy=async_copy, copy_bytes=copy_bytes
    )
    a_shape, b_shape = a_t.shape, b_t.shape

    @cuda.jit
    def panel_sums(a, b, out):
        ra = cuda.shared.array(a_shape, float32, alignment=ALIGN)
        rb = cuda.shared.array(b_shape, float32, alignment=ALIGN)
        m0 = cuda.blockIdx.x * tm
        n0 = cuda.blockIdx.y * tn
        pa = a[m0 : m0 + tm, :]
        pb = b[:, n0 : n0 + tn]
        for k in range(stages - 1):
            a_t.load_tile(ra, pa, k)
            b_t.load_tile(rb, pb, k)
            a_t.commit()
        t = cuda.threadIdx.x
        acc = float32(0)
        for k in range(a_t.num_tiles(pa)):
            s = a_t.wait_tile(k)
            a_t.load_tile(ra, pa, k + stages - 1)
            b_t.load_tile(rb, pb, k + stages - 1)
            a_t.commit()
            for j in range(tk):
                acc += ra[s, t % tm, j] * rb[s, j, t % tn]
        out[m0 + t % tm, n0 + t % tn] = acc

    return panel_sums


@cuda.jit
def raw_intrinsics(x, y):
    buf = cuda.shared.array(64, float32, alignment=ALIGN)
    t = cuda.threadIdx.x
    pipeline.cp_async_16(buf, 4 * t, x, 4 * t)
    pipeline.cp_async_commit_group()
    pipeline.cp_async_cg_16(buf, 4 * t, x, 4 * t + 64)
    pipeline.cp_async_8(buf, 2 * t, x, 2 * t + 128)
    pipeline.cp_async_4_zfill(buf, t, x, t + 192, 0)
    pipeline.cp_async_cg_16_zfill_at(buf, 4 * t, x, 4 * t + 32, 16)
    pipeline.cp_async_cg_16_zfill_at(buf, 4 * t, x, (4 * t, 48), 8)
    pipeline.cp_async_commit_group()
    pipeline.cp_async_wait_group(1)
    pipeline.cp_async_wait_all()
    cuda.syncthreads()
    y[t] = buf[t]


def check(report) -> None:
    print(report)
    assert report.spill_stores == 0 and report.spill_loads == 0, report
    assert not report.uses_local_memory, report
    assert report.registers <= REGISTER_BUDGET, report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_async_ring_compiles_to_ldgsts(arch, stages):
    report = inspect.compile(
        stream_sum_kernel(stages, True, 256), f"void({F32_1D}, {F32_1D})", arch=arch
    )
    check(report)
    assert report.count("LDGSTS") >= 1, report
    assert report.count("LDGDEPBAR") >= 1 and report.count("DEPBAR") >= 1, report
    assert f"cp.async.wait_group {stages - 2};" in report.ptx


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stages", [2, 4])
def test_sync_ring_has_no_ldgsts(arch, stages):
    report = inspect.compile(
        stream_sum_kernel(stages, False, 256), f"void({F32_1D}, {F32_1D})", arch=arch
    )
    check(report)
    assert report.count("LDGSTS") == 0, report
    assert report.count("LDG") >= 1 and report.count("STS") >= 1, report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("copy_bytes", [4, 16])
def test_two_operand_panels(arch, copy_bytes):
    sig = f"void({F32_2D}, {F32_2D}, {F32_2D})"
    report = inspect.compile(panel_kernel(3, True, copy_bytes), sig, arch=arch)
    check(report)
    assert report.count("LDGSTS") >= 2, report
    if copy_bytes == 16:
        assert report.count("LDGSTS.E.BYPASS.128") >= 2, report  # .cg: L2 only
    sync = inspect.compile(panel_kernel(3, False, copy_bytes), sig, arch=arch)
    check(sync)
    assert sync.count("LDGSTS") == 0, sync


@pytest.mark.parametrize("arch", ARCHS)
def test_raw_intrinsics(arch):
    report = inspect.compile(raw_intrinsics, f"void({F32_1D}, {F32_1D})", arch=arch)
    check(report)
    assert report.count("LDGSTS") == 6, report
    for ptx in (
        "cp.async.ca.shared.global",
        "cp.async.cg.shared.global",
        "cp.async.commit_group;",
        "cp.async.wait_group 1;",
        "cp.async.wait_all;",
    ):
        assert ptx in report.ptx, ptx
