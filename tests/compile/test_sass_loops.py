"""Loops of the SASS, instructions per element and bytes in flight (tessera_tile.inspect.sass,
through tessera_tile.inspect): structural facts on small real kernels, and the analysis on hand-made
listings. No exact instruction count is asserted: those change with ptxas."""

import json
import math
import re

import pytest
from numba import cuda, float32

from tessera_tile import inspect
from tessera_tile.inspect import sass
from tessera_tile.memory import load16, store16

F32 = "float32[::1]"
I32 = "int32[::1]"


@cuda.jit
def scale(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * float32(2.0)


@cuda.jit
def copy16(x, y):
    # A grid-stride copy with 16-byte accesses: LLVM unrolls it and keeps a remainder loop.
    for i in range(cuda.grid(1), x.shape[0] // 4, cuda.gridsize(1)):
        store16(y, i * 4, load16(x, i * 4))


# While loops whose next index is loaded cannot be unrolled (no trip count), so their
# number of loops is a structural fact, not a choice of the optimiser.
@cuda.jit
def chase(nxt, x, y):
    i = cuda.grid(1)
    while i < y.shape[0]:
        y[i] = x[i]
        i = nxt[i]


@cuda.jit
def chase_nested(nxt, x, y):
    i = cuda.grid(1)
    while i < y.shape[0]:
        acc = float32(0.0)
        j = i
        while j >= 0:
            acc += x[j]
            j = nxt[j]
        y[i] = acc
        i = nxt[i]


@cuda.jit
def sum4(nxt, a, b, c, d, out):
    # Four independent 128-bit loads issued before any of them is used.
    i = cuda.grid(1)
    while i < out.shape[0] // 4:
        va, vb, vc, vd = load16(a, i * 4), load16(b, i * 4), load16(c, i * 4), load16(d, i * 4)
        s0 = va[0] + vb[0] + vc[0] + vd[0]
        s1 = va[1] + vb[1] + vc[1] + vd[1]
        s2 = va[2] + vb[2] + vc[2] + vd[2]
        s3 = va[3] + vb[3] + vc[3] + vd[3]
        store16(out, i * 4, (s0, s1, s2, s3))
        i = nxt[i]


@cuda.jit
def gather2(idx, a, b, out):
    # The vector loads' addresses come from a load: only that 4-byte load is independent.
    i = cuda.grid(1)
    while i < out.shape[0] // 4:
        j = idx[i]
        va, vb = load16(a, j * 4), load16(b, j * 4)
        store16(out, i * 4, (va[0] + vb[0], va[1] + vb[1], va[2] + vb[2], va[3] + vb[3]))
        i = j


def backward_branches(text: str) -> dict[int, int]:
    """Header -> offset of its last backward branch, read from the ``nvdisasm -c`` text
    listing, which names branch targets by label: a second witness for the JSON inspect reads."""
    labels, branches = {}, []
    pending = []
    for line in text.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        ins = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*)$", line)
        if ins:
            offset = int(ins.group(1), 16)
            labels.update(dict.fromkeys(pending, offset))
            pending = []
            bra = re.search(r"\bBRA(?:\.\S+)?\s.*`\((\.L_x_\d+)\)", ins.group(2))
            if bra:
                branches.append((offset, bra.group(1)))
    ends: dict[int, int] = {}
    for offset, label in branches:
        if labels[label] < offset:
            ends[labels[label]] = max(ends.get(labels[label], 0), offset)
    return ends


def test_kernel_without_loops():
    report = inspect.compile(scale, f"void({F32}, {F32})")
    assert report.loops == () and report.hottest_loop is None
    assert re.search(r"^  loops +none$", str(report), flags=re.M), str(report)
    assert "hottest loop" not in str(report)
    with pytest.raises(ValueError, match="scale.*no loop"):
        report.instructions_per_element(1)
    # Without a loop the whole kernel is scanned: x[i] is its one load, 4 bytes.
    assert report.bytes_in_flight() == 4


def test_one_loop():
    report = inspect.compile(chase, f"void({I32}, {F32}, {F32})")
    (loop,) = report.loops
    assert loop.depth == 1 and loop.innermost and report.hottest_loop == loop
    assert loop.start < loop.end and loop.count("BRA") >= 1
    assert loop.histogram["LDG.E"] == 2 and loop.histogram["STG.E"] == 1, loop.histogram
    assert 0 < loop.instructions < report.instructions
    assert loop.instructions == sum(loop.histogram.values()) and "NOP" not in loop.histogram


def test_nested_loops():
    report = inspect.compile(chase_nested, f"void({I32}, {F32}, {F32})")
    outer, inner = sorted(report.loops, key=lambda loop: loop.depth)
    assert (outer.depth, outer.innermost) == (1, False)
    assert (inner.depth, inner.innermost) == (2, True)
    assert outer.start <= inner.start and inner.end <= outer.end
    assert report.hottest_loop == inner
    # y[i] is stored after the inner loop, in the outer one only.
    assert inner.count("FADD") >= 1 and inner.count("STG") == 0 and outer.count("STG.E") == 1
    assert outer.instructions > inner.instructions
    assert "nested 2 deep" in str(report)
    # Counted in each loop's own body: the outer loop's x[j] loads belong to the inner loop.
    assert report.loop_with("LDG") == inner and report.loop_with("STG") == outer
    assert report.loop_with("HMMA") is None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_grid_stride_copy_with_16_byte_accesses(arch):
    report = inspect.compile(copy16, f"void({F32}, {F32})", arch=arch)
    hot = report.hottest_loop
    assert hot is not None and hot.innermost
    assert hot.count("LDG.E.128") == hot.count("STG.E.128") >= 1, hot.histogram
    assert hot.count("LDG") == hot.count("LDG.E.128"), "no narrower global load in the loop"
    # The unroll factor is the number of vector loads; 4 float32 per load.
    per_iteration = 4 * hot.count("LDG.E.128")
    ipe = report.instructions_per_element(per_iteration)
    assert 0 < ipe < math.inf and ipe == hot.instructions / per_iteration
    assert report.instructions_per_element(4) < report.instructions_per_element(1)
    assert report.instructions_per_element(1) == hot.instructions
    other = [loop for loop in report.loops if loop != hot]
    assert ipe == report.instructions_per_element(per_iteration, loop=hot)
    assert all(report.instructions_per_element(1, loop=loop) <= hot.instructions for loop in other)
    # The text listing (labels) has a backward branch to each header, inside the body.
    branches = backward_branches(report.sass)
    assert set(branches) == {loop.start for loop in report.loops}
    assert all(branches[loop.start] in loop for loop in report.loops)
    line = re.search(r"^  hottest loop +(\d+) instructions at (0x[0-9a-f]{4})", str(report), re.M)
    assert line and int(line.group(1)) == hot.instructions and int(line.group(2), 16) == hot.start
    assert "LDG.E.128:" in str(report).split("hottest loop")[1]


def test_bytes_in_flight_counts_independent_vector_loads():
    report = inspect.compile(sum4, f"void({I32}, {F32}, {F32}, {F32}, {F32}, {F32})")
    (loop,) = report.loops
    assert loop.count("LDG.E.128") == 4
    assert report.bytes_in_flight() == loop.bytes_in_flight == 16 * 4
    assert report.bytes_in_flight(loop) == 64


def test_bytes_in_flight_stops_at_a_dependent_load():
    report = inspect.compile(gather2, f"void({I32}, {F32}, {F32}, {F32})")
    (loop,) = report.loops
    assert loop.count("LDG.E.128") == 2 and loop.histogram["LDG.E"] == 1, loop.histogram
    # idx[i] (4 B) must arrive before either vector load can be addressed.
    assert report.bytes_in_flight() == 4


def test_instructions_per_element_validates():
    report = inspect.compile(chase, f"void({I32}, {F32}, {F32})")
    for bad in (0, -4, 1.5, None):
        with pytest.raises(ValueError, match="elements_per_iteration"):
            report.instructions_per_element(bad)


# ---- the analysis on hand-made listings -------------------------------------------------


def listing(*instructions: str) -> str:
    """An ``nvdisasm -json`` document of one function: 'OPCODE operands' per instruction,
    with an optional '@P0 ' guard."""
    out = []
    for text in instructions:
        predicate = ""
        if text.startswith("@"):
            predicate, text = text.split(" ", 1)
        opcode, _, operands = text.partition(" ")
        ins = {"opcode": opcode, "operands": operands.replace(" ", "")}
        if predicate:
            ins["predicate"] = predicate
        out.append(ins)
    function = {"function-name": "k", "start": 0, "length": 16 * len(out)}
    return json.dumps([{"SM": {}}, [function | {"sass-instructions": out}]])


def loops_of(*instructions: str) -> tuple[sass.Loop, ...]:
    return sass.find_loops(sass.parse(listing(*instructions), "k", "sm_90"))


def test_loops_of_a_listing():
    loops = loops_of(
        "MOV R0, RZ",  # 0x00
        "IADD3 R0, R0, 0x1, RZ",  # 0x10  outer header
        "FADD R2, R2, R3",  # 0x20  inner header
        "NOP",  # 0x30
        "@P0 BRA 0x20",  # 0x40  inner back edge
        "@P1 BRA 0x70",  # 0x50  forward: not a loop
        "@P2 BRA 0x10",  # 0x60  outer back edge (a 'continue')
        "@P3 BRA 0x10",  # 0x70  outer back edge
        "EXIT",  # 0x80
        "BRA 0x90",  # 0x90  the trap after EXIT
    )
    outer, inner = loops
    assert (outer.start, outer.end, outer.depth, outer.innermost) == (0x10, 0x70, 1, False)
    assert (inner.start, inner.end, inner.depth, inner.innermost) == (0x20, 0x40, 2, True)
    assert inner.instructions == 2 and inner.histogram == {"FADD": 1, "BRA": 1}
    assert outer.instructions == 6 and outer.count("BRA") == 4
    assert sass.hottest(loops) == inner


def test_never_true_guard_is_not_counted():
    # ptxas pads around barriers with "@!PT LDS RZ, [RZ]": it never runs, so it is no load
    (loop,) = loops_of(
        "LDS.128 R4, [R2]",  # 0x00  header
        "@!PT LDS RZ, [RZ]",  # 0x10
        "FFMA R0, R4, R5, R0",  # 0x20
        "@P0 BRA 0x0",  # 0x30
        "EXIT",  # 0x40
    )
    assert loop.count("LDS") == 1 and loop.instructions == 3


def test_loop_with_counts_own_bodies():
    # A GEMM-like main loop with a small copy loop nested in it: the copy loop is innermost,
    # so it is the hottest guess, but the FFMAs are in the outer loop's own body.
    listing_ = (
        "FFMA R0, R1, R2, R0",  # 0x00  main loop header
        "FFMA R0, R1, R3, R0",  # 0x10
        "LDS R4, [R5]",  # 0x20  copy loop header
        "FFMA R6, R4, R4, R6",  # 0x30  one FFMA in the copy loop
        "@P0 BRA 0x20",  # 0x40
        "FFMA R0, R1, R4, R0",  # 0x50
        "@P1 BRA 0x0",  # 0x60
    )
    loops = loops_of(*listing_)
    (fn,) = sass.parse(listing(*listing_), "k", "sm_90")
    main, copy = loops
    assert sass.hottest(loops) == copy and main.count("FFMA") == 4
    assert sass.loop_with("FFMA", loops, [fn]) == main  # 3 own FFMAs against 1
    assert sass.loop_with("LDS", loops, [fn]) == copy  # 1 each: the deeper one
    assert sass.loop_with("HMMA", loops, [fn]) is None


def test_out_of_line_block_and_one_block_loops():
    loops = loops_of(
        "MOV R0, RZ",  # 0x00
        "FADD R2, R2, R3",  # 0x10  row loop header
        "BRA.DIV UR4, 0x90",  # 0x20  to the fallback placed after EXIT
        "SHFL.BFLY PT, R5, R2, 0x1, 0x1f",  # 0x30
        "FADD R6, R6, R1",  # 0x40  a one-block loop
        "@P1 BRA 0x40",  # 0x50
        "@P0 BRA 0x10",  # 0x60  row loop back edge
        "EXIT",  # 0x70
        "BRA 0x80",  # 0x80  the trap
        "WARPSYNC 0xffffffff",  # 0x90  fallback: part of the row loop
        "BRA 0x40",  # 0xa0  back into the body
    )
    row, inner = loops
    assert (row.start, row.end, row.depth, row.innermost) == (0x10, 0xA0, 1, False)
    assert row.ranges == ((0x10, 0x60), (0x90, 0xA0)) and 0x90 in row and 0x70 not in row
    assert row.instructions == 8 and row.count("WARPSYNC") == 1
    assert (inner.start, inner.end, inner.depth, inner.innermost) == (0x40, 0x50, 2, True)
    assert inner.instructions == 2 and inner.ranges == ((0x40, 0x50),)


def test_hottest_is_the_largest_innermost_loop():
    loops = loops_of(
        "FADD R2, R2, R3",  # 0x00  a one-instruction remainder loop
        "@P0 BRA 0x0",  # 0x10
        "FADD R2, R2, R3",  # 0x20  the unrolled main loop
        "FADD R2, R2, R4",
        "FADD R2, R2, R5",
        "@P0 BRA 0x20",  # 0x50
    )
    assert [loop.instructions for loop in loops] == [2, 4]
    assert sass.hottest(loops) == loops[1] and sass.hottest(()) is None


def test_hottest_prefers_the_widest_global_load_then_the_most_bytes():
    # a long 2-byte path (unaligned rows) beside a short 16-byte main loop: the main loop
    narrow = ["LDG.E.U16 R4, [R2.64]"] * 4 + ["HADD2 R0, R0, R4"] * 6
    loops = loops_of(
        *narrow,  # 0x00  header of the 2-byte loop
        "@P0 BRA 0x0",  # 0xa0
        "LDG.E.128 R4, [R2.64]",  # 0xb0  the 16-byte main loop
        "HADD2 R0, R0, R4",
        "@P0 BRA 0xb0",  # 0xd0
    )
    assert [loop.instructions for loop in loops] == [11, 3]
    assert sass.hottest(loops) == loops[1]
    # equal widths: the loop that loads more per iteration (4 loads against 1)
    more = loops_of(
        "LDG.E R4, [R2.64]",  # 0x00
        "FADD R0, R0, R4",
        "FADD R0, R0, R4",
        "@P0 BRA 0x0",  # 0x30
        *["LDG.E R4, [R2.64]"] * 4,  # 0x40
        "@P0 BRA 0x40",  # 0x80
    )
    assert sass.hottest(more) == more[1]


def test_a_kernels_hottest_loop_is_its_vector_main_loop():
    """cross_entropy_rows_f16 has a 16-byte loop and a longer 2-byte one for unaligned rows."""
    from tessera_tile.kernels import cross_entropy

    signature = "void(float16[:, ::1], int64[::1], float16[::1], float32[::1], int64, boolean)"
    report = inspect.compile(cross_entropy.cross_entropy_rows_f16, signature, "sm_90", block=128)
    assert report.hottest_loop.count("LDG.E.128") >= 1, report


def test_listing_with_wrong_length_is_refused():
    doc = json.loads(listing("EXIT"))
    doc[1][0]["length"] = 32
    with pytest.raises(RuntimeError, match="kernel 'k' on sm_90.*32 bytes long.*1 instr"):
        sass.parse(json.dumps(doc), "k", "sm_90")


@pytest.mark.parametrize(
    "opcode, size",
    [
        ("LDG.E", 4),
        ("LDG.E.64", 8),
        ("LDG.E.128", 16),
        ("LDG.E.128.CONSTANT", 16),
        ("LDG.E.LTC128B.128", 16),
        ("LDG.E.U16", 2),
        ("LDG.E.S8", 1),
        ("STG.E.128", 16),
    ],
)
def test_load_bytes(opcode, size):
    assert sass.load_bytes(opcode) == size


def in_flight(*instructions: str) -> int:
    (fn,) = sass.parse(listing(*instructions), "k", "sm_90")
    return sass.bytes_in_flight(fn.instructions)


@pytest.mark.parametrize(
    "body, expected",
    [
        # three independent loads of three widths, then a use
        (["LDG.E.128 R4, desc[UR4][R2.64]", "LDG.E.64 R8, desc[UR4][R2.64+0x10]",
          "LDG.E.U16 R10, desc[UR4][R12.64]", "FADD R11, R4, R8"], 26),
        # the use of the first load comes before the second load
        (["LDG.E.128 R4, desc[UR4][R2.64]", "FADD R11, R7, R7",
          "LDG.E.128 R8, desc[UR4][R2.64+0x10]"], 16),
        # the second load's address is the first load's result: it is not independent
        (["LDG.E R4, desc[UR4][R2.64]", "LDG.E.128 R8, desc[UR4][R4.64]"], 4),
        # overwriting a pending register waits for the load too
        (["LDG.E R4, desc[UR4][R2.64]", "MOV R4, RZ", "LDG.E R8, desc[UR4][R2.64+0x4]"], 4),
        # a 128-bit store names four data registers: R4..R7 covers the load into R6
        (["LDG.E R6, desc[UR4][R2.64]", "STG.E.128 desc[UR4][R12.64], R4",
          "LDG.E R8, desc[UR4][R2.64+0x4]"], 4),
        # uniform and special registers are not R registers; predicated loads are issued
        (["LDG.E.128 R4, desc[UR4][R2.64]", "S2R R20, SR_TID.X", "IADD3 R21, R20, UR4, RZ",
          "@P0 LDG.E.128 R8, desc[UR4][R2.64+0x10]", "FADD R0, R4, R8"], 32),
        # no load at all
        (["FADD R0, R1, R2", "EXIT"], 0),
    ],
    ids=["widths", "used-early", "dependent-address", "overwritten", "wide-store", "uniform",
         "no-load"],
)  # fmt: skip
def test_bytes_in_flight_of_a_listing(body, expected):
    assert in_flight(*body) == expected
