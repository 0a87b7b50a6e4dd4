"""``@tt.fuse``: trace -> Tile IR -> plan -> generated ``@cuda.jit`` kernels -> cache.

::

    @tt.fuse
    def softmax(x):
        m = tt.max(x, axis=-1, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=-1, keepdims=True)

    y = softmax(x)               # one kernel: the row is read once when it fits on chip
    print(softmax.explain(x))    # what it did, without running

Inputs: NumPy arrays (run in the simulator under ``NUMBA_ENABLE_CUDASIM=1``, else copied to the
GPU and back), arrays with ``__cuda_array_interface__`` (CuPy, Numba device arrays), Python
scalars and 0-d arrays. Results have the type of the array inputs. Inputs are never modified.

Caching: the first call with a new *signature* (dtypes, ranks, which axes have length 1, scalar
kinds, layout class, target) traces and plans; kernels are generated once per stage fingerprint
and variant. A call that hits the cache does no tracing and no code generation.
``fn.cache_info()`` reports the hits and misses.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

import numpy as np

from .. import tile_ir as ir
from . import codegen, host
from . import plan as planner
from .trace import Traced, TraceError, trace

__all__ = ["Explain", "FusedFunction", "TraceError", "Traced", "fuse", "kernel_cache"]

kernel_cache = codegen.KernelCache()


@dataclass
class Explain:
    """What a fused call does, from ``fn.explain(*args)``."""

    kernels: int
    ir: str
    source: str
    bytes_fused: int
    bytes_unfused: int
    reasons: list[str]
    stages: list[str]

    def __str__(self) -> str:
        ratio = self.bytes_unfused / self.bytes_fused if self.bytes_fused else float("nan")
        lines = [
            f"{self.kernels} kernel(s); predicted global traffic {self.bytes_fused} B fused vs "
            f"{self.bytes_unfused} B with one kernel per op ({ratio:.2f}x less)",
            *(f"  kernel {i}: {s}" for i, s in enumerate(self.stages)),
        ]
        if self.reasons:
            lines.append("why more than one kernel:")
            lines += [f"  - {r}" for r in self.reasons]
        lines += ["Tile IR:", *("  " + line for line in self.ir.splitlines())]
        return "\n".join(lines)


@dataclass
class _Program:
    trace: object
    plan: planner.Plan


def _simulated() -> bool:
    return codegen.device.SIMULATED


@functools.cache
def _gpu_present() -> bool:
    if _simulated():
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:
        return False


class FusedFunction:
    """A function of arrays compiled into as few kernels as the data allows."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)
        self._programs: dict = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    # signature and program ----------------------------------------------------------------
    def _classify(self, args):
        """Per-argument descriptors; also the cache key. Errors name the argument."""
        descr = []
        for i, a in enumerate(args):
            name = f"argument {i} of {self.fn.__name__}"
            if isinstance(a, bool | int | float) and not isinstance(a, np.generic):
                descr.append(("scalar", type(a).__name__))
                continue
            if isinstance(a, np.generic) or (isinstance(a, np.ndarray) and a.ndim == 0):
                dtype = np.asarray(a).dtype
                _check_dtype(dtype, name)
                descr.append(("scalar", dtype.str))
                continue
            if not host.is_array(a):
                raise TypeError(
                    f"{name} is a {type(a).__name__}: expected an array (NumPy, CuPy or any "
                    "__cuda_array_interface__ object) or a scalar"
                )
            shape, strides, dtype = host.array_meta(a)
            _check_dtype(dtype, name)
            if len(shape) == 0:
                descr.append(("scalar", dtype.str))
                continue
            ones = tuple(n == 1 for n in shape)
            contiguous = strides == host.contiguous_strides(shape, dtype.itemsize)
            descr.append(("array", dtype.str, len(shape), ones, contiguous))
        return tuple(descr)

    def _program(self, args, key) -> _Program:
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                self.hits += 1
                return program
            self.misses += 1

            def classify(i, a):
                d = key[i]
                if d[0] == "scalar":
                    return ("scalar", _scalar_value(a))
                shape, _, dtype = host.array_meta(a)
                return ("array", dtype, shape)

            traced = trace(self.fn, args, classify)
            program = _Program(traced, planner.plan(traced))
            self._programs[key] = program
            return program

    def cache_info(self) -> dict:
        """Program-cache hits and misses of this function, and the shared kernel cache's."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "kernel_hits": kernel_cache.hits,
            "kernel_misses": kernel_cache.misses,
        }

    # execution ----------------------------------------------------------------------------
    def _prepare(self, args):
        key = self._classify(args) + (("sim" if _simulated() else "cuda"),)
        program = self._program(args, key)
        input_shapes = {}
        for i, a in enumerate(args):
            if key[i][0] == "array":
                input_shapes[i] = host.array_meta(a)[0]
        shapes = planner.propagate_shapes(program.trace.nodes, input_shapes)
        for k, node in enumerate(program.trace.outputs):
            input_shapes[("out", k)] = shapes[node.key]
        for stage in program.plan.stages:  # temps get their shapes from the stage writing them
            planner.propagate_shapes(stage.nodes, input_shapes, shapes)
            for node, dest in stage.outputs:
                input_shapes[dest] = shapes[node.key]
        return key, program, shapes

    def explain(self, *args) -> Explain:
        """The plan for these arguments: kernels, IR, generated source, predicted traffic."""
        _, program, shapes = self._prepare(args)
        arrays = _placeholder_arrays(program, shapes)
        sources, stages, fused = [], [], 0
        for stage in program.plan.stages:
            leaves, outs = _stage_arrays(stage, arrays, args)
            layout = host.Layout(stage, host.stage_index_shape(stage, shapes), leaves, outs)
            variant = layout.variant()
            gen = kernel_cache.get(stage, variant)
            blocks, _ = layout.launch_config(variant)
            fused += host.predicted_bytes(stage, variant, layout, blocks)
            sources.append(gen.source)
            stages.append(f"{gen.name}: {_describe(stage, variant, layout)}")
        return Explain(
            kernels=len(program.plan.stages),
            ir=ir.format_ir(program.trace.outputs),
            source="\n\n".join(sources),
            bytes_fused=fused,
            bytes_unfused=host.unfused_bytes(program.trace, shapes),
            reasons=list(program.plan.reasons),
            stages=stages,
        )

    def inspect(self, *args, arch: str = "sm_90") -> list:
        """Compile the kernels of this call offline (no GPU needed) for ``arch``.

        Returns one :class:`tessera_tile.inspect.CompileReport` per kernel, in launch order.
        """
        from numba import typeof

        from .. import inspect as offline

        _, program, shapes = self._prepare(args)
        arrays = _placeholder_arrays(program, shapes)
        reports = []
        for stage in program.plan.stages:
            gen, _, threads, params, _ = _kernel_call(stage, arrays, args, shapes, program)
            block = int(np.prod(threads))
            signature = tuple(typeof(p) for p in params)
            reports.append(offline.compile(gen.kernel, signature, arch=arch, block=block))
        return reports

    def __call__(self, *args, out=None):
        if not _simulated() and not _gpu_present():
            raise RuntimeError(
                "no CUDA GPU found: set NUMBA_ENABLE_CUDASIM=1 (before Python starts) to run "
                "fused functions in tessera_tile's simulator"
            )
        key, program, shapes = self._prepare(args)
        on_device = not _simulated() and any(host.is_device_array(a) for a in args)
        if not _simulated():
            _check_one_side(self.fn.__name__, args)
        outputs = _outputs(program, shapes, out, args, self.fn.__name__)
        temps = {
            tid: np.empty(shapes[node.key], node.dtype) for tid, node in program.plan.temps.items()
        }
        run_args = list(args)
        if not _simulated():
            run_args, outputs, temps, copy_back = _to_device(run_args, outputs, temps, on_device)
        arrays = {("out", k): o for k, o in enumerate(outputs)}
        arrays.update({("temp", t): a for t, a in temps.items()})
        for stage in program.plan.stages:
            _launch(stage, arrays, run_args, shapes, program)
        if not _simulated():
            outputs = copy_back(outputs, out)
        results = tuple(outputs)
        return results[0] if program.trace.single else results


def fuse(fn) -> FusedFunction:
    """Decorator: compile ``fn``'s elementwise and reduction ops into fused kernels."""
    if not callable(fn):
        raise TypeError(f"fuse expects a function, got {type(fn).__name__}")
    return FusedFunction(fn)


# --------------------------------------------------------------------------------------------
# helpers


def _check_one_side(name: str, args) -> None:
    """On a GPU, arrays must all be on the host or all on the device."""
    arrays_at = [i for i, a in enumerate(args) if host.is_array(a) and host.array_meta(a)[0]]
    on_host = [i for i in arrays_at if isinstance(args[i], np.ndarray)]
    if on_host and len(on_host) < len(arrays_at):
        device = next(i for i in arrays_at if i not in on_host)
        raise TypeError(
            f"{name}: argument {on_host[0]} is a host (NumPy) array and argument {device} a "
            "device array; move them to one side first"
        )


def _check_dtype(dtype, name) -> None:
    if np.dtype(dtype) not in ir.SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} has dtype {dtype}, which tessera_tile does not support (supported: "
            f"{', '.join(map(str, ir.SUPPORTED_DTYPES))})"
        )


def _scalar_value(a):
    if isinstance(a, bool | int | float) and not isinstance(a, np.generic):
        return a
    return np.asarray(a)[()]  # a NumPy scalar: strong dtype


def _outputs(program, shapes, out, args, name):
    nodes = program.trace.outputs
    if out is None:
        return [np.empty(shapes[n.key], n.dtype) for n in nodes]
    outs = (out,) if not isinstance(out, tuple) else out
    if len(outs) != len(nodes):
        raise ValueError(f"{name} has {len(nodes)} result(s); out= has {len(outs)} array(s)")
    for k, (o, n) in enumerate(zip(outs, nodes, strict=True)):
        if not host.is_array(o):
            raise TypeError(f"out[{k}] is a {type(o).__name__}, not an array")
        shape, _, dtype = host.array_meta(o)
        if tuple(shape) != tuple(shapes[n.key]) or np.dtype(dtype) != n.dtype:
            raise ValueError(
                f"out[{k}] has shape {tuple(shape)} and dtype {dtype}; the result has shape "
                f"{tuple(shapes[n.key])} and dtype {n.dtype}"
            )
        if isinstance(o, np.ndarray) and not o.flags.writeable:
            raise ValueError(f"out[{k}] is read-only")
        for i, a in enumerate(args):
            if host.is_array(a) and _overlap(o, a):
                raise ValueError(f"out[{k}] overlaps argument {i}: inputs are never modified")
    return list(outs)


def _overlap(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    if isinstance(a, np.ndarray) != isinstance(b, np.ndarray):
        return False
    lo_a, hi_a = _extent(a)
    lo_b, hi_b = _extent(b)
    return lo_a < hi_b and lo_b < hi_a


def _extent(a):
    cai = a.__cuda_array_interface__
    shape, strides, dtype = host.array_meta(a)
    ptr = cai["data"][0]
    lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    return lo, hi + dtype.itemsize


def _stage_arrays(stage, arrays, args):
    leaves = [arrays[n.arg] if isinstance(n.arg, tuple) else args[n.arg] for n in stage.leaves]
    outs = [arrays[dest] for _, dest in stage.outputs]
    return leaves, outs


def _placeholder_arrays(program, shapes):
    """Zero-stride stand-ins for outputs and temps (explain() allocates nothing real)."""
    arrays = {}
    for k, n in enumerate(program.trace.outputs):
        arrays[("out", k)] = _fake(shapes[n.key], n.dtype)
    for tid, n in program.plan.temps.items():
        arrays[("temp", tid)] = _fake(shapes[n.key], n.dtype)
    return arrays


def _fake(shape, dtype):
    base = np.zeros(1, dtype)
    strides = host.contiguous_strides(shape, np.dtype(dtype).itemsize)
    return np.lib.stride_tricks.as_strided(base, shape, strides)


def _scalar_params(scalars, args, program, shapes):
    counts = planner.count_values(program.trace, shapes)
    values = []
    for n in scalars:
        if n.op is ir.Op.COUNT:
            values.append(counts[n.arg])
        else:
            values.append(_scalar_value(args[n.arg]))
    return values


def _kernel_call(stage, arrays, args, shapes, program):
    """(generated kernel, blocks, threads, parameters) of one stage for these arrays."""
    leaves, outs = _stage_arrays(stage, arrays, args)
    layout = host.Layout(stage, host.stage_index_shape(stage, shapes), leaves, outs)
    variant = layout.variant()
    gen = kernel_cache.get(stage, variant)
    blocks, threads = layout.launch_config(variant)
    params = list(layout.views)
    if variant.kind == "full":
        for r in stage.reductions:
            params.append(_zeros(blocks, codegen.acc_dtype(r), leaves))
            if r.op in ir.INDEX_REDUCE:
                params.append(_zeros(blocks, np.int64, leaves))
        params.append(_zeros(1, np.int32, leaves))
    params += _scalar_params(stage.scalars, args, program, shapes)
    params += layout.sizes()
    empty = layout.n_kept == 0 or (stage.kind == "elementwise" and layout.n_red == 0)
    return gen, blocks, threads, params, empty


def _launch(stage, arrays, args, shapes, program) -> None:
    gen, blocks, threads, params, empty = _kernel_call(stage, arrays, args, shapes, program)
    if empty:
        return
    if os.environ.get("TESSERA_TILE_DUMP"):
        print(f"launch {gen.name}[{blocks}, {threads}]")
    with np.errstate(all="ignore"):
        gen.kernel[blocks, threads](*params)


def _zeros(n, dtype, like):
    if _simulated() or not any(host.is_device_array(a) for a in like):
        return np.zeros(n, dtype)
    from numba import cuda

    return cuda.to_device(np.zeros(n, dtype))


def _to_device(args, outputs, temps, on_device):
    """Move NumPy inputs to the GPU; returns a function that brings results back."""
    from numba import cuda

    dev_args = [
        cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) and a.ndim else a
        for a in args
    ]
    dev_args = [host._as_numba(a) if host.is_device_array(a) else a for a in dev_args]
    dev_outs = [cuda.to_device(o) if isinstance(o, np.ndarray) else host._as_numba(o)
                for o in outputs]  # fmt: skip
    dev_temps = {t: cuda.to_device(a) for t, a in temps.items()}

    originals = list(outputs)

    def copy_back(device_outputs, out):
        if on_device:
            if out is not None:
                return originals
            try:
                import cupy

                return [cupy.asarray(o) for o in device_outputs]
            except ImportError:
                return device_outputs
        return [d.copy_to_host(o) for d, o in zip(device_outputs, originals, strict=True)]

    return dev_args, dev_outs, dev_temps, copy_back


def _describe(stage, variant, layout) -> str:
    what = {
        "elementwise": "elementwise, grid-stride",
        "row": f"rows reduced by a {variant.mode}"
        + (", row kept on chip between passes" if variant.cache else ""),
        "column": "coalesced column reduction",
        "full": "full reduction, two-stage in one launch",
    }[stage.kind]
    passes = codegen.plan_passes(stage, codegen.uses_online(variant))
    passes = len(passes) if stage.kind != "elementwise" else 1
    return (
        f"{what}; {layout.n_kept} x {layout.n_red} index space, {passes} pass(es), "
        f"{len(stage.outputs)} output(s)"
    )
