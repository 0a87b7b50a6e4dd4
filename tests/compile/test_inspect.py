"""tessera_tile.inspect on small known kernels, and its parsers on broken tool output."""

import math
import re

import numba.cuda.dispatcher
import pytest
from numba import cuda, float32

from tessera_tile import inspect
from tessera_tile._runtime import compat
from tessera_tile.inspect import sass

F32_3 = "void(float32[::1], float32[::1], float32[::1])"
CHAIN = "void(float32[::1], float32[::1], float32[::1], float32[::1])"
ONE = float32(1.0)


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


def exp_divide(x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.exp(x[i]) / y[i]


def chain(a, b, c, out):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        t = a[i] * b[i] + c[i]
        out[i] = math.tanh(t) * (ONE / (ONE + math.exp(-t))) - a[i]


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
    assert report.arch == "sm_90" and report.count("SHFL") >= 1 and report.options == {}


def test_compat_answers_for_the_current_device():
    # The private numba-cuda name inspect relies on (through compat) with no GPU.
    saved = numba.cuda.dispatcher.get_current_device
    with compat.current_device_answered((9, 0)):
        assert numba.cuda.dispatcher.get_current_device().compute_capability == (9, 0)
    assert numba.cuda.dispatcher.get_current_device is saved


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fastmath_of_the_dispatcher_reaches_the_compiler(arch):
    plain = inspect.compile(cuda.jit(exp_divide), F32_3, arch=arch)
    fast = inspect.compile(cuda.jit(fastmath=True)(exp_divide), F32_3, arch=arch)
    assert fast.options == {"fastmath": True} and plain.options == {}
    # IEEE division: div.rn with a call to its out-of-line slow path; fastmath: div.approx.
    assert "div.rn.f32" in plain.ptx and plain.count("CALL") >= 1, plain.histogram
    assert "div.approx" in fast.ptx and fast.count("CALL") == 0, fast.histogram
    assert fast.count("MUFU.RCP") >= 1 and fast.instructions < plain.instructions
    assert fast.sass != plain.sass


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_max_registers_reaches_ptxas(arch):
    free = inspect.compile(cuda.jit(chain), CHAIN, arch=arch)
    capped = inspect.compile(cuda.jit(max_registers=24)(chain), CHAIN, arch=arch)
    assert free.registers > 24, "the kernel must need more registers than the cap to test it"
    assert capped.registers <= 24 and capped.options == {"max_registers": 24}
    assert "max_registers=24" in str(capped)


def test_launch_bounds_and_lineinfo_reach_nvvm():
    bounded = inspect.compile(cuda.jit(launch_bounds=128)(exp_divide), F32_3)
    assert ".maxntid 128" in bounded.ptx and bounded.block == 128
    with pytest.raises(ValueError, match="launch_bounds"):
        inspect.compile(cuda.jit(launch_bounds=128)(exp_divide), F32_3, block=256)
    assert ".loc" not in inspect.compile(cuda.jit(exp_divide), F32_3).ptx
    assert ".loc" in inspect.compile(cuda.jit(lineinfo=True)(exp_divide), F32_3).ptx


def test_linked_code_is_refused():
    with pytest.raises(NotImplementedError, match="exp_divide.*link"):
        inspect.compile(cuda.jit(link=["helpers.ptx"])(exp_divide), F32_3)


def test_tools_match_nvvm_and_the_histogram_matches_the_listing():
    report = inspect.compile(cuda.jit(chain), CHAIN)
    nvvm = report.tools["nvvm"].split(".")[:2]
    assert report.tools["ptxas"].split(".")[:2] == nvvm, report.tools
    assert report.tools["nvdisasm"].split(".")[:2] == nvvm, report.tools
    # The histogram comes from nvdisasm -json; the text listing is a second witness.
    listed = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", report.sass, flags=re.M)
    assert len(listed) == sum(report.histogram.values()) > 100


def test_report_renders_as_plain_text():
    report = inspect.compile(cuda.jit(fastmath=True)(chain), CHAIN, arch="sm_80")
    text = str(report)
    lines = text.splitlines()
    assert "\x1b" not in text
    # Brackets are printed, not read as rich markup.
    assert lines[0] == f"chain [sm_80] {CHAIN}"
    assert all(len(line) <= 100 for line in lines), text
    for label, value in [
        ("registers", str(report.registers)),
        ("spills", f"{report.spill_stores} B stored, {report.spill_loads} B loaded"),
        ("stack", f"{report.stack_bytes} B"),
        ("shared", f"{report.shared_bytes} B static"),
        ("occupancy", f"{report.occupancy:.0%} at 256 threads/block"),
        ("instructions", f"{report.instructions} SASS"),
    ]:
        assert re.search(rf"^  {label} +{re.escape(value)}", text, flags=re.M), (label, text)
    assert "fastmath=True" in text and "MUFU" in text
    # The grid-stride loop: the loops line and the hottest loop's figures.
    hot = report.hottest_loop
    assert hot is not None and hot.count("MUFU") >= 1
    assert re.search(
        rf"^  loops +{len(report.loops)} \(\d+ innermost, nested 1 deep\)$", text, re.M
    )
    hot_line = f"{hot.instructions} instructions at {hot.start:#06x}-{hot.end:#06x}, "
    hot_line += f"{hot.bytes_in_flight} B in flight; "
    assert re.search(rf"^  hottest loop +{re.escape(hot_line)}", text, flags=re.M), text
    assert "MUFU" in text.split("hottest loop")[1].split("tools")[0]  # may wrap to a new line


def test_missing_tool_names_the_wheels(monkeypatch):
    monkeypatch.setattr("cuda.pathfinder.find_nvidia_binary_utility", lambda name: None)
    with pytest.raises(RuntimeError, match=r"ptxas not found.*nvidia-cuda-nvcc==\d+\.\d+\.\*"):
        inspect._find_tool("ptxas")
    with pytest.raises(RuntimeError, match="nvidia-cuda-nvdisasm"):
        inspect._find_tool("nvdisasm")


ENTRY = "_ZN8k_mangledE"
GOOD_LOG = f"""ptxas info    : 8 bytes gmem
ptxas info    : Compiling entry function '{ENTRY}' for 'sm_90'
ptxas info    : Function properties for {ENTRY}
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4224 bytes smem
ptxas info    : Compile time = 17.547 ms
"""


def test_ptxas_log_is_parsed():
    assert inspect._parse_ptxas(GOOD_LOG, "k", "sm_90") == {
        "registers": 40,
        "stack_bytes": 16,
        "spill_stores": 8,
        "spill_loads": 4,
        "shared_bytes": 4224,
    }
    no_smem = GOOD_LOG.replace(", 4224 bytes smem", "")
    assert inspect._parse_ptxas(no_smem, "k", "sm_90")["shared_bytes"] == 0


@pytest.mark.parametrize(
    "log, missing",
    [
        ("", "found 0"),
        (GOOD_LOG.replace("Used 40 registers", "Used many registers"), "Used N registers"),
        (GOOD_LOG.replace("16 bytes stack frame", "stack frame"), "bytes stack frame"),
        (GOOD_LOG.replace(f"properties for {ENTRY}", "properties for other"), "stack frame"),
        (GOOD_LOG + GOOD_LOG.split("\n", 1)[1], "found 2"),
    ],
    ids=["empty", "no-registers", "no-frame", "frame-of-another-function", "two-entries"],
)
def test_unreadable_ptxas_log_raises(log, missing):
    with pytest.raises(RuntimeError, match=rf"kernel 'k' on sm_90(.|\n)*{missing}"):
        inspect._parse_ptxas(log, "k", "sm_90")


def test_sass_json_is_parsed():
    doc = '[{"SM": {}}, [{"function-name": "k", "sass-instructions": [{"opcode": "EXIT"}, '
    doc += '{"predicate": "@P0", "opcode": "LDG.E.128"}, {"opcode": "LDG.E.128"}]}]]'
    functions = sass.parse(doc, "k", "sm_90")
    assert sass.histogram(ins for f in functions for ins in f.instructions) == {
        "EXIT": 1,
        "LDG.E.128": 2,
    }


def test_report_holds_the_listing_it_was_counted_from():
    report = inspect.compile(cuda.jit(chain), CHAIN)
    (kernel,) = report.functions
    assert kernel.name.startswith("_Z") and "chain" in kernel.name
    assert sum(report.histogram.values()) == len(kernel.instructions)
    assert [ins.offset for ins in kernel.instructions[:3]] == [0, 16, 32]
    assert report.loops and all(loop.function == kernel.name for loop in report.loops)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "unexpected document"),
        ("/*0000*/ EXIT ;", "unexpected document"),
        ('[{"SM": {}}, [{"function-name": "k"}]]', "unexpected document"),
        ('[{"SM": {}}, []]', "no instructions"),
        ('[{"SM": {}}, [{"function-name": "k", "sass-instructions": []}]]', "no instructions"),
    ],
    ids=["empty", "text-listing", "no-instruction-list", "no-functions", "empty-function"],
)
def test_unreadable_sass_raises(text, message):
    with pytest.raises(RuntimeError, match=f"kernel 'k' on sm_80.*{message}"):
        sass.parse(text, "k", "sm_80")


def test_occupancy_model():
    # 32 registers x 256 threads: 64 warps resident, the full sm_90 SM.
    assert inspect.occupancy("sm_90", 32, 0, 256) == 1.0
    # 64 registers: 65536 / (64*32) = 32 warps -> 50 %.
    assert inspect.occupancy("sm_90", 64, 0, 256) == 0.5
    # 100 KiB of shared memory per block: two blocks of 8 warps on sm_90 -> 25 %.
    assert inspect.occupancy("sm_90", 16, 100 * 1024, 256) == 0.25


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown architecture 'sm_70'"):
        inspect.compile(shuffle_down, "void(float32[::1], float32[::1])", arch="sm_70")
    with pytest.raises(TypeError, match="expected a @cuda.jit kernel"):
        inspect.compile(42, "void()")
    with pytest.raises(TypeError, match="device function"):
        inspect.compile(halve, "float32(float32)")
    with pytest.raises(TypeError, match="shuffle_down"):
        inspect.compile(shuffle_down, "void(float32[::1], int32)")
    with pytest.raises(ValueError, match="block"):
        inspect.compile(shuffle_down, "void(float32[::1], float32[::1])", block=0)


def test_signatures_given_as_numba_types_read_as_written():
    from numba.core import types

    sig = (types.float32[:, ::1], types.float16[:], types.Array(types.float32, 2, "F"), types.int64)
    assert inspect.signature_text(sig) == "(float32[:, ::1], float16[:], float32[::1, :], int64)"
    assert inspect.signature_text("void(float32[::1])") == "void(float32[::1])"
