"""Chunk bookkeeping for the Dask layer: the array module of a chunk, chunk alignment across
arrays that broadcast, nested partials, and the record a Dask call keeps for ``explain``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def xp_of(a):
    """The array module of a chunk: CuPy for CuPy chunks, else NumPy."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def is_dask(a) -> bool:
    """True for a Dask array (without importing Dask for anything else)."""
    return type(a).__module__.split(".")[0] == "dask" and hasattr(a, "__dask_graph__")


def as_dask(a):
    """A Dask array of ``a``: itself, or one chunk of a NumPy or CuPy array."""
    import dask.array as da

    return a if is_dask(a) else da.from_array(a, chunks=a.shape, asarray=False)


def meta_of(arrays, ndim: int, dtype):
    """An empty chunk of the arrays' kind (NumPy or CuPy) with ``ndim`` axes and ``dtype``."""
    from dask.array.utils import meta_from_array

    base = next((a._meta for a in arrays if is_dask(a)), np.empty(0))
    return meta_from_array(base, ndim=ndim, dtype=dtype)


def nbytes_of(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def rechunk_moved(a, target) -> int:
    """Bytes that change chunk when ``a`` is rechunked to ``target``: of the old pieces that
    make one new chunk, all but the largest move (the largest can stay where it is)."""
    moved = 0
    item = a.dtype.itemsize
    for axis, (old, new) in enumerate(zip(a.chunks, target, strict=True)):
        if tuple(old) == tuple(new):
            continue
        other = nbytes_of(a.shape[:axis] + a.shape[axis + 1 :], np.uint8) * item
        edges = np.cumsum((0, *old))
        start = 0
        for size in new:
            lo, hi = start, start + size
            pieces = [
                min(hi, edges[i + 1]) - max(lo, edges[i])
                for i in range(len(old))
                if min(hi, edges[i + 1]) > max(lo, edges[i])
            ]
            moved += (size - max(pieces, default=0)) * other
            start = hi
    return int(moved)


def unify(arrays, ndim: int, trace: DaskExplain | None = None):
    """Align the chunks of arrays that broadcast together (right-aligned in ``ndim`` axes):
    along each axis, the chunks of the largest array that is not of length 1 there; the
    others are rechunked to them. Returns the arrays and the chunks of each axis."""
    chunks = []
    for j in range(ndim):
        best = None
        for a in arrays:
            d = j - (ndim - a.ndim)
            if d < 0 or a.shape[d] == 1:
                continue
            if best is None or a.nbytes > best[0].nbytes:
                best = (a, d)
        chunks.append(tuple(best[0].chunks[best[1]]) if best else (1,))
    out = []
    for a in arrays:
        lead = ndim - a.ndim
        target = tuple((1,) if a.shape[d] == 1 else chunks[lead + d] for d in range(a.ndim))
        if tuple(map(tuple, a.chunks)) != target:
            if trace is not None:
                trace.moved(rechunk_moved(a, target), f"rechunk {a.shape} to align chunks")
            a = a.rechunk(target)
        out.append(a)
    return out, tuple(chunks)


def broadcast_reads(a, out_blocks, ndim: int) -> int:
    """Bytes of ``a`` read by blocks of another chunk: a block that the output grid reads
    from several of its blocks (a broadcast weight, a vector along rows) is read once where
    it is and moved to every other one."""
    lead = ndim - a.ndim
    repeat = 1
    for j in range(ndim):
        d = j - lead
        if d < 0 or (a.shape[d] == 1 and a.numblocks[d] == 1):
            repeat *= out_blocks[j]
    return int(a.nbytes) * (repeat - 1)


def concat_nested(nested, axes, xp):
    """Concatenate the nested lists of a tree level (one list depth per reduced axis, in
    order) along those axes."""
    if not isinstance(nested, list):
        return nested
    parts = [concat_nested(n, axes[1:], xp) for n in nested]
    return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=axes[0])


@dataclass
class DaskExplain:
    """What a call on Dask arrays does, from ``tessera_tile.dask.explain``: the steps of its
    task graph, the kernels each step runs on one chunk (the fused function's or op's own
    ``explain`` on that chunk's shapes) and the bytes they move there, and the bytes moved
    between chunks (so between workers when the chunks live on different ones)."""

    tasks: int = 0
    steps: list[str] = field(default_factory=list)
    per_chunk: list = field(default_factory=list)  # (step, blocks, Explain of one chunk)
    decisions: list[str] = field(default_factory=list)  # rounds or rechunk, and why
    bytes_between_chunks: int = 0
    minimum_between_chunks: int = 0
    moves: list[tuple[int, str]] = field(default_factory=list)

    def moved(self, nbytes: int, why: str, minimum: int = 0) -> None:
        """Record ``nbytes`` moved between chunks, of which ``minimum`` any schedule needs."""
        if nbytes or minimum:
            self.moves.append((int(nbytes), why))
            self.bytes_between_chunks += int(nbytes)
            self.minimum_between_chunks += int(minimum)

    @property
    def kernels_per_chunk(self) -> int:
        return int(sum(e.kernels for _, _, e in self.per_chunk))

    @property
    def bytes_in_chunks(self) -> int:
        """Global-memory traffic of every kernel over every chunk (predicted per chunk shape by
        the kernels' own plans, times the chunks of that shape)."""
        return int(sum(blocks * e.bytes_fused for _, blocks, e in self.per_chunk))

    def __str__(self) -> str:
        lines = [
            f"{self.tasks} task(s); {len(self.steps)} step(s); bytes moved between chunks "
            f"{self.bytes_between_chunks} B (the reductions need at least "
            f"{self.minimum_between_chunks} B); kernel traffic inside chunks "
            f"{self.bytes_in_chunks} B"
        ]
        lines += [f"  step {i}: {s}" for i, s in enumerate(self.steps)]
        if self.per_chunk:
            lines.append("per chunk:")
            for step, blocks, e in self.per_chunk:
                lines.append(
                    f"  {step} x {blocks} chunk(s): {e.kernels} kernel(s), {e.bytes_fused} B "
                    "per chunk"
                )
                lines += [f"    kernel {i}: {s}" for i, s in enumerate(e.stages)]
        if self.moves:
            lines.append("between chunks:")
            lines += [f"  {b} B: {why}" for b, why in self.moves]
        if self.decisions:
            lines.append("why:")
            lines += [f"  - {d}" for d in self.decisions]
        return "\n".join(lines)


def stand_in(chunk_shape, dtype):
    """A NumPy array of a chunk's shape for ``explain`` (its memory is never touched)."""
    return np.empty(chunk_shape, dtype)


def largest_block(chunks) -> tuple[int, ...]:
    return tuple(max(c) if len(c) else 0 for c in chunks)
