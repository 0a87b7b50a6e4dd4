"""Compile tier: the matmul kernels' main loop and epilogue, read from their SASS.

* Main loop (the loop with the most FFMA): at least 12.8 FFMA per executed shared load (the
  expert hand-written CUDA C++ SIMT GEMM has 16, Triton's exact-fp32 GEMM 12.8), ``LDGSTS`` in
  the pipelined variants, no spills, no local memory. (ptxas pads around barriers with
  ``@!PT LDS RZ, [RZ]``, a load whose guard is never true: inspect does not count it.)
* Fused epilogue: ``linear`` with exact gelu does not spill, calls libdevice's ``erff`` (no
  float64), and costs at most 30 SASS instructions per output element a thread handles
  (linear's SASS minus matmul's, same config, over the 64 elements of its 8 x 8 register tile;
  the expert CUDA C++ gelu epilogue costs 25.3, Triton's 33.7, ptxas 13.5).
* The ops' ``inspect`` compiles what their ``explain`` says they launch.
The figures are recorded as ``resources`` lines in the terminal summary.
"""

import numpy as np
import pytest
from numba import types
from numba.cuda.compiler import compile_cuda  # LLVM IR before NVVM: names libdevice calls

from tessera_tile import inspect, ops
from tessera_tile.kernels import epilogue
from tessera_tile.kernels.matmul import simt as km
from tessera_tile.tile_config import CANDIDATES, estimated_registers

ARCHS = ("sm_80", "sm_90")
SIG = km.signature()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("config", CANDIDATES, ids=str)
def test_main_loop_ffma_per_shared_load(config, arch, record_property):
    kernel = km.simt_matmul(config)
    report = inspect.compile(kernel, SIG, arch=arch, block=config.threads)
    loop = report.loop_with("FFMA")
    loads = loop.count("LDS")
    ratio = loop.count("FFMA") / loads
    record_property(
        "resources",
        f"matmul {config} {arch}: regs {report.registers} (model {estimated_registers(config)}) "
        f"main loop {loop.instructions} instr, {loop.key_opcodes()}; "
        f"{ratio:.1f} FFMA per executed shared load",
    )
    assert ratio >= 12.8, report
    assert loop.count("LDGSTS") >= 1 and loop.count("BAR") >= 1, loop.key_opcodes()
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    # the default model's register estimate stays within 25% of ptxas's figure
    assert abs(report.registers - estimated_registers(config)) <= 0.25 * report.registers


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu"])
def test_epilogue_cost_per_output_element(activation, arch, record_property):
    config = CANDIDATES[0]
    plain = inspect.compile(km.simt_matmul(config), SIG, arch=arch)
    fused_kernel = km.simt_matmul(config, epilogue.ACTIVATIONS[activation], True)
    fused = inspect.compile(fused_kernel, SIG, arch=arch)
    tm, tn = config.register_tile
    per_element = (fused.instructions - plain.instructions) / (tm * tn)
    record_property(
        "resources",
        f"linear {activation}+bias {arch}: regs {fused.registers} spills "
        f"{fused.spill_stores + fused.spill_loads}, {fused.instructions} vs matmul "
        f"{plain.instructions} SASS: epilogue {per_element:.1f} instr per output element",
    )
    assert fused.spill_stores == fused.spill_loads == 0 and not fused.uses_local_memory
    assert not any(fused.count(op) for op in ("DFMA", "DADD", "DMUL", "MUFU.RCP64H"))
    assert per_element <= 30, per_element


def test_exact_gelu_calls_libdevice_erff():
    cres = compile_cuda(epilogue.gelu.py_func, types.float32, (types.float32,), cc=(8, 0))
    llvm = cres.library.get_llvm_str()
    assert '@"__nv_erff"' in llvm and "double" not in llvm


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("matmul", lambda x, w, b: ops.matmul.inspect(x, w, arch="sm_90")),
        ("linear", lambda x, w, b: ops.linear.inspect(x, w, b, "gelu", arch="sm_90")),
        ("mlp", lambda x, w, b: ops.mlp.inspect(x, w, b, w.T.copy(), x[0].copy(), arch="sm_90")),
    ],
)
def test_inspect_compiles_what_explain_launches(name, call):
    x, w, b = np.zeros((256, 256), "f4"), np.zeros((256, 256), "f4"), np.zeros(256, "f4")
    reports = call(x, w, b)
    explained = {
        "matmul": lambda: ops.matmul.explain(x, w),
        "linear": lambda: ops.linear.explain(x, w, b, "gelu"),
        "mlp": lambda: ops.mlp.explain(x, w, b, w.T.copy(), x[0].copy()),
    }[name]()
    assert len(reports) == explained.kernels >= 1
    for r in reports:
        assert r.spill_stores == r.spill_loads == 0 and not r.uses_local_memory, r
        assert r.count("LDGSTS") >= 1 and r.count("FFMA") >= 512, r


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k, n", [(4096, 4096), (4100, 4100)], ids=["aligned", "unaligned"])
def test_float16_linear_runs_on_tensor_cores(k, n, arch, record_property):
    # the default float16 tile (128 x 128 x 32, 4 warps, cp.async) on 16-byte aligned rows,
    # the synchronous 8-warp variant otherwise; exact gelu and a bias on the accumulators, in
    # registers: no spills and no local memory (the epilogue is written out, not looped). On
    # sm_90 aligned rows run on the warpgroup MMA (test_matmul_wgmma_sass.py), no ldmatrix.
    x, w = np.zeros((256, k), np.float16), np.zeros((k, n), np.float16)
    (report,) = ops.linear.inspect(x, w, np.zeros(n, np.float16), "gelu", arch=arch)
    record_property("resources", f"linear f16 gelu {k}x{n} {arch}: regs {report.registers}")
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    if arch == "sm_90" and k % 8 == 0:
        assert report.loop_with("HGMMA").count("HGMMA") >= 2, report.histogram
        assert report.count("HMMA") == report.count("LDSM") == 0, report.histogram
        return
    loop = report.loop_with("HMMA")
    assert loop.count("HMMA.16816.F32") >= 32 and loop.count("LDSM") >= 8
    assert (report.count("LDGSTS") > 0) == (k % 8 == 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k, n", [(4096, 4096), (4098, 4096)], ids=["aligned", "unaligned"])
def test_tf32_linear_inspects_the_kernel_explain_names(k, n, arch, record_property):
    # precision="tf32": the TF32 tensor-core kernel where rows are 16-byte aligned (K and N
    # multiples of 4), with exact gelu and a bias in registers; the exact SIMT kernel otherwise
    x, w, b = np.zeros((256, k), "f4"), np.zeros((k, n), "f4"), np.zeros(n, "f4")
    (report,) = ops.linear.inspect(x, w, b, "gelu", arch=arch, precision="tf32")
    explained = ops.linear.explain(x, w, b, "gelu", precision="tf32")
    assert report.name in explained.stages[0]
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    loop = report.loop_with("HMMA" if k % 4 == 0 else "FFMA")
    if k % 4 == 0:
        record_property("resources", f"linear tf32 gelu {k}x{n} {arch}: regs {report.registers}")
        assert report.name.startswith("matmul_tf32_")
        assert loop.count("HMMA.1688.F32.TF32") >= 32 and loop.count("LDSM") >= 8
        assert report.count("LDGSTS") > 0
    else:
        assert loop.count("FFMA") >= 512 and report.count("HMMA") == 0


class DeviceStandIn:
    """A device array as ``__cuda_array_interface__`` describes it (never dereferenced:
    ``inspect`` reads only shape, dtype and strides)."""

    def __init__(self, shape, dtype, transposed=False, column_step=1):
        itemsize = np.dtype(dtype).itemsize
        strides = (itemsize, shape[0] * itemsize) if transposed else None
        if column_step > 1:  # every column_step-th column of a wider array
            strides = (shape[1] * column_step * itemsize, column_step * itemsize)
        self.__cuda_array_interface__ = {
            "version": 3, "shape": shape, "typestr": np.dtype(dtype).str,
            "data": (256, False), "strides": strides,
        }  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_transposed_weight_runs_on_tensor_cores(arch, record_property):
    # a transposed float16 device weight (a backward pass's w.T): read in place by the
    # tensor-core kernel (sm_80: mma.sync, sm_90: wgmma), exact gelu and a bias; 0 spills
    x, b = DeviceStandIn((256, 512), np.float16), DeviceStandIn((256,), np.float16)
    w = DeviceStandIn((512, 256), np.float16, transposed=True)
    (report,) = ops.linear.inspect(x, w, b, "gelu", arch=arch)
    record_property("resources", f"linear f16 transposed w gelu {arch}: regs {report.registers}")
    assert "_bt" in report.name, report.name
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert report.count("HGMMA" if arch == "sm_90" else "HMMA") >= 8, report.histogram


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_strided_operand_runs_on_simt(arch, record_property):
    # a float16 device weight read every other column: the float32 SIMT kernel's default tile
    # with synchronous widening copies (issue 19), exact gelu and a bias; 0 spills
    x, b = DeviceStandIn((256, 512), np.float16), DeviceStandIn((256,), np.float16)
    w = DeviceStandIn((512, 256), np.float16, column_step=2)
    (report,) = ops.linear.inspect(x, w, b, "gelu", arch=arch)
    record_property("resources", f"linear f16 strided gelu {arch}: regs {report.registers}")
    assert report.name.startswith("matmul_128x128x8_w8_s3_sync_gelu_bias"), report.name
    assert report.spill_stores == report.spill_loads == 0 and not report.uses_local_memory
    assert report.loop_with("FFMA").count("FFMA") >= 512
