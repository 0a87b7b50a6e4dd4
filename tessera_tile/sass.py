"""SASS read from ``nvdisasm -json``: instructions, loops, and the figures measured on loops.

A base-layer module (it imports nothing from tessera_tile): :mod:`tessera_tile.inspect` runs
``nvdisasm -json`` once per compiled kernel and hands the text to :func:`parse`.

**Loops** are found from backward branches: a ``BRA`` (or ``JMP``) whose target is at or before
its own offset in the same function closes a loop whose body is ``target <= offset <= branch``.
Branches to one header merge into one loop; a branch to itself (the ``BRA`` after the final
``EXIT`` that ptxas emits as a trap) is not a loop. Nesting comes from containment of these
ranges. ptxas lays loops out contiguously, so the range is the body; code the body reaches
through ``CALL`` (an IEEE divide's slow path, 64-bit division) lies outside the range and is not
counted, but the ``CALL`` itself is, so ``loop.count("CALL")`` shows it.

**Bytes in flight** (:func:`bytes_in_flight`): scanning a body in program order from its first
instruction, the bytes of the global loads (``LDG``) issued before the first instruction that
names one of their destination registers. Any later mention counts as a use, read or write,
because the scoreboard makes either wait for the load. A load whose address depends on an
earlier load therefore ends the scan and is not counted: only independent loads are.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "Function",
    "Instruction",
    "Loop",
    "bytes_in_flight",
    "count",
    "find_loops",
    "hottest",
    "load_bytes",
    "loop_with",
    "parse",
]

INSTRUCTION_BYTES = 16  # every SASS instruction from sm_70 on

KEY_OPCODES = ("LDG", "STG", "LDS", "STS", "LDGSTS", "SHFL", "BAR", "FFMA", "MUFU", "HMMA", "LDSM")

# Width suffixes of a load or store opcode; a plain LDG.E moves 4 bytes.
_WIDTHS = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16, "256": 32}
# R0..R254, not UR4 (uniform), SR_TID (special) or RZ; an optional ".64" names a pair.
_REGISTER = re.compile(r"(?<![A-Z_])R(\d+)(\.64)?")
_STORES = ("STG", "STS", "STL", "ST", "STSM")


class Instruction(NamedTuple):  # a tuple: kernels have thousands of them
    """One SASS instruction: byte offset in its function, opcode with modifiers
    (``LDG.E.128``), operands as nvdisasm prints them (comma-separated) and guard predicate."""

    offset: int
    opcode: str
    operands: str = ""
    predicate: str = ""


@dataclass(frozen=True)
class Function:
    """A function of the cubin (the kernel, or a subroutine in a section of its own)."""

    name: str
    instructions: tuple[Instruction, ...] = field(repr=False)


@dataclass(frozen=True)
class Loop:
    """One loop of a kernel's SASS.

    ``start`` is the offset of the loop header (the backward branch's target) and ``end`` the
    offset of the backward branch itself: the body is every instruction with
    ``start <= offset <= end``. ``instructions`` counts the body without padding NOPs, once per
    iteration; branches inside the body (an ``if``, a predicated slow path) are counted as if
    every path ran, so it is an upper bound of one iteration's issued instructions. ``depth`` is
    1 for an outermost loop, 2 for a loop inside it...; ``innermost`` when no loop lies inside.
    ``bytes_in_flight``: see :func:`bytes_in_flight`.
    """

    start: int
    end: int
    instructions: int
    histogram: dict[str, int] = field(hash=False)
    depth: int
    innermost: bool
    bytes_in_flight: int
    function: str = field(default="", repr=False)

    def count(self, opcode: str) -> int:
        """Instructions of the body whose opcode is ``opcode`` or starts with ``opcode.``."""
        return count(self.histogram, opcode)

    def key_opcodes(self, prefixes: tuple[str, ...] = KEY_OPCODES) -> str:
        """A compact 'OP:count' line of the body, like the anchors' columns."""
        return key_opcodes(self.histogram, prefixes)


def count(histogram: dict[str, int], opcode: str) -> int:
    """Instructions of ``histogram`` whose opcode is ``opcode`` or starts with ``opcode.``."""
    return sum(n for op, n in histogram.items() if op == opcode or op.startswith(opcode + "."))


def key_opcodes(histogram: dict[str, int], prefixes: tuple[str, ...] = KEY_OPCODES) -> str:
    """'OP:count' for the opcodes of ``histogram`` that match one of ``prefixes``."""
    return " ".join(
        f"{op}:{n}"
        for op, n in sorted(histogram.items())
        if any(op == p or op.startswith(p + ".") for p in prefixes)
    )


def parse(text: str, kernel: str, arch: str) -> tuple[Function, ...]:
    """The functions of ``nvdisasm -json`` output, with their instructions and offsets.

    Raises ``RuntimeError`` when the document cannot be read, holds no instruction, or a
    function's length does not match 16 bytes per instruction (offsets would be wrong).
    """

    def fail(what: str):
        raise RuntimeError(f"cannot read the SASS of kernel {kernel!r} on {arch}: {what}")

    try:
        doc = json.loads(text)
        raw = [f for part in doc if isinstance(part, list) for f in part]
        functions = []
        for f in raw:
            start = int(f.get("start", 0))
            listing = f["sass-instructions"]
            length = f.get("length")
            if length is not None and int(length) != INSTRUCTION_BYTES * len(listing):
                fail(
                    f"function {f.get('function-name')!r} is {length} bytes long but lists "
                    f"{len(listing)} instructions of {INSTRUCTION_BYTES} bytes"
                )
            instructions = tuple(
                Instruction(
                    offset=start + INSTRUCTION_BYTES * i,
                    opcode=ins["opcode"],
                    operands=ins.get("operands", ""),
                    predicate=ins.get("predicate", ""),
                )
                for i, ins in enumerate(listing)
            )
            functions.append(Function(str(f.get("function-name", "")), instructions))
    except (ValueError, LookupError, TypeError) as e:
        fail(f"nvdisasm -json printed an unexpected document ({type(e).__name__}: {e})")
    if not any(f.instructions for f in functions):
        raise RuntimeError(
            f"the SASS of kernel {kernel!r} on {arch} has no instructions "
            f"({len(functions)} functions in nvdisasm -json output)"
        )
    return tuple(functions)


def histogram(instructions: Iterable[Instruction]) -> dict[str, int]:
    """Opcode counts, NOPs included (``CompileReport.instructions`` leaves them out)."""
    return dict(Counter(ins.opcode for ins in instructions))


def _branch_target(ins: Instruction) -> int | None:
    root = ins.opcode.split(".")[0]
    if root not in ("BRA", "JMP"):
        return None
    last = ins.operands.rsplit(",", 1)[-1].strip()
    return int(last, 16) if re.fullmatch(r"0x[0-9a-fA-F]+", last) else None


def find_loops(functions: Sequence[Function]) -> tuple[Loop, ...]:
    """Every loop of ``functions``, ordered by function, then start offset."""
    loops = []
    for fn in functions:
        if not fn.instructions:
            continue
        first = fn.instructions[0].offset
        ends: dict[int, int] = {}  # header offset -> offset of its last backward branch
        for ins in fn.instructions:
            target = _branch_target(ins)
            # target == offset is the trap ptxas puts after the last EXIT, not a loop
            if target is not None and first <= target < ins.offset:
                ends[target] = max(ends.get(target, target), ins.offset)
        ranges = sorted(ends.items())
        for start, end in ranges:
            body = [ins for ins in fn.instructions if start <= ins.offset <= end]
            hist = histogram(body)
            hist.pop("NOP", None)
            outer = [1 for s, e in ranges if (s, e) != (start, end) and s <= start and end <= e]
            inner = [1 for s, e in ranges if (s, e) != (start, end) and start <= s and e <= end]
            loops.append(
                Loop(
                    start=start,
                    end=end,
                    instructions=sum(hist.values()),
                    histogram=hist,
                    depth=1 + len(outer),
                    innermost=not inner,
                    bytes_in_flight=bytes_in_flight(body),
                    function=fn.name,
                )
            )
    return tuple(loops)


def hottest(loops: Sequence[Loop]) -> Loop | None:
    """A static guess at the loop that runs most: the innermost loop with the most
    instructions (an unrolled main loop rather than its remainder loop), the first on a tie.
    ``None`` when there is no loop."""
    candidates = [loop for loop in loops if loop.innermost]
    return max(candidates, key=lambda loop: loop.instructions, default=None)


def loop_with(opcode: str, loops: Sequence[Loop], functions: Sequence[Function]) -> Loop | None:
    """The loop with the most ``opcode`` instructions in its own body, outside the loops
    nested in it (the FFMA main loop of a GEMM, not the copy loops inside it); on a tie the
    deeper loop, then the first. ``None`` when no loop has one."""
    by_name = {fn.name: fn for fn in functions}

    def own(loop: Loop) -> int:
        nested = [
            (n.start, n.end)
            for n in loops
            if n.function == loop.function
            and n != loop
            and loop.start <= n.start
            and n.end <= loop.end
        ]
        fn = by_name.get(loop.function)
        return sum(
            1
            for ins in (fn.instructions if fn else ())
            if loop.start <= ins.offset <= loop.end
            and (ins.opcode == opcode or ins.opcode.startswith(opcode + "."))
            and not any(s <= ins.offset <= e for s, e in nested)
        )

    scored = [(own(loop), loop.depth, -i, loop) for i, loop in enumerate(loops)]
    best = max(scored, key=lambda t: t[:3], default=None)
    return best[3] if best and best[0] > 0 else None


def load_bytes(opcode: str) -> int:
    """Bytes one thread loads or stores with ``opcode`` (``LDG.E.128`` -> 16, ``LDG.E`` -> 4,
    ``LDG.E.U16`` -> 2); modifiers such as ``CONSTANT`` or ``LTC128B`` do not change it."""
    widths = [_WIDTHS[m] for m in opcode.split(".")[1:] if m in _WIDTHS]
    return widths[-1] if widths else 4


def _registers(ins: Instruction) -> set[int]:
    """The registers an instruction names. Wide operands are widened by an approximation (a
    store's data by the store's width, ``R4.64`` and 64-bit opcodes by a pair): naming too many
    only ends a bytes-in-flight scan earlier, so the figure stays a lower bound."""
    root = ins.opcode.split(".")[0]
    wide_op = ".64" in ins.opcode or ".WIDE" in ins.opcode or root[:1] == "D"
    data_regs = max(1, load_bytes(ins.opcode) // 4) if root in _STORES else 1
    names: set[int] = set()
    for operand in ins.operands.split(","):
        for m in _REGISTER.finditer(operand):
            n = int(m.group(1))
            width = 2 if (m.group(2) or wide_op) else 1
            if root in _STORES and "[" not in operand:
                width = max(width, data_regs)
            names.update(range(n, n + width))
    return names


def bytes_in_flight(instructions: Iterable[Instruction]) -> int:
    """Global load bytes per thread issued before the first use of any of them.

    Scans ``instructions`` in order; each ``LDG`` adds :func:`load_bytes` and marks its
    destination registers (``16 // 4`` registers for ``LDG.E.128``); the scan ends at the first
    instruction that names a marked register. Predicated loads count as issued. Loads the body
    issues after that point (software-pipelined loads for the next iteration) are not counted.
    """
    pending: set[int] = set()
    total = 0
    for ins in instructions:
        if pending and pending & _registers(ins):
            break
        if ins.opcode.split(".")[0] == "LDG":
            width = load_bytes(ins.opcode)
            dest = _REGISTER.search(ins.operands.split(",")[0])
            if dest is None:  # LDG to RZ: a prefetch that nothing waits for
                continue
            first = int(dest.group(1))
            pending.update(range(first, first + max(1, width // 4)))
            total += width
    return total
