"""Tile descriptors, global <-> shared staging, 16-byte vector accesses.

A :class:`Tile` describes a 2-D shared-memory tile: its shape, dtype, row padding and the way a
warp will read it. ``pad="auto"`` picks the smallest padding that makes that access pattern
conflict free under :func:`bank_conflict_degree` (32 banks of 4 bytes; the model lives in
:mod:`tessera_tile._device.banks`, shared with the simulator's profiler, and is re-exported here).

:func:`make_stager` turns a tile into Numba CUDA device functions that a whole block calls to
move the tile between global memory and shared memory::

    TILE = Tile((32, 32), np.float32, pad="auto", access="column")   # pad -> 1
    SHAPE = TILE.padded_shape                                          # (32, 33)
    stage = make_stager(TILE)

    @cuda.jit
    def transpose(src, dst):
        tile = cuda.shared.array(SHAPE, float32, alignment=16)  # 16-byte accesses, banks
        row0 = cuda.blockIdx.y * 32
        col0 = cuda.blockIdx.x * 32
        stage.global_to_shared(src, row0, col0, tile, 0)
        cuda.syncthreads()
        stage.shared_to_global_transposed(tile, dst, col0, row0)

Mapping (any block shape; ``tid`` is the linear thread index): the tile is cut into chunks of
``16 // itemsize`` consecutive elements of a row (one 16-byte vector), and consecutive threads take
consecutive chunks, so a warp reads contiguous global memory::

    tile row 0:  | t0 x4 | t1 x4 | t2 x4 | ... | t7 x4 |
    tile row 1:  | t8 x4 | t9 x4 | ...
                 (float32, TILE_N = 32: 8 threads per row, a warp covers 4 rows)

A chunk that lies inside the array, on a contiguous row and at a 16-byte aligned address moves
with one 128-bit instruction (``LDG.E.128`` / ``STG.E.128``); any other chunk moves element by
element, with elements beyond the array edge never touched (``global_to_shared`` writes ``fill``
into shared memory for them). Alignment is decided at run time from the address.

:func:`load16` / :func:`store16` (global) and :func:`load16_shared` / :func:`store16_shared` are the
inline-PTX vector intrinsics underneath; each has a simulator twin (they live in
:mod:`tessera_tile._device.vector_access` and are re-exported here). :func:`carve` cuts a tile (any
shape, C order) out of a 1-D shared array: dynamic shared memory, which holds tiles past 48 KiB
(:mod:`tessera_tile.dynamic_shared`), is one such array.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np
from numba import cuda
from numba.np import numpy_support

from ._device.banks import BANK_BYTES, BANKS, Access, bank_conflict_degree, request_wavefronts
from ._device.carve import carve
from ._device.intrinsics import thread_rank
from ._device.vector_access import (
    VECTOR_BYTES,
    aligned16,
    load16,
    load16_shared,
    store16,
    store16_shared,
)

__all__ = [
    "BANKS",
    "BANK_BYTES",
    "SUPPORTED_DTYPES",
    "Stager",
    "Tile",
    "aligned16",
    "bank_conflict_degree",
    "carve",
    "load16",
    "load16_shared",
    "make_stager",
    "request_wavefronts",
    "store16",
    "store16_shared",
]

MAX_AUTO_PAD = 32  # elements; a 32-bank cycle is always enough to find the best pitch

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32))

# -------------------------------------------------------------------------------------------
# Tile descriptor
# -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    """A 2-D shared-memory tile: ``shape`` = ``(TILE_M, TILE_N)`` elements of ``dtype``.

    Parameters
    ----------
    shape:
        ``(rows, cols)``, positive ints.
    dtype:
        float16, float32, float64 or int32 (anything ``np.dtype`` accepts).
    pad:
        extra elements at the end of each row (the row pitch is ``cols + pad``), or ``"auto"``
        for the smallest padding that makes ``access`` conflict free (see
        :func:`bank_conflict_degree`). After construction ``pad`` holds the resolved number.
    access:
        how warps will read the tile: ``"row"`` (consecutive lanes, consecutive columns) or
        ``"column"`` (consecutive lanes, consecutive rows: a transpose, a column reduction).
    vector:
        elements a lane accesses at once (1, 2, 4, ...; at most 16 bytes). With ``"row"`` they
        are one vector access, so each row must start 16-byte aligned: padding keeps that.

    >>> Tile((32, 32), np.float32, pad="auto", access="column").padded_shape
    (32, 33)
    """

    shape: tuple[int, int]
    dtype: np.dtype
    pad: int | Literal["auto"] = 0
    access: Access = "row"
    vector: int = 1

    def __post_init__(self) -> None:
        shape = self.shape
        if not isinstance(shape, tuple | list) or len(shape) != 2:
            raise TypeError(f"Tile shape must be a (rows, cols) tuple, got {shape!r}")
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in shape):
            raise TypeError(f"Tile shape must hold ints, got {shape!r}")
        shape = (int(shape[0]), int(shape[1]))
        if min(shape) <= 0:
            raise ValueError(f"Tile shape must be positive, got {shape}")
        try:
            dt = np.dtype(self.dtype)
        except TypeError as e:
            raise TypeError(f"Tile dtype {self.dtype!r} is not a dtype") from e
        if dt not in SUPPORTED_DTYPES:
            names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
            raise TypeError(f"Tile dtype must be one of {names}, got {dt}")
        if self.access not in ("row", "column"):
            raise ValueError(f"Tile access must be 'row' or 'column', got {self.access!r}")
        v = self.vector
        if not isinstance(v, int | np.integer) or isinstance(v, bool):
            raise TypeError(f"Tile vector must be an int, got {v!r}")
        v = int(v)
        if v < 1 or v & (v - 1) or v * dt.itemsize > VECTOR_BYTES:
            raise ValueError(
                f"Tile vector must be a power of two with vector * itemsize <= {VECTOR_BYTES} "
                f"bytes, got {v} x {dt.itemsize} bytes"
            )
        along = shape[1] if self.access == "row" else shape[0]
        if along % v:
            raise ValueError(
                f"Tile vector {v} must divide the tile's "
                f"{'cols' if self.access == 'row' else 'rows'} ({along})"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "vector", v)
        pad = self.pad
        if pad == "auto":
            pad = self._auto_pad()
        elif isinstance(pad, int | np.integer) and not isinstance(pad, bool):
            pad = int(pad)
            if pad < 0:
                raise ValueError(f"Tile pad must be >= 0 or 'auto', got {pad}")
            if not self._aligned(pad):
                raise ValueError(
                    f"Tile pad {pad} breaks the {v * dt.itemsize}-byte alignment that vector={v} "
                    "row accesses need: use a multiple of the vector width or 'auto'"
                )
        else:
            raise TypeError(f"Tile pad must be an int or 'auto', got {pad!r}")
        object.__setattr__(self, "pad", pad)

    def _aligned(self, pad: int) -> bool:
        return self.access == "column" or (self.shape[1] + pad) % self.vector == 0

    def _auto_pad(self) -> int:
        best = None
        for pad in range(MAX_AUTO_PAD + 1):
            if not self._aligned(pad):
                continue
            degree = self._degree(pad)
            if degree == 1:
                return pad
            if best is None or degree < best[0]:
                best = (degree, pad)
        return best[1]

    def _degree(self, pad: int) -> int:
        rows, cols = self.shape
        return bank_conflict_degree(
            (rows, cols + pad), self.dtype, self.access, self.vector, cols=cols
        )

    @property
    def padded_shape(self) -> tuple[int, int]:
        """``(rows, cols + pad)``: the shape to give ``cuda.shared.array``."""
        return (self.shape[0], self.shape[1] + self.pad)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the padded tile, rounded up to 16 (what a second tile after it must skip)."""
        raw = self.padded_shape[0] * self.padded_shape[1] * self.itemsize
        return -(-raw // VECTOR_BYTES) * VECTOR_BYTES

    @property
    def conflict_degree(self) -> int:
        """:func:`bank_conflict_degree` of the declared access on this tile (1 = conflict free)."""
        return self._degree(self.pad)

    @property
    def vector_elements(self) -> int:
        """Elements in one 16-byte vector of this dtype."""
        return VECTOR_BYTES // self.itemsize


# -------------------------------------------------------------------------------------------
# Staging device functions
# -------------------------------------------------------------------------------------------


class Stager(ModuleType):
    """Device functions that stage one :class:`Tile` (from :func:`make_stager`).

    A module object, so kernels can call ``stage.global_to_shared(...)`` on a module-level
    ``stage`` (Numba resolves attributes of module globals at compile time). All functions are
    called by every thread of the block, with the same arguments; put ``cuda.syncthreads()``
    between a write of the shared tile and reads of it by other threads.

    ``global_to_shared(src, row0, col0, shared, fill)``
        ``shared[i, j] = src[row0 + i, col0 + j]`` for the tile, ``fill`` (cast to the dtype)
        where ``(row0 + i, col0 + j)`` is outside ``src``.
    ``shared_to_global(shared, dst, row0, col0)``
        ``dst[row0 + i, col0 + j] = shared[i, j]`` where inside ``dst``.
    ``shared_to_global_transposed(shared, dst, row0, col0)``
        ``dst[row0 + j, col0 + i] = shared[i, j]`` where inside ``dst`` (the tile's columns
        become rows of ``dst``; threads walk the tile's columns, so pad it for ``"column"``).
    ``shared_to_registers(shared, row, col, regs)``, ``registers_to_shared(regs, shared, row, col)``
        one thread's sub-tile ``shared[row:row+R, col:col+C]`` <-> ``regs``, a
        ``cuda.local.array((R, C), dtype)`` (constant shape: it lives in registers).

    ``row0, col0 >= 0``; arrays are 2-D with the tile's dtype. Declare the shared array with
    ``alignment=16`` when its pitch is a whole number of 16-byte vectors: staging then uses
    ``STS.128`` / ``LDS.128`` too. Into a padded (unaligned) pitch a 16-byte chunk is stored
    element by element. Each walk keeps 16-byte chunks per lane only where the bank model says
    its shared accesses are conflict free on this pitch, and otherwise moves one element per
    lane (the model's plain ``"row"``/``"column"`` access): so a pitch the model calls conflict
    free is staged without conflicts in every direction. ``row_vector`` and ``column_vector``
    say which walk was chosen (elements per lane).
    """

    tile: Tile
    row_vector: int
    column_vector: int


def _gather(vector: int, along_rows: bool):
    """Device function reading ``vector`` consecutive shared elements (along a row or down a
    column) into a tuple."""
    di, dj = (0, 1) if along_rows else (1, 0)  # constants: Numba folds the zero steps away
    if vector == 1:
        fn = lambda s, i, j: (s[i, j],)
    elif vector == 2:
        fn = lambda s, i, j: (s[i, j], s[i + di, j + dj])
    elif vector == 4:
        fn = lambda s, i, j: (
            s[i, j], s[i + di, j + dj], s[i + 2 * di, j + 2 * dj], s[i + 3 * di, j + 3 * dj]
        )  # fmt: skip
    else:
        fn = lambda s, i, j: (
            s[i, j], s[i + di, j + dj], s[i + 2 * di, j + 2 * dj], s[i + 3 * di, j + 3 * dj],
            s[i + 4 * di, j + 4 * dj], s[i + 5 * di, j + 5 * dj], s[i + 6 * di, j + 6 * dj],
            s[i + 7 * di, j + 7 * dj],
        )  # fmt: skip
    return cuda.jit(device=True)(fn)


def _walk_vectors(tile: Tile) -> tuple[int, int]:
    """Elements per lane of the stager's row walk (``global_to_shared``, ``shared_to_global``)
    and of its column walk (``shared_to_global_transposed``).

    A walk moves whole 16-byte chunks per lane where the tile's shape allows it and the bank
    model says the chunked shared accesses are conflict free on this pitch; otherwise it moves
    one element per lane (consecutive lanes on consecutive elements of the walk), which is the
    model's plain ``"row"`` / ``"column"`` access, the one ``pad="auto"`` makes conflict free.
    So a tile whose pitch the model calls conflict free for a direction is staged without
    conflicts in that direction, whatever its shape and dtype.
    """
    (rows, cols), shape = tile.shape, tile.padded_shape
    v = VECTOR_BYTES // tile.itemsize

    def conflict_free(access, vector, scalar=False):
        degree = bank_conflict_degree(shape, tile.dtype, access, vector, scalar=scalar, cols=cols)
        return degree == 1

    def choose(access, along, scalar=False):
        if along % v or v == 1:
            return 1
        if conflict_free(access, v, scalar) or not conflict_free(access, 1):
            return v  # chunks cost no more than single elements here: keep the 16-byte global side
        return 1

    aligned = shape[1] % v == 0  # chunks go to shared memory as one 16-byte store
    return choose("row", cols, scalar=not aligned), choose("column", rows)


@functools.cache
def make_stager(tile: Tile) -> Stager:
    """The staging device functions of ``tile`` (memoised: one set per distinct tile).

    See :class:`Stager` for the functions and the module docstring for the thread mapping.
    """
    if not isinstance(tile, Tile):
        raise TypeError(f"make_stager needs a Tile, got {tile!r}")
    TILE_M, TILE_N = tile.shape
    PITCH = tile.padded_shape[1]
    ITEMSIZE = tile.itemsize
    NBT = numpy_support.from_dtype(tile.dtype)  # the Numba type: casts fill values
    V = VECTOR_BYTES // ITEMSIZE
    # Rows split into whole 16-byte chunks, or element by element when they do not.
    VG, VT = _walk_vectors(tile)
    VEC_G = VG > 1
    VEC_T = VT > 1
    VEC_S = VEC_G and PITCH % V == 0  # shared rows can be 16-byte aligned
    CPR = TILE_N // VG
    CHUNKS = TILE_M * CPR
    CPR_T = TILE_M // VT
    CHUNKS_T = TILE_N * CPR_T
    gather_row = _gather(VG, True)
    gather_col = _gather(VT, False)

    @cuda.jit(device=True)
    def store_chunk(dst, gr, gc, vals, width, contiguous):
        # vals: VECTOR elements for dst[gr, gc:gc + VECTOR]; only those inside dst are written.
        m, n = dst.shape
        if gr < m:
            for k in range(width):
                if gc + k < n:
                    dst[gr, gc + k] = vals[k]

    @cuda.jit(device=True)
    def store_chunk16(dst, gr, gc, vals, width, contiguous):
        m, n = dst.shape
        if gr < m and gc + width <= n and contiguous and aligned16(dst, (gr, gc)):
            store16(dst, (gr, gc), vals)
        elif gr < m:
            for k in range(width):
                if gc + k < n:
                    dst[gr, gc + k] = vals[k]

    @cuda.jit(device=True)
    def load_row16(shared, r, c):
        if aligned16(shared, (r, c)):
            return load16_shared(shared, (r, c))
        return gather_row(shared, r, c)

    @cuda.jit(device=True)
    def global_to_shared_scalar(src, row0, col0, shared, fill):
        tid, nthreads = thread_rank()
        m, n = src.shape
        fill_value = NBT(fill)
        q = tid
        while q < TILE_M * TILE_N:  # no range(): its trip count divides by nthreads
            r = q // TILE_N
            c = q - r * TILE_N
            x = fill_value
            if row0 + r < m and col0 + c < n:
                x = src[row0 + r, col0 + c]
            shared[r, c] = x
            q += nthreads

    @cuda.jit(device=True)
    def global_to_shared16(src, row0, col0, shared, fill):
        tid, nthreads = thread_rank()
        m, n = src.shape
        fill_value = NBT(fill)
        contiguous = src.strides[1] == ITEMSIZE
        q = tid
        while q < CHUNKS:
            r = q // CPR
            c = (q - r * CPR) * VG
            gr = row0 + r
            gc = col0 + c
            if gr < m and gc + VG <= n and contiguous and aligned16(src, (gr, gc)):
                vals = load16(src, (gr, gc))
                if VEC_S and aligned16(shared, (r, c)):
                    store16_shared(shared, (r, c), vals)
                else:
                    for k in range(VG):
                        shared[r, c + k] = vals[k]
            else:
                for k in range(VG):
                    x = fill_value
                    if gr < m and gc + k < n:
                        x = src[gr, gc + k]
                    shared[r, c + k] = x
            q += nthreads

    put = store_chunk16 if VEC_G else store_chunk
    put_t = store_chunk16 if VEC_T else store_chunk
    get_row = load_row16 if VEC_S else gather_row

    @cuda.jit(device=True)
    def shared_to_global(shared, dst, row0, col0):
        tid, nthreads = thread_rank()
        contiguous = dst.strides[1] == ITEMSIZE
        q = tid
        while q < CHUNKS:
            r = q // CPR
            c = (q - r * CPR) * VG
            put(dst, row0 + r, col0 + c, get_row(shared, r, c), VG, contiguous)
            q += nthreads

    @cuda.jit(device=True)
    def shared_to_global_transposed(shared, dst, row0, col0):
        tid, nthreads = thread_rank()
        contiguous = dst.strides[1] == ITEMSIZE
        q = tid
        while q < CHUNKS_T:
            j = q // CPR_T  # tile column = dst row
            i = (q - j * CPR_T) * VT  # tile row = dst column
            put_t(dst, row0 + j, col0 + i, gather_col(shared, i, j), VT, contiguous)
            q += nthreads

    global_to_shared = global_to_shared16 if VEC_G else global_to_shared_scalar

    @cuda.jit(device=True)
    def shared_to_registers(shared, row, col, regs):
        for a in range(regs.shape[0]):
            for b in range(regs.shape[1]):
                regs[a, b] = shared[row + a, col + b]

    @cuda.jit(device=True)
    def registers_to_shared(regs, shared, row, col):
        for a in range(regs.shape[0]):
            for b in range(regs.shape[1]):
                shared[row + a, col + b] = regs[a, b]

    stager = Stager(f"tessera_tile.memory.stager_{TILE_M}x{TILE_N}_{tile.dtype}_pad{tile.pad}")
    stager.tile = tile
    stager.row_vector, stager.column_vector = VG, VT
    stager.global_to_shared = global_to_shared
    stager.shared_to_global = shared_to_global
    stager.shared_to_global_transposed = shared_to_global_transposed
    stager.shared_to_registers = shared_to_registers
    stager.registers_to_shared = registers_to_shared
    return stager
