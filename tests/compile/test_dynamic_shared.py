"""The compiler's side of the simulator's shared-memory refusals: ptxas refuses a kernel whose
static arrays pass 48 KiB (for sm_80; for sm_90a it does not), and a kernel on dynamic shared
memory declares none statically."""

import pytest
from dynamic_shared_kernels import CARVED_BYTES, carved_tiles
from numba import cuda, float32

from tessera_tile import inspect

KIB = 1024


def static_49_kib(out):
    big = cuda.shared.array(12289, float32)  # 48 KiB + 4 B
    big[cuda.threadIdx.x] = out[0]
    cuda.syncthreads()
    out[1] = big[cuda.threadIdx.x + 1]


def on_dynamic(x, out):
    smem = cuda.shared.array(0, float32)
    smem[cuda.threadIdx.x] = x[cuda.threadIdx.x]
    cuda.syncthreads()
    out[cuda.threadIdx.x] = smem[x.size - 1 - cuda.threadIdx.x]


def test_ptxas_refuses_static_shared_over_48_kib():
    with pytest.raises(RuntimeError, match="too much shared data"):
        inspect.compile(static_49_kib, "void(float32[::1])", "sm_80")


def test_ptxas_for_sm90a_takes_static_shared_over_48_kib():
    """ptxas 13.5 refuses the same kernel for sm_80 (and for plain sm_90) but assembles it for
    sm_90a, what numba-cuda builds on a device of compute capability 9.0. Whether such a
    device then loads it is not known here (no GPU has run it); the simulator keeps refusing
    static arrays over 48 KiB, as the CUDA C++ Programming Guide states the limit."""
    report = inspect.compile(static_49_kib, "void(float32[::1])", "sm_90")
    assert report.shared_bytes == 48 * KIB + 4


@pytest.mark.parametrize(("arch", "limit_kib"), [("sm_80", 163), ("sm_90", 227)])
def test_dynamic_shared_is_reported_and_checked(arch, limit_kib):
    sig = "void(float32[::1], float32[::1])"
    report = inspect.compile(on_dynamic, sig, arch, block=256, dynamic_shared=96 * KIB)
    assert report.shared_bytes == 0
    assert report.dynamic_shared_bytes == 96 * KIB
    assert f"+ {96 * KIB} B dynamic (of {limit_kib * KIB} B" in " ".join(str(report).split())
    # 96 KiB + 1 KiB reserve per block: 2 blocks fit in sm_90's 228 KiB, 1 in sm_80's 164 KiB
    assert report.occupancy == (2 if arch == "sm_90" else 1) * 8 / 64
    with pytest.raises(ValueError, match=f"pass the {limit_kib * KIB} B a block may use"):
        inspect.compile(on_dynamic, sig, arch, dynamic_shared=limit_kib * KIB + 4)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_carved_views_compile_to_plain_shared_accesses(arch):
    """memory.carve builds the view in place: no call (numba's reshape calls a host helper
    that does not link), no local memory, shared loads and stores only."""
    sig = "void(float32[:, ::1], float32[:, ::1])"
    report = inspect.compile(carved_tiles, sig, arch, block=32, dynamic_shared=CARVED_BYTES)
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert report.count("CALL") == 0, report
    assert report.count("LDS") >= 2 and report.count("STS") >= 2, report
