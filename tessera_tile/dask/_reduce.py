"""Tree reductions over chunked axes: each chunk's statistics (the *partial*), their merge
(``combine``, at every level of the tree) and the last merge (``aggregate``) all run as fused
kernels; :func:`dask.array.reduction` builds the tree.

A partial is a dict of arrays with the reduced axes kept (length 1), all of one accumulation
dtype (float32 for float16 and bfloat16; float64 for the moments of float32, whose merged mean
is subtracted from every element afterwards):

=========================  ==========================  ===========================================
kind                       fields                      merge
=========================  ==========================  ===========================================
sum, prod, max, min,       ``v``                       the same reduction of the partials
any, all, sumsq
argmax, argmin             ``v`` (value), ``i``        best value; ties and NaN: the smallest
                           (global index)              index (NumPy's first occurrence)
moments                    ``n``, ``m`` (mean),        Chan, Golub and LeVeque: ``N = sum n``,
                           ``M2``                      ``mean = sum(n m) / N``,
                                                       ``M2 = sum(M2 + n (m - mean)^2)``
lse                        ``m`` (max), ``s``          ``M = max m``;
                           (``sum exp(x - shift(m))``)  ``S = sum s exp(shift(m) - shift(M))``
=========================  ==========================  ===========================================

``shift(m)`` is ``m`` where finite, else 0, so that a chunk of only ``-inf`` contributes 0 and
NumPy's NaN for ``inf - inf`` is kept: the apply step divides by ``S exp(shift(M) - M)``,
which is NaN where NumPy's ``sum(exp(x - max))`` is.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import fusion as tt
from .. import tile_ir as ir
from ._chunks import concat_nested, xp_of

FIELDS = {
    "sum": ("v",), "prod": ("v",), "max": ("v",), "min": ("v",), "any": ("v",),
    "all": ("v",), "sumsq": ("v",), "argmax": ("v", "i"), "argmin": ("v", "i"),
    "moments": ("n", "m", "M2"), "lse": ("m", "s"),
}  # fmt: skip
_FOLD = {"sum": tt.sum, "sumsq": tt.sum, "prod": tt.prod, "max": tt.max, "min": tt.min}
_FOLD.update({"any": tt.any, "all": tt.all})
_INT64_MAX = int(np.iinfo(np.int64).max)


def acc_dtype(kind: str, dtype) -> np.dtype:
    """The dtype partials of ``kind`` over ``dtype`` are kept in."""
    dtype = np.dtype(dtype)
    if kind in ("max", "min", "argmax", "argmin"):
        return dtype
    if kind in ("any", "all"):
        return np.dtype(bool)
    if dtype.kind in "biu":
        return np.dtype(np.int64) if kind in ("sum", "prod") else np.dtype(np.float64)
    if dtype.itemsize < 4 or dtype == ir.BFLOAT16:
        return np.dtype(np.float32)
    if kind == "moments":  # a float32 mean rounded once costs its half ulp in every output
        return np.dtype(np.float64)
    return dtype


def _shift(m):
    return tt.where(tt.isfinite(m), m, 0)


@functools.cache
def partial_kernel(kind: str, axes: tuple[int, ...], flat: bool, acc: str):
    """The fused function of one chunk's partial: a tuple of the fields but ``n``."""
    acc_t = np.dtype(acc) if acc != "bfloat16" else ir.BFLOAT16

    def partial(x):
        if kind in ("argmax", "argmin"):
            value = (tt.max if kind == "argmax" else tt.min)(x, axes, keepdims=True)
            index = getattr(tt, kind)(x, None if flat else axes[0], keepdims=True)
            return value, index
        xf = tt.astype(x, acc_t)
        if kind == "sumsq":
            return (tt.sum(xf * xf, axes, keepdims=True),)
        if kind in _FOLD:
            return (_FOLD[kind](xf, axes, keepdims=True),)
        if kind == "moments":
            mean = tt.mean(xf, axes, keepdims=True)
            centred = xf - mean
            return mean, tt.sum(centred * centred, axes, keepdims=True)
        m = tt.max(xf, axes, keepdims=True)  # lse
        return m, tt.sum(tt.exp(xf - _shift(m)), axes, keepdims=True)

    partial.__name__ = partial.__qualname__ = f"dask_partial_{kind}"
    return tt.fuse(partial)


@functools.cache
def merge_kernel(kind: str, axes: tuple[int, ...], dtype: str):
    """The fused function that merges partials concatenated along ``axes`` (keepdims)."""
    floating = np.dtype(dtype).kind == "f" or dtype == "bfloat16"

    def merge(*fields):
        if kind in _FOLD:
            return (_FOLD[kind](fields[0], axes, keepdims=True),)
        if kind in ("argmax", "argmin"):
            v, i = fields
            best = (tt.max if kind == "argmax" else tt.min)(v, axes, keepdims=True)
            hit = v == best
            if floating:
                hit = hit | (tt.isnan(v) & tt.isnan(best))
            return best, tt.min(tt.where(hit, i, _INT64_MAX), axes, keepdims=True)
        if kind == "moments":
            n, m, m2 = fields
            total = tt.sum(n, axes, keepdims=True)
            mean = tt.sum(n * m, axes, keepdims=True) / total
            d = m - mean
            return total, mean, tt.sum(m2 + n * (d * d), axes, keepdims=True)
        m, s = fields  # lse
        big = tt.max(m, axes, keepdims=True)
        scaled = tt.where(s == 0, 0, s * tt.exp(_shift(m) - _shift(big)))
        return big, tt.sum(scaled, axes, keepdims=True)

    merge.__name__ = merge.__qualname__ = f"dask_merge_{kind}"
    return tt.fuse(merge)


def _name(dtype) -> str:
    dtype = np.dtype(dtype)
    return "bfloat16" if dtype == ir.BFLOAT16 else dtype.str


class Partial:
    """A block function: one chunk's partial of ``kind`` over ``axes`` as a dict of fields.

    ``compute`` (optional) computes the fields from the blocks it is given (a fused region of
    a traced function); without it the block is reduced by :func:`partial_kernel`. Arg
    reductions add the chunk's offsets (from ``chunks``, the source's chunks per axis) to make
    their indices global; flat ones ravel them in ``shape``."""

    def __init__(self, kind, axes, flat=False, acc=None, chunks=None, shape=None, compute=None):
        self.kind, self.axes, self.flat = kind, tuple(axes), flat
        self.acc, self.chunks, self.shape, self.compute = acc, chunks, shape, compute

    def __call__(self, *blocks, block_info=None):
        if self.compute is not None:
            values = self.compute(*blocks)
            values = values if isinstance(values, tuple) else (values,)
        else:
            kernel = partial_kernel(self.kind, self.axes, self.flat, _name(self.acc))
            values = kernel(blocks[0])
        xp = xp_of(values[0])
        fields = dict(zip([f for f in FIELDS[self.kind] if f != "n"], values, strict=True))
        if self.kind == "moments":
            src = blocks[0].shape if self.compute is None else self._source_shape(block_info)
            count = int(np.prod([src[a] for a in self.axes], dtype=np.int64))
            fields["n"] = xp.full(values[0].shape, count, values[0].dtype)
        if self.kind in ("argmax", "argmin"):
            fields["i"] = self._global(fields["i"], block_info, xp)
        return fields

    def _location(self, block_info):
        where = block_info[None]["chunk-location"]
        return [int(sum(c[:k])) for c, k in zip(self.chunks, where, strict=True)]

    def _source_shape(self, block_info):
        where = block_info[None]["chunk-location"]
        return [c[k] for c, k in zip(self.chunks, where, strict=True)]

    def _global(self, index, block_info, xp):
        start = self._location(block_info)
        if not self.flat:
            return index + start[self.axes[0]]
        local = xp.unravel_index(index, tuple(self._source_shape(block_info)))
        full = tuple(i + s for i, s in zip(local, start, strict=True))
        return xp.ravel_multi_index(full, self.shape).astype(np.int64)


class Merge:
    """``combine`` and ``aggregate`` of :func:`dask.array.reduction`: concatenate the nested
    partials, merge them with :func:`merge_kernel`; the aggregate finishes with ``finish``."""

    def __init__(self, kind, acc, finish=None):
        self.kind, self.acc, self.finish = kind, acc, finish

    def __call__(self, parts, axis, keepdims):
        first = parts
        while isinstance(first, list):
            first = first[0]
        xp = xp_of(first[FIELDS[self.kind][0]])
        names = FIELDS[self.kind]
        arrays = [concat_nested(_field(parts, f), list(axis), xp) for f in names]
        merged = merge_kernel(self.kind, tuple(axis), _name(self.acc))(*arrays)
        out = dict(zip(names, merged, strict=True))
        if self.finish is None:
            return out
        return self.finish(out, tuple(axis), keepdims, xp)


def _field(parts, name):
    if isinstance(parts, list):
        return [_field(p, name) for p in parts]
    return parts[name]


def _identity(x, axis=None, keepdims=None):
    return x


def tree(partials, kind, axes, keepdims, dtype, acc, finish, meta, split_every=None):
    """The tree reduction of a Dask array of partial dicts over ``axes``."""
    import dask.array as da

    return da.reduction(
        partials,
        chunk=_identity,
        combine=Merge(kind, acc),
        aggregate=Merge(kind, acc, finish),
        axis=axes,
        keepdims=keepdims,
        dtype=dtype,
        concatenate=False,
        split_every=split_every,
        meta=meta,
        name=f"tessera-{kind}",
    )


def squeeze(a, axes, keepdims, xp):
    return a if keepdims else xp.squeeze(a, axis=axes)


class Finish:
    """The last step of a reduction of NumPy's semantics: ``what`` is sum, prod, max, min, any,
    all, sumsq, mean, var, std, argmax, argmin; the result has ``dtype``."""

    def __init__(self, what, dtype, count=None, ddof=0):
        self.what, self.dtype, self.count, self.ddof = what, np.dtype(dtype), count, ddof

    def __call__(self, fields, axes, keepdims, xp):
        w = self.what
        if w in ("argmax", "argmin"):
            out = fields["i"]
        elif w == "mean":
            out = fields["v"] / self.count
        elif w in ("var", "std"):
            with np.errstate(divide="ignore", invalid="ignore"):
                out = fields["M2"] / max(self.count - self.ddof, 0)
            out = xp.sqrt(out) if w == "std" else out
        else:
            out = fields["v"]
        return squeeze(out, axes, keepdims, xp).astype(self.dtype, copy=False)
