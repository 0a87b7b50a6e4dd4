"""Prebuilt fused ops on CuPy arrays, numba device arrays and NumPy arrays.

::

    from tessera_tile import ops

    y = ops.softmax(x)                      # x: CuPy in, CuPy out; NumPy in, NumPy out
    y = ops.layer_norm(x, w, b, out=y, stream=s)
    print(ops.softmax.explain(x))           # kernels, predicted traffic, source, no launch
    reports = ops.rms_norm.inspect(x, w, arch="sm_90")   # offline compile reports

Every op validates its arguments (each read once into an ``_arrays.Arg`` record) and raises
``TypeError`` or ``ValueError`` naming the argument before anything is launched, then dispatches
to :mod:`tessera_tile.kernels`: a fused definition where the composer already makes the best
kernel (softmax, log-softmax, the norms, reductions), a hand-written kernel where one does
better (cross-entropy's gather, the padded transpose). Results follow the inputs (see
``docs/ops.md``); ``out=`` writes into a given array, ``stream=`` picks the stream; inputs are
never modified. float16 is computed in float32.
"""

from __future__ import annotations

import builtins
import numbers
from dataclasses import dataclass

import numpy as np

from . import _arrays as arrays
from ._attention_ops import attention
from ._matmul_ops import linear, matmul, mlp
from ._prebuilt import (
    FLOATS,
    Fused,
    PrebuiltOp,
    array_arg,
    axis_index,
    check_out,
    eps_value,
    numba_type,
    source_of,
)
from .kernels import cross_entropy as _cross_entropy
from .kernels import layer_norm_long as _layer_norm_long
from .kernels import norms as _norms
from .kernels import reduction as _reduction
from .kernels import softmax as _softmax
from .kernels import transpose as _transpose

__all__ = [
    "argmax", "argmin", "attention", "cross_entropy", "layer_norm", "linear", "log_softmax",
    "matmul", "max", "mean", "min", "mlp", "rms_norm", "softmax", "std", "sum", "transpose",
    "var",
]  # fmt: skip

REDUCIBLE = tuple(np.dtype(d) for d in ("bool", "int32", "int64")) + FLOATS


def _axes(axis, ndim: int):
    """None, or a sorted tuple of distinct normalised axes (NumPy's rules for ``axis=``)."""
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = tuple(axis_index(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis {axis} repeats an axis")
        return tuple(sorted(axes))
    return axis_index(axis, ndim)


def _row_param(value, name: str, x: arrays.Arg, what: str) -> arrays.Arg:
    """The record of a weight or bias: shape ``(x.shape[-1],)`` and x's dtype, on x's side."""
    p = arrays.read(value, name, scalars=False)
    if p.shape != x.shape[-1:]:
        raise ValueError(f"{name} has shape {p.shape}; {what} needs ({x.shape[-1]},)")
    if p.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {p.dtype}; it must match x's dtype {x.dtype}")
    arrays.check_one_side([x, p], ["x", name])
    return p


# --------------------------------------------------------------------------------------------
# softmax, log-softmax, norms (fused definitions)


def _softmax_plan(kind: str):
    def plan(x, axis=-1):
        a = array_arg(x, "x", FLOATS, kind)
        if not a.shape:
            raise ValueError(f"x is 0-dimensional; {kind} needs at least one axis")
        return Fused(getattr(_softmax, kind)(axis_index(axis, len(a.shape))), (a,))

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
    (over 32 KiB) go to a hand-written kernel that reads them twice (Welford's one-pass
    statistics, then the output).
    """
    a = array_arg(x, "x", FLOATS, "layer_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; layer_norm normalises over the last axis")
    w, b = (
        None if v is None else _row_param(v, name, a, "layer_norm")
        for v, name in ((weight, "weight"), (bias, "bias"))
    )
    eps = eps_value(eps)
    fused = Fused(_norms.layer_norm(w is not None, b is not None), (a, *filter(None, (w, b)), eps))
    rows = _layer_norm_long.rows_view(a)
    if rows is not None and not _layer_norm_long.on_chip(a.shape[-1], a.dtype):
        return _LayerNormLong(a, rows, w, b, eps, fused)
    return fused


def rms_norm(x, weight=None, eps=1e-6):
    """RMS norm over the last axis: ``x / sqrt(mean(x**2) + eps) * weight``.

    weight: None or an array of shape ``(x.shape[-1],)`` and x's dtype. x: float16 (computed
    in float32, rounded once), float32 or float64. A NaN makes its row NaN; an infinity makes
    itself NaN (``inf / inf``) and the rest of its row 0, as NumPy's formula.
    """
    a = array_arg(x, "x", FLOATS, "rms_norm")
    if not a.shape:
        raise ValueError("x is 0-dimensional; rms_norm normalises over the last axis")
    params = [] if weight is None else [_row_param(weight, "weight", a, "rms_norm")]
    return Fused(_norms.rms_norm(weight is not None), (a, *params, eps_value(eps)))


@dataclass
class _LayerNormLong:
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

    def run(self, out, stream):
        params = {"weight": self.weight, "bias": self.bias}
        inputs = {"x": self.x} | {k: v for k, v in params.items() if v is not None}
        o = check_out(out, self.x.shape, self.x.dtype, inputs)
        place = arrays.Placement(list(inputs.values()), [o], stream)
        result = place.result(self.x.shape, self.x.dtype, o)
        (n_rows, n), strides = self.rows
        if n_rows:
            handle = arrays.device_handle(place.device(self.x))
            x = arrays.view(handle, (n_rows, n), strides)
            y = arrays.view(arrays.device_handle(result), (n_rows, n), _rows_strides(result))
            weight, bias = (
                arrays.zeros(1, self.x.dtype, place.stream)
                if p is None
                else arrays.device_handle(place.device(p))
                for p in params.values()
            )
            with np.errstate(all="ignore"):  # the simulator computes in NumPy
                self.kernel[n_rows, _layer_norm_long.THREADS, place.stream](
                    x, weight, bias, y, self.eps
                )
        return place.finish(result, o)

    def predicted_bytes(self) -> int:
        """x read twice, y written once, each weight read once per block (a block per row)."""
        n_rows = self.rows[0][0]
        weights = builtins.sum(p.size * p.dtype.itemsize for p in (self.weight, self.bias) if p)
        return 3 * self.x.size * self.x.dtype.itemsize + n_rows * weights

    def explain(self):
        from .fusion import Explain

        name = self.kernel.py_func.__name__
        (n_rows, n), _ = self.rows
        return Explain(
            kernels=1,
            ir=f"hand-written {name} (no Tile IR)",
            source=source_of(self.kernel),
            bytes_fused=self.predicted_bytes(),
            bytes_unfused=self.fused.explain().bytes_unfused,
            reasons=[
                f"rows of {n} {self.x.dtype} are past the {_layer_norm_long.CACHE_BYTES} bytes "
                "the composer keeps on chip: Welford's one-pass statistics read x twice, "
                "where the composer's three passes would read it three times"
            ],
            stages=[
                f"{name}: hand-written, a block of {_layer_norm_long.THREADS} per row, "
                f"{n_rows} rows of {n}; {n_rows} block(s) of {_layer_norm_long.THREADS} threads"
            ],
        )

    def inspect(self, arch: str) -> list:
        from numba import from_dtype, types

        from . import inspect as offline

        dt = from_dtype(self.x.dtype)
        x_layout = (
            "C"
            if self.rows[1] == arrays.contiguous_strides(self.rows[0], dt.bitwidth // 8)
            else "A"
        )
        signature = (
            types.Array(dt, 2, x_layout),
            types.Array(dt, 1, "C"),
            types.Array(dt, 1, "C"),
            types.Array(dt, 2, "C"),
            types.float64,
        )
        return [offline.compile(self.kernel, signature, arch=arch, block=_layer_norm_long.THREADS)]


def _rows_strides(rec: arrays.Arg) -> tuple:
    """Byte strides of a C-contiguous result seen as (rows, n)."""
    itemsize = rec.dtype.itemsize
    return (rec.shape[-1] * itemsize if rec.shape else itemsize, itemsize)


# --------------------------------------------------------------------------------------------
# reductions (fused definitions)


_SELECTION = "Exact; NaN wins, as in NumPy."
_REDUCTION_NUMERICS = {
    "sum": "float16 is summed in float32 and rounded once; NaN propagates, inf + -inf is NaN.",
    "mean": "float16 is summed in float32 and rounded once; NaN propagates, inf + -inf is NaN.",
    "var": "float16 is computed in float32 and rounded once (NumPy squares float16 deviations "
    "in float16); a NaN or an infinity gives NaN.",
    "std": "float16 is computed in float32 and rounded once, so it is inf only where the "
    "result is (NumPy's float16 std overflows with its variance); a NaN or an infinity gives "
    "NaN.",
    "max": _SELECTION,
    "min": _SELECTION,
    "argmax": "Exact; the first NaN's index wins, as in NumPy.",
    "argmin": "Exact; the first NaN's index wins, as in NumPy.",
}


def _reduction_plan(name: str):
    one_axis = name in ("argmax", "argmin")

    def plan(x, axis=None, keepdims=False):
        a = array_arg(x, "x", REDUCIBLE, name)
        if not isinstance(keepdims, bool | np.bool_):
            raise TypeError(f"keepdims must be a bool, got {type(keepdims).__name__}")
        if one_axis and isinstance(axis, tuple):
            raise TypeError(f"{name} takes one axis or None, not a tuple")
        axes = _axes(axis, len(a.shape))
        return Fused(_reduction.reduction(name, axes, bool(keepdims)), (a,))

    plan.__name__ = plan.__qualname__ = name
    plan.__doc__ = (
        f"``numpy.{name}(x, axis, keepdims=keepdims)`` with NumPy's result dtype"
        + (" (ddof=0)" if name in ("var", "std") else "")
        + ".\n\n    x: bool, int32, int64, float16, float32 or float64. "
        + _REDUCTION_NUMERICS[name]
    )
    return plan


softmax = PrebuiltOp(softmax)
log_softmax = PrebuiltOp(log_softmax)
layer_norm = PrebuiltOp(layer_norm)
rms_norm = PrebuiltOp(rms_norm)
sum = PrebuiltOp(_reduction_plan("sum"))  # noqa: A001 - NumPy's names
mean = PrebuiltOp(_reduction_plan("mean"))
max = PrebuiltOp(_reduction_plan("max"))  # noqa: A001
min = PrebuiltOp(_reduction_plan("min"))  # noqa: A001
var = PrebuiltOp(_reduction_plan("var"))
std = PrebuiltOp(_reduction_plan("std"))
argmax = PrebuiltOp(_reduction_plan("argmax"))
argmin = PrebuiltOp(_reduction_plan("argmin"))


# --------------------------------------------------------------------------------------------
# cross-entropy (hand-written: the gather of row[target] in the pass that reads the row)

REDUCTIONS = ("none", "mean", "sum")
INTEGER_TARGETS = tuple(np.dtype(d) for d in ("int32", "int64"))


@dataclass
class _CrossEntropy:
    logits: arrays.Arg
    targets: arrays.Arg
    reduction: str
    ignore_index: int

    @property
    def compute(self) -> np.dtype:
        return np.dtype(np.float64 if self.logits.dtype == np.float64 else np.float32)

    @property
    def kernel(self):
        return _cross_entropy.KERNELS[self.logits.dtype]

    def _shape(self) -> tuple:
        return self.logits.shape[:1] if self.reduction == "none" else ()

    def _reducer(self):
        if self.reduction == "none":
            return None
        return _cross_entropy.reduce_losses(self.reduction, self.logits.dtype.str)

    def _loss_dtype(self) -> np.dtype:
        return self.logits.dtype if self.reduction == "none" else self.compute

    def run(self, out, stream):
        n = self.logits.shape[0]
        o = check_out(
            out, self._shape(), self.logits.dtype, {"logits": self.logits, "targets": self.targets}
        )
        place = arrays.Placement([self.logits, self.targets], [o], stream)
        s = place.stream
        logits = arrays.device_handle(place.device(self.logits))
        targets = arrays.device_handle(place.device(self.targets))
        if self.reduction == "none":
            loss = place.result((n,), self.logits.dtype, o)
            valid = arrays.unused(self.compute)  # nothing counts rows
        else:
            loss, valid = place.temp((n,), self.compute), place.temp((n,), self.compute).value
        loss_handle = arrays.device_handle(loss)
        if n:
            blocks = -(-n // _cross_entropy.WARPS_PER_BLOCK)
            write_valid = self.reduction == "mean"
            with np.errstate(all="ignore"):  # the simulator computes in NumPy
                self.kernel[blocks, _cross_entropy.THREADS, s](
                    logits, targets, loss_handle, valid, self.ignore_index, write_valid
                )
        if self.reduction == "none":
            return place.finish(loss, o)
        total = place.result((), self.logits.dtype, o)
        args = (loss_handle, valid) if self.reduction == "mean" else (loss_handle,)
        self._reducer()(*args, out=total.value, stream=s)
        return place.finish(total, o)

    def predicted_bytes(self) -> int:
        """Global bytes the row kernel moves: the logits once, one target and one loss per
        row (and one count per row for the mean)."""
        n = self.logits.shape[0]
        per_row = self.targets.dtype.itemsize + self._loss_dtype().itemsize
        per_row += self.compute.itemsize if self.reduction == "mean" else 0
        return self.logits.size * self.logits.dtype.itemsize + n * per_row

    def unfused_bytes(self) -> int:
        """One kernel per op, as a chain of CuPy calls does it: m = max(x); e = exp(x - m);
        lse = log(sum(e)) + m; loss = lse - take(x, t); then the reduction."""
        n, c = self.logits.shape
        x, t = self.logits.dtype.itemsize, self.targets.dtype.itemsize
        big = n * c * x
        steps = [
            big + n * x,  # max
            big + n * x + big,  # x - m
            2 * big,  # exp
            big + n * x,  # sum
            2 * n * x,  # log
            3 * n * x,  # + m
            n * t + 2 * n * x,  # take_along_axis
            3 * n * x,  # lse - picked
        ]
        if self.reduction != "none":
            steps.append(n * x + x)
        return int(np.sum(steps, dtype=np.int64))

    def _reduce_args(self):
        n = self.logits.shape[0]
        loss = np.zeros(n, self.compute)
        return (loss, loss.copy()) if self.reduction == "mean" else (loss,)

    def explain(self):
        from .fusion import Explain

        kernel = self.kernel
        reducer = self._reducer()
        stages = [
            f"{kernel.py_func.__name__}: hand-written, a warp per row, logits read once, "
            f"{self.logits.shape[0]} rows of {self.logits.shape[1]}"
        ]
        source, fused = source_of(kernel), self.predicted_bytes()
        reasons = []
        if reducer is not None:
            ex = reducer.explain(*self._reduce_args())
            stages += ex.stages
            source += "\n\n" + ex.source
            fused += ex.bytes_fused
            reasons.append(f"the {self.reduction} over rows is a full reduction of the losses")
        return Explain(
            kernels=len(stages),
            ir=f"hand-written {kernel.py_func.__name__} (no Tile IR)",
            source=source,
            bytes_fused=fused,
            bytes_unfused=self.unfused_bytes(),
            reasons=reasons,
            stages=stages,
        )

    def inspect(self, arch: str) -> list:
        from numba import from_dtype, types

        from . import inspect as offline

        loss_type = types.Array(from_dtype(self._loss_dtype()), 1, "C")
        signature = (
            numba_type(self.logits),
            numba_type(self.targets),
            loss_type,
            types.Array(from_dtype(self.compute), 1, "C"),
            types.int64,
            types.boolean,
        )
        reports = [offline.compile(self.kernel, signature, arch=arch, block=_cross_entropy.THREADS)]
        reducer = self._reducer()
        if reducer is not None:
            reports += reducer.inspect(*self._reduce_args(), arch=arch)
        return reports


def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100):
    """Cross-entropy of ``logits`` (N, C) against integer ``targets`` (N,), as in PyTorch.

    The loss of a row is ``logsumexp(row) - row[target]``; rows whose target is
    ``ignore_index`` contribute nothing. ``reduction``: ``"none"`` (the (N,) losses),
    ``"mean"`` (over the rows not ignored; NaN when all are) or ``"sum"``. Results have the
    logits' dtype; float16 logits are computed in float32 (the mean and sum of the float32
    losses too) and rounded once. NaN and infinities as PyTorch's ``log_softmax`` gives them:
    a NaN or a +inf logit makes its row's loss NaN (``exp(inf - inf)``), a row of only -inf
    NaN, a -inf target among finite logits +inf. A target outside ``[0, C)`` that is not
    ``ignore_index`` raises
    ``ValueError`` before launch when the targets are on the host, and gives a NaN loss for its
    row when they are on the device. One hand-written kernel reads each logit once and writes
    no probabilities; ``"mean"`` and ``"sum"`` add a fused full reduction of the N losses.
    """
    x = array_arg(logits, "logits", FLOATS, "cross_entropy")
    if len(x.shape) != 2:
        raise ValueError(f"logits has shape {x.shape}; cross_entropy needs (N, C)")
    t = arrays.read(targets, "targets", scalars=False)
    if t.dtype not in INTEGER_TARGETS:
        raise TypeError(f"targets has dtype {t.dtype}; cross_entropy takes int32 or int64")
    if t.shape != x.shape[:1]:
        raise ValueError(
            f"targets has shape {t.shape}; logits of shape {x.shape} need {x.shape[:1]}"
        )
    arrays.check_one_side([x, t], ["logits", "targets"])
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    ignore_index = int(ignore_index)
    if t.kind == arrays.HOST:
        tv = t.value
        bad = (tv != ignore_index) & ((tv < 0) | (tv >= x.shape[1]))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"targets[{row}] = {int(tv[row])} is outside [0, {x.shape[1]}) and is not "
                f"ignore_index ({ignore_index})"
            )
    return _CrossEntropy(x, t, reduction, ignore_index)


# --------------------------------------------------------------------------------------------
# transpose (hand-written: a padded shared-memory tile keeps reads and writes coalesced)

MAX_BLOCKS = 132 * 16  # an H100 full 16 times over; blocks grid-stride over further tiles


@dataclass
class _Transpose:
    x: arrays.Arg

    @property
    def kernel(self):
        return _transpose.KERNELS[self.x.dtype]

    def _blocks(self) -> int:
        m, n = self.x.shape
        tiles = -(-m // _transpose.TILE) * -(-n // _transpose.TILE)
        return builtins.min(tiles, MAX_BLOCKS)

    def run(self, out, stream):
        m, n = self.x.shape
        o = check_out(out, (n, m), self.x.dtype, {"x": self.x})
        if o is not None and not o.contiguous:
            raise ValueError("out must be C-contiguous: transpose writes C-contiguous results")
        place = arrays.Placement([self.x], [o], stream)
        result = place.result((n, m), self.x.dtype, o)
        if self.x.size:
            src = arrays.device_handle(place.device(self.x))
            dst = arrays.device_handle(result)
            self.kernel[self._blocks(), _transpose.THREADS, place.stream](src, dst)
        return place.finish(result, o)

    def explain(self):
        from .fusion import Explain

        name = self.kernel.py_func.__name__
        nbytes = 2 * self.x.size * self.x.dtype.itemsize
        return Explain(
            kernels=1,
            ir=f"hand-written {name} (no Tile IR)",
            source=source_of(self.kernel),
            bytes_fused=nbytes,
            bytes_unfused=nbytes,  # one op: nothing to fuse
            reasons=[],
            stages=[
                f"{name}: hand-written, {_transpose.TILE}x{_transpose.TILE} tiles through padded "
                f"shared memory, {self._blocks()} block(s) of {_transpose.THREADS}"
            ],
        )

    def inspect(self, arch: str) -> list:
        from numba import from_dtype, types

        from . import inspect as offline

        out_type = types.Array(from_dtype(self.x.dtype), 2, "C")
        signature = (numba_type(self.x), out_type)
        return [offline.compile(self.kernel, signature, arch=arch, block=_transpose.THREADS)]


def transpose(x):
    """``x.T`` of a 2-D array as a new C-contiguous array: float16, float32 or float64, any
    strides in; values are copied bit for bit (NaN and ±inf included, float16 stays float16).
    One hand-written kernel through a padded shared-memory tile: each element read and written
    once, both coalesced, no bank conflicts.
    """
    a = array_arg(x, "x", FLOATS, "transpose")
    if len(a.shape) != 2:
        raise ValueError(f"x has shape {a.shape}; transpose takes 2-D arrays")
    return _Transpose(a)


cross_entropy = PrebuiltOp(cross_entropy)
transpose = PrebuiltOp(transpose)
