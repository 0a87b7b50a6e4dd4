"""``tessera_tile.profile()``: what each fused kernel launched inside a ``with`` block costs.

::

    with tt.profile(device="h100") as prof:
        y = ops.softmax(x)
        z = my_fused_fn(y)
    print(prof)

On a GPU every kernel is timed with CUDA events (and wrapped in an NVTX range named after the
kernel when the ``nvtx`` package is installed, for Nsight Systems); the report gives its time,
achieved bandwidth against the device's peak, and FLOP rate. Without a GPU (the simulator, or a
machine with none) the report says so and gives the static figures instead: predicted bytes,
counted FLOPs, and the roofline bound (the shortest time the device's bandwidth and FP32 peak
allow). ``prof.add(op, *args)`` adds a call's static figures from ``explain()`` without running
it, so the report also works where nothing can run.

Covered: kernels of fused functions and of the ops built on them (the launch path of
:mod:`tessera_tile._fusion.runtime`). Hand-written kernels (cross-entropy's gather, transpose,
long-row layer norm) are not timed by the hook; add them with ``prof.add``.

FLOPs are counted from the Tile IR: one per element for each arithmetic node (a transcendental
counts as one; casts and leaves count nothing), one per element reduced for each reduction.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

import numpy as np

from . import tile_ir as ir
from ._runtime import config as _config

__all__ = ["DEVICES", "DeviceSpec", "KernelRecord", "Profile", "active", "profile"]


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one GPU, from its vendor datasheet (SXM boards, dense FP32 without
    tensor cores)."""

    name: str
    bandwidth: float  # bytes/s of DRAM (HBM)
    fp32: float  # FLOP/s
    fp16_tensor: float  # FLOP/s, dense (without the sparsity the datasheets also quote)
    source: str

    def bound_seconds(self, nbytes: int, flops: int) -> float:
        return max(nbytes / self.bandwidth, flops / self.fp32)

    def ridge(self) -> float:
        """FLOPs per byte where the bandwidth roof meets the compute roof."""
        return self.fp32 / self.bandwidth


DEVICES = {
    "a100": DeviceSpec(
        "A100 SXM4 80GB", 2.039e12, 19.5e12, 312e12, "NVIDIA A100 Tensor Core GPU datasheet"
    ),
    "h100": DeviceSpec(
        "H100 SXM5 80GB", 3.35e12, 67e12, 989.4e12, "NVIDIA H100 Tensor Core GPU datasheet"
    ),
    "h200": DeviceSpec(
        "H200 SXM 141GB", 4.8e12, 67e12, 989.4e12, "NVIDIA H200 Tensor Core GPU datasheet"
    ),
}


def node_flops(node: ir.Node, elements: int, reduced: int) -> int:
    """FLOPs of one node evaluated over ``elements`` values (``reduced``: a reduction's input
    size)."""
    if node.op in ir.LEAF or node.op in ir.GENERATED or node.op is ir.Op.CAST:
        return 0
    return reduced if node.op in ir.REDUCE else elements


def trace_flops(nodes, shapes: dict) -> int:
    """Counted FLOPs of a traced program, with ``shapes`` by node key."""
    total = 0
    for n in nodes:
        size = int(np.prod(shapes[n.key], dtype=np.int64))
        src = int(np.prod(shapes[n.srcs[0].key], dtype=np.int64)) if n.srcs else 0
        total += node_flops(n, size, src)
    return total


def stage_flops(stage, n_kept: int, n_red: int) -> int:
    """Counted FLOPs of one fused stage over its index space (kept x reduced)."""
    per_space = {"F": n_kept * n_red, "row": n_kept, "const": 0}
    return sum(
        node_flops(n, per_space[stage.space.get(id(n), "F")], n_kept * n_red) for n in stage.nodes
    )


@dataclass
class KernelRecord:
    name: str
    bytes: int
    flops: int
    time_ms: float | None = None  # measured with CUDA events; None without a GPU
    note: str = ""  # why a launch on a GPU has no time

    def row(self, device: DeviceSpec) -> dict:
        bound_ms = device.bound_seconds(self.bytes, self.flops) * 1e3
        out = {"kernel": self.name, "bytes": self.bytes, "flops": self.flops}
        if self.note:
            out["note"] = self.note
        out["bound"] = "memory" if self.bytes * device.ridge() >= self.flops else "compute"
        out["roofline_ms"] = bound_ms
        if self.time_ms is not None:
            seconds = self.time_ms / 1e3
            out["time_ms"] = self.time_ms
            out["bandwidth_gbs"] = self.bytes / seconds / 1e9 if seconds else None
            out["bandwidth_of_peak"] = self.bytes / seconds / device.bandwidth if seconds else None
            out["gflops"] = self.flops / seconds / 1e9 if seconds else None
        return out


@dataclass
class Profile:
    """Kernels recorded inside one ``with tessera_tile.profile()`` block."""

    device: DeviceSpec
    measured: bool  # a GPU times launches
    records: list[KernelRecord] = field(default_factory=list)

    def launch(self, name: str, nbytes: int, flops: int, run, stream=0, kernel=None) -> None:
        """Run one kernel launch (``run()``) on ``stream``; on a GPU, time it between two CUDA
        events on that stream. Called by the fused runtime. A launch that compiled ``kernel``
        (numba-cuda compiles at a kernel's first launch for its argument types) is recorded
        without a time: the events would have timed the compiler."""
        if not self.measured:
            run()
            self.records.append(KernelRecord(name, nbytes, flops))
            return
        from numba import cuda

        compiled_before = len(getattr(kernel, "overloads", ()))
        start, stop = cuda.event(), cuda.event()
        with _nvtx_range(name):
            start.record(stream)
            run()
            stop.record(stream)
        stop.synchronize()
        if len(getattr(kernel, "overloads", ())) != compiled_before:
            self.records.append(KernelRecord(name, nbytes, flops, note="compiled at this launch"))
            return
        self.records.append(KernelRecord(name, nbytes, flops, start.elapsed_time(stop)))

    def add(self, op, *args, **kwargs) -> None:
        """The static figures of ``op(*args, **kwargs)`` (a fused function or a prebuilt op)
        from its ``explain()``, without running it."""
        explain = op.explain(*args, **kwargs)
        flops = explain_flops(op, *args, **kwargs)
        name = getattr(op, "__name__", type(op).__name__)
        self.records.append(
            KernelRecord(f"{name} ({explain.kernels} kernel(s))", explain.bytes_fused, flops)
        )

    def rows(self) -> list[dict]:
        return [r.row(self.device) for r in self.records]

    def __str__(self) -> str:
        from rich import box
        from rich.console import Console
        from rich.table import Table

        buf = io.StringIO()
        console = Console(file=buf, width=120, color_system=None)
        if self.measured:
            console.print(f"tessera_tile profile on a GPU, peaks of {self.device.name}")
        else:
            console.print(
                "tessera_tile profile: no GPU, so nothing was timed; static report (predicted "
                f"bytes, counted FLOPs, roofline bound on {self.device.name})"
            )
        cols = ["kernel", "bytes", "FLOPs", "bound", "roofline µs"]
        if self.measured:
            cols += ["time µs", "GB/s", "% of peak BW", "GFLOP/s"]
        table = Table(*cols, box=box.SIMPLE)
        for r in self.rows():
            cells = [r["kernel"], f"{r['bytes']:,}", f"{r['flops']:,}", r["bound"]]
            cells.append(f"{r['roofline_ms'] * 1e3:.3g}")
            if self.measured and "time_ms" in r:
                cells += [
                    f"{r['time_ms'] * 1e3:.2f}",
                    f"{r['bandwidth_gbs']:.0f}" if r["bytes"] else "-",
                    f"{100 * r['bandwidth_of_peak']:.1f}" if r["bytes"] else "-",
                    f"{r['gflops']:.1f}" if r["flops"] else "-",
                ]
            elif self.measured:
                cells += [r.get("note", "not timed"), "", "", ""]
            table.add_row(*cells)
        console.print(table)
        return buf.getvalue().rstrip()


def explain_flops(op, *args, **kwargs) -> int:
    """Counted FLOPs of a call of a fused function or of a prebuilt op: from its Tile IR, or
    from the op's own count (matmul, attention); 0 for a data movement such as transpose.
    Duck-typed: this layer sits below the composer and the ops."""
    target = op._plan(*args, **kwargs) if hasattr(op, "_plan") else None
    if hasattr(target, "flops"):  # a hand-written product (matmul, attention) counts its own
        return target.flops()
    fused = getattr(target, "fused", target)  # long-row layer norm keeps its fused twin
    if fused is not None and hasattr(fused, "fn"):
        op, args = fused.fn, fused.args
    return op.flops(*args) if hasattr(op, "flops") else 0


_active: Profile | None = None


@contextlib.contextmanager
def suspended():
    """Launches inside are not recorded by the active profile (warm-up runs)."""
    global _active
    saved, _active = _active, None
    try:
        yield
    finally:
        _active = saved


def active() -> Profile | None:
    """The profile of the ``with tessera_tile.profile()`` block in progress, if any."""
    return _active


@contextlib.contextmanager
def profile(device: str = "h100"):
    """Record the fused kernels launched inside the block (see the module docstring).

    ``device``: whose peaks the report compares with (``"a100"``, ``"h100"``, ``"h200"``); on a
    GPU, the peaks of the named device are used as given, not read from the device.
    """
    global _active
    if device not in DEVICES:
        raise ValueError(f"device must be one of {sorted(DEVICES)}, got {device!r}")
    if _active is not None:
        raise RuntimeError("a tessera_tile.profile() is already active")
    _active = Profile(DEVICES[device], measured=_config.gpu_present())
    try:
        yield _active
    finally:
        _active = None


def _nvtx_range(name: str):
    try:
        import nvtx  # NVIDIA's NVTX binding, optional
    except ImportError:
        return contextlib.nullcontext()
    return nvtx.annotate(name)
