"""Cross-entropy: hand-written, the gather of ``row[target]`` in the pass that reads the row."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .. import _arrays as arrays
from ..kernels import cross_entropy as _cross_entropy
from ._contract import (
    FLOATS,
    PrebuiltOp,
    array_arg,
    check_out,
    numba_type,
    source_of,
)

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
        from ..fusion import Explain

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

        from .. import inspect as offline

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


cross_entropy = PrebuiltOp(cross_entropy)
