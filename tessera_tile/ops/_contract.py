"""The prebuilt op object (call, ``explain``, ``inspect``, Dask arrays) and the dispatch of a
call to a fused definition. The hand-written calls and the argument checks are a layer
below (:mod:`tessera_tile.kernels._calls`); :mod:`tessera_tile.ops` builds its ops
from both."""

from __future__ import annotations

import inspect as _pyinspect
from dataclasses import dataclass

from .. import fusion
from .._fusion import autodiff, runtime
from .._runtime import arrays, target
from ..kernels._calls import HandWritten, Ready, argument_positions
from . import _backward

MAX_READY = 256  # calls an op keeps (by key; bounded)


class PrebuiltOp:
    """A prebuilt op: ``op(*args, out=None, stream=None, **kwargs)``, ``op.explain(...)`` and
    ``op.inspect(..., arch="sm_90")``.

    ``explain`` returns the :class:`tessera_tile.fusion.Explain` report of the call (kernels,
    predicted traffic, source, reasons) and ``inspect`` one offline compile report per kernel
    the call would launch (both for ``arch=`` where given: ``"sm_90"`` plans Hopper's
    warpgroup-MMA kernels); neither allocates nor launches, and NumPy arrays may stand in for
    device arrays (only their shape, dtype and strides are used).

    A call whose arrays are device arrays (numba's, CuPy's, any ``__cuda_array_interface__``)
    is kept by its key (``arrays.kept_call``: each array's layout, each other argument's
    value): a later call with the same key skips validation and planning and runs the kept
    launches on its own arrays.
    """

    def __init__(self, plan, gradient=None):
        self._plan = plan
        # (the op's arguments) -> a Fused definition of the same call that the composer
        # differentiates, for ops whose plan has no gradient of its own
        self._gradient = gradient
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
        key, values = _key(args, kwargs) if out is None else (None, args)
        if key is not None:
            ready = self._ready.get(key)
            if ready is not None and (ready.tuner is None or ready.current()):
                return ready.run(values, stream)
        if key is None and fusion.on_dask(args, kwargs):
            return self._on_dask(args, kwargs, out, stream)
        plan = self._plan(*args, **kwargs)
        result = _run(plan, out, stream)
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

    def explain(self, *args, arch: str | None = None, backward: bool = False, **kwargs):
        """What the call would do, without running it (see the class docstring): for where
        kernels run now, or for ``arch`` (``"sm_90"``: what a GPU of compute capability 9.0
        runs, the warpgroup-MMA kernels); ``backward=True``: what its pullback would do for a
        contiguous cotangent (see :meth:`vjp`)."""
        with target.planning_for(arch):
            if backward:
                return self._backward_stand_in(args, kwargs).explain()
            return self._plan(*args, **kwargs).explain()

    def inspect(self, *args, arch: str | None = None, backward: bool = False, **kwargs) -> list:
        """Offline compile reports of the kernels the call (``backward=True``: its pullback)
        would launch: the kernels :meth:`explain` plans for the same ``arch``, compiled for it."""
        with target.planning_for(arch):
            if backward:
                plan = self._backward_stand_in(args, kwargs)
            else:
                plan = self._plan(*args, **kwargs)
            return plan.inspect(target.current().name)

    def vjp(self, *args, **kwargs):
        """``tt.vjp`` of this op: its result and a pullback. The call's plan differentiates
        itself (``gradient_run`` keeps what its backward needs, ``gradient_plan`` plans the
        backward for a cotangent): softmax and log_softmax from the result, layer_norm,
        rms_norm and cross_entropy by hand-written kernels, transpose by its own kernel, the
        reductions and the matmul family by the composer's differentiation of a fused
        definition (``ops._backward``, the op's ``gradient`` hook). One cotangent per
        positional argument (None where it is no float array). Attention has no gradient
        yet."""
        plan = self._differentiable(args, kwargs)
        outputs, saved = plan.gradient_run()
        result = arrays.read(outputs, "the result")

        def backward(cotangents):
            autodiff.check_cotangent(0, cotangents, result.shape, result.dtype)
            return plan.gradient_plan(saved, cotangents)

        def pullback(cotangents):
            grads = backward(cotangents).grads()
            return tuple(_gradient_of(a, plan.gradient_args, grads) for a in args)

        def inspect(cotangents, arch: str | None = None) -> list:
            with target.planning_for(arch):
                return backward(cotangents).inspect(target.current().name)

        pullback.explain = lambda cotangents: backward(cotangents).explain()
        pullback.inspect = inspect
        return outputs, pullback

    def _differentiable(self, args, kwargs):
        """The call's plan, as it differentiates itself."""
        plan = self._plan(*args, **kwargs)  # the arguments checked as for a call
        if self._gradient is not None:
            plan = self._gradient(*args, **kwargs)
        plan = getattr(plan, "fused", plan)  # a hand-written forward's fused definition
        if not hasattr(plan, "gradient_run"):
            raise NotImplementedError(
                f"tt.vjp: ops.{self.__name__} runs a hand-written kernel for these arguments; "
                "its gradient is not written yet"
            )
        return plan

    def _backward_stand_in(self, args, kwargs):
        """The backward of the call for stand-ins of what its forward keeps and of a
        contiguous cotangent."""
        plan = self._differentiable(args, kwargs)
        saved, cotangent = plan.gradient_stand_ins()
        return plan.gradient_plan(saved, cotangent)

    def __repr__(self) -> str:
        return f"<tessera_tile op {self.__name__}{self.__signature__}>"


def _gradient_of(arg, fused_args: tuple, grads: tuple):
    """The cotangent of an op's argument: of the fused arguments read from it (summed where it
    was passed twice, as weight and bias)."""
    found = [
        g for a, g in zip(fused_args, grads, strict=True)
        if g is not None and type(a) is arrays.Arg and a.value is arg
    ]  # fmt: skip
    total = found[0] if found else None
    for g in found[1:]:
        total = _add(total, g)
    return total


_add = fusion.fuse(lambda a, b: a + b)


def _key(args: tuple, kwargs: dict) -> tuple[tuple | None, tuple | list]:
    """An op call's key (None: not kept) and the values a kept call runs on
    (``arrays.kept_call``): positional arrays by layout, everything else by value (keywords
    must be values: an array passed by keyword is not kept)."""
    kept = arrays.kept_call(args, constants=True)
    if kept is None:
        return None, args
    key, values = kept
    key = (target.current(), *key)  # the kernels differ per architecture (sm_90a: wgmma)
    if not kwargs:
        return key, values
    named = arrays.kept_call(tuple(kwargs.values()), constants=True)
    if named is None or any(type(k) is tuple for k in named[0]):  # an array by keyword
        return None, args
    return (key, tuple(kwargs), named[0]), values


def _run(plan, out, stream):
    """Run a plan; ``out=`` of another dtype (NumPy's same_kind, as fused functions): the
    result, then one elementwise kernel casting it into ``out``."""
    if out is not None and isinstance(plan, HandWritten):
        o = plan.checked_out(out)
        if o.dtype != plan.dtype:
            return _cast_into(plan.run(None, stream), out=out, stream=stream)
    return plan.run(out, stream)


@dataclass
class Fused:
    """A call dispatched to a fused definition (:mod:`tessera_tile.ops._definitions`)."""

    fn: object  # a FusedFunction
    args: tuple
    # the op's own backward (``ops._backward``), written for speed; None: the composer
    # differentiates ``fn``
    backward: object = None

    def run(self, out, stream):
        return self.fn(*self.args, out=out, stream=stream)

    def explain(self):
        return self.fn.explain(*self.args)

    def inspect(self, arch: str) -> list:
        return self.fn.inspect(*self.args, arch=arch)

    # gradients (PrebuiltOp.vjp): the result is what the backward keeps
    @property
    def gradient_args(self) -> tuple:
        return self.args

    def gradient_run(self):
        outputs = self.run(None, None)
        return outputs, outputs

    def gradient_plan(self, result, cotangent):
        return _backward.planned(self, result, cotangent)

    def gradient_stand_ins(self) -> tuple:
        (shape, dtype), *_ = autodiff.Pullback(self.fn, self.args, {}, True).results
        like = next(a for a in self.args if type(a) is arrays.Arg and a.is_array)
        result = _backward.stand_in(shape, dtype, like)
        return result, result

    def ready(self, op_args: tuple) -> Ready | None:
        """The fused function's launch plan for these arguments, each array record taken from
        the op's argument it was read from, the other values kept as they are."""
        entry = self.fn.ready(self.args)
        if entry is None:
            return None
        records = [a for a in self.args if type(a) is arrays.Arg]
        positions = argument_positions(records, op_args)
        if positions is None:
            return None
        slots = iter(positions)
        picks = [next(slots) if type(a) is arrays.Arg else None for a in self.args]
        sources = list(zip(picks, self.args, strict=True))  # per fused argument, made once

        def run(args, stream):
            taken = [c if i is None else args[i] for i, c in sources]
            return runtime.run_ready(*entry, taken, stream)

        return Ready(run)


def _same(result):
    return result


# an out= of another dtype (same_kind): the result, then one elementwise kernel casting it
_cast_into = fusion.fuse(_same)
