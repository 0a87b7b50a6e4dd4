"""A fused function on Dask arrays: its traced Tile IR, cut into Dask steps.

The function is traced once on stand-ins of the whole arrays' shapes. Then, in the graph's
order:

* elementwise ops and reductions whose reduced axes lie inside one chunk stay *pending*: they
  run together, per chunk, in one fused function rebuilt from the IR between the arrays it
  reads (a *region*), as one ``map_blocks`` step (NumPy broadcasting across chunks: arrays
  right-aligned, chunks aligned along each axis);
* a reduction whose axes span several chunks either runs as a tree (the region fused with
  each chunk's partial, then :func:`dask.array.reduction` with fused merges), or its source's
  arrays are rechunked to one chunk along those axes so that it stays pending: whichever moves
  fewer bytes between chunks (``strategy="auto"``), the choice written in ``explain``;
* a matmul runs as :func:`tessera_tile.dask.matmul` (row chunks against the whole right
  operand, chunked K summed as a tree of partial products).

Each region is rebuilt into a fused function on the worker that runs it (kept per process), so
a chunk's kernels are the composer's own for that region.
"""

from __future__ import annotations

import inspect

import numpy as np

from .. import fusion as tt
from .. import tile_ir as ir
from .._fusion import trace as tr
from ..tile_ir import Op
from . import _reduce as red
from ._chunks import DaskExplain, as_dask, is_dask, largest_block, meta_of, stand_in, unify

STRATEGIES = ("auto", "rounds", "rechunk")
_KIND = {
    Op.SUM: "sum", Op.PROD: "prod", Op.MAX: "max", Op.MIN: "min", Op.ANY: "any",
    Op.ALL: "all", Op.ARGMAX: "argmax", Op.ARGMIN: "argmin",
}  # fmt: skip
_BUILT: dict = {}  # region key -> FusedFunction, per process


def _rebuild(targets, params):
    """A Python function of ``params`` (frontier nodes) computing ``targets`` with tt.*."""

    def region(*values):
        env = {id(p): v for p, v in zip(params, values, strict=True)}

        def ev(n):
            if id(n) in env:
                return env[id(n)]
            if n.op is Op.CONST:
                v = n.arg if n.weak else np.asarray(n.arg, n.dtype)[()]
            elif n.op in ir.UNARY:
                v = tr.unary(n.op, ev(n.srcs[0]), arg=n.arg)
            elif n.op in ir.BINARY:
                v = tr.binary(n.op, ev(n.srcs[0]), ev(n.srcs[1]))
            elif n.op in ir.TERNARY:
                v = tr.ternary(n.op, *(ev(s) for s in n.srcs))
            elif n.op in ir.REDUCE:
                axes, keepdims, flat = n.arg
                axis = None if flat else axes[0] if n.op in ir.INDEX_REDUCE else axes
                v = tr.reduce(n.op, ev(n.srcs[0]), axis, keepdims)
            else:
                raise NotImplementedError(f"{n.op.name.lower()} inside a Dask region")
            env[id(n)] = v
            return v

        out = tuple(ev(t) for t in targets)
        return out if len(out) > 1 else out[0]

    return region


class Region:
    """A block function: the fused function of ``targets`` over ``params``, built once per
    process (its kernels come from the composer and its caches)."""

    def __init__(self, targets, params, math="fast", precision=None):
        self.targets, self.params = tuple(targets), tuple(params)
        self.math, self.precision = math, precision
        self.key = (
            tuple(t.key for t in self.targets),
            tuple((p.key, p.op.name) for p in self.params),
            math,
            precision,
        )

    @property
    def fused(self):
        fn = _BUILT.get(self.key)
        if fn is None:
            fn = _BUILT[self.key] = tt.fuse(
                _rebuild(self.targets, self.params), math=self.math, precision=self.precision
            )
        return fn

    def __call__(self, *values, block_info=None):
        return self.fused(*values)


class Evaluator:
    """Evaluates a traced graph on Dask arrays (see the module docstring)."""

    def __init__(self, fn, inputs, scalars, strategy, report: DaskExplain, split_every=None):
        self.fn, self.strategy, self.report = fn, strategy, report
        self.split_every = split_every
        self.mat: dict[int, object] = {}  # node id -> Dask array
        self.node_of: dict[int, ir.Node] = {}
        self.scalars = scalars  # node id -> Python value (SCALAR and COUNT leaves)
        for node, array in inputs:
            self.mat[id(node)] = array

    # the frontier of a pending node: the arrays and scalars its region reads
    def frontier(self, targets):
        arrays, scalars, seen = [], [], set()

        def visit(n):
            if id(n) in seen:
                return
            seen.add(id(n))
            if id(n) in self.mat:
                arrays.append(n)
            elif id(n) in self.scalars:
                scalars.append(n)
            else:
                for s in n.srcs:
                    visit(s)

        for t in targets:
            visit(t)
        return arrays, scalars

    def chunks_of(self, node):
        if id(node) in self.mat:
            return self.mat[id(node)].chunks
        arrays, _ = self.frontier([node])
        if not arrays:
            return tuple((n,) for n in node.shape)
        _, chunks = unify([self.mat[id(a)] for a in arrays], node.ndim)
        return chunks

    def region(self, targets, drop=(), kind=None):
        """Materialise ``targets`` (one node, or a partial's fields) as one map_blocks step."""
        arrays, scalars = self.frontier(targets)
        params = arrays + scalars
        values = [self.mat[id(a)] for a in arrays]
        ndim = max(a.ndim for a in values)
        values, chunks = unify(values, ndim, self.report)
        fn = self.fn
        region = Region(targets, params, fn.math, fn.precision)
        args = values + [self.scalars[id(s)] for s in scalars]
        t = targets[0]
        if kind is None:
            full = t.srcs[0].shape if drop else t.shape
            out_chunks = [(full[j],) if len(chunks[j]) == 1 else chunks[j] for j in range(ndim)]
            out_chunks = tuple(c for j, c in enumerate(out_chunks) if j not in drop)
            result = _map_blocks(region, args, out_chunks, drop, t.dtype, values, t.ndim)
            self._describe(region, args, chunks, values, "region", t)
            return result
        return region, args, chunks, values, ndim

    def _describe(self, region, args, chunks, values, what, t):
        block = largest_block(chunks)
        blocks = int(np.prod([len(c) for c in chunks], dtype=np.int64))
        stand = [_block_stand_in(a, block) for a in args]
        try:
            e = region.fused.explain(*stand)
        except Exception as err:  # a plan that needs the real data: say so, do not fail
            self.report.steps.append(f"{what}: per-chunk plan unavailable ({err})")
            return
        for a in values:
            self.report.moved(_broadcast_moved(a, chunks), f"{a.shape} read by other chunks")
        self.report.steps.append(
            f"{what}: {t.op.name.lower()} {t.dtype}{list(t.shape)} over {blocks} chunk(s) of "
            f"at most {list(block)}: {e.kernels} kernel(s) per chunk"
        )
        self.report.per_chunk.append((what, blocks, e))

    def value(self, node):
        """The Dask array of ``node`` (materialised if pending)."""
        if id(node) in self.mat:
            return self.mat[id(node)]
        if ir.on_host(node):
            return ir.evaluate(node, _positions(self.scalars, self.node_of))
        a = self.region([node])
        self.mat[id(node)] = a
        return a

    def run(self, outputs):
        for n in ir.walk(outputs):
            self.node_of[id(n)] = n
            if id(n) in self.mat or id(n) in self.scalars or n.op in ir.LEAF:
                continue
            if n.op in ir.REDUCE:
                self.reduction(n)
            elif n.op is Op.MATMUL:
                from ._ops import matmul

                a, b = (self.value(s) for s in n.srcs)
                self.mat[id(n)] = matmul(a, b, report=self.report)
            elif n.op is Op.SWAPAXES:
                self.mat[id(n)] = self.value(n.srcs[0]).swapaxes(*n.arg)
            elif n.op not in ir.ELEMENTWISE:
                raise NotImplementedError(f"{n.op.name.lower()} on Dask arrays")
        return [self.value(o) for o in outputs]

    def reduction(self, n):
        src = n.srcs[0]
        axes, keepdims, flat = n.arg
        chunks = self.chunks_of(src)
        k = int(np.prod([len(chunks[a]) for a in axes], dtype=np.int64))
        if k > 1:
            rounds, rechunk, targets = self._costs(n, src, chunks, axes, k)
            pick = self.strategy
            if pick == "auto":
                pick = "rechunk" if rechunk is not None and rechunk < rounds else "rounds"
            if pick == "rechunk" and rechunk is None:
                pick = "rounds"
            what = f"{n.op.name.lower()} over axes {list(axes)} of {k} chunks"
            self.report.decisions.append(
                f"{what}: {pick} (tree rounds move {rounds} B between chunks, rechunking "
                + (f"{rechunk} B" if rechunk is not None else "is refused: a chunk too large")
                + ")"
            )
            if pick == "rounds":
                self.mat[id(n)] = self.tree(n, src, chunks, axes, keepdims, flat)
                return
            for node, target in targets:
                self.mat[id(node)] = self.mat[id(node)].rechunk(target)
        if not keepdims:  # a local reduction that drops axes ends its region
            self.mat[id(n)] = self.region([n], drop=axes)

    def _costs(self, n, src, chunks, axes, k):
        """Bytes between chunks of a tree (the partials, and the result read back by every
        chunk for a reduce-then-broadcast) and of rechunking the source's arrays."""
        kind = _KIND[n.op]
        acc = red.acc_dtype(kind, src.dtype)
        out = int(np.prod(n.shape, dtype=np.int64))
        fields = len(red.FIELDS[kind])
        rounds = (k - 1) * out * fields * acc.itemsize
        if n.arg[1]:  # keepdims: the result is broadcast back to the k chunks
            rounds += (k - 1) * out * n.dtype.itemsize
        arrays, _ = self.frontier([src])
        import dask
        from dask.utils import parse_bytes

        cap = parse_bytes(dask.config.get("array.chunk-size"))
        cost, targets = 0, []
        lead = src.ndim
        for node in arrays:
            a = self.mat[id(node)]
            off = lead - a.ndim
            target = tuple(
                (a.shape[d],) if (d + off) in axes else a.chunks[d] for d in range(a.ndim)
            )
            if target == a.chunks:
                continue
            block = largest_block(target)
            if int(np.prod(block, dtype=np.int64)) * a.dtype.itemsize > cap:
                return rounds, None, []
            from ._chunks import rechunk_moved

            cost += rechunk_moved(a, target)
            targets.append((node, target))
        return rounds, cost, targets

    def tree(self, n, src, chunks, axes, keepdims, flat):
        kind = _KIND[n.op]
        acc = red.acc_dtype(kind, src.dtype)
        fields = self._partial_nodes(kind, src, axes, flat, acc)
        region, args, unified, values, ndim = self.region(fields, kind=kind)
        part = red.Partial(kind, axes, flat, acc, chunks=unified, shape=src.shape, compute=region)
        pchunks = tuple((1,) * len(c) if j in axes else c for j, c in enumerate(unified))
        partials = _map_blocks(part, args, pchunks, (), acc, values, ndim)
        self._describe(region, args, unified, values, f"partial {kind}", fields[0])
        finish = red.Finish(kind, n.dtype)
        meta = meta_of(values, len(n.shape), n.dtype)
        out = red.tree(partials, kind, axes, keepdims, n.dtype, acc, finish, meta, self.split_every)
        k = int(np.prod([len(unified[a]) for a in axes], dtype=np.int64))
        size = int(np.prod(n.shape, dtype=np.int64)) * acc.itemsize * len(red.FIELDS[kind])
        self.report.moved((k - 1) * size, f"{kind} partials up the tree", (k - 1) * size)
        self.report.steps.append(
            f"tree {kind}: {k} partials per result merged by fused kernels "
            f"(split_every={self.split_every or 'dask default'})"
        )
        return out

    def _partial_nodes(self, kind, src, axes, flat, acc):
        acc_arg = ir.dtype_arg(acc)
        if kind in ("argmax", "argmin"):
            pick = Op.MAX if kind == "argmax" else Op.MIN
            value = ir.reduction(pick, src, axes, True)
            index = ir.reduction(getattr(Op, kind.upper()), src, None if flat else axes[0], True)
            return [value, index]
        x = src if src.dtype == acc else ir.elementwise(Op.CAST, src, arg=acc_arg)
        return [ir.reduction(getattr(Op, kind.upper()), x, axes, True)]


def _positions(scalars, node_of):
    return {node_of[i].arg: v for i, v in scalars.items() if node_of[i].op is Op.SCALAR}


def _block_stand_in(a, block):
    if not is_dask(a):
        return a
    lead = len(block) - a.ndim
    shape = tuple(1 if a.shape[d] == 1 else block[lead + d] for d in range(a.ndim))
    return stand_in(shape, a.dtype)


def _broadcast_moved(a, chunks) -> int:
    from ._chunks import broadcast_reads

    return broadcast_reads(a, [len(c) for c in chunks], len(chunks))


def _map_blocks(fn, args, chunks, drop, dtype, values, ndim):
    import dask.array as da

    return da.map_blocks(
        fn,
        *args,
        chunks=chunks,
        drop_axis=list(drop),
        dtype=dtype,
        meta=meta_of(values, ndim, dtype),
        token=f"tessera-{getattr(fn, 'kind', 'region')}",
    )


def bind(fn, args, kwargs):
    """The arguments of a call bound to ``fn``'s parameters: ``(values, keyword names)``."""
    params = inspect.signature(fn.fn)
    try:
        bound = params.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{fn.fn.__name__}(): {e}") from None
    return bound.args + tuple(bound.kwargs.values()), tuple(bound.kwargs)


def evaluate(fn, args, kwargs, strategy="auto", split_every=None):
    """``fn(*args, **kwargs)`` on Dask arrays: ``(lazy results, DaskExplain)``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    values, keywords = bind(fn, args, kwargs)
    stand_ins = []
    for v in values:
        if is_dask(v) or hasattr(v, "shape") and np.ndim(v) > 0:
            stand_ins.append(("array", np.dtype(v.dtype), tuple(v.shape)))
        else:
            stand_ins.append(("scalar", v))
    traced = tr.trace(fn.fn, stand_ins, keywords)
    report = DaskExplain()
    inputs, scalars = [], {}
    leaves = {n.arg: n for n in traced.nodes if n.op in (Op.INPUT, Op.SCALAR)}
    for pos, node in leaves.items():
        if node.op is Op.INPUT:
            if any(np.isnan(c) for cs in getattr(values[pos], "chunks", ()) for c in cs):
                raise ValueError(f"argument {pos} has unknown chunk sizes: compute them first")
            inputs.append((node, as_dask(values[pos])))
        else:
            scalars[id(node)] = values[pos]
    for n in traced.nodes:
        if n.op is Op.COUNT:
            source, axes = traced.counts[id(n)]
            scalars[id(n)] = int(np.prod([source.shape[a] for a in axes], dtype=np.int64))
    ev = Evaluator(fn, inputs, scalars, strategy, report, split_every)
    results = ev.run(traced.outputs)
    report.tasks = _tasks(results)
    return traced.pack(results), report


def _tasks(results) -> int:
    graph: dict = {}
    for r in results:
        if is_dask(r):
            graph.update(dict(r.__dask_graph__()))
    return len(graph)
