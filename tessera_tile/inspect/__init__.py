"""Offline compilation of kernels: PTX, cubin, resources, SASS histogram, loops and occupancy.

Works with no GPU: Numba lowers the kernel through NVVM to PTX, ``ptxas`` assembles it into a
cubin for the chosen architecture and reports registers, spills, stack and static shared memory,
and ``nvdisasm`` disassembles the SASS. ``ptxas`` and ``nvdisasm`` are found by
``cuda.pathfinder``; tessera_tile depends on the pip wheels ``nvidia-cuda-nvcc`` and
``nvidia-cuda-nvdisasm`` of the same minor version as the NVVM that numba-cuda uses (an older
``ptxas`` rejects newer PTX).

A ``@cuda.jit`` kernel compiles with the options it would run with: ``fastmath``, ``opt``,
``debug``, ``lineinfo`` and ``launch_bounds`` reach NVVM, ``max_registers`` reaches ``ptxas``
(as ``-maxrregcount``, where numba-cuda's linker puts it). The PTX is assembled on its own, not
link-time optimised: a kernel with ``link=`` files is refused. numba-cuda itself links with
nvJitLink LTO by default; on the example kernels that gives the same global and shared memory
opcodes, and registers and instruction counts equal or within a few (transpose on sm_80: 31-32
registers linked with LTO against 30 here, 8 instructions fewer).

Shared memory figures are ``ptxas``'s static figure: they exclude the 1 KiB per block that the
system reserves on sm_80 and newer (the occupancy model adds it back).

    >>> report = tessera_tile.inspect.compile(my_kernel, "void(float32[::1])", arch="sm_90")
    >>> report.registers, report.spill_stores, report.count("SHFL")
    >>> report.loops, report.instructions_per_element(4), report.bytes_in_flight()

The loop figures (:mod:`tessera_tile.inspect.sass` finds the loops) are static: ``docs/inspect.md``
says how each is computed and what it does and does not predict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import io
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._runtime import compat
from .._runtime import config as _config
from .._runtime import target as _target
from ..dynamic_shared import limit as dynamic_shared_limit
from . import sass
from .sass import Loop

__all__ = ["ARCHS", "CompileReport", "Loop", "compile", "occupancy"]


# The architectures reports are made for, with their per-SM limits (CUDA occupancy calculator
# figures): one table, the runtime's. "sm_90" (or "sm_90a") compiles for sm_90a, as numba-cuda
# does on a device of compute capability 9.0.
ARCHS = _target.TARGETS

DEFAULT_BLOCK = 256


def occupancy(arch: str, registers: int, shared_bytes: int, block: int) -> float:
    """Theoretical occupancy (resident warps / maximum warps per SM), 0..1.

    Limited by warps, blocks, registers (allocated per warp in units of 256) and shared memory
    (static + 1 KiB system reserve per block, in units of 128 bytes).
    """
    lim = _arch(arch)
    if not 1 <= block <= 1024:
        raise ValueError(f"block must be 1..1024 threads, got {block}")
    warps = -(-block // 32)
    by_warps = lim.max_warps // warps
    per_warp_regs = -(-max(registers, 1) * 32 // lim.register_granularity)
    per_warp_regs *= lim.register_granularity
    by_regs = (lim.registers // per_warp_regs) // warps
    smem = shared_bytes + lim.reserved_shared
    smem = -(-smem // lim.shared_granularity) * lim.shared_granularity
    by_smem = lim.sm_shared // smem
    blocks = min(by_warps, by_regs, by_smem, lim.max_blocks)
    return blocks * warps / lim.max_warps


# Options of numba-cuda's @cuda.jit that change the code a kernel compiles to, with their
# defaults; the others (extensions, shared_memory_carveout, ...) act at launch time.
_CODEGEN_DEFAULTS: dict[str, Any] = {
    "debug": False,
    "lineinfo": False,
    "fastmath": False,
    "opt": True,
    "launch_bounds": None,
    "max_registers": None,  # not an NVVM option: numba-cuda passes it to its linker (ptxas)
}


@dataclass(frozen=True)
class CompileReport:
    """What one kernel compiles to for one architecture."""

    name: str
    arch: str
    signature: str
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int  # static, from ptxas
    histogram: dict[str, int]
    block: int
    occupancy: float
    tools: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)  # jit options that differ from default
    dynamic_shared_bytes: int = 0  # given at launch (``compile(dynamic_shared=...)``)
    loops: tuple[Loop, ...] = ()
    """Every loop of the SASS (:class:`tessera_tile.inspect.sass.Loop`), by start offset."""
    functions: tuple[sass.Function, ...] = field(default=(), repr=False)

    @functools.cached_property
    def sass(self) -> str:
        """The SASS listing (``nvdisasm -c``), disassembled on first use: the histogram comes
        from ``nvdisasm -json``, and each run of nvdisasm costs about 0.3 s."""
        with tempfile.TemporaryDirectory(prefix="tessera_tile_") as tmp:
            path = Path(tmp, "k.cubin")
            path.write_bytes(self.cubin)
            return _disassemble(_tools()["nvdisasm_path"], path, [])

    @property
    def instructions(self) -> int:
        """Number of SASS instructions, padding NOPs excluded."""
        return sum(n for op, n in self.histogram.items() if op != "NOP")

    @property
    def uses_local_memory(self) -> bool:
        """True when the kernel has a stack frame or any local load/store (LDL/STL)."""
        return self.stack_bytes > 0 or self.count("LDL") > 0 or self.count("STL") > 0

    def count(self, opcode: str) -> int:
        """Instructions whose opcode is ``opcode`` or starts with ``opcode.``.

        ``count("SHFL")`` counts ``SHFL.DOWN``, ``SHFL.BFLY``...; ``count("LDG.E.128")`` only
        128-bit global loads.
        """
        return sass.count(self.histogram, opcode)

    def key_opcodes(self, prefixes: tuple[str, ...] = ()) -> str:
        """A compact 'OP:count' line, like the columns of the anchors table."""
        return sass.key_opcodes(self.histogram, prefixes or sass.KEY_OPCODES)

    @property
    def hottest_loop(self) -> Loop | None:
        """A static guess at the loop that runs most: the innermost loop with the most
        instructions (an unrolled main loop, not its remainder loop). ``None`` without loops."""
        return sass.hottest(self.loops)

    def loop_with(self, opcode: str) -> Loop | None:
        """The loop with the most ``opcode`` instructions (prefix match, as :meth:`count`) in
        its own body, outside the loops nested in it: a better pick than :attr:`hottest_loop`
        when the caller knows what the steady state runs, e.g. ``loop_with("FFMA")`` for a
        GEMM main loop that contains small copy loops, ``loop_with("LDG")`` for a streaming
        kernel. ``None`` when no loop has one."""
        return sass.loop_with(opcode, self.loops, self.functions)

    def instructions_per_element(
        self, elements_per_iteration: int, loop: Loop | None = None
    ) -> float:
        """Steady-state thread-instructions per element: ``loop.instructions`` (the body,
        NOPs excluded) divided by ``elements_per_iteration``.

        ``elements_per_iteration`` is what one thread handles in one iteration of the SASS
        loop, which the caller knows: when the compiler unrolled the source loop, multiply by
        the unroll factor (``loop.count("LDG.E.128")`` over the vector loads one source
        iteration issues tells it). ``loop`` defaults to :attr:`hottest_loop`; a kernel that
        runs several passes over its data sums the figure of each pass's loop.

        Not a timing: it ignores latency, divergence and memory stalls, counts both sides of a
        branch inside the body, and leaves out on purpose the code outside the loop (setup,
        remainder loops and tails, which run once). Raises ``ValueError`` for a kernel without
        loops (divide :attr:`instructions` by the elements a thread handles instead).
        """
        if not isinstance(elements_per_iteration, int) or elements_per_iteration < 1:
            raise ValueError(
                f"elements_per_iteration must be a positive int, got {elements_per_iteration!r}"
            )
        loop = loop or self._loop_or_fail()
        return loop.instructions / elements_per_iteration

    def bytes_in_flight(self, loop: Loop | None = None) -> int:
        """Independent global load bytes per thread issued before the first use of any of them.

        Scanned from the first instruction of ``loop`` (default :attr:`hottest_loop`), or of the
        kernel when it has no loop (a row kept in registers is loaded before any loop). Counts
        ``LDG`` widths (``LDG.E.128`` 16 B, ``LDG.E.64`` 8, ``LDG.E`` 4, ``LDG.E.U16`` 2) up to
        the first instruction naming a destination register of one of them; see
        :func:`tessera_tile.inspect.sass.bytes_in_flight`. A figure of what the code allows, per
        thread:
        how much the memory system really has in flight also depends on occupancy.
        """
        if loop is not None:
            return loop.bytes_in_flight
        hot = self.hottest_loop
        if hot is not None:
            return hot.bytes_in_flight
        # The kernel, not a subroutine of it: the function that exits.
        kernel = next(
            (f for f in self.functions if any(i.opcode == "EXIT" for i in f.instructions)), None
        )
        return sass.bytes_in_flight(kernel.instructions if kernel else ())

    def _loop_or_fail(self) -> Loop:
        hot = self.hottest_loop
        if hot is None:
            raise ValueError(
                f"kernel {self.name!r} has no loop in its SASS; for a loop-free kernel divide "
                "report.instructions by the elements one thread handles"
            )
        return hot

    def _shared_line(self) -> str:
        static = f"{self.shared_bytes} B static (ptxas; excludes the 1 KiB system reserve)"
        if not self.dynamic_shared_bytes:
            return static
        return (
            f"{static} + {self.dynamic_shared_bytes} B dynamic "
            f"(of {dynamic_shared_limit(self.arch)} B a block may use on {self.arch})"
        )

    def __str__(self) -> str:
        # Rendered with rich like the simulator's profile: plain text, no colour codes, and
        # Text cells so that "[sm_90]" or "float32[::1]" are never read as markup.
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        rows = [
            ("registers", str(self.registers)),
            ("spills", f"{self.spill_stores} B stored, {self.spill_loads} B loaded"),
            ("stack", f"{self.stack_bytes} B"),
            ("shared", self._shared_line()),
            ("occupancy", f"{self.occupancy:.0%} at {self.block} threads/block"),
            ("instructions", f"{self.instructions} SASS"),
            ("key opcodes", self.key_opcodes() or "-"),
            ("loops", self._loops_line()),
        ]
        hot = self.hottest_loop
        if hot is not None:
            rows.append(
                (
                    "hottest loop",
                    f"{hot.instructions} instructions at {hot.start:#06x}-{hot.end:#06x}, "
                    f"{hot.bytes_in_flight} B in flight; {hot.key_opcodes() or '-'}",
                )
            )
        if self.options:
            rows.append(("options", ", ".join(f"{k}={v}" for k, v in self.options.items())))
        rows.append(("tools", ", ".join(f"{k} {v}" for k, v in self.tools.items())))
        table = Table.grid(padding=(0, 2), pad_edge=True)
        table.add_column(no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in rows:
            table.add_row(Text(label), Text(value))
        buf = io.StringIO()
        console = Console(
            file=buf, width=100, color_system=None, markup=False, highlight=False, emoji=False
        )
        console.print(Text(f"{self.name} [{self.arch}] {self.signature}"))
        console.print(table)
        return "\n".join(line.rstrip() for line in buf.getvalue().rstrip().splitlines())

    def _loops_line(self) -> str:
        if not self.loops:
            return "none"
        inner = sum(loop.innermost for loop in self.loops)
        deepest = max(loop.depth for loop in self.loops)
        return f"{len(self.loops)} ({inner} innermost, nested {deepest} deep)"


def compile(  # noqa: A001 - the public name asked for by users of this module
    fn: Any,
    signature: Any,
    arch: str = "sm_90",
    *,
    block: int | None = None,
    dynamic_shared: int = 0,
) -> CompileReport:
    """Compile a kernel for ``arch`` without a GPU and report its resources and SASS.

    Parameters
    ----------
    fn:
        A ``@cuda.jit`` kernel (compiled with its own options: ``fastmath``, ``opt``, ``debug``,
        ``lineinfo``, ``launch_bounds``, ``max_registers``) or the plain Python function of one
        (compiled with numba-cuda's defaults).
    signature:
        A Numba signature, as a string (``"void(float32[::1], int32)"``) or a tuple of types.
    arch:
        One of :data:`ARCHS`: ``"sm_80"``, ``"sm_86"``, ``"sm_87"``, ``"sm_89"`` or ``"sm_90"``
        (compiled for sm_90a, as numba-cuda compiles for a GPU of compute capability 9.0;
        ``"sm_90a"`` names it too).
    block:
        Threads per block for the occupancy figure (default: the kernel's ``launch_bounds``
        maximum if it has one, else 256).
    dynamic_shared:
        Bytes of dynamic shared memory the kernel is launched with: counted in the occupancy
        and reported beside the static bytes; ``ValueError`` where static and dynamic together
        pass what a block may use on ``arch`` (:func:`tessera_tile.dynamic_shared.limit`).

    Raises ``RuntimeError`` when a tool is missing or fails, or when its output cannot be read:
    a report is never built from figures that were not found.
    """
    pyfunc = _python_function(fn)
    lim = _arch(arch)
    if _config.SIMULATED:
        raise RuntimeError(
            "tessera_tile.inspect.compile needs the real compiler; it cannot run with "
            "NUMBA_ENABLE_CUDASIM=1 (run the compile tier in a separate process)"
        )
    options = _codegen_options(fn, pyfunc.__name__)
    block = _block(block, options.get("launch_bounds"))
    sig = tuple(signature) if isinstance(signature, list) else signature
    report = _compile_cached(pyfunc, sig, lim.cc, block, tuple(options.items()))
    if report.arch != arch:  # "sm_90a" asked: the one compile for compute capability 9.0
        report = dataclasses.replace(report, arch=arch)
    if not dynamic_shared:
        return report
    total, allowed = report.shared_bytes + dynamic_shared, dynamic_shared_limit(arch)
    if total > allowed:
        raise ValueError(
            f"{report.name}: {report.shared_bytes} B static and {dynamic_shared} B dynamic shared "
            f"memory pass the {allowed} B a block may use on {arch}"
        )
    return dataclasses.replace(
        report,
        dynamic_shared_bytes=dynamic_shared,
        occupancy=occupancy(arch, report.registers, total, report.block),
    )


@functools.lru_cache(maxsize=512)
def _compile_cached(pyfunc, signature, cc, block: int, options) -> CompileReport:
    """One compile per compute capability (``sm_90`` and ``sm_90a`` name one)."""
    name = pyfunc.__name__
    arch = f"sm_{cc[0]}{cc[1]}"
    nvvm_options = dict(options)
    max_registers = nvvm_options.pop("max_registers", None)
    ptx = _ptx(pyfunc, signature, cc, nvvm_options)
    tools = _tools()
    target = "sm_" + "".join(str(part) for part in cc)  # (9, 0, "a"): "sm_90a"
    ptxas_flags = [f"-arch={target}", "-v"]
    if max_registers:
        ptxas_flags.append(f"-maxrregcount={max_registers}")
    with tempfile.TemporaryDirectory(prefix="tessera_tile_") as tmp:
        ptx_path, cubin_path = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx_path.write_text(ptx)
        res = subprocess.run(
            [tools["ptxas_path"], *ptxas_flags, "-o", str(cubin_path), str(ptx_path)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"ptxas failed for {name!r} on {arch}: {res.stderr.strip()}\n"
                f"({tools['ptxas_path']}, version {tools['ptxas']}.) ptxas must be of the same "
                f"CUDA minor version as numba-cuda's NVVM: pip install {_tool_wheels()}"
            )
        cubin = cubin_path.read_bytes()
        sass_json = _disassemble(tools["nvdisasm_path"], cubin_path, ["-json"])
    resources = _parse_ptxas(res.stdout + res.stderr, name, arch)
    functions = sass.parse(sass_json, name, arch)
    return CompileReport(
        name=name,
        arch=arch,
        signature=signature_text(signature),
        ptx=ptx,
        cubin=cubin,
        histogram=sass.histogram(ins for f in functions for ins in f.instructions),
        loops=sass.find_loops(functions),
        functions=functions,
        block=block,
        occupancy=occupancy(arch, resources["registers"], resources["shared_bytes"], block),
        tools={k: v for k, v in tools.items() if not k.endswith("_path")},
        options=dict(options),
        **resources,
    )


def signature_text(signature) -> str:
    """A signature as its string form is written (``(float32[:, ::1], int64)``), whether it
    came as that string or as Numba types (a fused kernel's)."""
    if isinstance(signature, str):
        return signature
    from numba.core import types

    def text(t) -> str:
        if isinstance(t, types.Array):
            axes = [":"] * t.ndim
            if t.ndim and t.layout in "CF":
                axes[-1 if t.layout == "C" else 0] = "::1"
            return f"{t.dtype}[{', '.join(axes)}]"
        return str(t)

    return f"({', '.join(map(text, signature))})"


def _ptx(pyfunc, signature, cc, nvvm_options: dict[str, Any]) -> str:
    from numba import cuda
    from numba.core.errors import TypingError

    # A kernel that calls a device function asks numba-cuda for the current device; with no
    # GPU, compat answers for it with the target's compute capability.
    device = (
        contextlib.nullcontext() if _config.gpu_present() else compat.current_device_answered(cc)
    )
    try:
        with device:
            ptx, _ = cuda.compile_ptx(pyfunc, signature, cc=cc, **nvvm_options)
    except TypingError as e:
        first = str(e).strip().splitlines()[0]
        raise TypeError(
            f"kernel {pyfunc.__name__!r} does not type for signature {signature}: {first}"
        ) from e
    return ptx


def _disassemble(nvdisasm: str, cubin: Path, flags: list[str]) -> str:
    # -ndf: no dataflow analysis; the listing is the same (compared for nvdisasm 13.5), 12% faster
    res = subprocess.run(
        [nvdisasm, *flags, "-c", "-ndf", str(cubin)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm {' '.join(flags)} failed: {res.stderr.strip()}")
    return res.stdout


def _python_function(fn: Any):
    py = getattr(fn, "py_func", None)
    if py is None and callable(fn) and hasattr(fn, "__code__"):
        py = fn
    if py is None or not hasattr(py, "__code__"):
        raise TypeError(
            f"expected a @cuda.jit kernel or a Python function, got {type(fn).__name__}"
        )
    if compat.is_device_function(fn):
        raise TypeError(f"{py.__name__!r} is a device function, not a kernel")
    return py


def _codegen_options(fn: Any, name: str) -> dict[str, Any]:
    """The kernel's jit options that change its code and differ from numba-cuda's defaults."""
    targetoptions = compat.target_options(fn)
    if targetoptions.get("link"):
        raise NotImplementedError(
            f"kernel {name!r} links external code (link={list(targetoptions['link'])}); "
            "tessera_tile.inspect assembles the kernel's own PTX only"
        )
    options = {}
    for key, default in _CODEGEN_DEFAULTS.items():
        value = targetoptions.get(key, default)
        if isinstance(value, list):  # launch_bounds=[128, 2]; the compile cache needs a tuple
            value = tuple(value)
        if key in ("debug", "lineinfo", "opt"):
            value = bool(value)  # numba-cuda stores debug=0
        if value != default:
            options[key] = value
    return options


def _block(block: int | None, launch_bounds: Any) -> int:
    bound = launch_bounds if isinstance(launch_bounds, (int, type(None))) else launch_bounds[0]
    if block is None:
        block = bound or DEFAULT_BLOCK
    if not isinstance(block, int) or not 1 <= block <= 1024:
        raise ValueError(f"block must be an int in 1..1024, got {block!r}")
    if bound and block > bound:
        raise ValueError(f"block={block} exceeds the kernel's launch_bounds ({bound} threads)")
    return block


def _arch(arch: str) -> _target.Target:
    return _target.target(arch)


def _dist(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _tool_wheels() -> str:
    """The pip requirements that bring ptxas and nvdisasm matching the installed NVVM."""
    nvvm = _dist("nvidia-nvvm").split(".")
    pin = f"=={nvvm[0]}.{nvvm[1]}.*" if len(nvvm) >= 2 and nvvm[0].isdigit() else ""
    return f"'nvidia-cuda-nvcc{pin}' 'nvidia-cuda-nvdisasm{pin}'"


def _find_tool(name: str) -> str:
    from cuda.pathfinder import find_nvidia_binary_utility

    # Searches the NVIDIA wheels first, then CONDA_PREFIX, CUDA_PATH/CUDA_HOME and the toolkit.
    found = find_nvidia_binary_utility(name)
    if found is None:
        raise RuntimeError(
            f"{name} not found (tessera_tile.inspect needs ptxas and nvdisasm of the same CUDA "
            f"minor version as numba-cuda's NVVM): pip install {_tool_wheels()}"
        )
    return found


@functools.lru_cache(maxsize=1)
def _tools() -> dict[str, str]:
    ptxas, nvdisasm = _find_tool("ptxas"), _find_tool("nvdisasm")

    def version(exe: str) -> str:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"V(\d+\.\d+\.\d+)", out)
        return m.group(1) if m else "unknown"

    return {
        "numba": _dist("numba"),
        "numba-cuda": _dist("numba-cuda"),
        "nvvm": _dist("nvidia-nvvm"),
        "ptxas": version(ptxas),
        "nvdisasm": version(nvdisasm),
        "ptxas_path": ptxas,
        "nvdisasm_path": nvdisasm,
    }


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_REGISTERS = re.compile(r"Used (\d+) registers[^\n]*")
_FRAME = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
_SHARED = re.compile(r"(\d+) bytes smem")


def _parse_ptxas(log: str, kernel: str, arch: str) -> dict[str, int]:
    """Resources of the one entry function in ``ptxas -v`` output.

    Raises ``RuntimeError`` naming what is missing rather than reading a miss as zero.
    """

    def fail(what: str):
        raise RuntimeError(
            f"cannot read the resources of kernel {kernel!r} on {arch} from ptxas -v: {what}\n"
            f"--- ptxas output ---\n{log.strip()}"
        )

    entries = _ENTRY.findall(log)
    if len(entries) != 1:
        fail(f"expected one 'Compiling entry function' line, found {len(entries)}")
    entry = log[log.index("Compiling entry function") :]
    # The frame line under the entry's own "Function properties" (device functions that were
    # not inlined have their own).
    frame = re.search(rf"Function properties for {re.escape(entries[0])}\s+{_FRAME}", entry)
    if frame is None:
        fail("no 'N bytes stack frame, N bytes spill stores, N bytes spill loads' line")
    used = _REGISTERS.search(entry)
    if used is None:
        fail("no 'Used N registers' line")
    smem = _SHARED.search(used.group(0))  # ptxas leaves it out when the kernel uses none
    return {
        "registers": int(used.group(1)),
        "stack_bytes": int(frame.group(1)),
        "spill_stores": int(frame.group(2)),
        "spill_loads": int(frame.group(3)),
        "shared_bytes": int(smem.group(1)) if smem else 0,
    }
