"""What every prebuilt op shares: the op object (call, ``explain``, ``inspect``), the dispatch
of a call to a fused definition, and the checks that name the bad argument before any launch.
:mod:`tessera_tile.ops` builds its ops from these."""

from __future__ import annotations

import inspect as _pyinspect
import numbers
import operator
from dataclasses import dataclass

import numpy as np

from .. import _arrays as arrays
from .._fusion import runtime

MAX_READY = 256  # calls an op runs straight from their arguments, by key (bounded)

FLOATS = tuple(np.dtype(d) for d in ("float16", "float32", "float64"))


# --------------------------------------------------------------------------------------------
# the op object: call, explain, inspect


class PrebuiltOp:
    """A prebuilt op: ``op(*args, out=None, stream=None, **kwargs)``, ``op.explain(...)`` and
    ``op.inspect(..., arch="sm_90")``.

    ``explain`` returns the :class:`tessera_tile.fusion.Explain` report of the call (kernels,
    predicted traffic, source, reasons) and ``inspect`` one offline compile report per kernel
    the call would launch; neither allocates nor launches, and NumPy arrays may stand in for
    device arrays (only their shape, dtype and strides are used).
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
        self._ready: dict = {}  # runtime.quick_key -> a call that needs no checks or planning

    def __call__(self, *args, out=None, stream=None, **kwargs):
        key = runtime.quick_key(args, constants=True) if out is None and not kwargs else None
        if key is not None:
            ready = self._ready.get(key)
            if ready is not None:  # these arguments' layouts and values were checked before
                return ready(args, stream)
        plan = self._plan(*args, **kwargs)
        result = plan.run(out, stream)
        if key is not None:
            ready = getattr(plan, "ready", lambda _: None)(args)  # TODO base class
            if ready is not None:
                if len(self._ready) >= MAX_READY:
                    self._ready.clear()
                self._ready[key] = ready
        return result

    def explain(self, *args, **kwargs):
        """What the call would do, without running it (see the class docstring)."""
        return self._plan(*args, **kwargs).explain()

    def inspect(self, *args, arch: str = "sm_90", **kwargs) -> list:
        """Offline compile reports of the kernels the call would launch, for ``arch``."""
        return self._plan(*args, **kwargs).inspect(arch)

    def __repr__(self) -> str:
        return f"<tessera_tile op {self.__name__}{self.__signature__}>"


@dataclass
class Fused:
    """A call dispatched to a fused definition of :mod:`tessera_tile.kernels`."""

    fn: object  # a FusedFunction
    args: tuple

    def run(self, out, stream):
        return self.fn(*self.args, out=out, stream=stream)

    def ready(self, op_args: tuple):
        """A later call with ``op_args``' key, run straight from its arguments: each array
        record of the fused call taken from the op's argument it was read from; None when the
        fused call cannot run that way."""
        entry = self.fn.ready(self.args)
        if entry is None:
            return None
        picks = []  # per fused argument: the op argument's position, or None for a constant
        for a in self.args:
            if type(a) is arrays.Arg:
                at = [i for i, v in enumerate(op_args) if v is a.value]
                if not at:
                    return None  # a record made by the op, not one of its arguments
                picks.append(at[0])
            else:
                picks.append(None)
        constants = self.args

        def run(args, stream):
            fused_args = [
                c if i is None else args[i] for i, c in zip(picks, constants, strict=True)
            ]
            return runtime.run_ready(*entry, fused_args, stream)

        return run

    def explain(self):
        return self.fn.explain(*self.args)

    def inspect(self, arch: str) -> list:
        return self.fn.inspect(*self.args, arch=arch)


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
# hand-written kernels: placement of arrays, results, reports


def check_out(out, shape, dtype, inputs: dict[str, arrays.Arg]) -> arrays.Arg | None:
    """The record of ``out=`` of a hand-written op, checked against the result; and every
    array of the call (``inputs``: name -> record, and ``out``) on one side, host or device:
    TypeError naming two of them otherwise. Every hand-written op calls this before it
    places or launches anything (the fused functions check the same in their runtime)."""
    o = None if out is None else arrays.read(out, "out", scalars=False)
    named = inputs if o is None else {**inputs, "out": o}
    arrays.check_one_side(list(named.values()), list(named))
    if o is not None:
        arrays.check_out(o, "out", shape, dtype, inputs)
    return o


def numba_type(rec: arrays.Arg):
    """The numba type a kernel sees for this array (host arrays arrive as contiguous copies)."""
    from numba import from_dtype, types

    contiguous = rec.contiguous or rec.kind != arrays.DEVICE
    return types.Array(from_dtype(rec.dtype), len(rec.shape), "C" if contiguous else "A")


def source_of(kernel) -> str:
    return _pyinspect.getsource(kernel.py_func)
