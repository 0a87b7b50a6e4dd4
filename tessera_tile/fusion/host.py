"""Host side of fused calls: argument classes, strided views, launch configuration, traffic.

Arrays never get copied to make them contiguous: every stage sees each array as a strided view
in the stage's canonical order (kept axes, then reduced axes), with broadcast axes given stride
0, and adjacent axes merged wherever every array allows it. Contiguous arrays end up 1-D
(elementwise) or 2-D (reductions); anything else keeps the axes it needs.
"""

from __future__ import annotations

import numpy as np

from .. import tile_ir as ir
from ..tile_ir import Op
from . import codegen
from .codegen import BLOCK, COLUMN_BLOCK, WARP, WARP_ROW_MAX, Variant
from .plan import Stage

SIMULATED = codegen.device.SIMULATED
# Grid caps. On a GPU: enough blocks to fill the largest parts several times over. In the
# simulator every block is run in turn, so a few blocks (grid-stride loops do the rest).
MAX_BLOCKS = 8 if SIMULATED else 4096
MAX_FULL_BLOCKS = 4 if SIMULATED else 1024


# --------------------------------------------------------------------------------------------
# arrays


def is_device_array(a) -> bool:
    return hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray)


def is_array(a) -> bool:
    return isinstance(a, np.ndarray) or is_device_array(a)


def array_meta(a):
    """(shape, strides in bytes, dtype) of a NumPy or device array."""
    if isinstance(a, np.ndarray):
        return a.shape, a.strides, a.dtype
    cai = a.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is None:
        strides = contiguous_strides(shape, dtype.itemsize)
    return shape, tuple(strides), dtype


def contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _address(a) -> int:
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.__cuda_array_interface__["data"][0]


def make_view(a, shape, strides):
    """A view of ``a`` (same first element) with the given shape and byte strides."""
    if isinstance(a, np.ndarray):
        return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=a.flags.writeable)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    d = a if hasattr(a, "gpu_data") else _as_numba(a)
    return DeviceNDArray(shape, strides, d.dtype, gpu_data=d.gpu_data)


def _as_numba(a):
    from numba import cuda

    return cuda.as_cuda_array(a)


# --------------------------------------------------------------------------------------------
# layout of one stage


def stage_index_shape(stage: Stage, shapes: dict) -> tuple[int, ...]:
    """F for this call."""
    for r in stage.reductions:  # every reduction of a stage runs over F
        return shapes[r.srcs[0].key]
    for n, _ in stage.outputs:
        if stage.space[id(n)] == "F":
            return shapes[n.key]
    return ()


def _in_f(shape, strides, f_shape):
    """Shape/strides of an array broadcast to F (right-aligned, stride 0 where broadcast)."""
    pad = len(f_shape) - len(shape)
    out = []
    for d, n in enumerate(f_shape):
        if d < pad:
            out.append(0)
        else:
            m, st = shape[d - pad], strides[d - pad]
            out.append(0 if m == 1 and n != 1 else st)
    return out


def _row_strides(shape, strides, f_shape, axes):
    """Strides over F of a row-space array (reduced shape, keepdims or not)."""
    if len(shape) == len(f_shape):
        return [0 if d in axes else strides[d] for d in range(len(f_shape))]
    it = iter(range(len(shape)))
    return [0 if d in axes else strides[next(it)] for d in range(len(f_shape))]


def _collapse(dims: list[int], sizes, stride_sets) -> list[list[int]]:
    """Groups of adjacent dims (of ``dims``) that every array can index as one."""
    dims = [d for d in dims if sizes[d] != 1]
    groups: list[list[int]] = []
    for d in dims:
        if groups:
            outer = groups[-1][-1]
            if all(st[outer] == st[d] * sizes[d] for st in stride_sets):
                groups[-1].append(d)
                continue
        groups.append([d])
    return groups


class Layout:
    """Views of every array of a stage and the variant they call for."""

    def __init__(self, stage: Stage, f_shape, leaves, outputs):
        """``leaves``: arrays in ``stage.leaves`` order; ``outputs``: in stage order."""
        self.stage = stage
        axes = set(stage.axes)
        ndim = len(f_shape)
        kept = [d for d in range(ndim) if d not in axes]
        red = [d for d in range(ndim) if d in axes]
        entries = []  # (array, f-strides, is_row)
        for a in leaves:
            shape, strides, _ = array_meta(a)
            entries.append((a, _in_f(shape, strides, f_shape), False))
        for (node, _), a in zip(stage.outputs, outputs, strict=True):
            shape, strides, _ = array_meta(a)
            if stage.space[id(node)] == "row":
                entries.append((a, _row_strides(shape, strides, f_shape, axes), True))
            else:
                entries.append((a, _in_f(shape, strides, f_shape), False))
        kept_groups = _collapse(kept, f_shape, [e[1] for e in entries])
        red_groups = _collapse(red, f_shape, [e[1] for e in entries if not e[2]])
        self.kept_sizes = [int(np.prod([f_shape[d] for d in g])) for g in kept_groups]
        self.red_sizes = [int(np.prod([f_shape[d] for d in g])) for g in red_groups]
        self.n_kept = int(np.prod(self.kept_sizes, dtype=np.int64)) if kept else 1
        self.n_red = int(np.prod(self.red_sizes, dtype=np.int64)) if red else 1
        if not [d for d in kept if f_shape[d] == 0] and kept and not kept_groups:
            kept_groups, self.kept_sizes = [[kept[0]]], [1]
        if red and not red_groups:
            red_groups, self.red_sizes = [[red[0]]], [1]
        if stage.kind == "elementwise" and not kept_groups:
            kept_groups, self.kept_sizes = [[-1]], [int(np.prod(f_shape, dtype=np.int64))]
        if stage.kind == "full":
            kept_groups, self.kept_sizes = [], []

        def view(a, fstrides, is_row):
            groups = kept_groups if is_row else kept_groups + red_groups
            sizes = self.kept_sizes if is_row else self.kept_sizes + self.red_sizes
            strides = [fstrides[g[-1]] if g[-1] >= 0 else 0 for g in groups]
            if not groups:  # a full reduction's one-element output
                return make_view(a, (1,), (0,))
            return make_view(a, tuple(sizes), tuple(strides))

        self.views = [view(*e) for e in entries]
        self.row_views = [e[2] for e in entries]
        self.kept_rank = len(kept_groups)
        self.red_rank = len(red_groups)

    def variant(self) -> Variant:
        kind = self.stage.kind
        if kind == "elementwise":
            return Variant(kind, self.kept_rank, self.red_rank, vector=self.vector_width())
        if kind != "row":
            return Variant(kind, self.kept_rank, self.red_rank)
        mode = "warp" if self.n_red <= WARP_ROW_MAX else "block"
        groups = BLOCK // WARP if mode == "warp" else 1
        length = codegen.cache_length(self.stage, groups)
        cache = 0 < self.n_red <= length
        return Variant(kind, self.kept_rank, self.red_rank, mode, cache, self.row_vector_width())

    def row_vector_width(self) -> int:
        """4 when every row of every array is 4-byte, unit-stride, 16-byte aligned and a whole
        number of 16-byte vectors long, else 1."""
        if self.red_rank != 1 or self.n_red % 4:
            return 1
        for v, is_row in zip(self.views, self.row_views, strict=True):
            if is_row:
                continue
            _, strides, dtype = array_meta(v)
            kept_strides = strides[: self.kept_rank]
            if dtype.itemsize != 4 or strides[-1] != 4 or _address(v) % 16:
                return 1
            if any(st % 16 for st in kept_strides):
                return 1
        return 4

    def vector_width(self) -> int:
        """4 when every array is 1-D, unit-stride, 4-byte and 16-byte aligned, else 1."""
        if self.kept_rank != 1:
            return 1
        for v in self.views:
            shape, strides, dtype = array_meta(v)
            if dtype.itemsize != 4 or strides[0] != 4 or _address(v) % 16:
                return 1
        return 4

    def launch_config(self, variant: Variant):
        kind = variant.kind
        if kind == "elementwise":
            n = -(-self.n_kept // variant.vector)
            return max(1, min(-(-n // BLOCK), MAX_BLOCKS)), BLOCK
        if kind == "row":
            rows_per_block = BLOCK // WARP if variant.mode == "warp" else 1
            return max(1, min(-(-self.n_kept // rows_per_block), MAX_BLOCKS)), BLOCK
        if kind == "column":
            return max(1, min(-(-self.n_kept // COLUMN_BLOCK[0]), MAX_BLOCKS)), COLUMN_BLOCK
        return max(1, min(-(-self.n_red // BLOCK), MAX_FULL_BLOCKS)), BLOCK

    def sizes(self) -> list[int]:
        return [*self.kept_sizes, *self.red_sizes]


# --------------------------------------------------------------------------------------------
# predicted traffic


def predicted_bytes(stage: Stage, variant: Variant, layout: Layout, blocks: int) -> int:
    """Global bytes the generated kernel reads and writes (what the profiler must measure)."""
    passes = codegen.plan_passes(stage, codegen.uses_online(variant))
    cached = {n.key for n in codegen.multi_pass_leaves(stage)} if variant.cache else set()
    leaves = {n.key: n for n in stage.nodes if n.op is Op.INPUT}
    elements = layout.n_kept * layout.n_red
    total = 0
    if stage.kind == "elementwise":
        total += sum(n.dtype.itemsize for n in leaves.values()) * elements
    else:
        seen: set = set()
        for targets, _, _ in passes:
            for key in codegen.pass_leaves(targets):
                if key not in cached or key not in seen:
                    total += leaves[key].dtype.itemsize * elements
            seen |= codegen.pass_leaves(targets)
    for node, _ in stage.outputs:
        per_row = stage.space[id(node)] == "row"
        total += node.dtype.itemsize * (layout.n_kept if per_row else elements)
    if stage.kind == "full":
        for r in stage.reductions:
            width = codegen.acc_dtype(r).itemsize + (8 if r.op in ir.INDEX_REDUCE else 0)
            total += 2 * width * blocks  # each block writes its partial, the last reads all
        total += 2 * 4 * blocks + 4  # the ticket: one atomic per block, then a reset
    return total


def unfused_bytes(trace, shapes: dict) -> int:
    """Traffic of one kernel per op, each reading its operands and writing its result."""
    total = 0
    for n in trace.nodes:
        if n.op in ir.LEAF:
            continue
        size = int(np.prod(shapes[n.key], dtype=np.int64))
        total += size * n.dtype.itemsize
        for s in n.srcs:
            if s.op in (Op.CONST, Op.SCALAR, Op.COUNT):
                continue
            total += int(np.prod(shapes[s.key], dtype=np.int64)) * s.dtype.itemsize
    return total
