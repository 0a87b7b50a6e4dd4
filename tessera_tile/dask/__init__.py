"""Fused functions and prebuilt ops on Dask arrays (the optional extra ``tessera_tile[dask]``).

::

    import dask.array as da
    import tessera_tile as tt
    import tessera_tile.dask as ttd

    x = da.random.standard_normal((4096, 1024), chunks=(512, 1024))   # row chunks
    y = ttd.apply(softmax, x)          # a lazy Dask array: one fused kernel per chunk
    z = ttd.layer_norm(x, w, b)        # prebuilt ops, chunk by chunk
    print(ttd.explain(softmax, x))     # per chunk: kernels and bytes; bytes between chunks

Dask schedules and moves the chunks (a ``distributed`` cluster, a ``dask_cuda``
``LocalCUDACluster`` with one worker per GPU, or the local threads); tessera_tile runs each
chunk. A chunk keeps its kind: NumPy chunks give NumPy chunks (their kernels run on the
worker's GPU, or in the simulator under ``NUMBA_ENABLE_CUDASIM=1``), CuPy chunks CuPy chunks.

* :func:`apply` runs a fused function (``@tt.fuse``): elementwise stages chunk by chunk with
  NumPy's broadcasting, reductions within a chunk in the chunk's kernel, reductions over
  chunked axes as tree reductions whose chunk, combine and aggregate steps are fused kernels,
  or (when it moves fewer bytes) after rechunking along the reduced axes.
* The ops (:func:`softmax`, :func:`layer_norm`, :func:`sum`, :func:`linear`,
  :func:`attention`, ...) take the arguments of ``tessera_tile.ops``; see docs/distributed.md
  for what each one communicates.
* :func:`explain` describes either without computing anything.
"""

from __future__ import annotations

from . import _graph, _ops
from ._chunks import DaskExplain, is_dask

__all__ = [
    "DaskExplain", "apply", "argmax", "argmin", "attention", "cross_entropy", "explain",
    "is_dask", "layer_norm", "linear", "log_softmax", "matmul", "max", "mean", "min", "mlp",
    "rms_norm", "softmax", "std", "sum", "transpose", "var",
]  # fmt: skip


def apply(fn, *args, strategy: str = "auto", split_every=None, **kwargs):
    """``fn(*args, **kwargs)`` on Dask arrays, as a lazy Dask array (a tuple for several
    results).

    fn: a fused function (``tt.fuse``) or a prebuilt op (``tessera_tile.ops.<name>``).
    args: Dask arrays; NumPy and CuPy arrays (one chunk each) and scalars may be mixed in.
    strategy: for a reduction over axes that span several chunks, ``"rounds"`` (tree
    reduction, then the elementwise pass), ``"rechunk"`` (one chunk along those axes), or
    ``"auto"``: the one that moves fewer bytes between chunks.
    split_every: the tree's fan-in (Dask's default when None).
    """
    result, _ = _run(fn, args, kwargs, strategy, split_every)
    return result


def explain(fn, *args, strategy: str = "auto", split_every=None, **kwargs) -> DaskExplain:
    """What :func:`apply` would do, without computing: the steps, each step's kernels and
    bytes on one chunk (the fused function's or op's own ``explain`` on that chunk's shapes),
    the bytes moved between chunks and the least the reductions need, and why each reduction
    over several chunks runs in rounds or after a rechunk."""
    _, report = _run(fn, args, kwargs, strategy, split_every)
    return report


def _run(fn, args, kwargs, strategy, split_every):
    from ..fusion import FusedFunction

    if isinstance(fn, FusedFunction):
        return _graph.evaluate(fn, args, kwargs, strategy, split_every)
    name = getattr(fn, "__name__", None)
    op = _OPS.get(name) if getattr(fn, "__module__", "") == "tessera_tile.ops" else None
    if op is None:
        raise TypeError(f"expected a fused function or a tessera_tile.ops op, got {fn!r}")
    report = DaskExplain()
    if name in _ops.ROW_OPS:
        kwargs.setdefault("strategy", strategy)
    result = op(*args, report=report, **kwargs)
    report.tasks = _graph._tasks([result])
    return result, report


def softmax(x, axis=-1, *, strategy="auto", report=None):
    """``ops.softmax`` over ``axis`` of a Dask array: per chunk when the axis is in one chunk,
    else its statistics (max and sum of exponentials) merged as a tree, then one elementwise
    pass; or a rechunk along the axis when that moves fewer bytes (see :func:`explain`)."""
    return _ops.row_op("softmax", x, axis=axis, strategy=strategy, report=report)


def log_softmax(x, axis=-1, *, strategy="auto", report=None):
    """``ops.log_softmax`` over ``axis`` of a Dask array (as :func:`softmax`)."""
    return _ops.row_op("log_softmax", x, axis=axis, strategy=strategy, report=report)


def layer_norm(x, weight=None, bias=None, eps=1e-5, *, strategy="auto", report=None):
    """``ops.layer_norm`` over the last axis; a chunked last axis merges (count, mean, M2) of
    its chunks by Chan's formula, then normalises chunk by chunk."""
    return _ops.row_op("layer_norm", x, weight, bias, eps, strategy=strategy, report=report)


def rms_norm(x, weight=None, eps=1e-6, *, strategy="auto", report=None):
    """``ops.rms_norm`` over the last axis; a chunked last axis sums its squares as a tree."""
    return _ops.row_op("rms_norm", x, weight, None, eps, strategy=strategy, report=report)


def _reduction(what):
    def fn(x, axis=None, keepdims=False, *, report=None):
        return _ops.reduction(what, x, axis, keepdims, report=report)

    def moments(x, axis=None, keepdims=False, ddof=0, *, report=None):
        return _ops.reduction(what, x, axis, keepdims, ddof, report=report)

    chosen = moments if what in ("var", "std") else fn
    chosen.__name__ = chosen.__qualname__ = what
    chosen.__doc__ = (
        f"``numpy.{what}`` of a Dask array, NumPy's result dtype: per chunk when the reduced "
        "axes are each in one chunk, else a tree reduction of fused partials and merges."
    )
    return chosen


sum = _reduction("sum")  # noqa: A001 - NumPy's names
mean = _reduction("mean")
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
var = _reduction("var")
std = _reduction("std")
argmax = _reduction("argmax")
argmin = _reduction("argmin")


def linear(x, w, bias=None, activation=None, *, precision=None, report=None):
    """``ops.linear`` with x chunked by rows (data parallel: each row chunk against the whole
    ``w``) and along K (tensor parallel: partial products summed as a tree, then the bias
    and activation)."""
    return _ops.linear(x, w, bias, activation, precision, report)


def matmul(a, b, *, precision=None, report=None):
    """``a @ b`` for ``a`` (..., M, K) and ``b`` (K, N) or with a's batch shape (as
    :func:`linear`)."""
    return _ops.matmul(a, b, precision, report)


def mlp(x, w1, b1, w2, b2, activation="gelu", *, precision=None, report=None):
    """``activation(x @ w1 + b1) @ w2 + b2`` as two :func:`linear` steps."""
    return _ops.mlp(x, w1, b1, w2, b2, activation, precision, report)


def attention(q, k, v, *, causal=False, scale=None, report=None):
    """``ops.attention`` per chunk of the batch and head axes (each head's sequence and head
    dimension in one chunk; rechunked if not)."""
    return _ops.attention(q, k, v, causal, scale, report)


def cross_entropy(logits, targets, *, reduction="mean", ignore_index=-100, report=None):
    """``ops.cross_entropy`` over row chunks (the classes of a row in one chunk); ``"mean"``
    and ``"sum"`` add the rows' losses as a tree."""
    return _ops.cross_entropy(logits, targets, reduction, ignore_index, report)


def transpose(x, *, report=None):
    """``ops.transpose`` of a 2-D Dask array, chunk by chunk."""
    return _ops.transpose(x, report)


_OPS = {
    "softmax": softmax, "log_softmax": log_softmax, "layer_norm": layer_norm,
    "rms_norm": rms_norm, "sum": sum, "mean": mean, "max": max, "min": min, "var": var,
    "std": std, "argmax": argmax, "argmin": argmin, "linear": linear, "matmul": matmul,
    "mlp": mlp, "attention": attention, "cross_entropy": cross_entropy, "transpose": transpose,
}  # fmt: skip
