"""What every prebuilt op shares: the op object (call, ``explain``, ``inspect``), the dispatch
of a call to a fused definition, and the checks that name the bad argument before any launch.
:mod:`tessera_tile.ops` builds its ops from these."""

from __future__ import annotations

import inspect as _pyinspect
import math
import numbers
import operator
from dataclasses import dataclass, field

import numpy as np

from .. import fusion
from .._fusion import runtime
from .._runtime import arrays, launch, target
from ..tile_ir import BFLOAT16, storage_dtype

MAX_READY = 256  # calls an op keeps (by key; bounded)

FLOATS = tuple(np.dtype(d) for d in ("float16", "float32", "float64"))  # hand-written kernels
COMPOSED_FLOATS = (*FLOATS, BFLOAT16)  # the composer's fused definitions take bfloat16 too


# --------------------------------------------------------------------------------------------
# the op object: call, explain, inspect


class PrebuiltOp:
    """A prebuilt op: ``op(*args, out=None, stream=None, **kwargs)``, ``op.explain(...)`` and
    ``op.inspect(..., arch="sm_90")``.

    ``explain`` returns the :class:`tessera_tile.fusion.Explain` report of the call (kernels,
    predicted traffic, source, reasons) and ``inspect`` one offline compile report per kernel
    the call would launch (both for ``arch=`` where given: ``"sm_90"`` plans Hopper's
    warpgroup-MMA kernels); neither allocates nor launches, and NumPy arrays may stand in for
    device arrays (only their shape, dtype and strides are used).

    A call whose arrays are numba device arrays is kept by its key (``runtime.quick_key``:
    each array's layout, each other argument's value): a later call with the same key skips
    validation and planning and runs the kept launches on its own arrays.
    """

    def __init__(self, plan):
        self._plan = plan
        self.__name__ = self.__qualname__ = plan.__name__
        self.__doc__ = plan.__doc__
        self.__module__ = "tessera_tile.ops"
        sig = _pyinspect.signature(plan)
        extra = [
            _pyinspect.Parameter(n, _pyinspect.Parameter.KEYWORD_ONLY, default=None)
            for n in ("out", "stream")
        ]
        self.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
        self._ready: dict = {}  # key -> Ready

    def __call__(self, *args, out=None, stream=None, **kwargs):
        key = _key(args, kwargs) if out is None else None
        if key is not None:
            ready = self._ready.get(key)
            if ready is not None and (ready.tuner is None or ready.current()):
                return ready.run(args, stream)
        if key is None and fusion.on_dask(args, kwargs):
            return self._on_dask(args, kwargs, out, stream)
        plan = self._plan(*args, **kwargs)
        result = plan.run(out, stream)
        if key is not None:
            ready = plan.ready(args)
            if ready is not None:
                if len(self._ready) >= MAX_READY:
                    self._ready.clear()
                self._ready[key] = ready
        return result

    def _on_dask(self, args, kwargs, out, stream):
        """The op on Dask arrays: tessera_tile.dask's, chunk by chunk (a lazy Dask array)."""
        if out is not None or stream is not None:
            raise ValueError(
                f"{self.__name__} on Dask arrays: out= and stream= are not taken (Dask schedules "
                "the chunks and makes the result)"
            )
        on_chunks = getattr(fusion.dask_module(), self.__name__, None)
        if on_chunks is None:
            raise TypeError(f"{self.__name__} does not take Dask arrays")
        return on_chunks(*args, **kwargs)

    def explain(self, *args, arch: str | None = None, **kwargs):
        """What the call would do, without running it (see the class docstring): for where
        kernels run now, or for ``arch`` (``"sm_90"``: what a GPU of compute capability 9.0
        runs, the warpgroup-MMA kernels)."""
        with target.planning_for(arch):
            return self._plan(*args, **kwargs).explain()

    def inspect(self, *args, arch: str | None = None, **kwargs) -> list:
        """Offline compile reports of the kernels the call would launch: the kernels
        :meth:`explain` plans for the same ``arch``, compiled for it."""
        with target.planning_for(arch):
            return self._plan(*args, **kwargs).inspect(target.current().name)

    def __repr__(self) -> str:
        return f"<tessera_tile op {self.__name__}{self.__signature__}>"


def _key(args: tuple, kwargs: dict) -> tuple | None:
    """An op call's key: positional arrays by layout, everything else by value (keywords must
    be values: an array passed by keyword is not kept)."""
    key = runtime.quick_key(args, constants=True)
    if key is not None:  # the kernels differ per architecture (sm_90a: warpgroup MMA)
        key = (target.current(), *key)
    if key is None or not kwargs:
        return key
    named = runtime.quick_key(tuple(kwargs.values()), constants=True)
    if named is None or any(type(k) is tuple for k in named):  # an array by keyword
        return None
    return (key, tuple(kwargs), named)


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


def _positions(records, op_args: tuple) -> list[int] | None:
    """Where each record's array is among the op's arguments (by identity); None when one is
    not an argument (a record the op made)."""
    found = []
    for rec in records:
        at = [i for i, v in enumerate(op_args) if v is rec.value]
        if not at:
            return None
        found.append(at[0])
    return found


def _values(args, positions) -> list:
    return [a.value if type(a) is arrays.Arg else a for a in (args[i] for i in positions)]


@dataclass
class Fused:
    """A call dispatched to a fused definition (:mod:`tessera_tile.ops._definitions`)."""

    fn: object  # a FusedFunction
    args: tuple

    def run(self, out, stream):
        return self.fn(*self.args, out=out, stream=stream)

    def explain(self):
        return self.fn.explain(*self.args)

    def inspect(self, arch: str) -> list:
        return self.fn.inspect(*self.args, arch=arch)

    def ready(self, op_args: tuple) -> Ready | None:
        """The fused function's launch plan for these arguments, each array record taken from
        the op's argument it was read from, the other values kept as they are."""
        entry = self.fn.ready(self.args)
        if entry is None:
            return None
        records = [a for a in self.args if type(a) is arrays.Arg]
        positions = _positions(records, op_args)
        if positions is None:
            return None
        slots = iter(positions)
        picks = [next(slots) if type(a) is arrays.Arg else None for a in self.args]
        sources = list(zip(picks, self.args, strict=True))  # per fused argument, made once

        def run(args, stream):
            taken = [c if i is None else args[i] for i, c in sources]
            return runtime.run_ready(*entry, taken, stream)

        return Ready(run)


# --------------------------------------------------------------------------------------------
# hand-written kernels: one launch list serves the run, a kept call, explain and inspect


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
        handles = [arrays.device_handle(r) for r in (*records, result)]
        launch.run(self.launches(records, result), handles, place.stream, self.label)

    def run(self, out, stream):
        inputs = self.inputs()
        o = check_out(out, self.out_shape, self.dtype, inputs)
        if o is not None and o.dtype != self.dtype:  # NumPy's same_kind, as fused functions
            return _cast_into(self.run(None, stream), out=out, stream=stream)
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
        if not self.keepable:
            return None
        records = list(self.inputs().values())
        positions = _positions(records, op_args)
        if positions is None:
            return None
        result = arrays.placeholder(self.out_shape, self.dtype)
        kept = launch.Kept(self.launches(records, result), launched=True)
        shape, dtype = self.out_shape, self.dtype
        label = self.label()  # made now: the kept call must not hold this call's arrays

        def run(args, stream):
            place = arrays.Placement.of_numba_arrays(stream)
            result = place.new(shape, dtype)
            kept.run([*_values(args, positions), result], place.stream, lambda: label)
            return result

        tuner = self.tuner
        return Ready(run, tuner, tuner.generation if tuner is not None else 0)

    def explain(self):
        from ..fusion import Explain

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
        from .. import inspect as offline

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
        if o.dtype != dtype and not np.can_cast(dtype, o.dtype, "same_kind"):
            raise TypeError(  # NumPy's words, as the fused functions say it
                f"Cannot cast the result into out from dtype('{dtype}') to dtype('{o.dtype}') "
                "with casting rule 'same_kind'"
            )
        arrays.check_out(o, "out", shape, o.dtype, inputs)
    return o


def _same(result):
    return result


# an out= of another dtype (same_kind): the result, then one elementwise kernel casting it
_cast_into = fusion.fuse(_same)


def numba_type(rec: arrays.Arg):
    """The numba type a kernel sees for this array (host arrays arrive as contiguous copies)."""
    from numba import from_dtype, types

    contiguous = rec.contiguous or rec.kind != arrays.DEVICE
    return types.Array(from_dtype(rec.dtype), len(rec.shape), "C" if contiguous else "A")


def source_of(kernel) -> str:
    return _pyinspect.getsource(kernel.py_func)
