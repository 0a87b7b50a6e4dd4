"""Warpgroup MMA (wgmma) compiled for sm_90a: HGMMA in SASS, warpgroup fences and waits, no
shared-memory loads for operands read through descriptors, no spills.

numba-cuda compiles for sm_90a on a device of compute capability 9.0 and later; offline,
``inspect.compile`` builds the same with ``arch="sm_90a"``. Also: every kernel of
``tests/primitives/test_wgmma.py`` compiles for sm_90a with the argument types its tests launch it
with (the GPU tier runs them on an H100), and a wgmma kernel compiled for sm_80 is refused with
our message, not ptxas's.
"""

import importlib.util
import subprocess
import tempfile
from pathlib import Path

import pytest
from numba import cuda
from numba.types import float16

from tessera_tile import inspect, mma

SIM_TESTS = Path(__file__).resolve().parents[1] / "primitives" / "test_wgmma.py"


@cuda.jit
def gemm_k_tile(a, b, out):
    """One 64 x 128 x 64 k-tile of a float16 GEMM: A [64, 64] and B^T [128, 64] (K-major) in
    128B-swizzled shared memory, 4 chained k16 HGMMA, one commit, one wait."""
    sa = cuda.shared.array((64, 64), float16, alignment=1024)
    sb = cuda.shared.array((128, 64), float16, alignment=1024)
    tid = cuda.threadIdx.x
    for i in range(tid, 64 * 64, 128):
        r, c = i // 64, i % 64
        sa[r, (((c // 8) ^ (r % 8)) * 8) + c % 8] = a[r, c]
    for i in range(tid, 128 * 64, 128):
        r, c = i // 64, i % 64
        sb[r, (((c // 8) ^ (r % 8)) * 8) + c % 8] = b[r, c]
    cuda.syncthreads()
    acc = mma.wgmma_zeros(128)
    mma.wgmma_fence()
    for kk in range(4):
        da = mma.wgmma_descriptor(sa, (0, 16 * kk), 16, 1024, mma.SWIZZLE_128B)
        db = mma.wgmma_descriptor(sb, (0, 16 * kk), 16, 1024, mma.SWIZZLE_128B)
        acc = mma.wgmma_async(da, db, acc, 1, 1, 1, 0, 0)
    mma.wgmma_commit_group()
    acc = mma.wgmma_wait_group(0, acc)
    for i in range(64):
        out[tid, i] = acc[i]


@cuda.jit
def registers_a_bf16(a_regs, b, out):
    """A from registers (bfloat16 bits), B N-major without swizzle, N = 128: two products in
    two groups, the first waited for with the second still in flight (SASS only: the tile is
    not in a canonical layout and the values are not checked)."""
    sb = cuda.shared.array((32, 128), cuda.types.uint16, alignment=1024)
    tid = cuda.threadIdx.x
    for i in range(tid, 32 * 128, 128):
        sb[i // 128, i % 128] = b[i // 128, i % 128]
    cuda.syncthreads()
    a = (a_regs[tid, 0], a_regs[tid, 1], a_regs[tid, 2], a_regs[tid, 3])
    mma.wgmma_fence()
    d0 = mma.wgmma_async_bf16(
        a, mma.wgmma_descriptor(sb, (0, 0), 2048, 128, 0), mma.wgmma_zeros(128), 0, 1, 1, 0, 1
    )
    mma.wgmma_commit_group()
    d1 = mma.wgmma_async_bf16(
        a, mma.wgmma_descriptor(sb, (16, 0), 2048, 128, 0), mma.wgmma_zeros(128), 0, 1, -1, 0, 1
    )
    mma.wgmma_commit_group()
    d0 = mma.wgmma_wait_group(1, d0)
    for i in range(64):
        out[tid, i] = d0[i]
    d1 = mma.wgmma_wait_group(0, d1)
    for i in range(64):
        out[tid, 64 + i] = d1[i]


GEMM_SIG = "void(float16[:, ::1], float16[:, ::1], float32[:, ::1])"
RS_SIG = "void(uint32[:, ::1], uint16[:, ::1], float32[:, ::1])"


def _record(record_property, report):
    hgmma = ", ".join(f"{op}:{n}" for op, n in sorted(report.histogram.items()) if "GMMA" in op)
    record_property(
        "resources",
        f"{report.name} sm_90a: regs {report.registers}, spills {report.spill_stores}, "
        f"{report.instructions} instr, {hgmma}",
    )


def _clean(report):
    assert report.spill_stores == report.spill_loads == 0, report
    assert not report.uses_local_memory, report


def test_gemm_k_tile_is_four_hgmma_and_no_shared_loads(record_property):
    report = inspect.compile(gemm_k_tile, GEMM_SIG, arch="sm_90a", block=128)
    _record(record_property, report)
    _clean(report)
    assert report.count("HGMMA.64x128x16.F32") == 4, report.histogram
    assert report.count("HGMMA") == 4, report.histogram  # nothing else on the tensor cores
    # wgmma.fence -> WARPGROUP.ARRIVE; wgmma.wait_group 0 -> WARPGROUP.DEPBAR.LE gsb0, 0x0
    assert report.count("WARPGROUP.ARRIVE") >= 1, report.histogram
    assert report.count("WARPGROUP.DEPBAR") >= 1, report.histogram
    # the operands reach the tensor cores through descriptors: no LDS, no LDSM
    assert report.count("LDS") == 0 and report.count("LDSM") == 0, report.histogram
    assert report.count("HMMA") == 0, report.histogram


def ptxas_advisories(report) -> list[str]:
    """ptxas's wgmma advisories (C75xx: a wgmma serialised, or a wait_group it injected to
    protect registers an in-flight wgmma writes), from the same ptxas as ``inspect``."""
    ptxas = inspect._tools()["ptxas_path"]
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp, "k.ptx")
        ptx.write_text(report.ptx)
        res = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", "-o", str(Path(tmp, "k.cubin")), str(ptx)],
            capture_output=True,
            text=True,
            check=True,
        )
    return [line for line in (res.stdout + res.stderr).splitlines() if "(C75" in line]


def test_gemm_k_tile_has_no_wgmma_advisories():
    report = inspect.compile(gemm_k_tile, GEMM_SIG, arch="sm_90a", block=128)
    assert ptxas_advisories(report) == []


def test_registers_a_bf16_two_groups(record_property):
    report = inspect.compile(registers_a_bf16, RS_SIG, arch="sm_90a", block=128)
    _record(record_property, report)
    _clean(report)
    hgmma = {op: n for op, n in report.histogram.items() if op.startswith("HGMMA")}
    assert sum(hgmma.values()) == 2 and all("64x128x16.F32.BF16" in op for op in hgmma), hgmma
    assert report.count("WARPGROUP.DEPBAR") >= 2, report.histogram
    assert report.count("LDS") == 0, report.histogram


def test_sm80_refuses_wgmma_with_our_message():
    with pytest.raises(Exception, match="wgmma needs compute capability 9.0") as info:
        inspect.compile(gemm_k_tile, GEMM_SIG, arch="sm_80", block=128)
    assert "ptxas" not in str(info.value)


# -- the simulator tier's kernels, as the GPU tier compiles them --------------------------------


def _sim_module():
    spec = importlib.util.spec_from_file_location("compiled_test_wgmma", SIM_TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SIM = _sim_module()
IMG = "uint16[::1]"
FIELDS = "int64[::1]"
OUT = "float32[:, ::1]"
SS_SIG = f"void({IMG}, {FIELDS}, {FIELDS}, {OUT})"
SIM_KERNELS = [
    *(
        (f"ss n={n} bf16={bf16} ta={ta} tb={tb} swz={swz} k={k}",
         SIM.ss_kernel(n, bf16, ta, tb, swz, swz, k // 16), SS_SIG)
        for n, bf16, ta, tb, swz, k in [
            (64, False, 0, 0, mma.SWIZZLE_NONE, 32),
            (128, False, 0, 0, mma.SWIZZLE_128B, 64),
            (128, True, 0, 1, mma.SWIZZLE_128B, 64),
            (64, True, 1, 1, mma.SWIZZLE_NONE, 16),
        ]
    ),
    ("ss negated a, n=256", SIM.ss_kernel(256, False, 0, 1, 2, 2, 2, -1), SS_SIG),
    *(
        (f"rs n={n}", SIM.rs_kernel(n, bf16, tb, swz),
         f"void({IMG}, uint32[:, :, ::1], {FIELDS}, {OUT})")
        for n, bf16, tb, swz in [(64, False, 1, mma.SWIZZLE_NONE), (128, True, 0, mma.SWIZZLE_128B)]
    ),
    ("rule ok", SIM.rule_kernel("ok"), f"void({IMG}, {OUT})"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "kernel", "sig"), SIM_KERNELS, ids=[k[0] for k in SIM_KERNELS])
def test_simulator_kernels_compile_for_sm90a(what, kernel, sig):
    report = inspect.compile(kernel, sig, arch="sm_90a", block=128)
    _clean(report)
    assert report.count("HGMMA") >= 1, report.histogram
