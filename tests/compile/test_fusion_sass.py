"""Compile tier for generated kernels: a representative set, for sm_80 and sm_90.

Every generated kernel builds with 0 spills and no local memory; float32 kernels contain no
float64 instruction; contiguous float32 elementwise chains use 128-bit global accesses and fit
in 32 registers; row reductions use warp shuffles.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import tessera_tile as tt
from tessera_tile.ops import _definitions as norms

ARCHS = ("sm_80", "sm_90")
FLOAT64_OPCODES = (
    "DADD",
    "DMUL",
    "DFMA",
    "DSETP",
    "DMNMX",
    "MUFU.RCP64H",
    "MUFU.RSQ64H",
    "F2F.F64",
)


def chain5(a, b):
    return tt.tanh(a * b + 1.5) * tt.sigmoid(a - b) - a


def softmax(x):
    m = tt.max(x, axis=-1, keepdims=True)
    e = tt.exp(x - m)
    return e / tt.sum(e, axis=-1, keepdims=True)


def layer_norm(x):
    mu = tt.mean(x, axis=-1, keepdims=True)
    return (x - mu) * tt.rsqrt(tt.var(x, axis=-1, keepdims=True) + 1e-5)


def column_softmax(x):
    e = tt.exp(x - tt.max(x, axis=0, keepdims=True))
    return e / tt.sum(e, axis=0, keepdims=True)


def column_mean(x):
    return tt.mean(x, axis=0)


def total_and_argmax(x):
    return tt.sum(x), tt.argmax(x)


def gelu_bias(x, b):
    return tt.gelu(x + b)


def nan_constants(x):
    """NaN and infinite constants are written as float("nan") / float("-inf") literals."""
    return tt.where(x > 0, np.nan, x) + tt.where(x < -1, -np.inf, np.float16(0.5))


def residual_layer_norm(x, r, w, b):
    """The sum x + r stays in registers between the passes (issue 40, item 2)."""
    h = x + r
    d = h - tt.mean(h, axis=-1, keepdims=True)
    return d * tt.rsqrt(tt.mean(d * d, axis=-1, keepdims=True) + 1e-5) * w + b


def bias_gelu_residual_layer_norm(x, bias, r, w, b):
    return residual_layer_norm(tt.gelu(x + bias), r, w, b)


f32 = np.zeros((64, 1024), np.float32)
v32 = np.zeros(4096, np.float32)
f8192, w8192 = np.zeros((4, 8192), np.float32), np.zeros(8192, np.float32)
CASES = {
    "chain5": (chain5, (v32, v32)),
    "softmax_1024": (softmax, (f32,)),
    "softmax_8192": (softmax, (np.zeros((4, 8192), np.float32),)),
    "softmax_16384_block_of_512": (softmax, (np.zeros((4, 16384), np.float32),)),
    "softmax_16400_online": (softmax, (np.zeros((4, 16400), np.float32),)),
    "column_softmax_online": (column_softmax, (f32,)),
    "layer_norm": (layer_norm, (f32,)),
    "column_mean": (column_mean, (f32,)),
    "total_and_argmax": (total_and_argmax, (v32,)),
    "gelu_bias_broadcast": (gelu_bias, (f32, np.zeros(1024, np.float32))),
    "chain5_float16": (chain5, (v32.astype(np.float16),) * 2),
    "chain5_bfloat16": (chain5, (v32.astype(ml_dtypes.bfloat16),) * 2),
    "softmax_1024_bfloat16": (softmax, (f32.astype(ml_dtypes.bfloat16),)),
    "softmax_16400_online_bfloat16": (softmax, (np.zeros((4, 16400), ml_dtypes.bfloat16),)),
    "layer_norm_bfloat16": (layer_norm, (f32.astype(ml_dtypes.bfloat16),)),
    "nan_constants": (nan_constants, (v32,)),
    "residual_layer_norm_768": (
        residual_layer_norm,
        (f32[:, :768], f32[:, :768], v32[:768], v32[:768]),
    ),
    "bias_gelu_residual_layer_norm_8192": (
        bias_gelu_residual_layer_norm,
        (f8192, w8192, f8192, w8192, w8192),
    ),
    "bias_gelu_residual_layer_norm_8192_bfloat16": (
        bias_gelu_residual_layer_norm,
        (
            np.zeros((4, 8192), ml_dtypes.bfloat16),
            np.zeros(8192, ml_dtypes.bfloat16),
            np.zeros((4, 8192), ml_dtypes.bfloat16),
            np.zeros(8192, ml_dtypes.bfloat16),
            np.zeros(8192, ml_dtypes.bfloat16),
        ),
    ),
}
# the norms with their weights staged in shared memory once per block (see STAGED)
w512 = np.zeros(512, np.float32)
STAGED = {
    "layer_norm_weights_512_row_cache": (norms.layer_norm(True, True), (f32[:, :512], w512, w512)),
    "layer_norm_weights_129_scalar": (
        norms.layer_norm(True, True),
        (np.zeros((64, 129), np.float32), np.zeros(129, np.float32), np.zeros(129, np.float32)),
    ),
    "layer_norm_weights_float16": (
        norms.layer_norm(True, True),
        (f32[:, :512].astype(np.float16), w512.astype(np.float16), w512.astype(np.float16)),
    ),
    "rms_norm_weight_512_registers": (norms.rms_norm(True), (f32[:, :512], w512)),
}


def float64_ops(report):
    return {op: n for op, n in report.histogram.items() if op.startswith(FLOAT64_OPCODES)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_kernels_compile_cleanly(name, arch):
    fn, args = CASES[name]
    reports = tt.fuse(fn).inspect(*args, arch=arch)
    for report in reports:
        print(report)
        assert report.registers * report.block <= 65536  # a block fits an SM's registers
        assert report.spill_stores == 0 and report.spill_loads == 0
        assert not report.uses_local_memory
        assert not float64_ops(report), float64_ops(report)


@pytest.mark.parametrize("arch", ARCHS)
def test_contiguous_float32_chain_is_vectorized_and_fits_32_registers(arch):
    (report,) = tt.fuse(chain5).inspect(v32, v32, arch=arch)
    assert report.count("LDG.E.128") >= 2 and report.count("STG.E.128") >= 1
    assert report.registers <= 32
    if arch == "sm_90":
        assert report.occupancy == 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_softmax_rows_use_shuffles_and_16_byte_accesses(arch):
    (report,) = tt.fuse(softmax).inspect(f32, arch=arch)
    assert report.count("SHFL") >= 10
    assert report.count("LDG.E.128") >= 1 and report.count("STG.E.128") >= 1
    assert report.count("LDL") == 0 and report.count("STL") == 0


def divisions_64(report) -> set:
    return set(re.findall(r"\b(?:div|rem)\.[su]64\b", report.ptx))


@pytest.mark.parametrize("arch", ARCHS)
def test_vector_chain_tail_is_straight_code_without_64_bit_division(arch):
    # the scalar tail after the 16-byte loop runs at most once per thread: an `if`, whose
    # compiled form needs no trip count (a loop there costs a div.u64 and its unrolled copies)
    (report,) = tt.fuse(chain5).inspect(v32, v32, arch=arch)
    assert not divisions_64(report), divisions_64(report)
    assert report.histogram.get("STG.E") == 1  # one scalar store: the tail is not unrolled


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_max_and_min_propagate_nan_in_one_instruction(arch):
    # max.NaN.f32 (sm_80+): one FMNMX.NAN per element instead of a compare-and-select chain
    (report,) = tt.fuse(softmax).inspect(f32, arch=arch)
    assert report.count("FMNMX.NAN") >= 32  # 32 elements per lane, and the butterfly


@pytest.mark.parametrize("arch", ARCHS)
def test_float64_max_has_no_nan_instruction_and_selects(arch):
    # PTX has no max.NaN.f64: compare and select
    f64 = np.zeros((8, 256), np.float64)
    (report,) = tt.fuse(lambda x, y: tt.maximum(x, y) + tt.min(x, axis=-1, keepdims=True)).inspect(
        f64, f64, arch=arch
    )
    assert report.count("FMNMX.NAN") == 0 and report.count("DSETP") > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_strided_coordinates_divide_in_32_bits_below_2_31_elements(arch):
    # a broadcast operand keeps two index axes: coordinates are split off the linear index
    # with unsigned 32-bit division and remainder, never 64-bit ones
    x = np.zeros((64, 48), np.float32)
    y = np.zeros(48, np.float32)
    (report,) = tt.fuse(lambda a, b: a * b + a).inspect(x, y, arch=arch)
    assert "div.u32" in report.ptx and not divisions_64(report), divisions_64(report)


@pytest.mark.parametrize("arch", ARCHS)
def test_float16_rows_and_chains_use_16_byte_accesses(arch):
    # 8 float16 per LDG.E.128; 2-byte loads remain only in the chain's once-run tail
    h = np.zeros((64, 1024), np.float16)
    (rows,) = tt.fuse(softmax).inspect(h, arch=arch)
    assert rows.count("LDG.E.128") >= 1 and rows.count("STG.E.128") >= 1
    assert "LDG.E.U16" not in rows.histogram and "STG.E.U16" not in rows.histogram
    (chain,) = tt.fuse(chain5).inspect(*(v32.astype(np.float16),) * 2, arch=arch)
    assert chain.count("LDG.E.128") == 2 and chain.count("STG.E.128") == 1
    assert chain.histogram.get("LDG.E.U16") == 2 and chain.histogram.get("STG.E.U16") == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_softmax_reads_16_bytes_at_a_time_at_near_float32_cost(arch):
    """Issue 22's bar: LDG.E.128 (8 bfloat16 per access), and at most 1.5x the float32 kernel's
    instructions per element. A 1,024-element row is held in registers, unrolled: the whole
    kernel is its steady state (no loop), 32 elements per lane in both dtypes."""
    (bf16,) = tt.fuse(softmax).inspect(f32.astype(ml_dtypes.bfloat16), arch=arch)
    (fp32,) = tt.fuse(softmax).inspect(f32, arch=arch)
    assert bf16.count("LDG.E.128") == 4 and bf16.count("STG.E.128") == 4
    assert "LDG.E.U16" not in bf16.histogram and "STG.E.U16" not in bf16.histogram
    assert bf16.count("F2F") == 0  # widening is a shift; rounding packs pairs (F2FP)
    total = sum(bf16.histogram.values())
    base = sum(fp32.histogram.values())
    print(f"{arch}: bfloat16 {total / 32:.2f}, float32 {base / 32:.2f} instructions per element")
    assert total <= 1.5 * base


@pytest.mark.parametrize("arch", ARCHS)
def test_softmax_row_of_1024_stays_in_registers_and_computes_exp_once(arch):
    # a warp per row, 32 float32 per lane: 8 LDG.E.128 issued up front, no shared memory, one
    # exp per element (MUFU.EX2: 32 per lane), and the two all-reduces' 10 shuffles without a
    # divergent fallback copy
    (report,) = tt.fuse(softmax).inspect(f32, arch=arch)
    assert report.shared_bytes == 0 and report.spill_stores == 0
    assert report.count("LDG.E.128") == 8 and report.count("STG.E.128") == 8
    assert report.count("MUFU.EX2") == 32
    assert report.count("SHFL") == 10


def slow_path_calls(report) -> list[str]:
    """Calls of CUDA's out-of-line math (``__cuda_sm20_rcp_rn_f32_slowpath``...), not of
    local labels (a divergent-shuffle fallback)."""
    lines = report.sass.splitlines()
    return [line.split("`")[-1] for line in lines if "CALL" in line and "__cuda" in line]


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_math_has_no_ieee_slow_path_and_one_reciprocal_per_row(arch):
    # numerics policy: ex2.approx for exp(x - max), rcp.approx once per row and in sigmoid
    (rows,) = tt.fuse(softmax).inspect(f32, arch=arch)
    assert not slow_path_calls(rows) and rows.count("MUFU.RCP") == 1
    (chain,) = tt.fuse(chain5).inspect(v32, v32, arch=arch)
    assert not slow_path_calls(chain)
    # math="ieee": IEEE division and libdevice exp, which bring the slow path back
    (ieee,) = tt.fuse(softmax, math="ieee").inspect(f32, arch=arch)
    assert slow_path_calls(ieee)
    assert ieee.count("FFMA.RM") > 0 and rows.count("FFMA.RM") == 0  # libdevice expf's rounding


@pytest.mark.parametrize("arch", ARCHS)
def test_sigmoid_is_one_ex2_and_one_rcp_per_element_without_subnormal_fixups(arch):
    # the .ftz forms: ptxas adds no compare-and-rescale around MUFU.EX2 and MUFU.RCP (the
    # plain forms cost 7 more instructions per sigmoid); libdevice's tanhf brings one EX2 and
    # one RCP of its own per element
    (chain,) = tt.fuse(chain5).inspect(v32, v32, arch=arch)
    assert "ex2.approx.ftz.f32" in chain.ptx and "rcp.approx.ftz.f32" in chain.ptx
    loop = chain.loop_with("LDG.E.128")
    elements = 4 * loop.count("LDG.E.128") // 2  # two inputs, 4 floats per load
    assert loop.count("MUFU.EX2") == loop.count("MUFU.RCP") == 2 * elements


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_norm_over_4096_keeps_the_row_in_registers_with_one_rsqrt_per_row(arch):
    # a block per row, each thread's 16 elements in registers (4 LDG.E.128, no loop, no
    # shared row cache); the warps' partials are combined with shuffles, and the per-row mean
    # and rsqrt are one MUFU.RCP and one MUFU.RSQ, with no IEEE slow path anywhere
    (report,) = tt.fuse(layer_norm).inspect(np.zeros((8, 4096), np.float32), arch=arch)
    assert report.count("MUFU.RSQ") == 1 and report.count("MUFU.RCP") == 1
    assert not slow_path_calls(report)
    assert report.count("LDG.E.128") == 4 and report.count("STG.E.128") == 4
    assert not report.loops and report.count("LDS.128") == report.count("STS.128") == 0
    # each of the two block reductions: 5 shuffles in the warp, 5 over the warps' partials
    assert report.count("SHFL") == 20


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(STAGED))
def test_norms_with_weights_staged_once_per_block_compile_cleanly(name, arch):
    # the weights are copied to shared memory before the rows (a barrier), then every row
    # reads them from there: shared loads and no global load of a weight inside the row loop
    fn, args = STAGED[name]
    (report,) = fn.inspect(*args, 1e-5, arch=arch)
    print(report)
    assert report.spill_stores == 0 and report.spill_loads == 0
    assert not report.uses_local_memory
    assert not float64_ops(report), float64_ops(report)
    assert report.count("BAR.SYNC") >= 1 and report.count("LDS") >= 1


# Issue 40, item 2, planned for a GPU: (rows, columns) of a transformer block's activations
RESIDUAL_SHAPES = [(4096, 768), (4096, 4096), (2048, 8192), (64, 768), (64, 4096), (64, 8192)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_residual_layer_norms_move_at_most_1_1x_their_minimum_on_a_gpu(dtype):
    """A residual layer norm, and bias + gelu + residual + layer norm, move at most 1.1x their
    minimum (each row input read once, the result written once, each weight once) once there
    are rows enough for every block of the grid to serve ten or more: the grid is capped at two
    blocks of 256 (or one of 512) per SM of a 132-SM GPU, and each block reads the weights once
    for all its rows. With fewer rows every block still gets one: the ratio printed for 64 rows
    is the price of using the GPU's SMs. The simulator measures the same plans' bytes at small
    shapes (tests/fusion/test_fusion_row_chains.py); this checks the figures of GPU plans."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    for fn in (residual_layer_norm, bias_gelu_residual_layer_norm):
        for rows, width in RESIDUAL_SHAPES:
            x, v = np.zeros((rows, width), dt), np.zeros(width, dt)
            args = (x, x, v, v) if fn is residual_layer_norm else (x, v, x, v, v)
            report = tt.fuse(fn).explain(*args)
            weights = (len(args) - 2) * width * dt.itemsize
            ratio = report.bytes_fused / (3 * x.nbytes + weights)
            print(f"{fn.__name__} {dtype} {rows} x {width}: {ratio:.3f}x the minimum; "
                  f"{report.stages[0].rsplit('; ', 1)[1]}")  # fmt: skip
            assert report.kernels == 1
            if rows > 64:
                assert ratio <= 1.1, (fn.__name__, rows, width, ratio)


BACKWARD = ["residual_layer_norm", "bias_gelu_linear", "softmax", "log_softmax", "softmax_16_bit"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", BACKWARD)
def test_backward_kernels_compile_cleanly(name, arch):
    """The kernels of ``tt.vjp``'s pullbacks: a fused function's (the composer plans them as
    any fused function), and softmax's and log_softmax's own (one row kernel from y and dy):
    no spills, no local memory, no float64 instruction in float32 gradients."""
    from tessera_tile._fusion.autodiff import Pullback

    x, v, w = np.zeros((64, 768), np.float32), np.zeros(768, np.float32), np.zeros((768, 256))
    y16 = np.zeros((64, 512), np.float16)
    if name in ("residual_layer_norm", "bias_gelu_linear"):
        fn, args, cotangent = {
            "residual_layer_norm": (residual_layer_norm, (x, x, v, v), x),
            "bias_gelu_linear": (lambda x, w, b: tt.gelu(x @ w + b),
                                 (x, w.astype(x.dtype), v[:256]), x[:, :256]),
        }[name]  # fmt: skip
        reports = Pullback(tt.fuse(fn), args, {}, single=True).inspect(cotangent, arch)
    else:  # from the result y and the cotangent dy
        kind = name.removesuffix("_16_bit")
        backward = getattr(norms, f"{kind}_backward")(1)
        args = (y16, y16) if name.endswith("16_bit") else (x[:, :512], x[:, :512])
        reports = backward.inspect(*args, arch=arch)
    for report in reports:
        print(report)
        assert report.registers * report.block <= 65536
        assert report.spill_stores == 0 and report.spill_loads == 0
        assert not report.uses_local_memory
        assert not float64_ops(report), float64_ops(report)
