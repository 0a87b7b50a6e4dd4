"""Every kernel the library ships and every kernel an example defines, with its register budget.

Adding a kernel = adding one ``Case`` here: the compile tier then builds it for sm_80 and sm_90,
checks 0 spills, no local memory and the register budget, and ``test_every_kernel_has_a_case``
fails until it is listed. Budgets are the measured count plus a little headroom; raise one only
with a reason in the commit message.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    source: str  # "examples/<file>" or a tessera_tile module name
    kernel: str  # attribute name of the @cuda.jit kernel in that source
    signature: str
    budget: dict[str, int]  # arch -> maximum registers
    block: int = 256
    opcodes: dict[str, int] = field(default_factory=dict)  # opcode prefix -> minimum count
    dynamic_shared: int = 0  # bytes the launch gives (the tensor-core kernels' rings)

    @property
    def id(self) -> str:
        return f"{self.source}:{self.kernel}"


F32_1D = "float32[::1]"
MATMUL = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
BATCHED = "void(float32[:, :, ::1], float32[:, :, ::1], float32[::1], float32[:, :, ::1])"
BATCHED_F16 = "void(float16[:, :, ::1], float16[:, :, ::1], float16[::1], float16[:, :, ::1])"
MM = "tessera_tile.kernels.matmul.simt"
SIMT = {"LDGSTS.E.BYPASS.128": 1, "LDS.128": 32, "FFMA": 512}
FLASH = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, ::1]")
FLASH_ANY = "void({0}, {0}, {0}, {0}, float32)".format("float16[:, :, :]")
FLASH_BF16 = "void({0}, {0}, {0}, {0}, float32)".format("uint16[:, :, ::1]")  # bfloat16 bits
F16_MM = "void(float16[:, :, ::1], float16[:, :, ::1], float32[::1], float16[:, :, ::1])"
BF16_MM = "void(uint16[:, :, ::1], uint16[:, :, ::1], float32[::1], uint16[:, :, ::1])"  # bits
EX2 = {"MUFU.EX2": 1}  # exp as ex2.approx
# the norms' backward: 16-byte loads of x and dy, stores of dx, butterflies over warps
NB_VECTOR = {"LDG.E.128": 2, "STG.E.128": 1, "SHFL.BFLY": 10}
NB_SCALAR = {"LD.E.64": 8, "SHFL.BFLY": 10}  # strided rows: numba loads them generically
ATT = "tessera_tile.kernels.attention.simt"
ATT_ALIGNED = "void(" + "float32[:, :, ::1], " * 4 + "float32)"
ATT_STRIDED = "void(" + "float32[:, :, :], " * 4 + "float32)"
ATT_OPS = {"LDS.128": 16, "FFMA": 128, "MUFU.EX2": 2, "SHFL.BFLY": 6, "BAR": 2}
ATT_THREADS = {16: 128, 32: 128, 64: 128, 128: 128}  # default_config(d).threads
ATT_SHARED = {16: 31744, 32: 44032, 64: 43520, 128: 76288}  # default_config(d).shared_bytes(d)
# (head dim, aligned) -> registers: the most measured over causal / sm_80 / sm_90, plus 8
ATT_BUDGET = {
    (16, True): 104, (16, False): 104, (32, True): 158, (32, False): 150,
    (64, True): 136, (64, False): 138, (128, True): 178, (128, False): 176,
}  # fmt: skip

CASES = [
    Case(
        "examples/axpy",
        "axpy",
        f"void(float32, {F32_1D}, {F32_1D})",
        budget={"sm_80": 32, "sm_90": 32},
        opcodes={"FFMA": 1},
    ),
    Case(
        "examples/elementwise_chain",
        "tanh_sigmoid_chain",
        f"void({F32_1D}, {F32_1D}, {F32_1D}, {F32_1D})",
        budget={"sm_80": 32, "sm_90": 32},
        opcodes={"MUFU.EX2": 1},
    ),
    Case(
        "examples/transpose",
        "transpose_padded",
        "void(float32[:, ::1], float32[:, ::1])",
        budget={"sm_80": 33, "sm_90": 35},
        opcodes={"LDG.E.128": 1, "STG.E.128": 1},
    ),
    Case(
        "examples/transpose",
        "transpose_unpadded",
        "void(float32[:, ::1], float32[:, ::1])",
        budget={"sm_80": 33, "sm_90": 35},
        opcodes={"LDG.E.128": 1, "STG.E.128": 1, "STS.128": 1},
    ),
    Case(
        "examples/large_shared_tile",
        "panel_cumsum",
        "void(float32[:, ::1], float32[:, ::1])",
        budget={"sm_80": 40, "sm_90": 40},
        opcodes={"LDS": 1, "STS": 1, "BAR": 1},
        dynamic_shared=64 * 1024,
    ),
    Case(
        "examples/row_reductions",
        "row_max_sum_warp",
        "void(float32[:, ::1], float32[::1], float32[::1])",
        budget={"sm_80": 41, "sm_90": 43},
        opcodes={"SHFL": 10},
    ),
    Case(
        "examples/row_reductions",
        "row_max_sum_block",
        "void(float32[:, ::1], float32[::1], float32[::1])",
        budget={"sm_80": 53, "sm_90": 56},
        opcodes={"SHFL": 10, "BAR": 2},
    ),
    Case(
        "examples/matmul",
        "matmul_sync",
        MATMUL,
        budget={"sm_80": 88, "sm_90": 82},
        opcodes={"LDS.128": 32, "FFMA": 256, "STG.E.128": 1},
    ),
    Case(
        "examples/matmul",
        "matmul_2stage",
        MATMUL,
        budget={"sm_80": 62, "sm_90": 66},
        opcodes={"LDGSTS": 1, "LDS.128": 32, "FFMA": 256},
    ),
    Case(
        "examples/matmul",
        "matmul_3stage",
        MATMUL,
        budget={"sm_80": 62, "sm_90": 66},
        opcodes={"LDGSTS": 1, "LDS.128": 32, "FFMA": 256},
    ),
    Case(
        "examples/matmul",
        "matmul_3stage_v16",
        MATMUL,
        budget={"sm_80": 62, "sm_90": 66},
        opcodes={"LDGSTS.E.BYPASS.128": 1, "LDS.128": 32, "FFMA": 256},
    ),
    Case(
        "examples/matmul",
        "matmul_3stage_8x8",
        MATMUL,
        budget={"sm_80": 141, "sm_90": 180},
        opcodes={"LDGSTS.E.BYPASS.128": 1, "LDS.128": 32, "FFMA": 512},
    ),
    Case(
        "tessera_tile.kernels.cross_entropy",
        "cross_entropy_rows_f16",
        "void(float16[:, ::1], int64[::1], float16[::1], float32[::1], int64, boolean)",
        budget={"sm_80": 40, "sm_90": 40},
        block=128,
        opcodes={"SHFL": 10, "MUFU.EX2": 1, "LDG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.cross_entropy",
        "cross_entropy_rows_f32",
        "void(float32[:, ::1], int64[::1], float32[::1], float32[::1], int64, boolean)",
        budget={"sm_80": 44, "sm_90": 44},  # the chunk loop unrolled 4 times: 16 logits held
        block=128,
        opcodes={"SHFL": 10, "MUFU.EX2": 1, "LDG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.cross_entropy",
        "cross_entropy_rows_bf16",  # bfloat16 logits and losses: their uint16 bits
        "void(uint16[:, ::1], int64[::1], uint16[::1], float32[::1], int64, boolean)",
        budget={"sm_80": 40, "sm_90": 40},
        block=128,
        opcodes={"SHFL": 10, "MUFU.EX2": 1, "LDG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.cross_entropy",
        "cross_entropy_rows_bf16_f32",  # bfloat16 logits, float32 losses to reduce
        "void(uint16[:, ::1], int64[::1], float32[::1], float32[::1], int64, boolean)",
        budget={"sm_80": 40, "sm_90": 40},
        block=128,
        opcodes={"SHFL": 10, "MUFU.EX2": 1, "LDG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.cross_entropy",
        "cross_entropy_rows_f64",
        "void(float64[:, ::1], int32[::1], float64[::1], float64[::1], int64, boolean)",
        budget={"sm_80": 44, "sm_90": 64},
        block=128,
        opcodes={"SHFL": 10, "LDG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.layer_norm_long",
        "layer_norm_long_f16",
        "void(float16[:, :], float16[::1], float16[::1], float16[:, ::1], float64)",
        budget={"sm_80": 44, "sm_90": 36},
        opcodes={"SHFL": 10, "MUFU.RSQ": 1, "LDG.E.128": 3, "STG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.layer_norm_long",
        "layer_norm_long_f32",
        "void(float32[:, :], float32[::1], float32[::1], float32[:, ::1], float64)",
        budget={"sm_80": 52, "sm_90": 52},
        opcodes={"SHFL": 10, "MUFU.RSQ": 1, "LDG.E.128": 3, "STG.E.128": 1},
    ),
    Case(
        "tessera_tile.kernels.layer_norm_long",
        "layer_norm_long_f64",
        "void(float64[:, :], float64[::1], float64[::1], float64[:, ::1], float64)",
        budget={"sm_80": 50, "sm_90": 48},
        opcodes={"SHFL": 10, "LDG.E.128": 3, "STG.E.128": 1},
    ),
    *(
        Case(
            "tessera_tile.kernels.cross_entropy_backward",
            f"cross_entropy_forward_gradient_{name}",  # gradient_in_forward: the loss, then dx
            f"void({dt}[:, ::1], int64[::1], {ct}[::1], {ct}[::1], {dt}[:, ::1], {ct}[:], int64, "
            "boolean)",
            budget={"sm_80": regs, "sm_90": regs},
            block=128,
            opcodes={"SHFL": 10, "LDG.E.128": 2, "STG.E.128": 1} | ({} if ct == "float64" else EX2),
        )
        for name, dt, ct, regs in (
            ("f16", "float16", "float32", 44),
            ("f32", "float32", "float32", 52),
            ("f64", "float64", "float64", 68),
            ("bf16", "uint16", "float32", 44),  # bfloat16 as its bits
        )
    ),
    *(
        Case(
            "tessera_tile.kernels.cross_entropy_backward",
            f"cross_entropy_backward_{name}",
            f"void({dt}[:, ::1], int64[::1], {ct}[::1], {ct}[:], {dt}[:, ::1], int64)",
            budget={"sm_80": regs, "sm_90": regs},
            block=128,
            opcodes={"LDG.E.128": 1, "STG.E.128": 1} | ({} if ct == "float64" else EX2),
        )
        for name, dt, ct, regs in (
            ("f16", "float16", "float32", 52),
            ("f32", "float32", "float32", 52),
            ("f64", "float64", "float64", 72),
            ("bf16", "uint16", "float32", 52),  # bfloat16 as its bits
        )
    ),
    *(
        Case(
            "tessera_tile.kernels.norm_backward",
            name,
            "void({0}[:, {2}], {0}[:, {2}], {0}[::1], {0}[:, ::1], {1}[:, :, ::1], float64)".format(
                dtype, "float64" if dtype == "float64" else "float32", layout
            ),
            budget=budget,
            block=block,
            opcodes=opcodes,
        )
        for name, dtype, layout, block, budget, opcodes in (
            ("layer_f32_768", "float32", "::1", 256, {"sm_80": 84, "sm_90": 84}, NB_VECTOR),
            ("layer_f16_4096", "float16", "::1", 512, {"sm_80": 84, "sm_90": 84}, NB_VECTOR),
            ("layer_f64_1000", "float64", ":", 256, {"sm_80": 104, "sm_90": 104}, NB_SCALAR),
            ("rms_f32_8192", "float32", "::1", 1024, {"sm_80": 64, "sm_90": 64}, NB_VECTOR),
            ("layer_f32_8192", "float32", "::1", 1024, {"sm_80": 64, "sm_90": 64}, NB_VECTOR),
        )
    ),
    Case(
        "tessera_tile.kernels.norm_backward",
        "fold2_f32",
        "void(float32[:, :, ::1], float32[::1], float32[::1])",
        budget={"sm_80": 34, "sm_90": 34},
    ),
    Case(
        "tessera_tile.kernels.norm_backward",
        "fold1_f16",
        "void(float32[:, :, ::1], float16[::1], float16[::1])",
        budget={"sm_80": 32, "sm_90": 32},
    ),
    Case(
        "tessera_tile.kernels.transpose",
        "transpose_f32",
        "void(float32[:, ::1], float32[:, ::1])",
        budget={"sm_80": 32, "sm_90": 35},
        opcodes={"LDG.E.128": 1, "STG.E.128": 1, "BAR": 2},
    ),
    Case(
        "tessera_tile.kernels.transpose",
        "transpose_f16",
        "void(float16[:, ::1], float16[:, ::1])",
        budget={"sm_80": 58, "sm_90": 51},
        opcodes={"LDS.U16": 1, "STG.E.128": 1, "BAR": 2},
    ),
    Case(
        "tessera_tile.kernels.transpose",
        "transpose_f64",
        "void(float64[:, ::1], float64[:, ::1])",
        budget={"sm_80": 51, "sm_90": 43},
        opcodes={"LDS.64": 1, "BAR": 2},
    ),
    Case(MM, "matmul_f32_default_128x128", BATCHED, {"sm_80": 136, "sm_90": 136}, 256, SIMT),
    Case(MM, "matmul_f32_default_128x64", BATCHED, {"sm_80": 136, "sm_90": 136}, 128, SIMT),
    Case(MM, "matmul_f32_default_64x128", BATCHED, {"sm_80": 136, "sm_90": 136}, 128, SIMT),
    Case(MM, "matmul_f32_default_64x64", BATCHED, {"sm_80": 136, "sm_90": 136}, 64, SIMT),
    Case(MM, "linear_f32_gelu_bias_128x128", BATCHED, {"sm_80": 148, "sm_90": 163}, 256, SIMT),
    Case(
        MM, "matmul_f16_sync_128x128", BATCHED_F16, {"sm_80": 136, "sm_90": 136}, 256, {"FFMA": 512}
    ),
    # Past 48 KiB the SIMT tiles are carved from dynamic shared memory: carving the default
    # 128 x 64 x 8 tile that way compiles to the same SASS (34 LDS.128, 960 FFMA, 140
    # registers on sm_80); this tile's k-loop of 32 keeps a loop where the default unrolls,
    # hence fewer LDS.128 in the whole kernel (18 measured).
    Case(
        MM,
        "linear_f32_gelu_bias_dynamic_128x64x32",
        BATCHED,
        {"sm_80": 150, "sm_90": 167},
        128,
        {"LDGSTS.E.BYPASS.128": 1, "LDS.128": 16, "FFMA": 512},
        dynamic_shared=72 * 1024 + 32,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_anchor",
        F16_MM,
        {"sm_80": 232, "sm_90": 232},
        128,
        {"HMMA.16816.F32": 64, "LDSM": 16, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=49152,
    ),  # fmt: skip
    *(
        Case(
            "tessera_tile.kernels.matmul.tc",
            f"matmul_tc_{side}t",
            F16_MM,
            {"sm_80": 232, "sm_90": 232},
            128,
            {"HMMA.16816.F32": 64, "LDSM": 16, "LDGSTS.E.BYPASS.128": 8},
            dynamic_shared=49152,
        )
        for side in "ab"
    ),  # the anchor reading A or B transposed
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_8warps",
        F16_MM,
        {"sm_80": 136, "sm_90": 136},
        256,
        {"HMMA.16816.F32": 32, "LDSM": 12, "LDGSTS.E.BYPASS.128": 4},
        dynamic_shared=49152,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_sync",
        F16_MM,
        {"sm_80": 176, "sm_90": 176},
        256,
        {"HMMA.16816.F32": 32, "LDSM": 12, "STS.128": 2},
        dynamic_shared=32768,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_bf16_anchor",
        BF16_MM,
        {"sm_80": 232, "sm_90": 232},
        128,
        {"HMMA.16816.F32.BF16": 64, "LDSM": 16, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=49152,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_small_bias",
        F16_MM,
        {"sm_80": 80, "sm_90": 80},
        32,
        {"HMMA.16816.F32": 8, "LDSM": 4, "LDGSTS.E.BYPASS.128": 2},
        dynamic_shared=4096,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_256x128x64",
        F16_MM,
        {"sm_80": 244, "sm_90": 244},
        256,
        {"HMMA.16816.F32": 128, "LDSM": 32, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=147456,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tc",
        "matmul_tc_128x256",
        F16_MM,
        {"sm_80": 236, "sm_90": 236},
        256,
        {"HMMA.16816.F32": 64, "LDSM": 16, "LDGSTS.E.BYPASS.128": 4},
        dynamic_shared=73728,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_wide",
        BATCHED,
        {"sm_80": 248, "sm_90": 248},
        128,
        {"HMMA.1688.F32.TF32": 128, "LDSM": 16, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=98304,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_at",
        BATCHED,
        {"sm_80": 248, "sm_90": 248},
        128,
        {"HMMA.1688.F32.TF32": 128, "LDS.64": 32, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=98304,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_bt",
        BATCHED,
        {"sm_80": 248, "sm_90": 248},
        128,
        {"HMMA.1688.F32.TF32": 128, "LDSM": 32, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=98304,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_anchor",
        BATCHED,
        {"sm_80": 176, "sm_90": 176},
        256,
        {"HMMA.1688.F32.TF32": 32, "LDSM": 8, "LDGSTS.E.BYPASS.128": 4, "STG.E.64": 32},
        dynamic_shared=49152,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_4warps",
        BATCHED,
        {"sm_80": 176, "sm_90": 176},
        128,
        {"HMMA.1688.F32.TF32": 32, "LDSM": 8, "LDGSTS.E.BYPASS.128": 6},
        dynamic_shared=36864,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "matmul_tf32_small_bias",
        BATCHED,
        {"sm_80": 136, "sm_90": 136},
        32,
        {"HMMA.1688.F32.TF32": 16, "LDSM": 4, "LDGSTS.E.BYPASS.128": 8},
        dynamic_shared=8192,
    ),  # fmt: skip
    Case(
        "tessera_tile.kernels.matmul.tf32",
        "linear_tf32_gelu_bias",
        BATCHED,
        {"sm_80": 176, "sm_90": 176},
        256,
        {"HMMA.1688.F32.TF32": 32, "LDSM": 8, "LDGSTS.E.BYPASS.128": 4},
        dynamic_shared=49152,
    ),  # fmt: skip
    # The float32 SIMT flash attention, default configs: every head dim, causal or not, 16-byte
    # cp.async (aligned rows) or 4-byte copies (any strides); 0 spills in every case.
    *(
        Case(
            ATT,
            f"attention_simt_d{d}{'_causal' if causal else ''}{'' if aligned else '_strided'}",
            ATT_ALIGNED if aligned else ATT_STRIDED,
            {"sm_80": ATT_BUDGET[d, aligned], "sm_90": ATT_BUDGET[d, aligned]},
            ATT_THREADS[d],
            ATT_OPS | ({"LDGSTS.E.BYPASS.128": 1} if aligned else {"LDGSTS.E": 1}),
            dynamic_shared=ATT_SHARED[d],
        )
        for d in (16, 32, 64, 128)
        for causal in (False, True)
        for aligned in (True, False)
    ),
    *(
        Case(
            "tessera_tile.kernels.attention.tc",
            name,
            sig,
            budget,
            128,
            {"HMMA.16816.F32": hmma, "LDSM": 1, "MUFU.EX2": 1},
        )
        for name, sig, budget, hmma in (
            # 32-row warps (D <= 64): 192 accumulators and Q's fragments, up to the 255 a
            # thread may hold, with 0 spills (the compile tier checks it)
            ("flash_attention_d64", FLASH, {"sm_80": 255, "sm_90": 255}, 384),
            ("flash_attention_d64_causal", FLASH, {"sm_80": 255, "sm_90": 255}, 384),
            ("flash_attention_d128", FLASH, {"sm_80": 240, "sm_90": 240}, 384),
            ("flash_attention_d16_sync", FLASH_ANY, {"sm_80": 248, "sm_90": 248}, 96),
            ("flash_attention_bf16_d64", FLASH_BF16, {"sm_80": 255, "sm_90": 255}, 384),
        )
    ),  # fmt: skip
]
