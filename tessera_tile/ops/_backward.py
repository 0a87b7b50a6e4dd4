"""The prebuilt ops' backward passes, which ``PrebuiltOp.vjp`` runs and ``explain`` and
``inspect`` report with ``backward=True``:

- :class:`FromResult`: a fused function of the result and its cotangent (softmax and
  log-softmax: one row kernel);
- :class:`NormBackward`: layer norm's and RMS norm's hand-written kernels
  (:mod:`tessera_tile.kernels.norm_backward`): dx, dweight and dbias from x and dy read once;
- elsewhere the composer's differentiation of the op's fused definition (:class:`Composed`).

:func:`planned` gives the backward of one call for one cotangent: ``grads()`` (one cotangent
per argument of the fused definition), ``explain()`` and ``inspect(arch)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._fusion import autodiff
from .._runtime import arrays, launch
from ..kernels import layer_norm_long, norm_backward
from ..kernels._calls import FLOATS, HandWritten, Report
from ..kernels.norm_backward import FOLD_THREADS


def planned(plan, result, cotangent):
    """The backward of ``plan`` (an op's ``Fused`` call) whose result is ``result`` (or a
    stand-in record of it), for ``cotangent``."""
    if plan.backward is None:
        return Composed(autodiff.Pullback(plan.fn, plan.args, {}, True), cotangent)
    return plan.backward.planned(plan.args, result, cotangent)


def stand_in(shape: tuple, dtype, like: arrays.Arg) -> arrays.Arg:
    """A contiguous array's record on ``like``'s side, for plans that launch nothing."""
    strides = arrays.contiguous_strides(shape, np.dtype(dtype).itemsize)
    return arrays.Arg(like.kind, None, shape, strides, np.dtype(dtype), 0, like.family)


@dataclass(frozen=True)
class Composed:
    """The composer's differentiation of a fused definition, for one cotangent."""

    pullback: autodiff.Pullback
    cotangent: object

    def grads(self) -> tuple:
        return self.pullback(self.cotangent)

    def explain(self):
        return self.pullback.explain(self.cotangent)

    def inspect(self, arch: str) -> list:
        return self.pullback.inspect(self.cotangent, arch)


@dataclass(frozen=True)
class _FusedCall:
    fn: object
    args: tuple

    def grads(self) -> tuple:
        got = self.fn(*self.args)
        return got if isinstance(got, tuple) else (got,)

    def explain(self):
        return self.fn.explain(*self.args)

    def inspect(self, arch: str) -> list:
        return self.fn.inspect(*self.args, arch=arch)


@dataclass(frozen=True)
class FromResult:
    """A backward computed from the result and its cotangent by a fused function."""

    fn: object  # FusedFunction of (result, cotangent)

    def planned(self, args, result, cotangent) -> _FusedCall:
        return _FusedCall(self.fn, (result, cotangent))


@dataclass(frozen=True)
class NormBackward:
    """Layer norm's (``kind="layer"``) or RMS norm's (``"rms"``) backward: the hand-written
    kernels where x is float16, float32 or float64, the cotangent an array of its dtype on its
    side, the leading axes of both merge into rows and a row fits the registers of a block
    (8,192 float16 or float32 in 16-byte accesses, else 4,096; 2,048 float64); elsewhere the
    composer's differentiation."""

    kind: str
    fn: object  # the forward's fused definition
    params: tuple  # the parameters present, of ("weight", "bias")

    def planned(self, args, result, cotangent):
        x, *params, eps = args
        dy = arrays.read(cotangent, "cotangent 0", scalars=False)
        if x.dtype in FLOATS and dy.dtype == x.dtype and dy.kind == x.kind:
            x_rows, dy_rows = layer_norm_long.rows_view(x), layer_norm_long.rows_view(dy)
            if x_rows is not None and dy_rows is not None:
                (rows, n), _ = x_rows
                views = ((x, x_rows), (dy, dy_rows), *_params(params))
                vector = all(_vectors(r, rv, n) for r, rv in views)
                found = norm_backward.shape(self.kind, n, x.dtype, vector)
                if found is not None:
                    return _NormBackwardCall(self, x, dy, tuple(params), eps, rows, n, *found)
        return self.composed(args, cotangent)

    def composed(self, args, cotangent) -> Composed:
        """The composer's differentiation of the definition, for ``cotangent``."""
        return Composed(autodiff.Pullback(self.fn, args, {}, True), cotangent)


def _params(params) -> list:
    return [(p, ((p.shape[0],), p.strides)) for p in params]


def _vectors(rec: arrays.Arg, rows_view, n: int) -> bool:
    """Whether the kernel may move ``rec``'s rows 16 bytes at a time: rows of a multiple of
    16 bytes, contiguous and at 16-byte aligned addresses (a host array's device copy is
    contiguous and aligned)."""
    itemsize = rec.dtype.itemsize
    if (n * itemsize) % 16:
        return False
    if rec.kind != arrays.DEVICE:
        return True
    _, strides = rows_view
    return (
        strides[-1] == itemsize
        and all(s % 16 == 0 for s in strides[:-1])
        and (rec.address % 16 == 0)
    )


@dataclass
class _NormBackwardCall(HandWritten):
    """One backward call: the row kernel, then the fold of its partials."""

    op: NormBackward
    x: arrays.Arg
    dy: arrays.Arg
    params: tuple  # records of the weight and bias present
    eps: float
    rows: int
    n: int
    threads: int
    group: int  # threads per row
    accesses: int
    width: int

    @property
    def grid(self) -> int:
        return norm_backward.blocks(self.rows, self.threads, self.group)

    @property
    def kernels(self) -> tuple:
        dtype = self.x.dtype
        shape = (self.threads, self.group, self.accesses, self.width)
        main = norm_backward.kernel(self.op.kind, dtype, *shape, self.op.params)
        fold = norm_backward.fold(dtype, len(self.op.params)) if self.op.params else None
        return main, fold

    def inputs(self) -> dict:
        return {"x": self.x, "dy": self.dy} | dict(zip(self.op.params, self.params, strict=True))

    @property
    def compute_dtype(self) -> np.dtype:
        return np.dtype(np.float64 if self.x.dtype == np.float64 else np.float32)

    def launches(self, records: list, result=None) -> list:
        """Launches on ``records``: x, dy, the parameters, then dx, the partials and the
        parameters' gradients (the device records; the placeholders' in :meth:`report`)."""
        main, fold = self.kernels
        x, dy = records[0], records[1]
        at = 2 + len(self.params)  # dx, then the partials
        views = [_as_rows(i, r, self.rows, self.n) for i, r in ((0, x), (1, dy))]
        weight = launch.View(2) if "weight" in self.op.params else launch.Unused(x.dtype)
        params = (*views, weight, _as_rows(at, records[at], self.rows, self.n), launch.View(at + 1))
        out = [
            launch.KernelLaunch(
                main, self.grid, self.threads, (*params, self.eps), self._signature(x, dy)
            )
        ]
        if fold is not None:
            grads = [launch.View(at + 2 + i) for i in range(len(self.params))]
            if len(grads) == 1:
                grads.append(launch.Unused(x.dtype))
            blocks = -(-self.n // FOLD_THREADS)
            partials = launch.View(at + 1)
            fold_signature = (self._partials_type(), *[self._vector_type()] * 2)
            out.append(
                launch.KernelLaunch(fold, blocks, FOLD_THREADS, (partials, *grads), fold_signature)
            )
        return out

    def _signature(self, x, dy) -> tuple:
        from numba import from_dtype, types

        dt = from_dtype(self.x.dtype)

        def rows(rec):
            (_, (row, col)) = layer_norm_long.rows_view(rec)
            contiguous = col == rec.dtype.itemsize and row == self.n * rec.dtype.itemsize
            return types.Array(dt, 2, "C" if contiguous else "A")

        dx = types.Array(dt, 2, "C")
        return rows(x), rows(dy), self._vector_type(), dx, self._partials_type(), types.float64

    def _vector_type(self):
        from numba import from_dtype, types

        return types.Array(from_dtype(self.x.dtype), 1, "C")

    def _partials_type(self):
        from numba import from_dtype, types

        return types.Array(from_dtype(self.compute_dtype), 3, "C")

    def grads(self) -> tuple:
        """dx and the parameters' gradients (None for eps), on the caller's side."""
        inputs = list(self.inputs().values())
        place = arrays.Placement(inputs, [], None)
        records = [place.device(r) for r in inputs]
        dx = place.result(self.x.shape, self.x.dtype)
        shape = (len(self.params), self.grid, self.n)
        partials = place.temp(shape, self.compute_dtype)
        dparams = [place.result(p.shape, p.dtype) for p in self.params]
        handles = [*records, dx, partials, *dparams]
        launch.run(self.launches(handles), handles, place.stream, self.label)
        return (*(place.finish(r.value) for r in (dx, *dparams)), None)

    def predicted_bytes(self) -> int:
        """x and dy read once, dx written once, the weight read once by each group of threads
        (rows at once in a block: on a GPU, the block's later reads hit L1; a layer norm's
        group of 1,024 reads it for each row, from the cache), the partials written and read
        once, the parameters' gradients written once."""
        row_bytes = 3 * self.x.size * self.x.dtype.itemsize
        params = sum(p.size * p.dtype.itemsize for p in self.params)
        reads = self.grid * (self.threads // self.group)
        if norm_backward.weight_per_row(self.op.kind, self.group):
            reads = self.rows
        weight = reads * self.n * self.x.dtype.itemsize if "weight" in self.op.params else 0
        partials = 2 * len(self.params) * self.grid * self.n * self.compute_dtype.itemsize
        return row_bytes + weight + partials + params

    def report(self) -> Report:
        main, fold = self.kernels
        name = main.py_func.__name__
        args = (self.x, *self.params, self.eps)
        theirs = self.op.composed(args, self.dy).explain()  # for comparison
        stages = [
            f"{name}: hand-written, {self.group} threads per row, {self.grid} block(s) of "
            f"{self.threads} looping over {self.rows} row(s) of {self.n}: dx, and the blocks' "
            "column partials"
        ]
        if fold is not None:
            stages.append(
                f"{fold.py_func.__name__}: the partials summed over the {self.grid} block(s) "
                "in block order"
            )
        return Report(
            name,
            self.launches(self._stand_ins()),
            stages,
            self.predicted_bytes(),
            theirs.bytes_unfused,
            [
                "x and dy read once: the statistics recomputed from the row in registers (the "
                "forward saves nothing), dweight and dbias as per-block column partials folded "
                "in a fixed order (deterministic)",
                f"the composer's differentiation of the definition: {theirs.kernels} kernel(s), "
                f"{theirs.bytes_fused} B",
            ],
        )

    def _stand_ins(self) -> list:
        """Records standing for the call's device arrays in a report (their layouts: a host
        array's device copy and a result are contiguous)."""

        def on_device(rec):
            if rec.kind == arrays.DEVICE:
                return rec
            return rec._replace(strides=arrays.contiguous_strides(rec.shape, rec.dtype.itemsize))

        inputs = [on_device(r) for r in self.inputs().values()]
        return [*inputs, on_device(self.x), None, *self.params]


def _as_rows(index: int, rec: arrays.Arg, rows: int, n: int) -> launch.View:
    """Parameter ``index`` (whose record is ``rec``) seen as (rows, n)."""
    _, strides = layer_norm_long.rows_view(rec)
    return launch.View(index, (rows, n), strides)
