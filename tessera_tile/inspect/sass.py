"""SASS read from ``nvdisasm -json``: instructions, loops, and the figures measured on loops.

A base-layer module (it imports nothing from tessera_tile): :mod:`tessera_tile.inspect` runs
``nvdisasm -json`` once per compiled kernel and hands the text to :func:`parse`.

**Loops** are the natural loops of each function's control-flow graph: basic blocks split at
branch targets and after ``BRA``/``EXIT``/``RET``; an edge to a block that dominates its source
is a back edge, and the loop is its header plus every block that reaches the back edge without
passing the header (back edges to one header make one loop). So a block that ptxas places out
of line and that jumps back into the body (the divergent fallback of a shuffle) belongs to the
loop, and the trap ptxas puts after the last ``EXIT`` (a ``BRA`` to itself) is not a loop.
Nesting comes from containment of the bodies. Code reached through ``CALL`` (an IEEE divide's
slow path, 64-bit division) is not part of the body, but the ``CALL`` is: ``loop.count("CALL")``
shows it.

**Bytes in flight** (:func:`bytes_in_flight`): scanning a body in program order from its header,
the bytes of the global loads (``LDG``) issued before the first instruction that
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
    "histogram",
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
# Opcodes after which a new basic block starts; the indirect ones have no known target.
_INDIRECT = ("BRX", "JMX", "RET")
_ENDS_BLOCK = ("BRA", "JMP", "EXIT", "KILL", *_INDIRECT)


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

    ``start`` is the offset of the loop header (where an iteration begins) and ``end`` the
    offset of the body's last instruction in the listing; the body is usually the contiguous
    range between them, and ``ranges`` (``offset in loop``) says exactly which instructions it
    holds. ``instructions`` counts the body without padding NOPs, once per iteration; branches
    inside the body (an ``if``, a predicated slow path) are counted as if every path ran, so it
    is an upper bound of one iteration's issued instructions. ``depth`` is 1 for an outermost
    loop, 2 for a loop inside it...; ``innermost`` when no loop lies inside.
    ``bytes_in_flight``: see :func:`bytes_in_flight`, scanned from the header.
    """

    start: int
    end: int
    instructions: int
    histogram: dict[str, int] = field(hash=False)
    depth: int
    innermost: bool
    bytes_in_flight: int
    function: str = field(default="", repr=False)
    ranges: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    def __contains__(self, offset: int) -> bool:
        """Whether the instruction at ``offset`` (of :attr:`function`) is in the body."""
        return any(a <= offset <= b for a, b in self.ranges)

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


NEVER = "@!PT"  # the never-true guard: ptxas pads with such instructions (@!PT LDS RZ, [RZ])


def histogram(instructions: Iterable[Instruction]) -> dict[str, int]:
    """Opcode counts, NOPs included (``CompileReport.instructions`` leaves them out);
    instructions under the never-true guard ``@!PT`` are left out: they never run."""
    return dict(Counter(ins.opcode for ins in instructions if ins.predicate != NEVER))


def _branch_target(ins: Instruction) -> int | None:
    root = ins.opcode.split(".")[0]
    if root not in ("BRA", "JMP"):
        return None
    last = ins.operands.rsplit(",", 1)[-1].strip()
    return int(last, 16) if re.fullmatch(r"0x[0-9a-fA-F]+", last) else None


def _blocks(instructions: Sequence[Instruction]) -> tuple[list[range], list[set[int]]]:
    """Basic blocks (ranges of instruction indices) and each block's successors."""
    index = {ins.offset: i for i, ins in enumerate(instructions)}
    leaders = {0}
    for i, ins in enumerate(instructions):
        target = _branch_target(ins)
        if target in index:
            leaders.add(index[target])
        if ins.opcode.split(".")[0] in _ENDS_BLOCK:
            leaders.add(i + 1)
    starts = sorted(x for x in leaders if x < len(instructions))
    blocks = [range(a, b) for a, b in zip(starts, [*starts[1:], len(instructions)], strict=True)]
    block_of = {i: b for b, r in enumerate(blocks) for i in r}
    successors = []
    for r in blocks:
        ins = instructions[r[-1]]
        root = ins.opcode.split(".")[0]
        target = _branch_target(ins)
        # A guard predicate, or a condition operand (BRA.DIV UR4, BRA.U !UP0), makes it
        # conditional: the next block follows too.
        conditional = ins.predicate not in ("", "@PT") or "," in ins.operands
        falls_through = root not in _ENDS_BLOCK or (root not in _INDIRECT and conditional)
        succ = {block_of[index[target]]} if target in index else set()
        if falls_through and r[-1] + 1 < len(instructions):
            succ.add(block_of[r[-1] + 1])
        successors.append(succ)
    return blocks, successors


def _dominators(successors: list[set[int]]) -> list[set[int]]:
    """Dominator sets, from every block nothing branches to (the entry; subroutines reached
    by CALL)."""
    n = len(successors)
    predecessors: list[set[int]] = [set() for _ in range(n)]
    for b, succ in enumerate(successors):
        for t in succ:
            predecessors[t].add(b)
    roots = {b for b in range(n) if not predecessors[b]} | {0}
    everything = set(range(n))
    dom = [{b} if b in roots else set(everything) for b in range(n)]
    changed = True
    while changed:
        changed = False
        for b in range(n):
            if b in roots:
                continue
            new = set.intersection(*(dom[p] for p in predecessors[b])) if predecessors[b] else set()
            new = new | {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def find_loops(functions: Sequence[Function]) -> tuple[Loop, ...]:
    """Every loop of ``functions``, ordered by function, then header offset.

    Natural loops of the control-flow graph: an edge from a block to a block that dominates it
    is a back edge; the loop is its header plus every block that reaches the back edge without
    passing the header. Back edges to one header make one loop.
    """
    loops = []
    for fn in functions:
        code = fn.instructions
        if not code:
            continue
        blocks, successors = _blocks(code)
        dom = _dominators(successors)
        predecessors: list[set[int]] = [set() for _ in blocks]
        for b, succ in enumerate(successors):
            for t in succ:
                predecessors[t].add(b)
        bodies: dict[int, set[int]] = {}
        for b, succ in enumerate(successors):
            for header in succ:
                if header not in dom[b]:
                    continue
                body, stack = {header, b}, ([b] if b != header else [])
                while stack:
                    for p in predecessors[stack.pop()] - body:
                        body.add(p)
                        stack.append(p)
                bodies.setdefault(header, set()).update(body)
        found = []
        for header, members in sorted(bodies.items()):
            body = [code[i] for b in sorted(members) for i in blocks[b]]
            if all(ins.opcode.split(".")[0] in ("BRA", "NOP") for ins in body):
                continue  # the trap after the last EXIT (BRA to itself)
            found.append((code[blocks[header][0]], frozenset(members), body))
        for header, members, body in found:
            hist = histogram(body)
            hist.pop("NOP", None)
            loops.append(
                Loop(
                    start=header.offset,
                    end=body[-1].offset,
                    instructions=sum(hist.values()),
                    histogram=hist,
                    depth=1 + sum(members < other for _, other, _ in found),
                    innermost=not any(other < members for _, other, _ in found),
                    bytes_in_flight=bytes_in_flight(_from_header(body, header)),
                    function=fn.name,
                    ranges=_ranges(body),
                )
            )
    return tuple(loops)


def _from_header(body: list[Instruction], header: Instruction) -> list[Instruction]:
    # A rotated loop can place blocks before its header: scan from the header, then wrap.
    at = body.index(header)
    return body[at:] + body[:at]


def _ranges(body: list[Instruction]) -> tuple[tuple[int, int], ...]:
    ranges: list[list[int]] = []
    for ins in body:
        if ranges and ins.offset == ranges[-1][1] + INSTRUCTION_BYTES:
            ranges[-1][1] = ins.offset
        else:
            ranges.append([ins.offset, ins.offset])
    return tuple((a, b) for a, b in ranges)


def hottest(loops: Sequence[Loop]) -> Loop | None:
    """A static guess at the loop that runs most: of the innermost loops, the one with the
    widest global load (a kernel's vectorised main loop, not the narrow path it falls back to
    on unaligned rows), then the most bytes loaded from global memory per iteration, then the
    most instructions (an unrolled main loop rather than its remainder loop); the first on a
    tie. ``None`` when there is no loop."""

    def score(loop: Loop) -> tuple[int, int, int]:
        loads = [(load_bytes(op), n) for op, n in loop.histogram.items() if _global_load(op)]
        widest = max((width for width, _ in loads), default=0)
        return widest, sum(width * n for width, n in loads), loop.instructions

    candidates = [loop for loop in loops if loop.innermost]
    return max(candidates, key=score, default=None)


def _global_load(opcode: str) -> bool:
    """``LDG`` and ``LDGSTS`` (the copy into shared memory that ``cp.async`` is)."""
    return opcode.split(".")[0] in ("LDG", "LDGSTS")


def loop_with(opcode: str, loops: Sequence[Loop], functions: Sequence[Function]) -> Loop | None:
    """The loop with the most ``opcode`` instructions in its own body, outside the loops
    nested in it (the FFMA main loop of a GEMM, not the copy loops inside it); on a tie the
    deeper loop, then the first. ``None`` when no loop has one."""
    by_name = {fn.name: fn for fn in functions}

    def own(loop: Loop) -> int:
        nested = [
            n
            for n in loops
            if n.function == loop.function and n.depth > loop.depth and n.start in loop
        ]
        fn = by_name.get(loop.function)
        return sum(
            1
            for ins in (fn.instructions if fn else ())
            if ins.offset in loop
            and (ins.opcode == opcode or ins.opcode.startswith(opcode + "."))
            and not any(ins.offset in n for n in nested)
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
