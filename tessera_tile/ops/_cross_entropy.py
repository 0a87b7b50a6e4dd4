"""Cross-entropy: hand-written, the gather of ``row[target]`` in the pass that reads the row."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
from numba import from_dtype, types

from .._runtime import arrays, launch
from .._runtime.launch import KernelLaunch, Unused, View
from ..kernels import cross_entropy as _cross_entropy
from ..kernels._calls import (
    COMPOSED_FLOATS,
    HandWritten,
    Report,
    array_arg,
    numba_type,
    view_dtype,
)
from ..tile_ir import storage_dtype
from . import _definitions
from ._contract import PrebuiltOp

REDUCTIONS = ("none", "mean", "sum")
INTEGER_TARGETS = tuple(np.dtype(d) for d in ("int32", "int64"))


@dataclass
class _CrossEntropy(HandWritten):
    logits: arrays.Arg
    targets: arrays.Arg
    reduction: str
    ignore_index: int

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


cross_entropy = PrebuiltOp(cross_entropy)
