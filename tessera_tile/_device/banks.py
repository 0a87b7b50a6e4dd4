"""The shared-memory bank and wavefront model, shared by :mod:`tessera_tile.memory` (the
analytic model that picks tile padding) and :mod:`tessera_tile.sim` (the profiler that measures
kernels), so that both count the same way.

Shared memory has 32 banks of 4 bytes. A warp-wide request is served in phases of 128 bytes:
4-byte (or narrower) accesses form one phase of 32 lanes, 8-byte accesses two phases of 16 lanes
(half-warps), 16-byte accesses four phases of 8 lanes (quarter-warps). A phase takes as many
wavefronts as the largest number of distinct 4-byte words it touches in one bank (lanes reading
the same word share it); a request takes the sum over its phases, ideally one per phase.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np

__all__ = [
    "BANKS",
    "BANK_BYTES",
    "bank_conflict_degree",
    "lanes_per_phase",
    "phase_wavefronts",
    "request_wavefronts",
    "wavefronts",
]

BANKS = 32
BANK_BYTES = 4
WARP_SIZE = 32
MAX_MODEL_WARPS = 1024  # warps of a walk the model looks at (a 128 x 256 tile)

Access = Literal["row", "column"]


# -- one request -------------------------------------------------------------------------------


def lanes_per_phase(width: int) -> int:
    """Lanes served together for accesses of ``width`` bytes (128 bytes per phase)."""
    return 32 if width <= 4 else (16 if width <= 8 else 8)


def phase_wavefronts(accesses) -> list[int]:
    """Wavefronts of each phase of one warp-wide request, in phase order.

    ``accesses`` holds ``(lane, byte_offset, width)``; the widest access sets the phase size.
    """
    per_phase = lanes_per_phase(max(w for _, _, w in accesses))
    phases: dict[int, dict[int, set]] = {}
    for lane, off, w in accesses:
        banks = phases.setdefault(lane // per_phase, {})
        for word in range(off // BANK_BYTES, (off + w - 1) // BANK_BYTES + 1):
            banks.setdefault(word % BANKS, set()).add(word)
    return [max(len(words) for words in phases[p].values()) for p in sorted(phases)]


def wavefronts(accesses) -> tuple[int, int]:
    """(wavefronts, ideal wavefronts) of one warp-wide shared request.

    ``accesses`` holds ``(lane, byte_offset, width)``; the ideal is one wavefront per phase.
    """
    counts = phase_wavefronts(accesses)
    return sum(counts), len(counts)


# -- the analytic model of a warp walking a tile -------------------------------------------------


def _request(padded_shape, cols, itemsize, access, vector, scalar, start):
    """The shared requests one warp makes, as lists of ``(lane, byte_offset, width)``.

    ``row``: lanes walk the tile in row-major order from ``start``, each lane taking ``vector``
    consecutive elements of a row (one access of ``vector * itemsize`` bytes, or ``vector``
    one-element accesses when ``scalar``). ``column``: lanes walk in column-major order, each
    taking ``vector`` consecutive elements down a column (always one element per access).
    """
    rows, pitch = padded_shape
    r0, c0 = start
    lane_elems: list[tuple[int, list[tuple[int, int]]]] = []
    for lane in range(WARP_SIZE):
        if access == "row":
            pos = r0 * cols + c0 + lane * vector
            r, c = divmod(pos, cols)
            elems = [(r, c + k) for k in range(vector)]
        else:
            pos = c0 * rows + r0 + lane * vector
            c, r = divmod(pos, rows)
            elems = [(r + k, c) for k in range(vector)]
        if all(r < rows and c < cols for r, c in elems):
            lane_elems.append((lane, elems))
    if not lane_elems:
        return []
    if access == "row" and not scalar and vector > 1:
        return [[(lane, (e[0][0] * pitch + e[0][1]) * itemsize, vector * itemsize)
                 for lane, e in lane_elems]]  # fmt: skip
    return [
        [(lane, (e[k][0] * pitch + e[k][1]) * itemsize, itemsize) for lane, e in lane_elems]
        for k in range(vector)
    ]


def _check_model_args(padded_shape, dtype, access, vector, cols):
    rows, pitch = (int(d) for d in padded_shape)
    dt = np.dtype(dtype)
    if access not in ("row", "column"):
        raise ValueError(f"access must be 'row' or 'column', got {access!r}")
    if vector < 1:
        raise ValueError(f"vector must be >= 1, got {vector}")
    cols = pitch if cols is None else int(cols)
    if not 0 < cols <= pitch or rows <= 0:
        raise ValueError(f"bad padded shape {padded_shape} for {cols} columns")
    return (rows, pitch), dt.itemsize, cols


def _starts(rows, cols, access, vector):
    """Where each warp's walk begins when consecutive warps take consecutive stretches."""
    per_warp = WARP_SIZE * vector
    starts = []
    for w in range(min(-(-rows * cols // per_warp), MAX_MODEL_WARPS)):
        p = w * per_warp
        starts.append(divmod(p, cols) if access == "row" else divmod(p, rows)[::-1])
    return starts


def request_wavefronts(
    padded_shape: tuple[int, int],
    dtype,
    access: Access = "row",
    vector: int = 1,
    *,
    scalar: bool = False,
    cols: int | None = None,
    start: tuple[int, int] = (0, 0),
) -> list[tuple[int, int]]:
    """``(wavefronts, ideal)`` of each shared request one warp makes from ``start``.

    The same figures as :attr:`tessera_tile.sim.Profile.shared_wavefronts` for the same access:
    ``sum(w - ideal)`` over a kernel's requests is what the profiler reports as bank conflicts.
    ``cols`` is the logical column count (default: all of ``padded_shape[1]``); see
    :func:`bank_conflict_degree` for the access patterns.
    """
    shape, itemsize, cols = _check_model_args(padded_shape, dtype, access, vector, cols)
    reqs = _request(shape, cols, itemsize, access, vector, scalar, start)
    return [wavefronts(r) for r in reqs]


def bank_conflict_degree(
    padded_shape: tuple[int, int],
    dtype,
    access: Access = "row",
    vector: int = 1,
    *,
    scalar: bool = False,
    cols: int | None = None,
) -> int:
    """Worst-case wavefronts per 128-byte phase of a warp-wide shared request (1 = conflict free).

    4-byte accesses form one phase per warp, 8-byte ones two (half-warps), 16-byte ones four
    (quarter-warps), so for 4-byte elements the result is the number of wavefronts per request,
    and in general the n of an n-way conflict (see the module docstring for the model).

    Parameters
    ----------
    padded_shape:
        ``(rows, row pitch in elements)`` of the shared array.
    dtype:
        element type (its itemsize is what matters).
    access:
        ``"row"``: the 32 lanes of a warp walk the tile in row-major order, lane ``l`` taking
        elements ``l*vector .. l*vector+vector-1`` of the walk (consecutive lanes, consecutive
        columns; a row shorter than the warp wraps to the next row). ``"column"``: lanes walk in
        column-major order (consecutive lanes, consecutive rows), each taking ``vector``
        elements down the column, one element per access.
    vector:
        elements per lane. With ``"row"`` they are one ``vector * itemsize``-byte access unless
        ``scalar`` (then ``vector`` separate one-element accesses, as after a 16-byte global load).
    cols:
        logical columns when the pitch includes padding (default ``padded_shape[1]``).

    The worst case is taken over the warps of a block that walks the whole tile this way
    (warp ``w`` starts at element ``32 * vector * w`` of the walk).

    >>> bank_conflict_degree((32, 32), np.float32, "column")
    32
    >>> bank_conflict_degree((32, 33), np.float32, "column")
    1
    """
    shape, itemsize, cols = _check_model_args(padded_shape, dtype, access, vector, cols)
    return _degree(shape, itemsize, cols, access, vector, bool(scalar))


@functools.lru_cache(maxsize=4096)
def _degree(shape, itemsize, cols, access, vector, scalar) -> int:
    worst = 1
    seen = set()
    for start in _starts(shape[0], cols, access, vector):
        for req in _request(shape, cols, itemsize, access, vector, scalar, start):
            base = req[0][1] - req[0][1] % (BANKS * BANK_BYTES)
            key = tuple((lane, off - base, w) for lane, off, w in req)
            if key not in seen:  # requests that differ by whole bank cycles cost the same
                seen.add(key)
                worst = max(worst, *phase_wavefronts(req))
    return worst
