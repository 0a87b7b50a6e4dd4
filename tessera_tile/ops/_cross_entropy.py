"""Cross-entropy: hand-written, the gather of ``row[target]`` in the pass that reads the row."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np
from numba import from_dtype, types

from .._runtime import arrays, launch
from .._runtime.launch import KernelLaunch, Unused, View
from ..kernels import cross_entropy as _cross_entropy
from ..kernels import cross_entropy_backward as _backward_rows
from ..kernels._calls import (
    COMPOSED_FLOATS,
    HandWritten,
    Report,
    array_arg,
    numba_type,
    view_dtype,
)
from ..tile_ir import BFLOAT16, storage_dtype
from . import _definitions
from ._backward import stand_in
from ._contract import PrebuiltOp

REDUCTIONS = ("none", "mean", "sum")
INTEGER_TARGETS = tuple(np.dtype(d) for d in ("int32", "int64"))


@dataclass
class _CrossEntropy(HandWritten):
    logits: arrays.Arg
    targets: arrays.Arg
    reduction: str
    ignore_index: int
    gradient_in_forward: bool = False  # tt.vjp's forward writes the logits' gradient too

    @property
    def out_shape(self) -> tuple:
        return self.logits.shape[:1] if self.reduction == "none" else ()

    @property
    def dtype(self):
        return self.logits.dtype

    def inputs(self) -> dict:
        return {"logits": self.logits, "targets": self.targets}

    @property
    def compute(self) -> np.dtype:
        return np.dtype(np.float64 if self.logits.dtype == np.float64 else np.float32)

    @property
    def bits(self) -> np.dtype | None:
        """What the kernel reads bfloat16 logits as (their bits); None for the others."""
        return view_dtype(self.logits.dtype)

    @property
    def kernel(self):
        if self.bits is not None:
            return _cross_entropy.rows_kernel(None, bf16_none=self.reduction == "none")
        return _cross_entropy.rows_kernel(self.logits.dtype)

    def _reducer(self):
        if self.reduction == "none":
            return None
        return _definitions.reduce_losses(self.reduction, self.logits.dtype.name)

    def _loss_dtype(self) -> np.dtype:
        return self.logits.dtype if self.reduction == "none" else self.compute

    def launches(self, records, result) -> list:
        """The row kernel, writing the losses into ``result`` (reduction "none"); the other
        reductions write into temporaries (:meth:`execute`)."""
        n = self.logits.shape[0]
        if not n:
            return []
        blocks = -(-n // _cross_entropy.WARPS_PER_BLOCK)
        valid = View(3) if self.reduction == "mean" else Unused(self.compute)
        losses = self.bits if self.reduction == "none" else None  # bfloat16 losses: bits
        logits, loss = View(0, dtype=self.bits), View(2, dtype=losses)
        params = (logits, View(1), loss, valid, self.ignore_index, self.reduction == "mean")
        signature = self._signature(records)
        return [KernelLaunch(self.kernel, blocks, _cross_entropy.THREADS, params, signature)]

    def _signature(self, records) -> tuple:
        logits = records[0] if self.bits is None else records[0]._replace(dtype=self.bits)
        loss = self._loss_dtype()
        return (
            numba_type(logits),
            numba_type(records[1]),
            types.Array(from_dtype(storage_dtype(loss)), 1, "C"),
            types.Array(from_dtype(self.compute), 1, "C"),
            types.int64,
            types.boolean,
        )

    @property
    def keepable(self) -> bool:
        return self.reduction == "none"  # the row kernel alone

    def execute(self, place, records, result) -> None:
        """The row kernel, then the mean or sum of its losses (a fused full reduction)."""
        if self.reduction == "none":
            super().execute(place, records, result)
            return
        handles = [arrays.device_handle(r) for r in records]
        n = self.logits.shape[0]
        loss, valid = place.temp((n,), self.compute), place.temp((n,), self.compute)
        handles += [loss.value, valid.value]
        launch.run(self.launches(records, loss), handles, place.stream, self.label)
        args = (loss.value, valid.value) if self.reduction == "mean" else (loss.value,)
        self._reducer()(*args, out=result.value, stream=place.stream)

    def predicted_bytes(self) -> int:
        """Global bytes the row kernel moves: the logits once, one target and one loss per
        row (and one count per row for the mean)."""
        n = self.logits.shape[0]
        per_row = self.targets.dtype.itemsize + self._loss_dtype().itemsize
        per_row += self.compute.itemsize if self.reduction == "mean" else 0
        return self.logits.size * self.logits.dtype.itemsize + n * per_row

    def flops(self) -> int:
        """Counted from the kernel's source: per logit, the online log-sum-exp's max, subtract,
        exp and add (4); per row, the log and the two subtractions of
        ``(m - x[target]) + log(s)`` (3). The reduction over rows counts its own."""
        n, c = self.logits.shape
        return 4 * n * c + 3 * n

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

    def report(self) -> Report:
        signature = self._signature([self.logits, self.targets])
        launches = [KernelLaunch(self.kernel, None, _cross_entropy.THREADS, (), signature)]
        name = self.kernel.py_func.__name__
        stages = [
            f"{name}: hand-written, a warp per row, logits read once, "
            f"{self.logits.shape[0]} rows of {self.logits.shape[1]}"
        ]
        reasons, then = [], []
        if self.reduction != "none":
            then.append((self._reducer(), self._reduce_args()))
            reasons.append(f"the {self.reduction} over rows is a full reduction of the losses")
        return Report(
            name, launches, stages, self.predicted_bytes(), self.unfused_bytes(), reasons, then
        )

    # gradients (PrebuiltOp.vjp) ------------------------------------------------------------
    @property
    def gradient_args(self) -> tuple:
        return self.logits, self.targets

    def gradient_run(self):
        """The loss, with each row's loss kept in the compute dtype (and the rows counted) for
        the backward: the row kernel as for ``"mean"``, then the reduction or the cast. With
        ``gradient_in_forward``, the logits' gradient instead, written by the row kernel."""
        place = arrays.Placement(list(self.inputs().values()), [], None)
        records = [place.device(r) for r in self.inputs().values()]
        n = self.logits.shape[0]
        loss, valid = place.temp((n,), self.compute), place.temp((n,), self.compute)
        handles = [arrays.device_handle(r) for r in records] + [loss.value, valid.value]
        if self.gradient_in_forward:
            grad = place.temp(self.logits.shape, self.dtype)
            launches = self._forward_gradient(place, records, grad, handles)
        else:
            launches = dataclasses.replace(self, reduction="mean").launches(records, loss)
        launch.run(launches, handles, place.stream, self.label)
        result = place.result(self.out_shape, self.dtype)
        if self.reduction == "none":
            _definitions.cast(self.dtype)(loss.value, out=result.value, stream=place.stream)
        else:
            args = (loss.value, valid.value) if self.reduction == "mean" else (loss.value,)
            self._reducer()(*args, out=result.value, stream=place.stream)
        # the held gradient, and whether a pullback has handed it over
        saved = (grad, [False]) if self.gradient_in_forward else (loss, valid)
        return place.finish(result.value), saved

    def _forward_gradient(self, place, records, grad, handles) -> list:
        """The row kernel that writes the gradient too (scaled by one over the rows counted
        for ``"mean"``), its arrays appended to ``handles``."""
        n = self.logits.shape[0]
        scale = None
        if self.reduction == "mean":  # 1 / rows counted, before any row is read
            count = _definitions.valid_reciprocal(self.compute.name)
            scale = count(records[1].value, self.ignore_index, stream=place.stream)
        handles += [grad.value, scale if scale is not None else handles[3]]  # (unused: valid)
        if not n or not self.logits.shape[1]:
            return []
        bits = self.bits
        params = (
            View(0, dtype=bits), View(1), View(2), View(3), View(4, dtype=bits),
            View(5, (1,), (0,)), self.ignore_index, scale is None,
        )  # fmt: skip
        ct = types.Array(from_dtype(self.compute), 1, "C")
        logits = records[0] if bits is None else records[0]._replace(dtype=bits)
        grad_type = types.Array(from_dtype(storage_dtype(self.dtype)), 2, "C")
        scale_type = types.Array(from_dtype(self.compute), 1, "A")
        signature = (numba_type(logits), numba_type(records[1]), ct, ct, grad_type, scale_type,
                     types.int64, types.boolean)  # fmt: skip
        kernel = _backward_rows.kernel(None if bits is not None else self.dtype, forward=True)
        blocks = -(-n // _cross_entropy.WARPS_PER_BLOCK)
        return [KernelLaunch(kernel, blocks, _cross_entropy.THREADS, params, signature)]

    def gradient_plan(self, saved, cotangent):
        g = arrays.read(cotangent, "cotangent 0")
        if g.is_array:
            arrays.check_one_side([self.logits, g], ["logits", "cotangent 0"])
        if self.gradient_in_forward:
            return _HeldGradient(self, *saved, g)
        return _CrossEntropyBackward(self, *saved, g)

    def gradient_stand_ins(self) -> tuple:
        n = (self.logits.shape[0],)
        device = self.logits._replace(kind=arrays.DEVICE)
        saved = (stand_in(n, self.compute, device), stand_in(n, self.compute, device))
        if self.gradient_in_forward:
            saved = (stand_in(self.logits.shape, self.dtype, device), [False])
        return saved, stand_in(self.out_shape, self.dtype, self.logits)


@dataclass
class _HeldGradient:
    """The logits' gradient the forward wrote (``gradient_in_forward``), for the loss's
    cotangent ``g``: handed over as it is for a cotangent of 1 given as a number (the first
    time: the pullback holds one array), else scaled by ``g`` in one elementwise kernel."""

    forward: _CrossEntropy
    grad: arrays.Arg
    handed: list  # [True] once a pullback has handed the array over
    cotangent: arrays.Arg

    def _scaling(self):
        fn = _definitions.scaled_gradient(self.forward.dtype.name, self.forward.compute.name)
        g = self.cotangent
        if g.kind == arrays.HOST:  # a host call's 0-d cotangent: its number (the held
            g = 1.0 if g.value is None else g.value[()]  # gradient is on the device)
        return fn, (self.grad, g)

    def grads(self) -> tuple:
        g = self.cotangent
        place = arrays.Placement([self.forward.logits], [], None)  # the caller's side
        if g.kind == arrays.SCALAR and g.value == 1 and not self.handed[0]:
            self.handed[0] = True
            return place.finish(self.grad.value), None
        fn, args = self._scaling()
        return place.finish(fn(*args)), None

    def explain(self):
        fn, args = self._scaling()
        return fn.explain(*args)

    def inspect(self, arch: str) -> list:
        fn, args = self._scaling()
        return fn.inspect(*args, arch=arch)


@dataclass
class _CrossEntropyBackward(HandWritten):
    """The logits' gradient: one row kernel (kernels/cross_entropy_backward.py), after, for
    ``"mean"`` and ``"sum"``, a fused step making the rows' scale from the cotangent."""

    forward: _CrossEntropy
    loss: arrays.Arg  # each row's loss (compute dtype, on the device)
    valid: arrays.Arg  # 1 for each row counted, else 0
    cotangent: arrays.Arg

    @property
    def out_shape(self) -> tuple:
        return self.forward.logits.shape

    @property
    def dtype(self):
        return self.forward.logits.dtype

    def inputs(self) -> dict:
        return {"logits": self.forward.logits, "targets": self.forward.targets}

    @property
    def kernel(self):
        bits = self.forward.bits
        return _backward_rows.kernel(None if bits is not None else self.dtype)

    def grads(self) -> tuple:
        """The logits' gradient (None for the targets), on the caller's side."""
        inputs = list(self.inputs().values())
        place = arrays.Placement([*inputs, self.cotangent], [], None)
        records = [place.device(r) for r in inputs]
        scale = self._scale(place)
        result = place.result(self.out_shape, self.dtype)
        handles = [*records, self.loss, scale, result]
        launch.run(self.launches(handles), handles, place.stream, self.label)
        return place.finish(result.value), None

    def _scale(self, place) -> arrays.Arg:
        """The rows' scale on the device: the cotangent of each row's loss (``"none"``) or
        of the loss (``"sum"``, one element), or the fused ``g / rows counted`` (``"mean"``)."""
        g = self.cotangent
        if g.kind == arrays.SCALAR:
            g = arrays.read(np.asarray(g.value, self.forward.compute), "cotangent 0")
        g = place.device(g)
        if g.dtype == BFLOAT16:  # the kernel reads float32 (numba has no bfloat16)
            g = arrays.read(
                _definitions.cast(np.dtype(np.float32))(g.value, stream=place.stream), "scale"
            )
        if self.forward.reduction != "mean":
            return g
        scale = _definitions.mean_loss_scale(self.forward.compute.name)
        return arrays.read(scale(g.value, self.valid.value, stream=place.stream), "scale")

    def launches(self, records: list, result=None) -> list:
        logits, targets, loss, scale = records[:4]
        n = logits.shape[0]
        if not n or not logits.shape[1]:
            return []
        bits = self.forward.bits
        per_row = View(3) if scale.shape else View(3, (n,), (0,))  # a scalar for every row
        params = (
            View(0, dtype=bits), View(1), View(2), per_row, View(4, dtype=bits),
            self.forward.ignore_index,
        )  # fmt: skip
        blocks = -(-n // _cross_entropy.WARPS_PER_BLOCK)
        signature = self._signature(records)
        return [KernelLaunch(self.kernel, blocks, _backward_rows.THREADS, params, signature)]

    def _signature(self, records) -> tuple:
        bits = self.forward.bits
        logits = records[0] if bits is None else records[0]._replace(dtype=bits)
        scale = records[3]
        scale_type = types.Array(from_dtype(scale.dtype), 1, "C" if scale.shape else "A")
        grad = types.Array(from_dtype(storage_dtype(self.dtype)), 2, "C")
        loss = types.Array(from_dtype(self.forward.compute), 1, "C")
        return numba_type(logits), numba_type(records[1]), loss, scale_type, grad, types.int64

    def predicted_bytes(self) -> int:
        """The logits read once and the gradient written once; per row its target, loss,
        scale and ``x[target]``."""
        n = self.forward.logits.shape[0]
        itemsize = self.forward.logits.dtype.itemsize
        per_row = self.forward.targets.dtype.itemsize + self.forward.compute.itemsize + itemsize
        scale = self._scale_dtype.itemsize
        per_row += scale if self.forward.reduction == "none" else 0
        scalar = 0 if self.forward.reduction == "none" else scale
        return 2 * self.forward.logits.size * itemsize + n * per_row + scalar

    @property
    def _scale_dtype(self) -> np.dtype:
        """What the kernel reads each row's scale as: float32 for a bfloat16 cotangent."""
        g = self.cotangent
        if self.forward.reduction == "mean" or g.kind == arrays.SCALAR:
            return self.forward.compute
        return np.dtype(np.float32) if g.dtype == BFLOAT16 else g.dtype

    def report(self) -> Report:
        g = self.cotangent._replace(dtype=self._scale_dtype)
        if self.forward.reduction != "none":
            g = stand_in((), self._scale_dtype, self.forward.logits)
        records = [*self.inputs().values(), self.loss, g]
        launches = [
            KernelLaunch(self.kernel, None, _backward_rows.THREADS, (), self._signature(records))
        ]
        name = self.kernel.py_func.__name__
        n, c = self.forward.logits.shape
        stages = [
            f"{name}: hand-written, a warp per row, the logits read once, {n} rows of {c}: "
            "(softmax - onehot(target)) * scale from each row's kept loss"
        ]
        then = []
        if self.cotangent.dtype == BFLOAT16:
            then.append((_definitions.cast(np.dtype(np.float32)), (self.cotangent,)))
        if self.forward.reduction == "mean":
            scale = _definitions.mean_loss_scale(self.forward.compute.name)
            args = (np.zeros((), self.forward.compute), np.zeros(n, self.forward.compute))
            then.append((scale, args))
        reasons = [
            "the forward kept each row's loss in "
            f"{self.forward.compute}: lse = loss + x[target], so one pass writes the gradient"
        ]
        return Report(
            name, launches, stages, self.predicted_bytes(), self.unfused_bytes(), reasons, then
        )

    def unfused_bytes(self) -> int:
        """One kernel per op, as a chain of CuPy calls does it: m = max(x); e = exp(x - m);
        p = e / sum(e); p[rows, t] -= 1; p * scale."""
        n, c = self.forward.logits.shape
        x, t = self.forward.logits.dtype.itemsize, self.forward.targets.dtype.itemsize
        big = n * c * x
        steps = [big + n * x, 2 * big + n * x, 2 * big, big + n * x, 2 * big + n * x]
        steps += [n * t + 2 * n * x, 2 * big + n * x]
        return int(np.sum(steps, dtype=np.int64))


def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100,
                  gradient_in_forward=False):  # fmt: skip
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

    ``gradient_in_forward`` (``"mean"`` and ``"sum"``) matters under ``tt.vjp`` only: its
    forward's row kernel writes the logits' gradient too, reading each row a second time right
    after the first, and the pullback hands that array over for a cotangent of 1 (a number),
    or scales it by the cotangent in one elementwise kernel; the backward never reads the
    logits. Without it the forward keeps each row's loss and the backward makes one pass over
    the logits.
    """
    x = array_arg(logits, "logits", COMPOSED_FLOATS, "cross_entropy")
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
    if not isinstance(gradient_in_forward, bool | np.bool_):
        raise TypeError(
            f"gradient_in_forward must be a bool, got {type(gradient_in_forward).__name__}"
        )
    if gradient_in_forward and reduction == "none":
        raise ValueError(
            "gradient_in_forward needs a scalar loss (reduction 'mean' or 'sum'): with 'none' "
            "each row's cotangent scales its gradient, the pass over the logits the backward "
            "makes anyway"
        )
    if t.kind == arrays.HOST:
        tv = t.value
        bad = (tv != ignore_index) & ((tv < 0) | (tv >= x.shape[1]))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"targets[{row}] = {int(tv[row])} is outside [0, {x.shape[1]}) and is not "
                f"ignore_index ({ignore_index})"
            )
    return _CrossEntropy(x, t, reduction, ignore_index, bool(gradient_in_forward))


cross_entropy = PrebuiltOp(cross_entropy)
