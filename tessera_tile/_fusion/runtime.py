"""Running fused calls: arguments read once, views, allocation, launch.

A :class:`Call` reads every argument once (:func:`tessera_tile._runtime.arrays.read`). Host
inputs are copied to the device (contiguously, as numba requires); device inputs are used where
they are.
Every stage sees each array as a strided view in the stage's canonical order (kept axes, then
reduced axes), with broadcast axes given stride 0, and adjacent axes merged wherever every array
allows it: contiguous arrays end up 1-D (elementwise) or 2-D (reductions), anything else keeps
the axes it needs; nothing is copied to make it contiguous.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import profiling
from .. import tile_ir as ir
from .._runtime import arrays, launch, target
from .._runtime import config as _config
from .._runtime.arrays import DEVICE, Arg
from .._runtime.memo import MAX_LAUNCH_PLANS, CountingCache
from . import plan as planner
from . import schedule
from .compile import Generated, KernelCache
from .plan import Plan, Stage, StageKind
from .schedule import Variant
from .trace import Trace


@dataclass
class Program:
    """What a call signature traces and plans to (cached per signature); its launch plans are
    cached per layout of the call's arrays (:func:`launch_plan`)."""

    trace: Trace
    plan: Plan

    @functools.cached_property
    def launch_plans(self) -> CountingCache:
        return CountingCache(bound=MAX_LAUNCH_PLANS)

    @functools.cached_property
    def host_results(self) -> tuple[int, ...]:
        """Positions of the results that depend on no array: computed on the host."""
        return tuple(k for k, n in enumerate(self.trace.outputs) if ir.on_host(n))

    @functools.cached_property
    def host_exponents(self) -> list[ir.Node]:
        """Exponents of integer powers that are known on the host (constants and scalar
        arguments): a call checks them, as NumPy refuses negative ones. A kernel cannot
        raise: a negative element of an array exponent gives 0 (docs/fusion.md)."""
        return [
            n.srcs[1]
            for n in self.trace.nodes
            if n.op is ir.Op.POW and n.dtype.kind in "iu" and ir.on_host(n.srcs[1])
        ]

    @functools.cached_property
    def exponent_inputs(self) -> tuple[int, ...]:
        """Positions of the array arguments that are exponents of integer powers: a call
        checks those it holds on the host, as NumPy does; on the device it cannot look
        without a copy, and a negative element gives 0 (docs/fusion.md)."""
        return tuple(
            n.srcs[1].arg
            for n in self.trace.nodes
            if n.op is ir.Op.POW and n.dtype.kind in "iu" and n.srcs[1].op is ir.Op.INPUT
        )


# --------------------------------------------------------------------------------------------
# arguments


class Call:
    """One call of a fused function: its arguments, read once.

    ``args`` holds the values bound to the function's parameters, the last ``len(keywords)``
    of them passed by these names."""

    def __init__(self, fn_name: str, args: tuple, out=None, keywords: tuple[str, ...] = ()):
        positional = len(args) - len(keywords)
        names = [f"argument {i} of {fn_name}" for i in range(positional)]
        names += [f"argument {k!r} of {fn_name}" for k in keywords]
        self.args = [arrays.read(a, n) for a, n in zip(args, names, strict=True)]
        for a, name in zip(self.args, names, strict=True):
            if a.dtype is not None and a.dtype not in ir.SUPPORTED_DTYPES:
                raise TypeError(
                    f"{name} has dtype {a.dtype}, which tessera_tile does not support "
                    f"(supported: {', '.join(map(str, ir.SUPPORTED_DTYPES))})"
                )
        self.keywords = tuple(keywords)
        self.out: list[Arg] | None = None
        self.out_names: list[str] = []
        signature = tuple(_signature(a) for a in self.args) + (_config.TARGET,)
        if keywords:
            signature += (("keywords", self.keywords),)
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            self.out_names = [f"out[{k}]" for k in range(len(outs))] if out is outs else ["out"]
            self.out = [
                arrays.read(o, n, scalars=False) for o, n in zip(outs, self.out_names, strict=True)
            ]
            names += self.out_names
            # results are cast into out's dtypes in the kernels: part of the program's key
            signature += (("out", tuple(o.dtype.str for o in self.out)),)
        arrays.check_one_side(self.args + (self.out or []), names)
        self.signature = signature

    def stand_ins(self) -> list:
        return [
            ("array", a.dtype, a.shape) if a.is_array else ("scalar", a.value) for a in self.args
        ]

    def scalars(self) -> dict[int, object]:
        """The values of the scalar arguments, by position."""
        return {i: a.value for i, a in enumerate(self.args) if not a.is_array}

    def shapes(self, program: Program) -> dict:
        """Shapes, by node key, of every node of every stage for this call."""
        known = {i: a.shape for i, a in enumerate(self.args) if a.is_array}
        shapes = planner.propagate_shapes(program.trace.nodes, known)
        # a mean's count may come from a value the program never computes (in a gradient)
        counted = [source for source, _ in program.trace.counts.values()]
        planner.propagate_shapes(ir.walk(counted), known, shapes)
        for k, node in enumerate(program.trace.outputs):
            known[("out", k)] = shapes[node.key]
        for stage in program.plan.stages:  # temps get their shapes from the stage writing them
            planner.propagate_shapes(stage.nodes, known, shapes)
            for node, dest in stage.outputs:
                known[dest] = shapes[node.key]
        return shapes


def _signature(a: Arg) -> tuple:
    """The part of the program-cache key one argument contributes."""
    if not a.is_array:
        return ("scalar", a.dtype.str if a.dtype is not None else type(a.value).__name__)
    ones = tuple(n == 1 for n in a.shape)
    return ("array", a.dtype.str, len(a.shape), ones, a.contiguous)


def check_out(program: Program, shapes: dict, call: Call) -> None:
    """``out=`` must match the results and may not be read-only or overlap an input."""
    nodes = program.trace.outputs
    if call.out is None:
        return
    if len(call.out) != len(nodes):
        raise ValueError(f"the function has {len(nodes)} result(s); out= has {len(call.out)}")
    inputs = {f"argument {i}": a for i, a in enumerate(call.args)}
    for o, n, name in zip(call.out, nodes, call.out_names, strict=True):
        arrays.check_out(o, name, shapes[n.key], n.dtype, inputs)


def check_exponents(program: Program, call: Call) -> None:
    """NumPy's ValueError for an integer power whose exponent, known on the host (a constant,
    a scalar argument, or an array argument held there), is negative."""
    scalars = call.scalars()
    negative = any(ir.evaluate(exponent, scalars) < 0 for exponent in program.host_exponents)
    for position in program.exponent_inputs:
        arg = call.args[position]
        negative |= arg.kind == arrays.HOST and bool(np.any(np.asarray(arg.value) < 0))
    if negative:
        raise ValueError("Integers to negative integer powers are not allowed.")


# --------------------------------------------------------------------------------------------
# geometry


def _in_f(shape, strides, f_shape):
    """Shape/strides of an array broadcast to F (right-aligned, stride 0 where broadcast)."""
    pad = len(f_shape) - len(shape)
    out = []
    for d, n in enumerate(f_shape):
        if d < pad:
            out.append(0)
        else:
            m, st = shape[d - pad], strides[d - pad]
            out.append(0 if m == 1 and n != 1 else st)
    return out


def _row_strides(shape, strides, f_shape, axes):
    """Strides over F of a row-space array (reduced shape, keepdims or not)."""
    if len(shape) == len(f_shape):
        return [0 if d in axes else strides[d] for d in range(len(f_shape))]
    it = iter(range(len(shape)))
    return [0 if d in axes else strides[next(it)] for d in range(len(f_shape))]


def _collapse(dims: list[int], sizes, stride_sets) -> list[list[int]]:
    """Groups of adjacent dims (of ``dims``) that every array can index as one."""
    dims = [d for d in dims if sizes[d] != 1]
    groups: list[list[int]] = []
    for d in dims:
        if groups:
            outer = groups[-1][-1]
            if all(st[outer] == st[d] * sizes[d] for st in stride_sets):
                groups[-1].append(d)
                continue
        groups.append([d])
    return groups


class Layout:
    """The geometry of every array of one stage: collapsed index space and view specs."""

    def __init__(self, stage: Stage, f_shape, leaves: list[Arg], outputs: list[Arg]):
        """``leaves``: records in ``stage.leaves`` order; ``outputs``: in stage order."""
        self.stage = stage
        axes = set(stage.axes)
        ndim = len(f_shape)
        kept = [d for d in range(ndim) if d not in axes]
        red = [d for d in range(ndim) if d in axes]
        entries = []  # (record, f-strides, is_row)
        for a in leaves:
            entries.append((a, _in_f(a.shape, a.strides, f_shape), False))
        for (node, _), a in zip(stage.outputs, outputs, strict=True):
            if stage.space[id(node)] == "row":
                entries.append((a, _row_strides(a.shape, a.strides, f_shape, axes), True))
            else:
                entries.append((a, _in_f(a.shape, a.strides, f_shape), False))
        kept_groups = _collapse(kept, f_shape, [e[1] for e in entries])
        red_groups = _collapse(red, f_shape, [e[1] for e in entries if not e[2]])
        self.kept_sizes = [int(np.prod([f_shape[d] for d in g])) for g in kept_groups]
        self.red_sizes = [int(np.prod([f_shape[d] for d in g])) for g in red_groups]
        self.n_kept = int(np.prod(self.kept_sizes, dtype=np.int64)) if kept else 1
        self.n_red = int(np.prod(self.red_sizes, dtype=np.int64)) if red else 1
        if not [d for d in kept if f_shape[d] == 0] and kept and not kept_groups:
            kept_groups, self.kept_sizes = [[kept[0]]], [1]
        if red and not red_groups:
            red_groups, self.red_sizes = [[red[0]]], [1]
        if stage.kind is StageKind.ELEMENTWISE and not kept_groups:
            kept_groups, self.kept_sizes = [[-1]], [int(np.prod(f_shape, dtype=np.int64))]
        if stage.kind is StageKind.FULL:
            kept_groups, self.kept_sizes = [], []

        def spec(a: Arg, fstrides, is_row):
            groups = kept_groups if is_row else kept_groups + red_groups
            sizes = self.kept_sizes if is_row else self.kept_sizes + self.red_sizes
            strides = [fstrides[g[-1]] if g[-1] >= 0 else 0 for g in groups]
            if not groups:  # a full reduction's one-element output
                return (1,), (0,), ir.storage_dtype(a.dtype), a.address, is_row
            return tuple(sizes), tuple(strides), ir.storage_dtype(a.dtype), a.address, is_row

        # (shape, strides, dtype, address, is_row) of each array's view, leaves then outputs
        self.views = [spec(*e) for e in entries]
        self.kept_rank = len(kept_groups)
        self.red_rank = len(red_groups)

    def sizes(self) -> list[int]:
        return [*self.kept_sizes, *self.red_sizes]

    def as_rows(self, positions: tuple) -> None:
        """The leaves at ``positions`` (row-invariant: stride 0 over the kept axes, one reduced
        axis) become 1-D views of their one row."""
        for i in positions:
            shape, strides, *rest = self.views[i]
            self.views[i] = (shape[-1:], strides[-1:], *rest)

    def columns_last(self) -> None:
        """Views over (reduced axes, kept axes): a split column kernel loads 16 bytes along
        the innermost kept axis, which a vector access needs last."""
        k = self.kept_rank
        for i, (shape, strides, dtype, address, is_row) in enumerate(self.views):
            if not is_row:
                self.views[i] = (
                    shape[k:] + shape[:k],
                    strides[k:] + strides[:k],
                    dtype,
                    address,
                    is_row,
                )


# --------------------------------------------------------------------------------------------
# binding stages to one call's arrays


def stage_index_shape(stage: Stage, shapes: dict) -> tuple[int, ...]:
    """F for this call."""
    for r in stage.reductions:  # every reduction of a stage runs over F
        return shapes[r.srcs[0].key]
    for n, _ in stage.outputs:
        if stage.space[id(n)] == "F":
            return shapes[n.key]
    return ()


@dataclass
class Bound:
    """One stage with this call's arrays: geometry, the kernel and its launch configuration."""

    stage: Stage
    layout: Layout
    variant: Variant
    generated: Generated
    blocks: int
    threads: object

    @property
    def empty(self) -> bool:
        lay = self.layout
        return lay.n_kept == 0 or (self.stage.kind is StageKind.ELEMENTWISE and lay.n_red == 0)

    def predicted_bytes(self) -> int:
        lay = self.layout
        return schedule.predicted_bytes(self.generated.schedule, lay.n_kept, lay.n_red, self.blocks)


def bind(
    stage: Stage, records: dict, shapes: dict, cache: KernelCache, math: str = "fast",
    precision: str | None = None,
) -> Bound:  # fmt: skip
    """``records`` maps a leaf's ``arg`` (position, ``("temp", k)``, ``("out", k)``) to its
    record on the device; ``math`` is ``"fast"`` or ``"ieee"``, ``precision`` a GEMM stage's
    (see ``tt.fuse``). A GEMM or attention stage binds to its kernel family's plan
    (:mod:`.stages`, imported when first needed: it loads the matmul and attention plans)."""
    if stage.kind.hand_written:
        from . import stages

        return stages.bind(stage, records, math, precision)
    leaves = [records[n.arg] for n in stage.leaves]
    outs = [records[dest] for _, dest in stage.outputs]
    layout = Layout(stage, stage_index_shape(stage, shapes), leaves, outs)
    variant = schedule.choose_variant(stage, layout, math)
    layout.as_rows(variant.invariant)
    if variant.mode == "split":
        layout.columns_last()
    generated = cache.kernel(stage, variant)
    blocks, threads = schedule.launch_config(variant, layout.n_kept, layout.n_red)
    return Bound(stage, layout, variant, generated, blocks, threads)


def planned_records(program: Program, call: Call, shapes: dict) -> dict:
    """Records as a call would have them on the device, without allocating anything: host
    inputs as their contiguous copies, results and temporaries as fresh arrays."""
    records: dict = {}
    for i, a in enumerate(call.args):
        if a.is_array:
            records[i] = a if a.kind == DEVICE else arrays.placeholder(a.shape, a.dtype)
    for k, n in enumerate(program.trace.outputs):
        records[("out", k)] = arrays.placeholder(shapes[n.key], n.dtype)
    for tid, n in program.plan.temps.items():
        records[("temp", tid)] = arrays.placeholder(shapes[n.key], n.dtype)
    return records


# --------------------------------------------------------------------------------------------
# execution


@dataclass(frozen=True)
class StageLaunch:
    """One stage of a launch plan: everything its launch needs but this call's memory."""

    bound: Bound
    # per array parameter: its record key (position, ("out", k), ("temp", k)) and the
    # (shape, strides, offset, dtype) of its view, or None where the array is passed as it is
    arrays: tuple
    scalars: tuple  # per scalar parameter, then each size: (True, position) or (False, value)
    scratch: tuple  # a full stage's ("partial" or "ticket", dtype): partials per block, ticket
    flops: int
    kept: launch.Kept  # the launch itself: its parameters from the views above, kept

    def label(self) -> launch.Label:
        """What a profile records of the stage's launch."""
        return launch.Label(self.bound.generated.name, self.bound.predicted_bytes(), self.flops)


@dataclass(frozen=True)
class LaunchPlan:
    """What a call does, for one layout of its arrays: shapes, results, temporaries, and each
    stage's kernel, launch configuration and views. Made once (:func:`launch_plan`); a later
    call with the same layout looks it up, allocates, makes views and launches."""

    shapes: dict
    on_device: tuple  # positions of the results computed by kernels
    results: tuple  # (shape, dtype) of each of them
    temps: tuple  # (id, shape, dtype) of each temporary
    launches: tuple[StageLaunch, ...]

    def run(self, inputs: list, place: arrays.Placement, outs) -> list:
        """Launch every stage. ``inputs``: per argument, its numba device array or record
        (``arrays.Arg``: made into a numba array only if numba-cuda launches it), or its scalar
        value; ``outs``: per result, its device ``out=`` record or None. Returns the device
        array of each result computed here (``on_device`` order), of the call's family."""
        handles = dict(enumerate(inputs))
        results = []
        for k, (shape, dtype) in zip(self.on_device, self.results, strict=True):
            out = outs[k]
            if out is not None and out.kind == DEVICE:
                results.append(out.value)
                handles[("out", k)] = out
            elif place.family == "numba":
                results.append(place.new(shape, dtype))
                handles[("out", k)] = results[-1]
            else:
                rec = place.result(shape, dtype)
                results.append(rec.value)
                handles[("out", k)] = rec
        for tid, shape, dtype in self.temps:
            handles[("temp", tid)] = place.new(shape, dtype, "numba")
        for stage in self.launches:
            _launch(stage, handles, place)
        return results


def layout_key(call: Call) -> tuple:
    """What a launch plan depends on beyond the program: each array's ``Arg.layout()``."""

    def of(a: Arg | None):
        return a.layout() if a is not None and a.is_array else None

    return (tuple(of(a) for a in call.args), tuple(of(o) for o in call.out or ()))


def launch_plan(
    program: Program, call: Call, cache: KernelCache, math: str, precision: str | None = None
) -> LaunchPlan:
    """The call's launch plan, made at the first call with this layout."""
    key = (layout_key(call), math, precision, target.current())  # the stages' kernels
    return program.launch_plans.get(key, lambda: _make_plan(program, call, cache, math, precision))


def _make_plan(
    program: Program, call: Call, cache: KernelCache, math: str, precision: str | None
) -> LaunchPlan:
    shapes = call.shapes(program)
    nodes = program.trace.outputs
    on_device = tuple(k for k in range(len(nodes)) if k not in program.host_results)
    records = planned_records(program, call, shapes)
    for k, o in enumerate(call.out or ()):
        if o.kind == DEVICE:  # the kernels write into a device out= where it is
            records[("out", k)] = o
    counts = planner.count_values(program.trace, shapes)
    launches = []
    for stage in program.plan.stages:
        bound = bind(stage, records, shapes, cache, math, precision)
        if bound.empty:
            continue
        hand = stage.kind.hand_written
        launches.append(bound.launch(records) if hand else _stage_launch(bound, records, counts))
    return LaunchPlan(
        shapes,
        on_device,
        tuple((shapes[nodes[k].key], nodes[k].dtype) for k in on_device),
        tuple((tid, shapes[n.key], n.dtype) for tid, n in program.plan.temps.items()),
        tuple(launches),
    )


def _stage_launch(bound: Bound, records: dict, counts: dict) -> StageLaunch:
    """The launch of one bound stage: its parameters (``schedule.parameters``, in order)
    as the arrays to pass or view, the scratch to allocate and the values to pass."""
    stage, layout = bound.stage, bound.layout
    keys = [n.arg for n in stage.leaves] + [dest for _, dest in stage.outputs]
    views, scratch, scalars = [], [], []
    for p in schedule.parameters(stage, bound.variant):
        if p.role in ("leaf", "out"):
            at = p.index if p.role == "leaf" else len(stage.leaves) + p.index
            key, (shape, strides, dtype, *_) = keys[at], layout.views[at]
            rec = records[key]
            same = (shape, strides, dtype) == (rec.shape, rec.strides, rec.dtype)
            views.append((key, None if same else (shape, strides, 0, dtype)))
        elif p.role in ("partial", "ticket"):
            scratch.append((p.role, p.dtype))
        elif p.role == "scalar":
            n = stage.scalars[p.index]
            scalars.append((False, counts[n.arg]) if n.op is ir.Op.COUNT else (True, n.arg))
        else:  # a collapsed size
            at = p.index if p.role == "kept" else layout.kept_rank + p.index
            scalars.append((False, layout.sizes()[at]))
    flops = profiling.stage_flops(stage, layout.n_kept, layout.n_red)
    params = [launch.View(key) if view is None else launch.View(key, *view) for key, view in views]
    params += [launch.Value(("scratch", k)) for k in range(len(scratch))]
    params += [launch.Value(value) if is_arg else value for is_arg, value in scalars]
    kernel = bound.generated.kernel
    one = launch.KernelLaunch(kernel, bound.blocks, bound.threads, tuple(params), None)
    kept = launch.Kept([one])
    return StageLaunch(bound, tuple(views), tuple(scalars), tuple(scratch), flops, kept)


class KeptCall(NamedTuple):
    """What a kept call needs beyond its launch plan, decided from the first call's records:
    its results' family and where its interface arrays are (``arrays.Placement.kept``)."""

    family: str
    interfaces: tuple

    @classmethod
    def of(cls, call: Call) -> KeptCall:
        return cls(arrays.result_family(call.args), arrays.interface_positions(call.args))


def ready(program: Program, call: Call) -> bool:
    """Whether later calls with this call's key (``arrays.kept_call``) may run the launch plan
    straight from their arguments: every array on the device, no ``out=``, nothing computed
    or checked on the host."""
    return (
        call.out is None
        and not call.keywords
        and not program.host_results
        and not program.host_exponents
        and all(a.kind == DEVICE or not a.is_array for a in call.args)
    )


def run_ready(program: Program, plan: LaunchPlan, kept: KeptCall, args, stream):
    """A call for which :func:`ready` held, from the values ``arrays.kept_call`` gave for its
    arguments (device arrays or their records, and scalars)."""
    place = arrays.Placement.kept(stream, kept.family, args, kept.interfaces)
    inputs = [_runnable(a) for a in args]
    results = plan.run(inputs, place, [None] * len(plan.on_device))
    return program.trace.pack(results)


def _runnable(a):
    """What a launch takes of a kept call's value: a numba array or scalar as it is, any other
    device array as its record (packed without making a numba array of it)."""
    if type(a) is not Arg or (a.kind == DEVICE and a.family != "numba"):
        return a
    return a.value


def execute(program: Program, plan: LaunchPlan, call: Call, stream):
    """Run the call; results are of the arguments' family (NumPy, numba, CuPy), except those
    that depend on no array: NumPy scalars computed on the host, as NumPy gives them."""
    check_out(program, plan.shapes, call)
    if program.host_exponents or program.exponent_inputs:
        check_exponents(program, call)
    nodes = program.trace.outputs
    outs = call.out or [None] * len(nodes)
    results = {}
    if program.host_results:
        scalars = call.scalars()
        for k in program.host_results:
            results[k] = _host_result(ir.evaluate(nodes[k], scalars), outs[k])
    if plan.on_device:
        place = arrays.Placement(call.args, outs, stream)
        inputs = [place.device(a) if a.is_array else a.value for a in call.args]
        on_device = plan.run(inputs, place, outs)
        for k, result in zip(plan.on_device, on_device, strict=True):
            results[k] = place.finish(result, outs[k])
    ordered = [results[k] for k in range(len(nodes))]
    return program.trace.pack(ordered)


def _host_result(value: np.generic, out: Arg | None):
    """A result computed on the host: the NumPy scalar, or ``out`` holding it."""
    if out is None:
        return value
    if out.kind == DEVICE:
        bits = arrays.exportable(np.asarray(value))
        arrays.as_dtype(arrays.device_handle(out), bits.dtype).copy_to_device(bits)
    else:
        out.value[...] = value
    return out.value


def _launch(stage: StageLaunch, handles: dict, place: arrays.Placement) -> None:
    if not isinstance(stage, StageLaunch):  # a GEMM or attention stage's (its runner's)
        stage.run(handles, place)
        return
    bound = stage.bound
    if stage.scratch:  # a stage split across blocks: its partials and tickets
        lay = bound.layout
        partials, tickets = schedule.scratch_lengths(
            bound.variant, lay.n_kept, lay.n_red, bound.blocks
        )
        for k, (role, dtype) in enumerate(stage.scratch):
            handles["scratch", k] = (
                arrays.zeros(tickets, dtype, place.stream)
                if role == "ticket"
                else place.new(partials, dtype, "numba")
            )
    if _config.DUMP:
        print(f"launch {bound.generated.name}[{bound.blocks}, {bound.threads}]")
    stage.kept.run(handles, place.stream, stage.label)
