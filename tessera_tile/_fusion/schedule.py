"""Scheduling: every decision about how one stage runs, made here and only here.

For a stage (from :mod:`.plan`) and the geometry of one call's arrays (a ``Layout`` from
:mod:`.runtime`) this module chooses

* the **variant**: a warp or a block per row, the row kept on chip or read once per pass,
  16-byte vector accesses or not (part of the compiled kernel's cache key);
* the **passes** over each row (:mod:`.passes`), and what a row kept on chip holds between
  them: the values later passes reuse (a residual sum) or the leaves they read;
* the **rewrites**: a softmax-style normaliser folded into the pass of its maximum
  (:class:`~.passes.Online`) when rows are not kept on chip, and one reciprocal per row for
  every division by a per-row value;
* the shared **scratch** and row caches the kernel declares, and the row-invariant leaves
  (weights) a row kernel's block copies into shared memory once, before its rows;
* the **launch configuration** and the **traffic** the kernel will move.

The templates (:mod:`.templates`) render a :class:`Schedule` and decide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import tile_ir as ir
from .._runtime import config as _config
from .._runtime.target import GPU_SMS, VECTOR_BYTES
from ..tile_ir import Node, Op
from . import lower
from .passes import (
    Moments,
    Online,
    Pass,
    cached_leaves,
    kept_values,
    pass_leaves,
    plan_passes,
    words,
)
from .plan import Stage, StageKind

WARP = 32
BLOCK = 256  # threads per block in every template but column (and rows past WIDE_ROW)
COLUMN_BLOCK = (32, 8)  # a column stage of several passes: a block spans every row
# A one-pass column stage splits its rows across blocks ("split" mode): each thread loads
# COLUMN_UNROLL rows of 16 bytes (`vector` adjacent columns) before folding any (64 B in
# flight), blocks of 256 threads write per-block partials, and the last block of each column
# tile folds them in split order (deterministic). Enough splits for COLUMN_TARGET_BLOCKS
# blocks (4 per SM of a 132-SM H100), while every thread keeps COLUMN_SPLIT_ITERATIONS
# unrolled iterations to amortise the partials.
COLUMN_UNROLL = 4
COLUMN_TARGET_BLOCKS = 4 if _config.SIMULATED else 4 * GPU_SMS
COLUMN_SPLIT_ITERATIONS = 1 if _config.SIMULATED else 2
WARP_ROW_MAX = 1024  # rows up to this long get a warp each, longer rows a block
ROW_REGISTERS = 32  # 4-byte registers per lane that may hold a row's leaves (as Triton's BLOCK)
CACHE_BYTES = 32768  # shared memory that keeps a row on chip between passes
# Shared memory for the row-invariant leaves (a (C,) weight against (N, C) rows) that a
# warp-mode block stages once for its rows: with CACHE_BYTES and the scratch, a block stays
# under the 48 KiB of static shared memory. Rows of up to 1,024 elements (warp mode) have at
# most 8 KiB of float32 weight and bias; a register row, which has no cache, may stage more
# (a bias, a weight and a bias: 12 KiB).
BROADCAST_BYTES = 8192
# Grid caps. On a GPU: enough blocks to fill the largest parts several times over. In the
# simulator every block runs in turn, so a few blocks (grid-stride loops do the rest).
MAX_BLOCKS = 8 if _config.SIMULATED else 4096
# A row kernel whose blocks read row-invariant leaves (a norm's weight and bias) once, into
# shared memory or registers, loops over rows in a grid of at most this many threads: two
# blocks of 256 per SM of a 132-SM H100 or H200. Every block then serves many rows (about 16
# at 4,096 rows of 768 or of 4,096: the weights' re-reads are 1/16 of a row input's bytes per
# weight), and a register row's thread still has 64 B or more of each row input in flight
# (32 KiB an SM), where a memory-bound kernel needs about 22 KiB an SM (Little's law at
# 4.8 TB/s and about 600 ns).
REUSE_GRID_THREADS = MAX_BLOCKS * BLOCK if _config.SIMULATED else GPU_SMS * 2 * BLOCK
WIDE_ROW = 4096  # rows longer than this get a block of 2 * BLOCK threads (see choose_variant)
MAX_FULL_BLOCKS = 4 if _config.SIMULATED else 1024


@dataclass(frozen=True)
class Variant:
    """Layout and strategy of one compiled kernel (part of its cache key)."""

    kind: StageKind
    kept_rank: int  # index dimensions left after collapsing (elementwise: all in kept)
    red_rank: int
    mode: str = ""  # row: "warp" or "block"; column: "split" (rows split across blocks) or ""
    cache: bool = False  # row: keep multi-pass leaves in shared memory
    vector: int = 1  # elements per 16-byte load/store (contiguous and aligned)
    index_bits: int = 64  # width of the loop indices (elementwise and row kernels): 32 or 64
    chunks: int = 0  # row, warp: each lane holds its part of the row in registers, `chunks`
    # accesses of `vector` elements, fully unrolled (0: rows stream through loops)
    exact: bool = False  # the row length is exactly 32 * chunks * vector: no bounds guards
    math: str = "fast"  # "fast": the approximations of the numerics policy; "ieee": libdevice
    broadcast: tuple = ()  # row: positions in stage.leaves of the row-invariant leaves the
    # block stages into shared memory once, before its rows, and every row reads from there
    broadcast_length: int = 0  # elements each of their shared arrays holds (>= n_red)
    invariant: tuple = ()  # row: positions of the leaves that are the same row for every row
    # (a norm's weight): passed as 1-D arrays of the row, indexed by the row position alone
    held: tuple = ()  # register row: positions of the invariant leaves each thread loads
    # once, before its block's loop over rows, and keeps in registers
    threads: int = BLOCK  # threads per block

    @property
    def reuses_invariants(self) -> bool:
        """Whether the blocks read row-invariant leaves once for all their rows (staged in
        shared memory or held in registers): the grid is then capped and loops over rows."""
        return bool(self.broadcast or self.held)


# --------------------------------------------------------------------------------------------
# rewrites


def reciprocals(stage: Stage) -> dict[str, Node]:
    """Float divisions of F-space values by a per-row value: node key -> the divisor.

    The kernel computes the divisor's reciprocal once per row and multiplies (the result may
    differ from an IEEE division in the last bit).
    """
    space = stage.space
    return {
        n.key: n.srcs[1]
        for n in stage.nodes
        if n.op is Op.TRUEDIV
        and space[id(n)] == "F"
        and space[id(n.srcs[1])] == "row"
        and lower.is_float(n.dtype)
    }


def approximated(stage: Stage) -> frozenset:
    """float32 nodes written with hardware approximations (see docs/fusion.md, numerics
    policy): ``exp(f - max(f))`` over the reduced axes, whose argument is at most 0 (or NaN),
    by ``ex2.approx``; ``sigmoid`` and ``silu``, whose divisor ``1 + exp(-x)`` is at least 1,
    by one ``rcp.approx`` (exp itself stays libdevice's: its argument is unbounded); a
    per-row ``rsqrt`` and division (layer norm's ``rsqrt(var + eps)``, ``sum / n``) by one
    ``rsqrt.approx`` or ``rcp.approx`` per row."""
    out = set()
    for n in stage.nodes:
        if lower.compute_dtype(n.dtype) != np.dtype(np.float32):
            continue
        per_row = stage.space[id(n)] == "row"
        if n.op in (Op.SIGMOID, Op.SILU) or (n.op in (Op.RSQRT, Op.TRUEDIV) and per_row):
            out.add(n.key)
        if n.op is not Op.EXP:
            continue
        sub = n.srcs[0]
        if sub.op is not Op.SUB:
            continue
        f, peak = sub.srcs
        if peak.op is Op.MAX and peak.srcs[0].key == f.key and peak.arg[1]:
            out.add(n.key)
    return frozenset(out)


# --------------------------------------------------------------------------------------------
# the row cache


def cache_length(stage: Stage, groups: int, broadcast: frozenset = frozenset()) -> int:
    """Row elements the on-chip cache holds for ``groups`` rows per block (0: no cache): a
    multiple of 16, so every row of every cache starts 16-byte aligned (16-byte accesses)."""
    per = sum(n.dtype.itemsize for n in cached_leaves(stage, broadcast))
    return CACHE_BYTES // (groups * per) // VECTOR_BYTES * VECTOR_BYTES if per else 0


# --------------------------------------------------------------------------------------------
# variant and launch configuration


def _vector_width(views, kept_rank: int, rows_only: bool) -> int:
    """Elements per 16-byte access when every array allows one, else 1.

    ``views`` holds (shape, strides, dtype, address, is_row). Elementwise stages need 1-D,
    unit-stride, 16-byte aligned arrays of one item size, 2 or 4 bytes (8 float16 or 4 float32
    per access); row stages need unit-stride rows whose other strides keep every row 16-byte
    aligned (per-row outputs are written one element a row).
    """
    sizes = set()
    for _, strides, dtype, address, is_row in views:
        if rows_only and is_row:
            continue
        size = dtype.itemsize
        sizes.add(size)
        if size not in (2, 4) or strides[-1] != size or address % VECTOR_BYTES:
            return 1
        if rows_only and any(st % VECTOR_BYTES for st in strides[:kept_rank]):
            return 1
    return VECTOR_BYTES // sizes.pop() if len(sizes) == 1 else 1


INDEX32_LIMIT = 2**31  # index spaces below this many elements use 32-bit loop indices


def index_bits(n_kept: int, n_red: int) -> int:
    """32 when every loop index of the kernel fits in 32 bits with room for one grid stride
    (an index reaches at most the size plus one stride), else 64: a separate specialisation."""
    return 32 if n_kept * max(n_red, 1) < INDEX32_LIMIT else 64


MATH_MODES = ("fast", "ieee")


class Param(NamedTuple):
    """One parameter of a stage's kernel: the writer names it, the launch plan passes it."""

    name: str
    role: str  # "leaf", "out", "partial", "ticket", "scalar", "kept" or "red" (the sizes)
    index: int  # in stage.leaves, stage.outputs, stage.scalars or the collapsed sizes
    dtype: np.dtype | None = None  # of a partial or the ticket


def parameters(stage: Stage, variant: Variant) -> tuple[Param, ...]:
    """The kernel's parameters, in order: the arrays (leaves, then outputs), a full stage's
    partials per block and its ticket, the scalars, the collapsed kept and reduced sizes."""
    params = [Param(f"in{i}", "leaf", i) for i in range(len(stage.leaves))]
    params += [Param(f"out{i}", "out", i) for i in range(len(stage.outputs))]
    if has_partials(variant):
        split = variant.mode == "split"
        shifts = {t.key for t in lower.moment_sums(stage.nodes).values()} if split else set()
        for i, r in enumerate(stage.reductions):
            params.append(Param(f"part{i}", "partial", i, lower.acc_dtype(r)))
            if r.op in ir.INDEX_REDUCE:
                params.append(Param(f"parti{i}", "partial", i, np.dtype(np.int64)))
            elif r.key in shifts:  # a variance's sum(f) holds mean - shift, parti the shift
                params.append(Param(f"parti{i}", "partial", i, lower.acc_dtype(r)))
        params.append(Param("ticket", "ticket", 0, np.dtype(np.int32)))
    params += [Param(f"s{i}", "scalar", i) for i in range(len(stage.scalars))]
    params += [Param(f"dk{i}", "kept", i) for i in range(variant.kept_rank)]
    params += [Param(f"dr{i}", "red", i) for i in range(variant.red_rank)]
    return tuple(params)


def has_partials(variant: Variant) -> bool:
    """Whether the kernel takes partials and a ticket (full stages, split column stages)."""
    return variant.kind.scratch or variant.mode == "split"


def splits_rows(stage: Stage) -> bool:
    """A column stage whose rows can be split across blocks: one pass of plain reductions
    (no online normaliser, no per-element output), so partials combine after the loop."""
    passes = plan_passes(stage, True, True)
    return (
        len(passes) == 1
        and not passes[0].outputs
        and bool(passes[0].reductions)
        and not any(isinstance(r, Online) for r in passes[0].reductions)
    )


def _column_vector(layout) -> int:
    """Elements per 16-byte load along the innermost kept (contiguous) axis of a column
    stage: every array of one item size (2 or 4 bytes), unit stride and 16-byte aligned there,
    every other stride a multiple of 16 bytes, the innermost kept extent a multiple of the
    vector; else 1. Per-column outputs are stored one element at a time."""
    last = layout.kept_rank - 1
    sizes = set()
    for _, strides, dtype, address, is_row in layout.views:
        if is_row:
            continue
        size = dtype.itemsize
        sizes.add(size)
        if size not in (2, 4) or strides[last] != size or address % VECTOR_BYTES:
            return 1
        if any(st % VECTOR_BYTES for k, st in enumerate(strides) if k != last):
            return 1
    vector = VECTOR_BYTES // sizes.pop() if len(sizes) == 1 else 1
    return vector if layout.kept_sizes[-1] % vector == 0 else 1


def column_block(vector: int) -> tuple[int, int]:
    """(x, y) threads of a split column block: 16 column groups of 16 bytes (a warp reads two
    rows of 256 contiguous bytes), or 32 columns of one element (one 128-byte row)."""
    return (32, 8) if vector == 1 else (16, 16)


def column_grid(vector: int, n_kept: int, n_red: int) -> tuple[int, int]:
    """(column tiles, row splits) of a split column launch; blocks = tiles * splits."""
    tx, ty = column_block(vector)
    tiles = max(1, -(-(n_kept // vector) // tx))
    rows = COLUMN_SPLIT_ITERATIONS * COLUMN_UNROLL * ty  # the fewest rows worth a split
    return tiles, max(1, min(-(-COLUMN_TARGET_BLOCKS // tiles), n_red // rows))


def scratch_lengths(variant: Variant, n_kept: int, n_red: int, blocks: int) -> tuple[int, int]:
    """Elements of each partials array and of the ticket a launch allocates."""
    if variant.kind.scratch:
        return blocks, 1
    tiles, splits = column_grid(variant.vector, n_kept, n_red)
    return (splits * n_kept, tiles) if splits > 1 else (1, 1)  # one split writes no partial


def choose_variant(stage: Stage, layout, math: str = "fast", mode: str | None = None) -> Variant:
    """The variant of ``stage`` over ``layout``; ``mode`` (a row stage's "warp" or "block" per
    row) where the caller has chosen it."""
    kind, kept_rank, red_rank = stage.kind, layout.kept_rank, layout.red_rank
    bits = index_bits(layout.n_kept, layout.n_red)
    if kind is StageKind.ELEMENTWISE:
        vector = _vector_width(layout.views, kept_rank, False) if kept_rank == 1 else 1
        if any(n.op in ir.GENERATED for n in stage.nodes):  # made from the element's index
            vector = 1
        return Variant(kind, kept_rank, red_rank, vector=vector, index_bits=bits, math=math)
    if kind is StageKind.COLUMN and splits_rows(stage):
        vector = _column_vector(layout)
        return Variant(kind, kept_rank, red_rank, "split", vector=vector, math=math)
    if kind is not StageKind.ROW:
        return Variant(kind, kept_rank, red_rank, math=math)
    mode = mode or ("warp" if layout.n_red <= WARP_ROW_MAX else "block")
    vector = 1
    if red_rank == 1:
        vector = _vector_width(layout.views, kept_rank, True)
        if layout.n_red % vector:
            vector = 1
    # Rows past WIDE_ROW get twice the threads: at 8,192 elements a thread then holds 16 of
    # each leaf, which leaves room in its registers for the norms' weights (see held).
    threads = 2 * BLOCK if mode == "block" and layout.n_red > WIDE_ROW else BLOCK
    lanes = WARP if mode == "warp" else threads  # threads sharing a row
    chunks = register_chunks(stage, layout.n_red, vector, lanes) if red_rank == 1 else 0
    # the register row's bucket, else the row length rounded up to a power of two
    length = lanes * chunks * vector if chunks else 1 << max(layout.n_red - 1, 31).bit_length()
    # A warp-mode block holds several rows and stages their shared weights in shared memory
    # once; a block-mode block holds one row at a time and, when its row is in registers,
    # keeps its part of the weights in registers across its rows.
    invariant = row_invariant_leaves(stage, layout)
    # a register row keeps no row cache: its staged leaves may have that shared memory too
    budget = BROADCAST_BYTES + (CACHE_BYTES if chunks else 0)
    staged = broadcast_leaves(stage, invariant, length, budget) if mode == "warp" else ()
    held = held_leaves(stage, invariant, chunks * vector) if mode == "block" else ()
    shared = dict(
        broadcast=staged,
        broadcast_length=length if staged else 0,
        invariant=invariant,
        math=math,
        held=held,
        threads=threads,
    )
    groups = threads // WARP if mode == "warp" else 1
    staged_keys = frozenset(stage.leaves[i].key for i in staged)
    cache = 0 < layout.n_red <= cache_length(stage, groups, staged_keys)
    # A warp's registers cannot hold the row's kept values (softmax's backward keeps y and dy:
    # 8 B per float32 element), nor shared memory the block's rows: a block per row holds them
    # in its threads' registers, so each row is read once, not once per pass.
    block_row = red_rank == 1 and register_chunks(stage, layout.n_red, vector, BLOCK)
    if mode == "warp" and not chunks and not cache and block_row:
        return choose_variant(stage, layout, math, mode="block")
    if chunks:  # the row lives in registers: no shared cache, no loops over it
        exact = layout.n_red == length
        return Variant(
            kind, kept_rank, red_rank, mode, False, vector, bits, chunks, exact, **shared
        )
    return Variant(kind, kept_rank, red_rank, mode, cache, vector, bits, **shared)


def row_invariant_leaves(stage: Stage, layout) -> tuple:
    """Positions (in ``stage.leaves``) of the leaves that are one row for every row: views
    whose strides over every kept axis are 0, over one reduced axis. The kernel takes them as
    1-D arrays, so their addresses need no row term and, when contiguous, no stride multiply."""
    if layout.red_rank != 1 or layout.kept_rank < 1 or layout.n_red == 0:
        return ()
    leaves = layout.views[: len(stage.leaves)]
    return tuple(
        i
        for i, (_, strides, dtype, *_) in enumerate(leaves)
        if all(st == 0 for st in strides[: layout.kept_rank]) and dtype.kind in "fiu"
    )


def broadcast_leaves(stage: Stage, invariant: tuple, length: int, budget: int) -> tuple:
    """The row-invariant leaves a warp-mode block stages in shared memory once, when all of
    them fit ``budget`` bytes at ``length`` elements each."""
    size = sum(stage.leaves[i].dtype.itemsize for i in invariant) * length
    return invariant if invariant and size <= budget else ()


def held_leaves(stage: Stage, invariant: tuple, per_thread: int) -> tuple:
    """The row-invariant leaves a register row's threads load once and keep across rows, when
    they and the row's kept values together fit twice the registers a row may use (a thread
    holds ``per_thread`` elements of each); else none, and every row loads them again."""
    if not per_thread or not invariant:
        return ()
    leaves = [stage.leaves[i] for i in invariant]
    need = per_thread * (words(kept_values(stage)) + words(leaves))
    return invariant if need <= 2 * ROW_REGISTERS else ()


def register_chunks(stage: Stage, n_red: int, vector: int, lanes: int) -> int:
    """Accesses per thread when a row shared by ``lanes`` threads (a warp, or a block for
    rows over 1,024) fits in their registers (rows bucketed to a power of two of accesses per
    thread, bounds-guarded below it), else 0. Only rows read by several passes gain from it; a
    one-pass row streams. What stays resident is the leaves several passes read; a leaf one
    pass reads (a norm's weight) is loaded where it is used."""
    kept = kept_values(stage)
    if not kept or n_red == 0:
        return 0
    need = -(-n_red // (lanes * vector))
    chunks = 1 << (need - 1).bit_length()
    return chunks if chunks * vector * words(kept) <= ROW_REGISTERS else 0


def row_keeping(stage: Stage, variant: Variant, n_red: int) -> str | None:
    """Why a row stage of several passes keeps its rows on chip as it does, or reads them once
    per pass (what ``explain`` gives as a reason); None for a stage of one pass."""
    if stage.kind is not StageKind.ROW or len(plan_passes(stage)) < 2:
        return None
    broadcast = frozenset(stage.leaves[i].key for i in variant.broadcast)
    kept, leaves = kept_values(stage), cached_leaves(stage, broadcast)
    if not kept:  # no pass reads what an earlier one did
        return None
    values = f"({', '.join(n.op.name.lower() for n in kept)}: {4 * words(kept)} B per element)"
    size = sum(n.dtype.itemsize for n in leaves)
    inputs = f"{len(leaves)} input row(s) ({size} B per element)"
    if variant.cache:
        return f"rows of {n_red} stay in shared memory as their {inputs}"
    if variant.chunks and {n.key for n in kept} == {n.key for n in leaves}:
        return f"rows of {n_red} stay in registers as their {inputs}"
    if variant.chunks:
        return (
            f"rows of {n_red} stay in registers as the values later passes reuse {values}, "
            f"rather than the {inputs} they are computed from"
        )
    return (
        f"rows of {n_red} are read once per pass: the values later passes reuse {values} do "
        f"not fit {ROW_REGISTERS} registers per thread, nor do the {inputs} fit "
        f"{CACHE_BYTES // 1024} KiB of shared memory per block"
    )


def invariant_reading(variant: Variant, n_kept: int, blocks: int) -> str | None:
    """How a row kernel reads its row-invariant leaves (a norm's weight and bias), for
    ``explain``; None when it has none."""
    if not variant.invariant:
        return None
    leaves = f"{len(variant.invariant)} row-invariant input(s) (a (C,) weight or bias)"
    if variant.reuses_invariants:
        where = "staged in shared memory" if variant.broadcast else "held in registers"
        return f"{leaves} read once per block, {where}: {blocks} block(s) for {n_kept} row(s)"
    return (
        f"{leaves} read again for every row: with the row they do not fit the block's "
        "registers or shared memory"
    )


def launch_config(variant: Variant, n_kept: int, n_red: int):
    """(blocks, threads) of one launch."""
    kind = variant.kind
    if kind is StageKind.ELEMENTWISE:
        n = -(-n_kept // variant.vector)
        return max(1, min(-(-n // BLOCK), MAX_BLOCKS)), BLOCK
    if kind is StageKind.ROW:
        threads = variant.threads
        blocks = max(1, -(-n_kept // (threads // WARP if variant.mode == "warp" else 1)))
        if variant.reuses_invariants:  # fewer blocks, each reading the weights for many rows
            return min(blocks, REUSE_GRID_THREADS // threads), threads
        if variant.mode == "block" or variant.chunks:  # a block (warp) per row
            return blocks, threads
        return min(blocks, MAX_BLOCKS), threads
    if kind is StageKind.COLUMN and variant.mode == "split":
        tiles, splits = column_grid(variant.vector, n_kept, n_red)
        return tiles * splits, column_block(variant.vector)
    if kind is StageKind.COLUMN:
        return max(1, min(-(-n_kept // COLUMN_BLOCK[0]), MAX_BLOCKS)), COLUMN_BLOCK
    return max(1, min(-(-n_red // BLOCK), MAX_FULL_BLOCKS)), BLOCK


# --------------------------------------------------------------------------------------------
# the schedule of one kernel


@dataclass(frozen=True)
class Schedule:
    """Everything the templates need to render one stage variant."""

    stage: Stage
    variant: Variant
    passes: list[Pass]
    cached: frozenset  # leaf keys kept in the on-chip row cache
    cache_length: int  # row elements each cache holds (per row of the block)
    resident: frozenset  # leaf keys a register row holds (read once)
    broadcast: frozenset  # leaf keys staged in shared memory once per block
    held: frozenset  # leaf keys each thread loads once per block and keeps in registers
    invariant: frozenset  # leaf keys passed as 1-D rows (row-invariant)
    approx: frozenset  # keys of nodes written with hardware approximations
    approx_reciprocal: bool  # per-row float32 reciprocals with rcp.approx
    rows_per_block: int
    scratch: dict  # shared scratch array name -> type name
    reciprocals: dict  # TRUEDIV key -> divisor node


def schedule(stage: Stage, variant: Variant) -> Schedule:
    streamed = variant.kind in (StageKind.ROW, StageKind.COLUMN)
    online = streamed and not variant.cache and not variant.chunks
    passes = plan_passes(stage, online, variant.mode == "split")
    if variant.kind is StageKind.FULL:
        assert len(passes) <= 1 or not passes[1].reductions, "full stages reduce once"
    rows = variant.threads // WARP if variant.mode == "warp" else 1
    broadcast = frozenset(stage.leaves[i].key for i in variant.broadcast)
    cached = frozenset(n.key for n in cached_leaves(stage, broadcast) if variant.cache)
    reductions = [r for p in passes for r in p.reductions]
    scratch: dict[str, str] = {}
    if variant.kind in (StageKind.COLUMN, StageKind.FULL) or variant.mode == "block":
        for r in reductions:
            t = lower.TYPE_NAMES[lower.acc_dtype(r)]
            scratch.setdefault(f"scratch_{t}", t)
            if r.op in ir.INDEX_REDUCE:
                scratch["scratch_index"] = "int64"
            elif isinstance(r, Online):  # the running sums of online normalisers
                scratch[f"scratch_{t}_b"] = t
            elif isinstance(r, Moments):  # M2 and the shift beside the mean
                scratch[f"scratch_{t}_b"] = t
                scratch[f"scratch_{t}_c"] = t
    return Schedule(
        stage,
        variant,
        passes,
        cached,
        cache_length(stage, rows, broadcast) if cached else 0,
        frozenset(n.key for n in stage.leaves) if variant.chunks else frozenset(),
        broadcast,
        frozenset(stage.leaves[i].key for i in variant.held),
        frozenset(stage.leaves[i].key for i in variant.invariant),
        approximated(stage) if variant.math == "fast" else frozenset(),
        variant.math == "fast",
        rows,
        scratch,
        reciprocals(stage),
    )


# --------------------------------------------------------------------------------------------
# traffic


def predicted_bytes(sched: Schedule, n_kept: int, n_red: int, blocks: int) -> int:
    """Global bytes the generated kernel reads and writes (what the profiler must measure)."""
    stage = sched.stage
    leaves = {n.key: n for n in stage.leaves}
    elements = n_kept * n_red
    total = 0
    if stage.kind is StageKind.ELEMENTWISE:
        total += sum(n.dtype.itemsize for n in leaves.values()) * elements
    else:
        once = sched.broadcast | sched.held
        for key in once:  # each block reads the row once
            total += leaves[key].dtype.itemsize * n_red * blocks
        seen: set = set()
        for p in sched.passes:
            for key in pass_leaves(p.targets):
                if key in once:
                    continue
                kept = key in sched.cached or key in sched.resident
                if not kept or key not in seen:
                    total += leaves[key].dtype.itemsize * elements
            seen |= pass_leaves(p.targets)
    for node, _ in stage.outputs:
        per_row = stage.space[id(node)] == "row"
        total += node.dtype.itemsize * (n_kept if per_row else elements)
    # bytes of one partial: every partials array the kernel takes (a variance: 3 values)
    width = sum(p.dtype.itemsize for p in parameters(stage, sched.variant) if p.role == "partial")
    if stage.kind.scratch:
        total += 2 * width * blocks  # each block writes its partial, the last reads all
        total += 2 * 4 * blocks + 4  # the ticket: one atomic per block, then a reset
    elif sched.variant.mode == "split":
        splits = blocks // column_grid(sched.variant.vector, n_kept, n_red)[0]
        if splits > 1:  # each block writes its columns' partials, the last of a tile reads
            # every split's; one atomic on the tile's (fresh, zeroed) ticket per block
            total += 2 * width * splits * n_kept + 2 * 4 * blocks
    return total


def unfused_bytes(trace, shapes: dict) -> int:
    """Traffic of one kernel per op, each reading its operands and writing its result
    (values of scalars alone are computed on the host: no kernel)."""
    total = 0
    for n in trace.nodes:
        if n.op in ir.LEAF or ir.on_host(n):
            continue
        total += int(np.prod(shapes[n.key], dtype=np.int64)) * n.dtype.itemsize
        for s in n.srcs:
            if s.op not in (Op.CONST, Op.SCALAR, Op.COUNT):
                total += int(np.prod(shapes[s.key], dtype=np.int64)) * s.dtype.itemsize
    return total
