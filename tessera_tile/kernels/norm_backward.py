"""Layer-norm and RMS-norm backward over the last axis: hand-written, x and dy read once.

Why hand-written: differentiated by the composer, a layer norm's backward is five kernels that
read x and dy several times, because the weight's and bias's gradients (sums over the rows)
and dx (over the columns) are reductions along different axes. Here one kernel computes dx and
the blocks' column partials of both, and a small one folds the partials:

::

    a group of G threads per row (32 to 1,024: the fewest that give each thread
      at most 8 elements of a row, 4 of float64), 256 / G groups per block of 256 (one group
      of 512 or 1,024);
      grid = at most 512 threads per SM of the GPU, every block looping over rows
    thread t holds the same columns of every row: C accesses of W elements (16-byte loads where
      rows are contiguous and aligned, else W = 1), its elements of the weight loaded once
    per row, in registers: the statistics recomputed as the forward computes them (layer norm:
      the mean, then the corrected two-pass variance; RMS norm: the mean square), then
      sum(g) and sum(g * xhat) over the row (g = dy * weight, xhat the normalised x):
        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))       (RMS norm: no mean(g))
      dweight += dy * xhat, dbias += dy, accumulated in registers across the block's rows
    end: the groups' sums added in shared memory in group order, and each block writes its
      column partials, (grads, blocks, n) in the compute dtype; the fold kernel sums them over
      the blocks in block order: deterministic

So x and dy are read once, dx written once, the weight read once per block and the partials
written and read once (on a GPU they stay in L2): the minimum, with the partials as small as
the grid. Recomputing the statistics costs no memory traffic, so the forward saves nothing for
the backward. Every thread runs the same number of iterations (a group past the last row
computes zeros and stores nothing), so the barriers of the group sums are reached by all.

Computation is in float32 for float16 and float32 rows, float64 for float64 rows; sums over a
row combine the warps' partials in warp order (the same result on every run).
"""

from __future__ import annotations

import functools
import linecache

import numpy as np
from numba import cuda, float32, float64

from .._device.numerics import rsqrt_approx
from .._runtime import config as _config
from .._runtime import target
from ..memory import load16, store16
from ._named import NamedKernels

GROUPS = (32, 64, 128, 256, 512)  # threads per row
SLOTS = 5  # scratch slots of a row's sums: layer norm's mean, (s1, s2) and (a, b)
BLOCK = 256  # threads per block (a group of 512: 512)
# elements of a row per thread at most (float64: 4): with the thread's weight, its two
# gradients' sums, x and dy they take about 80 registers (16 spilled in a block of 512)
ELEMENTS = {np.dtype(np.float64): 4}
MAX_ELEMENTS = 8
FOLD_THREADS = 128
FULL_MASK = 0xFFFFFFFF
# Threads a grid may have: 512 per SM of the GPU (each block reads the weight once and writes
# one row of partials per gradient, so fewer, fuller blocks move fewer bytes); in the
# simulator two blocks of 256, so that tests' blocks loop over rows.
GRID_THREADS = 2 * BLOCK if _config.SIMULATED else target.GPU_SMS * 2 * BLOCK


# Both fit a launch bound of 1,024 threads at 8 float32 or float16 a thread in 16-byte accesses
# (64 registers at most; RMS norm 59, 0 spills on sm_80 and sm_90); single-element accesses
# (24 to 300 B of spills) and float64 (24 to 176 B) stay at 512. Layer norm's spilled 12 B
# holding its weight for all rows and g across the row's last sums, so a group of 1,024 reads
# its weight again for each row (from the cache: 32 KiB at most) and adds to the gradients'
# sums before those sums: 64 registers, 0 spills.
LARGEST_GROUP = {"layer": 1024, "rms": 1024}


def weight_per_row(kind: str, group: int) -> bool:
    """Whether ``kind``'s kernel with groups of ``group`` threads reads its weight for each
    row (layer norm's group of 1,024), not once before its rows."""
    return kind == "layer" and group >= 1024


@functools.lru_cache(maxsize=256)
def shape(kind: str, n: int, dtype, vector: bool) -> tuple[int, int, int, int] | None:
    """``(threads, group, accesses, width)`` for ``kind``'s rows of ``n`` elements of ``dtype``
    (``vector``: rows contiguous, 16-byte aligned, ``n`` a multiple of the 16-byte width); None
    when a row does not fit the registers of the largest group."""
    dtype = np.dtype(dtype)
    width = 16 // dtype.itemsize if vector else 1
    limit = ELEMENTS.get(dtype, MAX_ELEMENTS)
    for group in (*GROUPS, 1024):
        if group > LARGEST_GROUP[kind] or group == 1024 and (width == 1 or dtype == np.float64):
            break
        accesses = -(-n // (group * width))
        if accesses * width <= limit:
            return max(group, BLOCK), group, accesses, width
    return None


def blocks(rows: int, threads: int, group: int) -> int:
    """Blocks of the grid: a group per row at most, and at most ``GRID_THREADS`` threads (but
    a block of 1,024 on every SM)."""
    rows_at_once = threads // group
    cap = max(GRID_THREADS // threads, 1 if _config.SIMULATED else target.GPU_SMS)
    return max(1, min(-(-rows // rows_at_once), cap))


@functools.cache
def kernel(kind: str, dtype, threads: int, group: int, accesses: int, width: int, grads: tuple):
    """``kernel(x, dy, weight, dx, partials, eps)`` for ``kind`` ``"layer"`` or ``"rms"``;
    ``grads``: which of ``("weight", "bias")`` get gradients (a weight absent: a 1-element
    placeholder, never read). x, dy, dx: (rows, n); partials: (len(grads), blocks, n)."""
    dtype = np.dtype(dtype)
    ct = float64 if dtype == np.float64 else float32
    warps, group_warps = threads // 32, group // 32
    zero = ct(0.0)
    if ct is float32:  # one MUFU per row, as the forward (docs/fusion.md)
        inverse_sqrt = rsqrt_approx
    else:

        @cuda.jit(device=True)
        def inverse_sqrt(v):
            return float64(1.0) / v**0.5

    @cuda.jit(device=True)
    def butterfly(a, lanes):
        """The sum of ``a`` over each run of ``lanes`` lanes (a power of two), in every lane of
        the run: an xor butterfly, whose every step adds two values the same way in both
        lanes, so that all lanes get the same bits."""
        offset = lanes // 2
        while offset > 0:
            a += cuda.shfl_xor_sync(FULL_MASK, a, offset)
            offset //= 2
        return a

    @cuda.jit(device=True)
    def to_scratch(a, scratch, slot):
        """A warp's sum (the same in all its lanes) into the scratch."""
        if cuda.threadIdx.x & 31 == 0:
            scratch[slot * warps + (cuda.threadIdx.x >> 5)] = a

    @cuda.jit(device=True)
    def from_scratch(scratch, slot):
        """The sum of the group's warps' sums: lane k takes warp k modulo the group's warps,
        so every run of that many lanes holds them all and adds them alike."""
        warp = cuda.threadIdx.x >> 5
        at = slot * warps + warp - warp % group_warps + (cuda.threadIdx.x & 31) % group_warps
        return butterfly(scratch[at], group_warps)

    # Each call site of a row's sums has slots of its own in the scratch (``slot``), so one
    # barrier per sum is enough: a thread writes a site's slots again only in the next row,
    # after the barriers of the row's other sites, which every reader of them passes first.
    @cuda.jit(device=True)
    def group_sum1(a, scratch, slot):
        """The sum of ``a`` over the thread's group, in each of its threads (the same bits).
        Every thread of the block calls it (a group of several warps meets at a barrier)."""
        a = butterfly(a, 32)
        if group_warps == 1:
            return a
        to_scratch(a, scratch, slot)
        cuda.syncthreads()
        return from_scratch(scratch, slot)

    @cuda.jit(device=True)
    def group_sum(a, b, scratch, slot):
        """:func:`group_sum1` of two values (slots ``slot`` and ``slot + 1``), at one barrier."""
        a, b = butterfly(a, 32), butterfly(b, 32)
        if group_warps == 1:
            return a, b
        to_scratch(a, scratch, slot)
        to_scratch(b, scratch, slot + 1)
        cuda.syncthreads()
        return from_scratch(scratch, slot), from_scratch(scratch, slot + 1)

    name = f"{kind}_norm_backward_{dtype.name}_t{threads}_g{group}_c{accesses}_w{width}"
    name += "".join(f"_d{g}" for g in grads)
    source = _source(kind, threads, group, accesses, width, grads)
    filename = f"<{name}>"  # in linecache: explain shows the source, as of any kernel
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    columns = group * accesses * width  # the most a row may have
    namespace = {
        "cuda": cuda, "ct": ct, "zero": zero, "load16": load16, "store16": store16,
        "group_sum": group_sum, "group_sum1": group_sum1, "inverse_sqrt": inverse_sqrt,
        "SCRATCH": SLOTS * warps, "SUMS": max(len(grads), 1) * columns,
    }  # fmt: skip
    exec(compile(source, filename, "exec"), namespace)
    fn = namespace["norm_backward"]
    fn.__name__ = fn.__qualname__ = name
    # the block size as a launch bound: ptxas then budgets registers for it
    bounds = {} if _config.SIMULATED else {"launch_bounds": (threads,)}
    return cuda.jit(fn, **bounds)


def _source(kind, threads, group, accesses, width, grads) -> str:
    """The kernel's text: every access of the thread's columns written out (the elements live
    in registers, which a loop over a local array would not keep them in)."""
    has_weight = "weight" in grads  # a weight always gets its gradient
    per_row = weight_per_row(kind, group)
    groups = threads // group
    elems = [(c, k) for c in range(accesses) for k in range(width)]
    lines: list[str] = []

    def s(line: str, depth: int = 1) -> None:
        lines.append("    " * depth + line)

    def each(fmt: str, depth: int = 1) -> None:
        for c, k in elems:
            s(fmt.format(e=f"{c}_{k}", c=c), depth)

    def chunk(names: str, array: str, at: str, ok: str, depth: int) -> None:
        """Load access c of ``array`` into ``names{c}_k`` where ``ok{c}`` (else zeros)."""
        for c in range(accesses):
            targets = ", ".join(f"{names}{c}_{k}" for k in range(width))
            where = at.format(c=c)
            load = f"load16({array}, ({where},))" if width > 1 else f"{array}[{where}]"
            s(f"if {ok.format(c=c)}:", depth)
            s(f"{targets} = {load}", depth + 1)
            s("else:", depth)
            s(f"{targets} = {', '.join(['zero'] * width)}", depth + 1)

    def total(fmt: str) -> str:
        return " + ".join(fmt.format(e=f"{c}_{k}") for c, k in elems)

    s("def norm_backward(x, dy, weight, dx, partials, eps):", 0)
    s(f"lane = cuda.threadIdx.x % {group}")
    s(f"group = cuda.threadIdx.x // {group}")
    s("n = x.shape[1]")
    s("inv_n = ct(1.0) / ct(n)")
    s("scratch = cuda.shared.array(SCRATCH, ct)")
    for c in range(accesses):
        s(f"jc{c} = ({c * group} + lane) * {width}")
        s(f"ok{c} = jc{c} < n")
    if has_weight and not per_row:
        chunk("w", "weight", "jc{c}", "ok{c}", 1)
        each("w{e} = ct(w{e})")
    for g in grads:
        each(f"{g[0]}acc{{e}} = zero")
    s(f"span = cuda.gridDim.x * {groups}")
    s("for step in range((x.shape[0] + span - 1) // span):  # the same count in every thread")
    s(f"row = (step * cuda.gridDim.x + cuda.blockIdx.x) * {groups} + group", 2)
    s("live = row < x.shape[0]", 2)
    for c in range(accesses):
        s(f"in{c} = live and ok{c}", 2)
    chunk("x", "x", "row, jc{c}", "in{c}", 2)
    chunk("g", "dy", "row, jc{c}", "in{c}", 2)
    each("x{e} = ct(x{e})", 2)
    each("g{e} = ct(g{e})", 2)
    if kind == "layer":  # as the forward: the mean, then the corrected two-pass variance
        s(f"mean = group_sum1({total('x{e}')}, scratch, 0) * inv_n", 2)
        for c, k in elems:  # an element past the row is 0, not -mean
            s(f"d{c}_{k} = x{c}_{k} - mean if ok{c} else zero", 2)
        s(f"s1, s2 = group_sum({total('d{e}')}, {total('d{e} * d{e}')}, scratch, 1)", 2)
        s("error = s1 * inv_n", 2)
        s("rstd = inverse_sqrt(s2 * inv_n - error * error + ct(eps))", 2)
        each("h{e} = (d{e} - error) * rstd", 2)
    else:
        s(f"ss = group_sum1({total('x{e} * x{e}')}, scratch, 0)", 2)
        s("rstd = inverse_sqrt(ss * inv_n + ct(eps))", 2)
        each("h{e} = x{e} * rstd", 2)
    if has_weight and per_row:
        chunk("w", "weight", "jc{c}", "in{c}", 2)
        each("w{e} = ct(w{e})", 2)
    each("p{e} = g{e} * w{e}" if has_weight else "p{e} = g{e}", 2)

    def accumulate() -> None:  # a row past the last, or a column past the row, adds zeros
        for g in grads:
            each(f"{g[0]}acc{{e}} += g{{e}} * h{{e}}" if g == "weight" else "bacc{e} += g{e}", 2)

    if per_row:  # before the row's last sums: g is not held across their barrier
        accumulate()
    if kind == "layer":
        s(f"a, b = group_sum({total('p{e}')}, {total('p{e} * h{e}')}, scratch, 3)", 2)
        s("ma, mb = a * inv_n, b * inv_n", 2)
    else:  # RMS norm has no mean(g)
        s(f"ma, mb = zero, group_sum1({total('p{e} * h{e}')}, scratch, 1) * inv_n", 2)
    for c in range(accesses):
        vals = [f"rstd * (p{c}_{k} - ma - h{c}_{k} * mb)" for k in range(width)]
        s(f"if in{c}:", 2)
        if width > 1:
            s(f"store16(dx, (row, jc{c}), ({', '.join(vals)},))", 3)
        else:
            s(f"dx[row, jc{c}] = {vals[0]}", 3)
    if not per_row:
        accumulate()
    s("block = cuda.blockIdx.x")
    if not grads:
        return "\n".join(lines) + "\n"
    if groups == 1:  # the block's partials are the thread's sums
        for i, g in enumerate(grads):
            for c in range(accesses):
                s(f"if ok{c}:")
                for k in range(width):
                    s(f"partials[{i}, block, jc{c} + {k}] = {g[0]}acc{c}_{k}", 2)
        return "\n".join(lines) + "\n"
    # the groups' sums added in shared memory in group order, then written by every thread
    s("sums = cuda.shared.array(SUMS, ct)")
    s(f"for turn in range({groups}):")
    s("if group == turn:", 2)
    for i, g in enumerate(grads):
        for c, k in elems:
            at = f"{i * group * accesses * width} + jc{c} + {k}"
            s(f"sums[{at}] = {g[0]}acc{c}_{k} + (sums[{at}] if turn > 0 else zero)", 3)
    s("cuda.syncthreads()", 2)
    s(f"for j in range(cuda.threadIdx.x, n, {threads}):")
    for i in range(len(grads)):
        s(f"partials[{i}, block, j] = sums[{i * group * accesses * width} + j]", 2)
    return "\n".join(lines) + "\n"


@functools.cache
def fold(dtype, grads: int):
    """``fold(partials, first, second)``: each column's partials summed over the blocks in
    block order, into ``first`` (and ``second`` where ``grads`` is 2) of ``dtype``."""
    dtype = np.dtype(dtype)
    ct = float64 if dtype == np.float64 else float32

    def norm_backward_fold(partials, first, second):
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if j >= partials.shape[2]:
            return
        s = ct(0.0)
        for b in range(partials.shape[1]):
            s += partials[0, b, j]
        first[j] = s
        if grads == 2:
            s = ct(0.0)
            for b in range(partials.shape[1]):
                s += partials[1, b, j]
            second[j] = s

    norm_backward_fold.__name__ = norm_backward_fold.__qualname__ = (
        f"norm_backward_fold{grads}_{dtype.name}"
    )
    return cuda.jit(norm_backward_fold)


# Variants by name, for the compile tier (tests/compile/cases.py).
def _named(kind: str, dtype, n: int, vector: bool, grads: tuple):
    return kernel(kind, dtype, *shape(kind, n, dtype, vector), grads)


NAMED = NamedKernels(
    __name__,
    {
        "layer_f32_768": lambda: _named("layer", np.float32, 768, True, ("weight", "bias")),
        "layer_f16_4096": lambda: _named("layer", np.float16, 4096, True, ("weight", "bias")),
        "layer_f64_1000": lambda: _named("layer", np.float64, 1000, False, ("weight",)),
        "rms_f32_8192": lambda: _named("rms", np.float32, 8192, True, ("weight",)),
        "layer_f32_8192": lambda: _named("layer", np.float32, 8192, True, ("weight", "bias")),
        "fold2_f32": lambda: fold(np.float32, 2),
        "fold1_f16": lambda: fold(np.float16, 1),
    },
)
__getattr__ = NAMED.module_getattr
