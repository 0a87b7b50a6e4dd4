"""``tessera_tile.profile()``: what each kernel launched inside a ``with`` block costs.

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

Covered: every kernel the library launches, all of which go through one launch path
(:mod:`tessera_tile._runtime.launch`): the kernels of fused functions, one record per kernel,
and the hand-written kernels of the ops (matmul, linear, mlp, attention, cross-entropy,
transpose, long-row layer norm) and of the composer's GEMM and attention stages, one record per
call or stage with the bytes and FLOPs ``explain`` predicts for it. Kernels a user launches
directly (``kernel[grid, block](...)``) are not seen.

FLOPs are counted from the Tile IR: one per element for each arithmetic node (a transcendental
counts as one; casts, views and leaves count nothing), one per element reduced for each
reduction, two per product term of a matmul (a multiply and an add), and two per product term
of both of attention's products.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

import numpy as np

from . import tile_ir as ir
from ._runtime import config as _config
from ._runtime import launch

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
    """FLOPs of one elementwise or reduction node evaluated over ``elements`` values
    (``reduced``: a reduction's input size)."""
    if node.op in ir.LEAF or node.op in ir.GENERATED or node.op in ir.VIEW:
        return 0
    if node.op is ir.Op.CAST:
        return 0
    return reduced if node.op in ir.REDUCE else elements


def trace_flops(nodes, shapes: dict) -> int:
    """Counted FLOPs of a traced program, with ``shapes`` by node key: a matmul counts a
    multiply and an add per product term, attention its two products over every (query,
    key) pair."""
    total = 0
    for n in nodes:
        size = int(np.prod(shapes[n.key], dtype=np.int64))
        if n.op is ir.Op.MATMUL:
            total += 2 * size * shapes[n.srcs[0].key][-1]
        elif n.op is ir.Op.ATTENTION:
            q, k, v = (shapes[s.key] for s in n.srcs)
            total += 2 * (size // v[-1]) * k[-2] * (q[-1] + v[-1])
        else:
            src = int(np.prod(shapes[n.srcs[0].key], dtype=np.int64)) if n.srcs else 0
            total += node_flops(n, size, src)
    return total


def stage_flops(stage, n_kept: int, n_red: int) -> int:
    """Counted FLOPs of one fused stage over its index space (kept x reduced)."""
    per_space = {"F": n_kept * n_red, "row": n_kept, "const": 0}
    return sum(
        node_flops(n, per_space[stage.space.get(id(n), "F")], n_kept * n_red) for n in stage.nodes
    )


def launch_shape(launches) -> str:
    """Each launch's grid, block and dynamic shared memory: ``"8x1x1 x 256, 48 KiB dyn"``,
    joined by ``" + "`` for several."""

    def dims(d) -> str:
        return "x".join(map(str, d)) if isinstance(d, tuple) else str(d)

    return " + ".join(
        f"{dims(k.grid)} x {dims(k.threads)}"
        + (f", {k.shared / 1024:.3g} KiB dyn" if k.shared else "")
        for k in launches
    )


@dataclass
class KernelRecord:
    name: str
    bytes: int
    flops: int
    time_ms: float | None = None  # measured with CUDA events; None without a GPU
    note: str = ""  # why a launch on a GPU has no time
    launch: str = ""  # grid x block (and dynamic shared memory) of its launches

    def row(self, device: DeviceSpec) -> dict:
        bound_ms = device.bound_seconds(self.bytes, self.flops) * 1e3
        out = {"kernel": self.name, "launch": self.launch, "bytes": self.bytes, "flops": self.flops}
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

    def launch(self, name: str, nbytes: int, flops: int, run, stream=0, launches=()) -> None:
        """Run a group of kernel launches (``run()``, of ``launches``: their records) on
        ``stream``; on a GPU, time it between two CUDA events on that stream. Called by the one
        launch path (:mod:`tessera_tile._runtime.launch`). A launch that compiled one of the
        kernels (numba-cuda compiles at a kernel's first launch for its argument types) is
        recorded without a time: the events would have timed the compiler."""
        shape = launch_shape(launches)
        if not self.measured:
            run()
            self.records.append(KernelRecord(name, nbytes, flops, launch=shape))
            return
        from numba import cuda

        def compiled():
            return [len(getattr(k.kernel, "overloads", ())) for k in launches]

        compiled_before = compiled()
        start, stop = cuda.event(), cuda.event()
        with _nvtx_range(name):
            start.record(stream)
            run()
            stop.record(stream)
        stop.synchronize()
        if compiled() != compiled_before:
            note = "compiled at this launch"
            self.records.append(KernelRecord(name, nbytes, flops, note=note, launch=shape))
            return
        time_ms = start.elapsed_time(stop)
        self.records.append(KernelRecord(name, nbytes, flops, time_ms, launch=shape))

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
        cols = ["kernel", "grid x block", "bytes", "FLOPs", "bound", "roofline µs"]
        if self.measured:
            cols += ["time µs", "GB/s", "% of peak BW", "GFLOP/s"]
        table = Table(*cols, box=box.SIMPLE)
        for r in self.rows():
            cells = [r["kernel"], r["launch"] or "-", f"{r['bytes']:,}", f"{r['flops']:,}"]
            cells.append(r["bound"])
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
    if hasattr(target, "flops"):  # a hand-written call counts its own
        return target.flops()
    if hasattr(target, "fn"):  # a call of a fused definition
        op, args = target.fn, target.args
    return op.flops(*args) if hasattr(op, "flops") else 0


@contextlib.contextmanager
def suspended():
    """Launches inside are not recorded by the active profile (warm-up runs)."""
    saved, launch.recorder = launch.recorder, None
    try:
        yield
    finally:
        launch.recorder = saved


def active() -> Profile | None:
    """The profile of the ``with tessera_tile.profile()`` block in progress, if any."""
    return launch.recorder


@contextlib.contextmanager
def profile(device: str = "h100"):
    """Record the kernels launched inside the block (see the module docstring).

    ``device``: whose peaks the report compares with (``"a100"``, ``"h100"``, ``"h200"``); on a
    GPU, the peaks of the named device are used as given, not read from the device.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {sorted(DEVICES)}, got {device!r}")
    if launch.recorder is not None:
        raise RuntimeError("a tessera_tile.profile() is already active")
    launch.recorder = Profile(DEVICES[device], measured=_config.gpu_present())
    try:
        yield launch.recorder
    finally:
        launch.recorder = None


def _nvtx_range(name: str):
    try:
        import nvtx  # NVIDIA's NVTX binding, optional
    except ImportError:
        return contextlib.nullcontext()
    return nvtx.annotate(name)
