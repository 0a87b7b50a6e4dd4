"""A call of hand-written kernels, below the composer: the validated call (:class:`HandWritten`:
run, keep, explain, inspect) and the checks that name a bad argument before any launch. The
kernel families' plans (``matmul_plan``, ``attention_plan``...) build on it, and the composer's
GEMM and attention stages reach those plans by plain imports."""

from __future__ import annotations

import inspect as _pyinspect
import math
import numbers
import operator
from dataclasses import dataclass, field

import numpy as np

from .. import inspect as offline
from .._runtime import arrays, launch
from .._runtime.explain import Explain
from ..tile_ir import BFLOAT16, storage_dtype

FLOATS = tuple(np.dtype(d) for d in ("float16", "float32", "float64"))  # hand-written kernels
COMPOSED_FLOATS = (*FLOATS, BFLOAT16)  # the composer's fused definitions take bfloat16 too


@dataclass(frozen=True)
class Ready:
    """A kept call: ``run(args, stream)`` on the arguments of a call with the same key.
    ``tuner``: the tuner whose choice its launches hold (None: none), valid while that tuner's
    ``generation`` is ``generation`` (clearing the tuner drops the choice)."""

    run: object
    tuner: object = None
    generation: int = 0

    def current(self) -> bool:
        """Whether the choice of its tuner (one it has) still stands."""
        return self.tuner.generation == self.generation


def argument_positions(records, op_args: tuple) -> list[int] | None:
    """Where each record's array is among the op's arguments (by identity); None when one is
    not an argument (a record the op made)."""
    found = []
    for rec in records:
        at = [i for i, v in enumerate(op_args) if v is rec.value]
        if not at:
            return None
        found.append(at[0])
    return found


@dataclass
class Report:
    """What ``explain`` and ``inspect`` say of a hand-written call. ``then``: fused calls that
    follow the kernels, as ``(fused function, stand-in arguments)``."""

    name: str  # the call's kernels, for "hand-written <name>"
    launches: list  # KernelLaunch of each distinct kernel and signature, in launch order
    stages: list
    bytes_fused: int
    bytes_unfused: int
    reasons: list = field(default_factory=list)
    then: list = field(default_factory=list)


class HandWritten:
    """A validated call of hand-written kernels: what such an op's plan function returns.

    A subclass names its arrays (:meth:`inputs`) and result (``out_shape``, ``dtype``), makes
    its launches (:meth:`launches`, on the device records of its inputs and result) and its
    report (:meth:`report`); running, keeping the call (:meth:`ready`), ``explain`` and
    ``inspect`` are written here once. A call that does more than launch kernels (temporaries,
    a fused step) overrides :meth:`execute`, and is not kept (:attr:`keepable`).
    """

    out_shape: tuple
    dtype: np.dtype
    contiguous_out = False  # whether out= must be C-contiguous
    tuner = None  # the tuner whose choice the launches hold, if any
    kept = None  # the launches of the call's run (execute), for ready()

    def inputs(self) -> dict:
        raise NotImplementedError

    def launches(self, records: list, result: arrays.Arg) -> list:
        raise NotImplementedError

    def report(self) -> Report:
        raise NotImplementedError

    def label(self) -> launch.Label:
        """What a profile records of this call's kernels: their names and the figures
        ``explain`` gives."""
        r = self.report()
        names = " + ".join(dict.fromkeys(k.kernel.py_func.__name__ for k in r.launches))
        return launch.Label(names or r.name, r.bytes_fused, self.flops())

    def flops(self) -> int:
        """FLOPs the call's kernels compute (0 where they only move data); ops that count
        theirs override this."""
        return 0

    def execute(self, place: arrays.Placement, records: list, result: arrays.Arg) -> None:
        """Launch through a :class:`launch.Kept`, which :meth:`ready` keeps: its first run
        finds the compiled kernels, so a later call on the same layouts launches directly."""
        self.kept = launch.Kept(self.launches(records, result))
        self.kept.run([*records, result], place.stream, self.label)

    def checked_out(self, out) -> arrays.Arg | None:
        """The record of ``out=``, checked against the call (:func:`check_out`)."""
        return check_out(out, self.out_shape, self.dtype, self.inputs())

    def run(self, out, stream):
        """Launch into ``out`` (None: a new array), which must have the result's dtype:
        the op object casts a result into an ``out=`` of another dtype."""
        inputs = self.inputs()
        o = check_out(out, self.out_shape, self.dtype, inputs)
        if o is not None and o.dtype != self.dtype:
            raise TypeError(f"out has dtype {o.dtype}; this call writes {self.dtype}")
        if o is not None and o.size:
            if any(n > 1 and s == 0 for n, s in zip(o.shape, o.strides, strict=True)):
                raise ValueError("out repeats memory (a stride of 0): its copies would race")
            if self.contiguous_out and not o.contiguous:
                raise ValueError("out must be C-contiguous: this op writes C-contiguous results")
        place = arrays.Placement(list(inputs.values()), [o], stream)
        result = place.result(self.out_shape, self.dtype, o)
        self.execute(place, [place.device(r) for r in inputs.values()], result)
        return place.finish(result.value, o)

    @property
    def keepable(self) -> bool:
        """Whether the call only launches its kernels (so later calls may run them kept)."""
        return type(self).execute is HandWritten.execute

    def ready(self, op_args: tuple) -> Ready | None:
        """This call's launches, kept for later calls on arrays of the same layouts."""
        if not self.keepable or self.kept is None:
            return None
        records = list(self.inputs().values())
        positions = argument_positions(records, op_args)
        if positions is None:
            return None
        kept = self.kept
        shape, dtype = self.out_shape, self.dtype
        label = self.label()  # made now: the kept call must not hold this call's arrays
        family, interfaces = arrays.result_family(records), arrays.interface_positions(records)

        def run(args, stream):
            taken = [args[i] for i in positions]
            place = arrays.Placement.kept(stream, family, taken, interfaces)
            result = place.result(shape, dtype)
            kept.run([*taken, result], place.stream, lambda: label)
            return result.value

        tuner = self.tuner
        return Ready(run, tuner, tuner.generation if tuner is not None else 0)

    def explain(self) -> Explain:
        r = self.report()
        sources = list(dict.fromkeys(source_of(k.kernel) for k in r.launches))
        stages, fused, kernels = list(r.stages), r.bytes_fused, len(r.launches)
        for fn, args in r.then:
            ex = fn.explain(*args)
            stages += ex.stages
            sources.append(ex.source)
            fused += ex.bytes_fused
            kernels += ex.kernels
        return Explain(
            kernels=kernels,
            ir=f"hand-written {r.name} (no Tile IR)",
            source="\n\n".join(sources),
            bytes_fused=fused,
            bytes_unfused=r.bytes_unfused,
            reasons=list(r.reasons),
            stages=stages,
        )

    def inspect(self, arch: str) -> list:
        r = self.report()
        reports = [
            offline.compile(
                k.kernel, k.signature, arch, block=_threads(k.threads), dynamic_shared=k.shared
            )
            for k in r.launches
        ]
        for fn, args in r.then:
            reports += fn.inspect(*args, arch=arch)
        return reports


def _threads(threads) -> int:
    return math.prod(threads) if isinstance(threads, tuple) else threads


def view_dtype(dtype) -> np.dtype | None:
    """The dtype a kernel views an array of ``dtype`` as where it differs (bfloat16: its
    ``uint16`` bits); None where the array is passed as it is."""
    kind = storage_dtype(dtype)
    return None if kind == dtype else kind


def device_like(rec: arrays.Arg) -> arrays.Arg:
    """A record as the kernels will see it: a host array's device copy is C-contiguous and
    aligned as device allocations."""
    if rec.kind == arrays.DEVICE:
        return rec
    return arrays.placeholder(rec.shape, rec.dtype)


def distinct(launches) -> list:
    """The launches of distinct (kernel, signature), in order: what a report lists."""
    seen, out = set(), []
    for one in launches:
        key = (one.kernel, str(one.signature))
        if key not in seen:
            seen.add(key)
            out.append(one)
    return out


# --------------------------------------------------------------------------------------------
# validation (before any launch; every message names the argument)


def array_arg(value, name: str, dtypes, what: str) -> arrays.Arg:
    a = arrays.read(value, name, scalars=False)
    if a.dtype not in dtypes:
        raise TypeError(
            f"{name} has dtype {a.dtype}; {what} takes {', '.join(str(d) for d in dtypes)}"
        )
    return a


def axis_index(axis, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name} {axis} is out of range for an array of {ndim} dimension(s)")
    return axis % ndim


def eps_value(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return float(eps)


# --------------------------------------------------------------------------------------------
# checks and types the hand-written ops share


def check_out(out, shape, dtype, inputs: dict[str, arrays.Arg]) -> arrays.Arg | None:
    """The record of ``out=`` of a hand-written op, checked against the result (its dtype one
    the result casts to under NumPy's ``same_kind`` rule, as for fused functions); and every
    array of the call (``inputs``: name -> record, and ``out``) on one side, host or device:
    TypeError naming two of them otherwise. Every hand-written op calls this before it
    places or launches anything (the fused functions check the same in their runtime)."""
    o = None if out is None else arrays.read(out, "out", scalars=False)
    named = inputs if o is None else {**inputs, "out": o}
    arrays.check_one_side(list(named.values()), list(named))
    if o is not None:
        arrays.check_cast(np.dtype(dtype), o.dtype, "into out")
        arrays.check_out(o, "out", shape, o.dtype, inputs)
    return o


def numba_type(rec: arrays.Arg):
    """The numba type a kernel sees for this array (host arrays arrive as contiguous copies)."""
    from numba import from_dtype, types

    contiguous = rec.contiguous or rec.kind != arrays.DEVICE
    return types.Array(from_dtype(rec.dtype), len(rec.shape), "C" if contiguous else "A")


def source_of(kernel) -> str:
    return _pyinspect.getsource(kernel.py_func)
