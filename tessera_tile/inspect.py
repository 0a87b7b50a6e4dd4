"""Offline compilation of kernels: PTX, cubin, resources, SASS histogram and occupancy.

Works with no GPU: Numba lowers the kernel through NVVM to PTX, ``ptxas`` assembles it into a
cubin for the chosen architecture and reports registers, spills, stack and static shared memory,
and ``nvdisasm`` prints the SASS. ``ptxas`` and ``nvdisasm`` come from the pip wheels
``nvidia-cuda-nvcc`` and ``nvidia-cuda-nvdisasm`` of the same minor version as the NVVM that
numba-cuda uses (an older ``ptxas`` rejects newer PTX).

Shared memory figures are ``ptxas``'s static figure: they exclude the 1 KiB per block that the
system reserves on sm_80 and newer (the occupancy model adds it back).

    >>> report = tessera_tile.inspect.compile(my_kernel, "void(float32[::1])", arch="sm_90")
    >>> report.registers, report.spill_stores, report.count("SHFL")
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ARCHS", "CompileReport", "compile", "occupancy"]


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one architecture (CUDA occupancy calculator figures)."""

    cc: tuple[int, int]
    max_warps: int
    max_blocks: int
    registers: int
    max_shared: int  # bytes of shared memory per SM usable by blocks
    reserved_shared: int = 1024  # per block, reserved by the system on sm_80+
    register_granularity: int = 256  # registers are allocated per warp in units of this
    shared_granularity: int = 128


ARCHS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits((8, 0), max_warps=64, max_blocks=32, registers=65536, max_shared=167936),
    "sm_86": ArchLimits((8, 6), max_warps=48, max_blocks=16, registers=65536, max_shared=102400),
    "sm_89": ArchLimits((8, 9), max_warps=48, max_blocks=24, registers=65536, max_shared=102400),
    "sm_90": ArchLimits((9, 0), max_warps=64, max_blocks=32, registers=65536, max_shared=233472),
}

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
    by_smem = lim.max_shared // smem
    blocks = min(by_warps, by_regs, by_smem, lim.max_blocks)
    return blocks * warps / lim.max_warps


@dataclass(frozen=True)
class CompileReport:
    """What one kernel compiles to for one architecture."""

    name: str
    arch: str
    signature: str
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)
    sass: str = field(repr=False)
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    histogram: dict[str, int]
    block: int
    occupancy: float
    tools: dict[str, str]

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
        return sum(
            n for op, n in self.histogram.items() if op == opcode or op.startswith(opcode + ".")
        )

    def key_opcodes(self, prefixes: tuple[str, ...] = ()) -> str:
        """A compact 'OP:count' line, like the columns of the anchors table."""
        wanted = prefixes or (
            "LDG", "STG", "LDS", "STS", "LDGSTS", "SHFL", "BAR", "FFMA", "MUFU", "HMMA", "LDSM",
        )  # fmt: skip
        return " ".join(
            f"{op}:{n}"
            for op, n in sorted(self.histogram.items())
            if any(op == p or op.startswith(p + ".") for p in wanted)
        )

    def __str__(self) -> str:
        lines = [
            f"{self.name} [{self.arch}] {self.signature}",
            f"  registers {self.registers}, spills {self.spill_stores} B stored / "
            f"{self.spill_loads} B loaded, stack {self.stack_bytes} B, "
            f"static shared {self.shared_bytes} B (ptxas)",
            f"  occupancy {self.occupancy:.0%} at {self.block} threads/block, "
            f"{self.instructions} SASS instructions",
            f"  key opcodes: {self.key_opcodes() or '-'}",
            "  tools: " + ", ".join(f"{k} {v}" for k, v in self.tools.items()),
        ]
        return "\n".join(lines)


def compile(  # noqa: A001 - the public name asked for by users of this module
    fn: Any, signature: Any, arch: str = "sm_90", *, block: int = DEFAULT_BLOCK
) -> CompileReport:
    """Compile a kernel for ``arch`` without a GPU and report its resources and SASS.

    Parameters
    ----------
    fn:
        A ``@cuda.jit`` kernel or the plain Python function of one.
    signature:
        A Numba signature, as a string (``"void(float32[::1], int32)"``) or a tuple of types.
    arch:
        ``"sm_80"``, ``"sm_86"``, ``"sm_89"`` or ``"sm_90"``.
    block:
        Threads per block for the occupancy figure (default 256).
    """
    pyfunc = _python_function(fn)
    lim = _arch(arch)
    if _simulator_enabled():
        raise RuntimeError(
            "tessera_tile.inspect.compile needs the real compiler; it cannot run with "
            "NUMBA_ENABLE_CUDASIM=1 (run the compile tier in a separate process)"
        )
    if not isinstance(block, int) or not 1 <= block <= 1024:
        raise ValueError(f"block must be an int in 1..1024, got {block!r}")
    sig = tuple(signature) if isinstance(signature, list) else signature
    return _compile_cached(pyfunc, sig, arch, lim.cc, block)


@functools.lru_cache(maxsize=512)
def _compile_cached(pyfunc, signature, arch: str, cc, block: int) -> CompileReport:
    from numba import cuda
    from numba.core.errors import TypingError

    try:
        with _device_free_compilation(cc):
            ptx, _ = cuda.compile_ptx(pyfunc, signature, cc=cc)
    except TypingError as e:
        first = str(e).strip().splitlines()[0]
        raise TypeError(
            f"kernel {pyfunc.__name__!r} does not type for signature {signature}: {first}"
        ) from e
    tools = _tools()
    with tempfile.TemporaryDirectory(prefix="tessera_tile_") as tmp:
        ptx_path, cubin_path = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx_path.write_text(ptx)
        res = subprocess.run(
            [tools["ptxas_path"], f"-arch={arch}", "-v", "-o", str(cubin_path), str(ptx_path)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"ptxas failed for {pyfunc.__name__!r} on {arch}: {res.stderr.strip()}\n"
                "ptxas must be of the same CUDA minor version as numba-cuda's NVVM "
                "(pip install 'nvidia-cuda-nvcc==13.5.*')"
            )
        cubin = cubin_path.read_bytes()
        sass = subprocess.run(
            [tools["nvdisasm_path"], "-c", str(cubin_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    resources = _parse_ptxas(res.stdout + res.stderr)
    histogram = _histogram(sass)
    return CompileReport(
        name=pyfunc.__name__,
        arch=arch,
        signature=str(signature),
        ptx=ptx,
        cubin=cubin,
        sass=sass,
        histogram=histogram,
        block=block,
        occupancy=occupancy(arch, resources["registers"], resources["shared_bytes"], block),
        tools={k: v for k, v in tools.items() if not k.endswith("_path")},
        **resources,
    )


def _python_function(fn: Any):
    py = getattr(fn, "py_func", None)
    if py is None and callable(fn) and hasattr(fn, "__code__"):
        py = fn
    if py is None or not hasattr(py, "__code__"):
        raise TypeError(
            f"expected a @cuda.jit kernel or a Python function, got {type(fn).__name__}"
        )
    if getattr(fn, "_device", False) or getattr(fn, "targetoptions", {}).get("device"):
        raise TypeError(f"{py.__name__!r} is a device function, not a kernel")
    return py


def _arch(arch: str) -> ArchLimits:
    try:
        return ARCHS[arch]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {arch!r}; known: {', '.join(ARCHS)}") from None


def _simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


_patch_lock = threading.Lock()


@contextlib.contextmanager
def _device_free_compilation(cc):
    """Let kernels that call device functions compile with no GPU.

    numba-cuda compiles a called device function for the current device's compute capability,
    which asks the driver for a device. With no GPU we answer for it with the target's.
    """
    if _gpu_present():
        yield
        return
    import numba.cuda.dispatcher as dispatcher

    class _TargetDevice:
        compute_capability = cc

    with _patch_lock:
        saved = dispatcher.get_current_device
        dispatcher.get_current_device = lambda: _TargetDevice()
        try:
            yield
        finally:
            dispatcher.get_current_device = saved


@functools.lru_cache(maxsize=1)
def _gpu_present() -> bool:
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def _find_tool(name: str) -> str:
    with contextlib.suppress(ImportError):
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13/bin", "cuda_nvcc/bin", "cuda_nvdisasm/bin"):
                p = Path(base, sub, name)
                if p.exists():
                    return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise RuntimeError(
        f"{name} not found: pip install 'nvidia-cuda-nvcc==13.5.*' 'nvidia-cuda-nvdisasm==13.5.*'"
    )


@functools.lru_cache(maxsize=1)
def _tools() -> dict[str, str]:
    ptxas, nvdisasm = _find_tool("ptxas"), _find_tool("nvdisasm")

    def version(exe: str) -> str:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"V(\d+\.\d+\.\d+)", out)
        return m.group(1) if m else "unknown"

    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return {
        "numba": dist("numba"),
        "numba-cuda": dist("numba-cuda"),
        "nvvm": dist("nvidia-nvvm"),
        "ptxas": version(ptxas),
        "nvdisasm": version(nvdisasm),
        "ptxas_path": ptxas,
        "nvdisasm_path": nvdisasm,
    }


_PTXAS_PATTERNS = {
    "stack_bytes": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "registers": r"Used (\d+) registers",
    "shared_bytes": r"(\d+) bytes smem",
}


def _parse_ptxas(log: str) -> dict[str, int]:
    """Resources of the entry function from ``ptxas -v`` output."""
    # Keep only the block that follows "Compiling entry function": device functions that were
    # not inlined have blocks of their own.
    start = log.find("Compiling entry function")
    entry = log[start:] if start >= 0 else log
    nxt = entry.find("Compiling", 10)
    if nxt > 0:
        entry = entry[:nxt]
    out = {}
    for key, pat in _PTXAS_PATTERNS.items():
        m = re.search(pat, entry)
        out[key] = int(m.group(1)) if m else 0
    return out


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _histogram(sass: str) -> dict[str, int]:
    return dict(Counter(m.group(1) for m in _SASS_LINE.finditer(sass)))
