"""Softmax, log-softmax, layer norm and RMS norm: the fused definitions of
:mod:`tessera_tile.ops._definitions`, and the hand-written kernel for layer-norm rows too long
to keep on chip."""

from __future__ import annotations

import builtins
import functools
from dataclasses import dataclass

import numpy as np

from .._runtime import arrays
from .._runtime.launch import KernelLaunch, Unused, View
from ..kernels import layer_norm_long as _layer_norm_long
from ..kernels._calls import (
    COMPOSED_FLOATS,
    FLOATS,
    HandWritten,
    Report,
    array_arg,
    axis_index,
    eps_value,
)
from . import _definitions
from ._backward import FromResult, NormBackward
from ._contract import Fused, PrebuiltOp


def _row_param(value, name: str, x: arrays.Arg, what: str) -> arrays.Arg:
    """The record of a weight or bias: shape ``(x.shape[-1],)`` and x's dtype, on x's side."""
    p = arrays.read(value, name, scalars=False)
    if p.shape != x.shape[-1:]:
        raise ValueError(f"{name} has shape {p.shape}; {what} needs ({x.shape[-1]},)")
    if p.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {p.dtype}; it must match x's dtype {x.dtype}")
    arrays.check_one_side([x, p], ["x", name])
    return p


def _softmax_plan(kind: str):
    def plan(x, axis=-1):
        a = array_arg(x, "x", COMPOSED_FLOATS, kind)
        if not a.shape:
            raise ValueError(f"x is 0-dimensional; {kind} needs at least one axis")
        axis = axis_index(axis, len(a.shape))
        backward = FromResult(getattr(_definitions, f"{kind}_backward")(axis))  # from y, dy
        return Fused(getattr(_definitions, kind)(axis), (a,), backward)

    return plan


def softmax(x, axis=-1):
    """Softmax over ``axis``: ``exp(x - max) / sum(exp(x - max))`` (numerically stable).

    x: float16 (computed in float32, rounded once), float32 or float64, any strides. NaN as
    NumPy's formula gives it: a NaN or a +inf makes its row NaN (``exp(inf - inf)``), a -inf
    has probability 0, a row of only -inf is NaN. One kernel: a warp or a block per row, the
    row read once when it fits on chip.
    """
    return _softmax_plan("softmax")(x, axis)


def log_softmax(x, axis=-1):
    """Log-softmax over ``axis``: ``(x - max) - log(sum(exp(x - max)))`` (stable).

    x: float16 (computed in float32, rounded once), float32 or float64, any strides. NaN and
    infinities as for :func:`softmax` (a -inf gives -inf).
    """
    return _softmax_plan("log_softmax")(x, axis)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer norm over the last axis, as in PyTorch (biased variance)::

        (x - mean(x)) / sqrt(var(x) + eps) * weight + bias

    weight, bias: None or arrays of shape ``(x.shape[-1],)`` and x's dtype. x: float16
    (computed in float32, rounded once), float32 or float64. The statistics never round the
    mean (a constant row gives 0); a NaN or an infinity makes its row NaN, as NumPy's formula.
    One kernel, the row read once when it fits on chip, one ``rsqrt`` per row; longer rows
    (past 16,384 float32 or float16, 8,192 float64) go to a hand-written kernel that reads
    them twice (Welford's one-pass statistics, then the output).
    """
    a = array_arg(x, "x", COMPOSED_FLOATS, "layer_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; layer_norm normalises over the last axis")
    w, b = (
        None if v is None else _row_param(v, name, a, "layer_norm")
        for v, name in ((weight, "weight"), (bias, "bias"))
    )
    eps = eps_value(eps)
    definition = _definitions.layer_norm(w is not None, b is not None)
    present = tuple(name for name, p in (("weight", w), ("bias", b)) if p is not None)
    backward = NormBackward("layer", definition, present)
    fused = Fused(definition, (a, *filter(None, (w, b)), eps), backward)
    rows = _layer_norm_long.rows_view(a)
    long_rows = a.dtype in FLOATS and not _on_chip(a.shape[-1], np.dtype(a.dtype))
    # (bfloat16 rows of any length: the composer's kernel)
    if rows is not None and long_rows:
        return _LayerNormLong(a, rows, w, b, eps, fused)
    return fused


@functools.lru_cache(maxsize=256)
def _on_chip(n: int, dtype: np.dtype) -> bool:
    """Whether the composer keeps a layer norm's row of ``n`` elements on chip (then its fused
    layer norm reads x once: 16,384 float32 or float16, 8,192 float64), as its plan for one
    such row says; past this the hand-written kernel reads x twice instead of three times."""
    (stage,) = _definitions.layer_norm(False, False).explain(np.empty((1, n), dtype), 1e-5).stages
    return "kept on chip" in stage


def rms_norm(x, weight=None, eps=1e-6):
    """RMS norm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``.

    weight: None or an array of shape ``(x.shape[-1],)`` and x's dtype. x: float16 (computed
    in float32, rounded once), float32 or float64. A NaN makes its row NaN; an infinity makes
    itself NaN (``inf / inf``) and the rest of its row 0, as NumPy's formula.
    """
    a = array_arg(x, "x", COMPOSED_FLOATS, "rms_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; rms_norm normalises over the last axis")
    params = [] if weight is None else [_row_param(weight, "weight", a, "rms_norm")]
    definition = _definitions.rms_norm(weight is not None)
    backward = NormBackward("rms", definition, ("weight",) if params else ())
    return Fused(definition, (a, *params, eps_value(eps)), backward)


@dataclass
class _LayerNormLong(HandWritten):
    """Layer norm over rows longer than the composer keeps on chip: the hand-written kernel of
    :mod:`tessera_tile.kernels.layer_norm_long`, a block per row."""

    x: arrays.Arg
    rows: tuple  # x as (rows, n): shape and byte strides
    weight: arrays.Arg | None
    bias: arrays.Arg | None
    eps: float
    fused: Fused  # the composer's definition of the same call (its unfused chain's traffic)

    @property
    def kernel(self):
        return _layer_norm_long.kernel(self.x.dtype, self.weight is not None, self.bias is not None)

    @property
    def out_shape(self) -> tuple:
        return self.x.shape

    @property
    def dtype(self):
        return self.x.dtype

    def inputs(self) -> dict:
        params = {"weight": self.weight, "bias": self.bias}
        return {"x": self.x} | {k: v for k, v in params.items() if v is not None}

    def launches(self, records, result) -> list:
        x = records[0]  # on the device: a host x's contiguous copy has strides of its own
        (n_rows, n), strides = _layer_norm_long.rows_view(x)
        if not n_rows:
            return []
        x_view = View(0, (n_rows, n), strides)
        y_view = View(len(records), (n_rows, n), _rows_strides(result))
        present = iter(range(1, len(records)))
        weight, bias = (
            Unused(x.dtype) if p is None else View(next(present)) for p in (self.weight, self.bias)
        )
        params = (x_view, weight, bias, y_view, self.eps)
        signature = self._signature(strides)
        return [KernelLaunch(self.kernel, n_rows, _layer_norm_long.THREADS, params, signature)]

    def _signature(self, x_strides) -> tuple:
        from numba import from_dtype, types

        dt = from_dtype(self.x.dtype)
        contiguous = x_strides == arrays.contiguous_strides(self.rows[0], self.x.dtype.itemsize)
        return (
            types.Array(dt, 2, "C" if contiguous else "A"),
            types.Array(dt, 1, "C"),
            types.Array(dt, 1, "C"),
            types.Array(dt, 2, "C"),
            types.float64,
        )

    def predicted_bytes(self) -> int:
        """x read twice, y written once, each weight read once per block (a block per row)."""
        n_rows = self.rows[0][0]
        weights = builtins.sum(p.size * p.dtype.itemsize for p in (self.weight, self.bias) if p)
        return 3 * self.x.size * self.x.dtype.itemsize + n_rows * weights

    def flops(self) -> int:
        """The composer's count of the same layer norm."""
        return self.fused.fn.flops(*self.fused.args)

    def report(self) -> Report:
        name = self.kernel.py_func.__name__
        (n_rows, n), _ = self.rows
        threads = _layer_norm_long.THREADS
        x_strides = self.rows[1]
        if self.x.kind != arrays.DEVICE:  # its contiguous device copy
            x_strides = arrays.contiguous_strides(self.rows[0], self.x.dtype.itemsize)
        launch = KernelLaunch(self.kernel, n_rows, threads, (), self._signature(x_strides))
        return Report(
            name,
            [launch],
            [
                f"{name}: hand-written, a block of {threads} per row, {n_rows} rows of {n}; "
                f"{n_rows} block(s) of {threads} threads"
            ],
            self.predicted_bytes(),
            self.fused.explain().bytes_unfused,
            [
                f"rows of {n} {self.x.dtype} are longer than the composer keeps on chip: "
                "Welford's one-pass statistics read x twice, "
                "where the composer's three passes would read it three times"
            ],
        )


def _rows_strides(rec: arrays.Arg) -> tuple:
    """Byte strides of a C-contiguous result seen as (rows, n)."""
    itemsize = rec.dtype.itemsize
    return (rec.shape[-1] * itemsize if rec.shape else itemsize, itemsize)


softmax = PrebuiltOp(softmax)
log_softmax = PrebuiltOp(log_softmax)
layer_norm = PrebuiltOp(layer_norm)
rms_norm = PrebuiltOp(rms_norm)
