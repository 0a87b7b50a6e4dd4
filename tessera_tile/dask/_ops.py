"""The prebuilt ops on Dask arrays: each chunk runs the op itself (``tessera_tile.ops``), or a
fused partial or apply kernel where the op's axis spans several chunks."""

from __future__ import annotations

import functools
import string

import numpy as np

from .. import fusion as tt
from .. import tile_ir as ir
from . import _reduce as red
from ._chunks import (
    DaskExplain,
    as_dask,
    broadcast_reads,
    largest_block,
    meta_of,
    rechunk_moved,
    stand_in,
    unify,
)

ROW_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm")
REDUCTIONS = ("sum", "mean", "max", "min", "var", "std", "argmax", "argmin")
_KIND = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "var": "moments"}
_KIND.update({"std": "moments", "argmax": "argmax", "argmin": "argmin"})


class OpBlock:
    """A block function: ``tessera_tile.ops.<name>(*blocks, **kwargs)``."""

    def __init__(self, name, **kwargs):
        self.name, self.kwargs = name, kwargs

    def __call__(self, *blocks, block_info=None):
        from .. import ops

        return getattr(ops, self.name)(*blocks, **self.kwargs)

    def explain(self, *blocks):
        from .. import ops

        return getattr(ops, self.name).explain(*blocks, **self.kwargs)


def _per_chunk(report, what, fn, arrays, chunks):
    """``fn.explain`` on the largest chunk's stand-ins, kept in the report."""
    block = largest_block(chunks)
    stands = [
        stand_in(largest_block(a.chunks), a.dtype) if hasattr(a, "chunks") else a for a in arrays
    ]
    blocks = int(np.prod([len(c) for c in chunks], dtype=np.int64))
    try:
        e = fn.explain(*stands)
    except Exception as err:
        report.steps.append(f"{what}: per-chunk plan unavailable ({err})")
        return
    report.per_chunk.append((what, blocks, e))
    report.steps.append(f"{what} over {blocks} chunk(s) of at most {list(block)}")


def _axis(axis, ndim):
    return ir.normalize_axes(axis, ndim)[0]


# row ops --------------------------------------------------------------------------------------


@functools.cache
def _apply_kernel(name: str, weight: bool, bias: bool):
    def apply(x, *rest):
        acc = np.float64 if x.dtype == np.float64 else np.float32
        xf = tt.astype(x, acc)
        rest = list(rest)
        if name in ("softmax", "log_softmax"):
            m, s = rest[:2]
            denom = s * tt.exp(tt.where(tt.isfinite(m), m, 0) - m)
            y = tt.exp(xf - m) / denom if name == "softmax" else (xf - m) - tt.log(denom)
            return tt.astype(y, x.dtype)
        if name == "layer_norm":
            n, mean, m2, eps = rest[:4]
            rest = rest[4:]
            y = (xf - mean) * tt.rsqrt(m2 / n + eps)
        else:  # rms_norm
            ss, n, eps = rest[:3]
            rest = rest[3:]
            y = xf / tt.sqrt(ss / n + eps)
        if weight:
            y = y * tt.astype(rest.pop(0), acc)
        if bias:
            y = y + tt.astype(rest.pop(0), acc)
        return tt.astype(y, x.dtype)

    apply.__name__ = apply.__qualname__ = f"dask_apply_{name}"
    return tt.fuse(apply)


class Apply:
    """The elementwise pass of a row op after its statistics were merged."""

    def __init__(self, name, weight, bias, eps, count):
        self.name, self.weight, self.bias, self.eps, self.count = name, weight, bias, eps, count

    def stats(self, s):
        if self.name in ("softmax", "log_softmax"):
            return [s["m"], s["s"]]
        if self.name == "layer_norm":
            return [s["n"], s["m"], s["M2"], self.eps]
        return [s["v"], self.count, self.eps]

    def __call__(self, x, s, *params, block_info=None):
        kernel = _apply_kernel(self.name, self.weight, self.bias)
        return kernel(x, *self.stats(s), *params)

    def explain(self, x, s, *params):
        kernel = _apply_kernel(self.name, self.weight, self.bias)
        acc = np.float64 if x.dtype == np.float64 else np.float32
        shape = list(x.shape)
        shape[-1 if self.name in ("layer_norm", "rms_norm") else self.axis] = 1
        fields = {k: np.empty(shape, acc) for k in ("m", "s", "n", "M2", "v")}
        return kernel.explain(x, *self.stats(fields), *params)


def row_op(name, x, weight=None, bias=None, eps=None, axis=-1, strategy="auto", report=None):
    report = report if report is not None else DaskExplain()
    x = as_dask(x)
    if x.ndim == 0:
        raise ValueError(f"x is 0-dimensional; {name} needs at least one axis")
    axis = _axis(axis, x.ndim) if name in ("softmax", "log_softmax") else x.ndim - 1
    params = [as_dask(p) for p in (weight, bias) if p is not None]
    k = x.numblocks[axis]
    kind = {"softmax": "lse", "log_softmax": "lse", "layer_norm": "moments"}.get(name, "sumsq")
    acc = red.acc_dtype(kind, x.dtype)
    rows = x.size // max(x.shape[axis], 1)
    fields = len(red.FIELDS[kind])
    rounds = 2 * (k - 1) * rows * fields * acc.itemsize  # partials up, merged stats back
    target = tuple(
        (n,) if d == axis else c for d, (n, c) in enumerate(zip(x.shape, x.chunks, strict=True))
    )
    rechunk = rechunk_moved(x, target)
    kw = {"axis": axis} if name in ("softmax", "log_softmax") else {}
    if eps is not None:
        kw["eps"] = eps
    if k > 1:
        pick = strategy if strategy != "auto" else "rechunk" if rechunk < rounds else "rounds"
        report.decisions.append(
            f"{name} over axis {axis} of {k} chunks: {pick} (statistics rounds move {rounds} B "
            f"between chunks, rechunking to one chunk along the axis {rechunk} B)"
        )
        if pick == "rechunk":
            report.moved(rechunk, f"rechunk {x.shape} to one chunk along axis {axis}")
            x = x.rechunk(target)
            k = 1
    arrays, chunks = unify([x, *params], x.ndim, report)
    x, params = arrays[0], arrays[1:]
    for p in params:
        report.moved(broadcast_reads(p, x.numblocks, x.ndim), f"{name} parameter to row chunks")
    meta = meta_of([x], x.ndim, x.dtype)
    if k == 1:
        block = OpBlock(name, **kw)
        if name in ("layer_norm", "rms_norm"):  # weight and bias by keyword
            names = ["weight", "bias"] if weight is not None else ["bias"]
            block = _Keywords(name, names[: len(params)], kw)
        _per_chunk(report, f"ops.{name}", block, [x, *params], chunks)
        return x.map_blocks(block, *params, dtype=x.dtype, meta=meta, token=f"tessera-{name}")
    count = x.shape[axis]
    stats = _tree(x, kind, (axis,), True, acc, None, report, name=f"{name} statistics")
    apply = Apply(name, weight is not None, bias is not None, eps, count)
    apply.axis = axis
    _per_chunk(report, f"{name} apply", apply, [x, None, *params], chunks)
    return x.map_blocks(apply, stats, *params, dtype=x.dtype, meta=meta, token=f"tessera-{name}")


class _Keywords(OpBlock):
    """``ops.<name>(x, **{names: params}, **kwargs)``: norms take weight and bias by name."""

    def __init__(self, name, names, kwargs):
        super().__init__(name, **kwargs)
        self.names = names

    def __call__(self, x, *params, block_info=None):
        from .. import ops

        kw = dict(zip(self.names, params, strict=True), **self.kwargs)
        return getattr(ops, self.name)(x, **kw)

    def explain(self, x, *params):
        from .. import ops

        kw = dict(zip(self.names, params, strict=True), **self.kwargs)
        return getattr(ops, self.name).explain(x, **kw)


def _tree(x, kind, axes, keepdims, acc, finish, report, dtype=None, flat=False, name=None):
    """Partials of ``x`` per chunk (fused kernels), merged as a tree (fused kernels)."""
    part = red.Partial(kind, axes, flat, acc, chunks=x.chunks, shape=x.shape)
    pchunks = tuple((1,) * len(c) if d in axes else c for d, c in enumerate(x.chunks))
    partials = x.map_blocks(
        part, chunks=pchunks, dtype=acc, meta=meta_of([x], x.ndim, acc), token=f"tessera-{kind}"
    )
    dtype = np.dtype(dtype or acc)
    out_ndim = x.ndim if keepdims else x.ndim - len(axes)
    meta = meta_of([x], out_ndim, dtype)
    k = int(np.prod([x.numblocks[a] for a in axes], dtype=np.int64))
    out_size = x.size // max(int(np.prod([x.shape[a] for a in axes], dtype=np.int64)), 1)
    size = out_size * acc.itemsize * len(red.FIELDS[kind])
    report.moved((k - 1) * size, f"{name or kind} partials up the tree", (k - 1) * size)
    if kind in ("lse", "moments"):  # merged statistics read back by each chunk
        report.moved((k - 1) * size if keepdims else 0, f"{name or kind} merged, to each chunk")
    kernel = red.partial_kernel(kind, tuple(axes), flat, red._name(acc))
    _per_chunk(report, f"partial {kind}", kernel, [x], x.chunks)
    report.steps.append(f"tree {kind}: {k} partials per result merged by fused kernels")
    return red.tree(partials, kind, tuple(axes), keepdims, dtype, acc, finish, meta)


# reductions -----------------------------------------------------------------------------------


def reduction(what, x, axis=None, keepdims=False, ddof=0, report=None):
    report = report if report is not None else DaskExplain()
    x = as_dask(x)
    flat = what in ("argmax", "argmin") and axis is None
    if what in ("argmax", "argmin") and isinstance(axis, tuple):
        raise TypeError(f"{what} takes one axis or None, not a tuple")
    axes = ir.normalize_axes(axis, x.ndim)
    ref = np.ones((1,) * x.ndim, x.dtype)
    dtype = getattr(np, what)(ref, axis=axis, keepdims=keepdims).dtype
    if what in ("max", "min", "argmax", "argmin") and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"zero-size array to reduction operation {what} which has no identity")
    kw = {"axis": axis, "keepdims": keepdims}
    if what in ("var", "std"):
        kw["ddof"] = ddof
    if all(x.numblocks[a] == 1 for a in axes):
        block = OpBlock(what, **kw)
        _per_chunk(report, f"ops.{what}", block, [x], x.chunks)
        if keepdims:
            chunks = tuple((1,) if d in axes else c for d, c in enumerate(x.chunks))
            return x.map_blocks(block, chunks=chunks, dtype=dtype, meta=meta_of([x], x.ndim, dtype))
        drop = list(axes)
        return x.map_blocks(
            block, drop_axis=drop, dtype=dtype, meta=meta_of([x], x.ndim - len(drop), dtype)
        )
    kind = _KIND[what]
    acc = red.acc_dtype(kind, x.dtype)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    finish = red.Finish(what, dtype, count, ddof)
    return _tree(x, kind, axes, keepdims, acc, finish, report, dtype, flat, what)


# matmul, linear, mlp --------------------------------------------------------------------------


class _Product:
    """A block function: one partial product of a row chunk and a K chunk, kept as a tree
    partial (a new last axis of length 1, accumulated in float32 for float16)."""

    def __init__(self, acc, precision=None):
        self.acc, self.precision = acc, precision

    def __call__(self, a, b, block_info=None):
        from .. import ops

        p = ops.matmul(a, b, precision=self.precision)
        return {"v": p.astype(self.acc, copy=False)[..., None]}


@functools.cache
def _epilogue(activation, bias: bool):
    def epilogue(p, *b):
        y = p + b[0] if bias else p
        if activation == "relu":
            y = tt.relu(y)
        elif activation in ("gelu", "gelu_tanh"):
            y = tt.gelu(y, "tanh" if activation == "gelu_tanh" else "none")
        elif activation == "silu":
            y = tt.silu(y)
        return y

    epilogue.__name__ = f"dask_epilogue_{activation}"
    return tt.fuse(epilogue)


class _Epilogue:
    def __init__(self, activation, bias):
        self.activation, self.bias = activation, bias

    def __call__(self, p, *b, block_info=None):
        return _epilogue(self.activation, self.bias)(p, *b)

    def explain(self, p, *b):
        return _epilogue(self.activation, self.bias).explain(p, *b)


def linear(x, w, bias=None, activation=None, precision=None, report=None, op="linear"):
    import dask.array as da

    report = report if report is not None else DaskExplain()
    x, w = as_dask(x), as_dask(w)
    if x.ndim < 2 or w.ndim < 2:
        raise ValueError(f"{op} on Dask arrays takes operands of at least 2 dimensions")
    if w.ndim > 2 and w.shape[:-2] != x.shape[:-2]:
        raise ValueError(f"{op} on Dask arrays: batched operands must have equal batch shapes")
    if x.shape[-1] != w.shape[-2]:
        raise ValueError(f"{op}: K of x ({x.shape[-1]}) and w ({w.shape[-2]}) differ")
    if activation not in (None, "relu", "gelu", "gelu_tanh", "silu"):
        raise ValueError(f"unknown activation {activation!r}")
    nb = x.ndim - 2
    batch = string.ascii_lowercase[:nb]
    w_batch = batch if w.ndim > 2 else ""
    k_chunks = x.chunks[-1]
    if w.chunks[-2] != k_chunks:  # w follows x's K chunks (and x's batch chunks)
        target = (*x.chunks[:-2], k_chunks, w.chunks[-1]) if w_batch else (k_chunks, w.chunks[-1])
        report.moved(rechunk_moved(w, target), "w rechunked to x's K chunks")
        w = w.rechunk(target)
    if bias is not None:
        bias = as_dask(bias).rechunk((w.chunks[-1],))
    dtype = np.result_type(x.dtype, w.dtype)
    kb, mb, nbk = len(k_chunks), x.numblocks[-2], w.numblocks[-1]
    rows_blocks = int(np.prod(x.numblocks[:-1], dtype=np.int64))
    report.moved(x.nbytes * (nbk - 1), "x chunks read by each N chunk of w")
    if not w_batch:
        report.moved(w.nbytes * (rows_blocks - 1), "w read by each row chunk of x")
    else:
        report.moved(w.nbytes * (mb - 1), "w read by each row chunk of x")
    out_ind = batch + "mn"
    meta = meta_of([x], x.ndim, dtype)
    if kb == 1:
        kw = {"precision": precision}
        if op == "linear":
            kw["activation"] = activation
        block = OpBlock(op, **kw)
        args = [x, batch + "mk", w, w_batch + "kn"]
        if bias is not None and op == "linear":
            args += [bias, "n"]
        out = da.blockwise(block, out_ind, *args, dtype=dtype, concatenate=True, meta=meta)
        report.decisions.append(f"{op}: K in one chunk: data parallel over {rows_blocks} rows")
        chunks = out.chunks[:-1] + (k_chunks,)
        _per_chunk(report, f"ops.{op}", block, [x, w, bias], chunks)
        return out
    acc = red.acc_dtype("sum", dtype)
    partials = da.blockwise(
        _Product(acc, precision), out_ind + "k", x, batch + "mk", w, w_batch + "kn",
        adjust_chunks={"k": 1}, dtype=acc, concatenate=True, meta=meta_of([x], x.ndim + 1, acc),
    )  # fmt: skip
    out_bytes = int(np.prod((*x.shape[:-1], w.shape[-1]), dtype=np.int64)) * acc.itemsize
    report.moved((kb - 1) * out_bytes, "partial products up the tree", (kb - 1) * out_bytes)
    report.decisions.append(
        f"{op}: K in {kb} chunks: tensor parallel, {kb} partial products per output chunk "
        "summed as a tree (fused sum kernels)"
    )
    report.steps.append(f"partial products: ops.matmul per (row, N, K) chunk, {kb} K chunks")
    _per_chunk(
        report,
        "ops.matmul partial",
        OpBlock("matmul", precision=precision),
        [x, w],
        partials.chunks[:-1],
    )
    finish = red.Finish("sum", dtype)
    out = red.tree(partials, "sum", (x.ndim,), False, dtype, acc, finish, meta)
    report.steps.append(f"tree sum of {kb} partial products")
    if bias is not None or activation is not None:
        epi = _Epilogue(activation, bias is not None)
        extra = [bias] if bias is not None else []
        _per_chunk(report, f"epilogue {activation}", epi, [out, *extra], out.chunks)
        out = out.map_blocks(epi, *extra, dtype=dtype, meta=meta)
    return out


def matmul(a, b, precision=None, report=None):
    return linear(a, b, precision=precision, report=report, op="matmul")


def mlp(x, w1, b1, w2, b2, activation="gelu", precision=None, report=None):
    h = linear(x, w1, b1, activation, precision, report)
    return linear(h, w2, b2, None, precision, report)


# attention, cross-entropy, transpose ----------------------------------------------------------


def attention(q, k, v, causal=False, scale=None, report=None):
    import dask.array as da

    report = report if report is not None else DaskExplain()
    q, k, v = (as_dask(t) for t in (q, k, v))
    if not q.ndim == k.ndim == v.ndim or q.ndim < 2:
        raise ValueError("attention on Dask arrays: q, k and v need one rank, at least 2")
    arrays = []
    for t in (q, k, v):  # each head's sequence and head dimension in one chunk
        target = (*t.chunks[:-2], (t.shape[-2],), (t.shape[-1],))
        if target != t.chunks:
            report.moved(rechunk_moved(t, target), f"rechunk {t.shape}: one chunk per head")
            t = t.rechunk(target)
        arrays.append(t)
    q, k, v = arrays
    batch = string.ascii_lowercase[: q.ndim - 2]
    block = OpBlock("attention", causal=causal, scale=scale)
    out = da.blockwise(
        block, batch + "SE", q, batch + "SD", k, batch + "TD", v, batch + "TE",
        dtype=q.dtype, concatenate=True, meta=meta_of([q], q.ndim, q.dtype),
    )  # fmt: skip
    report.decisions.append(
        f"attention: {int(np.prod(out.numblocks))} chunk(s) over the batch and head axes; "
        "no communication between them"
    )
    _per_chunk(report, "ops.attention", block, [q, k, v], out.chunks)
    return out


class _Kept:
    def __init__(self, ignore_index):
        self.ignore_index = ignore_index

    def __call__(self, t, block_info=None):
        return _kept_kernel()(t, self.ignore_index)


@functools.cache
def _kept_kernel():
    return tt.fuse(lambda t, ignore: tt.astype(t != ignore, np.int64))


def cross_entropy(logits, targets, reduction="mean", ignore_index=-100, report=None):
    import dask.array as da

    report = report if report is not None else DaskExplain()
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    x, t = as_dask(logits), as_dask(targets)
    if x.ndim != 2 or t.ndim != 1:
        raise ValueError("cross_entropy takes (N, C) logits and (N,) targets")
    target = (x.chunks[0], (x.shape[1],))
    if x.chunks != target:
        report.moved(rechunk_moved(x, target), "logits rechunked: each row in one chunk")
        report.decisions.append("cross_entropy: classes in one chunk per row (rechunked)")
        x = x.rechunk(target)
    t = t.rechunk((x.chunks[0],))
    block = OpBlock("cross_entropy", reduction="none", ignore_index=ignore_index)
    losses = da.blockwise(
        block, "i", x, "ij", t, "i", dtype=x.dtype, concatenate=True,
        meta=meta_of([x], 1, x.dtype),
    )  # fmt: skip
    _per_chunk(report, "ops.cross_entropy", block, [x, t], x.chunks)
    if reduction == "none":
        return losses
    acc = red.acc_dtype("sum", x.dtype)
    total = _tree(losses, "sum", (0,), False, acc, red.Finish("sum", acc), report, acc)
    if reduction == "sum":
        return total.astype(x.dtype)
    kept = t.map_blocks(_Kept(ignore_index), dtype=np.int64, meta=meta_of([t], 1, np.int64))
    i64 = np.dtype(np.int64)
    count = _tree(kept, "sum", (0,), False, i64, red.Finish("sum", i64), report, i64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / count).astype(x.dtype)


def transpose(x, report=None):
    import dask.array as da

    report = report if report is not None else DaskExplain()
    x = as_dask(x)
    if x.ndim != 2:
        raise ValueError("transpose takes a 2-D array")
    block = OpBlock("transpose")
    _per_chunk(report, "ops.transpose", block, [x], x.chunks)
    return da.blockwise(block, "ji", x, "ij", dtype=x.dtype, meta=meta_of([x], 2, x.dtype))
