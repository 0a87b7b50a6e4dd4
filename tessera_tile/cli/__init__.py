"""The ``tessera-tile`` command (also ``python -m tessera_tile``).

::

    tessera-tile doctor                                  versions, tools, GPU, CuPy, cache
    tessera-tile inspect kernels.py:axpy --signature "void(float32[::1], float32[::1])"
    tessera-tile explain softmax --shape 4096x1024 --dtype float16
    tessera-tile tune matmul --shape 4096x1024           fills the cache the matmul ops read
    tessera-tile cache list | cache clear
    tessera-tile bench [OP...]                           GPU: vs CuPy; else the static report
    tessera-tile report --device h100 --out roofline.png

Human-readable output by default, ``--json`` for machines. A bad op, shape or dtype is a
one-line error under the usage, exit code 2. ``tune`` of an op without tunable configs (all but
matmul and linear: they choose their launch from the data) says so and exits 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import click
import numpy as np

from .. import profiling
from .._runtime import cache as _cache
from .._runtime import config as _config
from .._runtime.arrays import host_to_device
from . import roofline as _roofline

DTYPES = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")
NAMESPACES = ("autotune", "programs", "kernels")


def _stderr():
    from rich.console import Console

    return Console(stderr=True)


def _emit(as_json: bool, data, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def _ops():
    from .. import ops

    return ops


def _op(name: str):
    ops = _ops()
    if name not in ops.__all__:
        raise click.BadParameter(
            f"unknown op {name!r}; prebuilt ops: {', '.join(ops.__all__)}", param_hint="OP"
        )
    return getattr(ops, name)


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(p) for p in text.lower().split("x")) if text else ()
    except ValueError:
        shape = None
    if shape is None or any(n < 0 for n in shape):
        raise click.BadParameter(f"{text!r} is not a shape like 4096x1024", param_hint="--shape")
    return shape


def _checked(fn, *args, **kwargs):
    """Run an op's explain/inspect; its argument errors become usage errors (exit 2)."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e).splitlines()[0]) from None


# Each op's shape when --shape is not given: (rows, length) for the row ops and reductions, (M, K)
# for the matmul family; attention's is (heads, S, D), as its D must be a head dimension.
DEFAULT_SHAPE = (4096, 1024)
DEFAULT_SHAPES = {"attention": (16, 4096, 64)}


def _shape_of(op: str, text: str | None) -> tuple[int, ...]:
    """``--shape`` if given, else the op's default shape."""
    return _shape(text) if text is not None else DEFAULT_SHAPES.get(op, DEFAULT_SHAPE)


shape_option = click.option(
    "--shape",
    default=None,
    help="NxM... [default: 4096x1024; attention 16x4096x64 (heads x S x D)]",
)
dtype_option = click.option(
    "--dtype", type=click.Choice(DTYPES), default="float32", show_default=True
)
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tessera_tile")
def main() -> None:
    """tessera_tile: tile-level GPU programming with Numba CUDA."""


# doctor -------------------------------------------------------------------------------------


@main.command()
@json_option
def doctor(as_json: bool) -> None:
    """numba-cuda, NVVM, ptxas and nvdisasm versions, GPU, CuPy and the cache directory."""
    from .. import inspect as offline

    info: dict = {"tessera_tile": _cache.versions()["tessera_tile"]}
    problems = []
    try:
        info.update(offline._tools())
    except Exception as e:  # a missing tool: say which, keep going
        problems.append(f"compiler tools: {e}")
    info["simulator"] = _config.SIMULATED
    info["gpu"] = _gpu_name()
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        info["cupy"] = None
    directory = _config.cache_dir()
    info["cache_dir"] = str(directory)
    info["cache_writable"] = _writable(directory)
    info["problems"] = problems
    lines = [f"{k:>16}: {'-' if v is None else v}" for k, v in info.items() if k != "problems"]
    lines += [f"problem: {p}" for p in problems]
    _emit(as_json, info, "\n".join(lines))
    if problems:
        sys.exit(1)


def _gpu_name() -> str | None:
    if not _config.gpu_present():
        return None
    from numba import cuda

    dev = cuda.get_current_device()
    major, minor = dev.compute_capability
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    return f"{name} (sm_{major}{minor})"


def _writable(directory: Path) -> bool:
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK)


# inspect ------------------------------------------------------------------------------------


@main.command("inspect")
@click.argument("target", metavar="FILE:KERNEL")
@click.option("--signature", required=True, help='e.g. "void(float32[::1], int32)"')
@click.option("--arch", default="sm_90", show_default=True)
@click.option("--block", type=int, default=None, help="threads per block (occupancy)")
@click.option(
    "--elements-per-iteration",
    type=int,
    default=None,
    help="elements one thread handles per iteration of the hottest loop",
)
@json_option
def inspect_cmd(target, signature, arch, block, elements_per_iteration, as_json) -> None:
    """Compile FILE:KERNEL offline: resources, opcode histogram, occupancy, loops."""
    if _config.SIMULATED:
        raise click.ClickException(
            "inspect compiles for a real GPU architecture, which cannot happen in a process "
            "running the simulator: run it without NUMBA_ENABLE_CUDASIM=1 (no GPU is needed)"
        )
    from .. import inspect as offline

    path, _, name = target.rpartition(":")
    if not path or not name:
        raise click.BadParameter(f"{target!r} is not FILE:KERNEL", param_hint="FILE:KERNEL")
    kernel = _load(Path(path), name)
    report = _checked(offline.compile, kernel, signature, arch=arch, block=block)
    per_element = None
    if elements_per_iteration is not None and report.hottest_loop is not None:
        per_element = report.instructions_per_element(elements_per_iteration)
    data = {
        "name": report.name,
        "arch": report.arch,
        "signature": report.signature,
        "registers": report.registers,
        "spill_stores": report.spill_stores,
        "spill_loads": report.spill_loads,
        "stack_bytes": report.stack_bytes,
        "shared_bytes": report.shared_bytes,
        "occupancy": report.occupancy,
        "block": report.block,
        "instructions": report.instructions,
        "histogram": report.histogram,
        "loops": [
            {"start": lp.start, "end": lp.end, "instructions": lp.instructions, "depth": lp.depth}
            for lp in report.loops
        ],
        "instructions_per_element": per_element,
    }
    text = str(report)
    if per_element is not None:
        text += f"\n  instructions per element (hottest loop): {per_element:.2f}"
    _emit(as_json, data, text)


def _load(path: Path, name: str):
    if not path.is_file():
        raise click.BadParameter(f"no file {str(path)!r}", param_hint="FILE:KERNEL")
    spec = importlib.util.spec_from_file_location(f"_tessera_cli_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # the file's own imports of its neighbours
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise click.BadParameter(f"{path} defines no {name!r}", param_hint="FILE:KERNEL")
    return getattr(module, name)


# explain, tune, bench -----------------------------------------------------------------------


@main.command()
@click.argument("op")
@shape_option
@dtype_option
@json_option
def explain(op, shape, dtype, as_json) -> None:
    """What a prebuilt op does at a shape: kernels, predicted traffic, FLOPs, IR.

    NumPy zeros stand in for the arrays (see docs/tuning.md for the weights and targets)."""
    fn, shape = _op(op), _shape_of(op, shape)
    args, kwargs = _roofline.stand_ins(op, shape, dtype)
    report = _checked(fn.explain, *args, **kwargs)
    flops = profiling.explain_flops(fn, *args, **kwargs)
    data = {
        "op": op,
        "shape": list(shape),
        "dtype": dtype,
        "kernels": report.kernels,
        "bytes_fused": report.bytes_fused,
        "bytes_unfused": report.bytes_unfused,
        "flops": flops,
        "stages": report.stages,
        "reasons": report.reasons,
        "ir": report.ir,
    }
    _emit(as_json, data, f"{op} {'x'.join(map(str, shape))} {dtype}: {flops} FLOPs\n{report}")


@main.command()
@click.argument("op")
@shape_option
@dtype_option
@json_option
def tune(op, shape, dtype, as_json) -> None:
    """Fill the tuning cache for OP at a shape (ops with tunable configs: matmul, linear; the
    ops read it for their default configs)."""
    from .. import tuned

    _op(op)
    shape = _shape_of(op, shape)
    tuner = getattr(tuned, op, None) if op in tuned.__all__ else None
    if tuner is None:
        message = f"{op} has no tunable configs: its launch is chosen from the data"
        _emit(as_json, {"op": op, "tunable": False}, f"{message}, nothing to tune (exit 0)")
        return
    args, kwargs = _roofline.stand_ins(op, shape, dtype)
    if _config.gpu_present():  # timed on the device, as the tuned op's callers run it
        args = tuple(host_to_device(a) if isinstance(a, np.ndarray) else a for a in args)
    config = _checked(tuner.choose, *args, **kwargs)
    entry = tuner.disk.get(tuner.disk_key(args, kwargs)) if tuner.disk else None
    chosen_by = (entry or {}).get("chosen_by", "cache")
    data = {"op": op, "tunable": True, "shape": list(shape), "dtype": dtype}
    data |= {"config": repr(config), "chosen_by": chosen_by}
    how = "timed on this GPU" if chosen_by == "measured" else "ranked by the model (no GPU)"
    text = f"{op} {'x'.join(map(str, shape))} {dtype}: {config!r}, {how}; cached"
    _emit(as_json, data, text)


@main.command()
@click.argument("op_names", metavar="[OP]...", nargs=-1)
@shape_option
@dtype_option
@click.option("--device", type=click.Choice(sorted(profiling.DEVICES)), default="h100")
@click.option("--repeat", type=int, default=20, show_default=True, help="timed runs (GPU)")
@json_option
def bench(op_names, shape, dtype, device, repeat, as_json) -> None:
    """Time each op against CuPy's unfused chain on a GPU; without one, the static report."""
    names = list(op_names) or list(_ops().__all__)
    fns = [_op(n) for n in names]
    shapes = [_shape_of(n, shape) for n in names]
    if not _config.gpu_present():
        with profiling.profile(device=device) as prof:
            for name, fn, at in zip(names, fns, shapes, strict=True):
                _checked(prof.add, fn, *_roofline.stand_ins(name, at, dtype)[0])
        _emit(as_json, {"measured": False, "rows": prof.rows()}, str(prof))
        return
    try:
        import cupy
    except ImportError:
        raise click.ClickException(
            "bench on a GPU compares with CuPy: pip install 'tessera_tile[cupy]'"
        ) from None
    rows = [
        _bench_gpu(cupy, name, fn, at, dtype, device, repeat)
        for name, fn, at in zip(names, fns, shapes, strict=True)
    ]
    lines = [f"{'op':>14}  {'tessera_tile ms':>15}  {'CuPy unfused ms':>15}  speed-up"]
    for r in rows:
        ours, theirs = r["tessera_tile_ms"], r["cupy_ms"]
        speedup = f"{theirs / ours:.2f}x" if ours and theirs else "-"
        lines.append(f"{r['op']:>14}  {ours:>15.4f}  {theirs or float('nan'):>15.4f}  {speedup}")
    _emit(as_json, {"measured": True, "rows": rows}, "\n".join(lines))


def _bench_gpu(cupy, name, fn, shape, dtype, device, repeat) -> dict:
    """Median time of one call of an op (its kernels, summed per call, timed by the
    profile) and of CuPy's unfused chain of the same call (hand-written ops: the call)."""
    from .bench_ref import REFERENCE, time_ms

    args, kwargs = _roofline.stand_ins(name, shape, dtype)
    dev = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    with profiling.suspended():
        _checked(fn, *dev, **kwargs)  # compiles, outside the timing
    with profiling.profile(device=device) as prof:
        for _ in range(repeat):
            fn(*dev, **kwargs)
    timed = [r.time_ms for r in prof.records if r.time_ms is not None]
    per_call = len(timed) // repeat if timed else 0
    if per_call:
        ours = float(
            np.median([sum(timed[i : i + per_call]) for i in range(0, len(timed), per_call)])
        )
    else:  # every launch compiled at its launch (none timed): the whole call
        ours = time_ms(lambda: fn(*dev, **kwargs), repeat=repeat)
    theirs = (
        time_ms(lambda: REFERENCE[name](cupy, *dev), repeat=repeat) if name in REFERENCE else None
    )
    return {
        "op": name,
        "shape": list(shape),
        "dtype": dtype,
        "tessera_tile_ms": ours,
        "cupy_ms": theirs,
    }


# cache ----------------------------------------------------------------------------------------


@main.group()
def cache() -> None:
    """The persistent caches (tuning choices, compiled kernels)."""


@cache.command("list")
@json_option
def cache_list(as_json) -> None:
    """Every entry of this library version, by cache; then the files ignored (corrupt, or of other
    versions), which the next use rebuilds."""
    rows, ignored = [], []
    for ns in NAMESPACES:
        for e in _cache.DiskCache(ns).entries(include_ignored=True):
            row = {"cache": ns, "file": e["path"].name, "bytes": e["path"].stat().st_size}
            if e["status"] == "ok":
                rows.append(row | {"key": e["key"], "value": e["value"]})
            else:
                ignored.append(row | {"status": e["status"], "problem": e["problem"]})
    lines = [f"cache directory: {_config.cache_dir()}", f"{len(rows)} entr(y/ies)"]
    lines += [
        f"  {r['cache']}/{r['file']} ({r['bytes']} B): {json.dumps(r['key'], default=str)}"
        for r in rows
    ]
    if ignored:
        lines.append(f"{len(ignored)} ignored, rebuilt at their next use:")
        lines += [
            f"  {i['cache']}/{i['file']}: {i['status']}"
            + (f" ({i['problem']})" if i["problem"] else "")
            for i in ignored
        ]
    data = {"cache_dir": str(_config.cache_dir()), "entries": rows, "ignored": ignored}
    _emit(as_json, data, "\n".join(lines))


@cache.command("clear")
@json_option
def cache_clear(as_json) -> None:
    """Remove every entry."""
    removed = {ns: _cache.DiskCache(ns).clear() for ns in NAMESPACES}
    total = sum(removed.values())
    _emit(as_json, removed, f"removed {total} entr(y/ies) from {_config.cache_dir()}")


# report ---------------------------------------------------------------------------------------


@main.command()
@click.option("--device", type=click.Choice(sorted(profiling.DEVICES)), default="h100")
@click.option("--out", default="roofline.png", show_default=True, help="PNG to write")
@click.option("--shape", default="x".join(map(str, _roofline.SHAPE)), show_default=True)
@json_option
def report(device, out, shape, as_json) -> None:
    """A roofline PNG of every prebuilt op, bytes measured in the simulator."""
    shape = _shape(shape)
    if len(shape) != 2:
        raise click.BadParameter("the report takes a 2-D shape (rows x length)", "--shape")
    try:
        import matplotlib  # noqa: F401 - the optional extra
    except ImportError:
        raise click.ClickException(
            "the report needs matplotlib: pip install 'tessera_tile[report]'"
        ) from None
    from rich.progress import Progress

    from .. import ops

    # on stderr, so that --json output stays one document on stdout
    with Progress(console=_stderr(), transient=True) as bar:
        task = bar.add_task("measuring each op in the simulator", total=len(ops.__all__))
        rows = _roofline.measure(shape, progress=lambda row: bar.advance(task))
    axes = _roofline.plot(rows, device, out)
    lines = [f"wrote {out} ({profiling.DEVICES[device].name})"]
    lines += [
        f"  {r['op']:>14}: {r['bytes']:>9} B measured, {r['flops']:>9} FLOPs, "
        f"{(r['flops'] / r['bytes'] if r['bytes'] else 0):.3f} FLOP/B"
        for r in rows
    ]
    data = {"png": out, "device": device, "rows": rows, "axes": axes}
    _emit(as_json, data, "\n".join(lines))
