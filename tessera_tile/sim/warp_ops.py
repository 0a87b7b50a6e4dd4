"""The semantics of warp-level operations, as pure functions of the participating lanes.

Each function takes ``args``, a dict from lane (0..31) to that lane's arguments, and returns a
dict from lane to result. The engine calls them once every lane named in the mask that has not
exited has arrived (PTX ISA, "Parallel Synchronization and Communication Instructions":
``shfl.sync``, ``vote.sync``, ``match.sync`` wait for the non-exited threads of the mask), so
``args`` holds the participating lanes: lanes that exited, or that do not exist in a partial
warp, are absent from it. Integer results are typed as Numba types them (:mod:`.ints`).
"""

from __future__ import annotations

import numpy as np

from .ints import NARROW

_INT32 = NARROW[np.int32]
_UINT32 = NARROW[np.uint32]

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF

# Numba's shfl_*_sync call PTX shfl.sync with these (mode, c) operands.
SHUFFLE_MODES = {
    "shfl_sync": ("idx", 0x1F),
    "shfl_up_sync": ("up", 0x00),
    "shfl_down_sync": ("down", 0x1F),
    "shfl_xor_sync": ("bfly", 0x1F),
}


def shuffle_source(mode: str, lane: int, b: int, c: int) -> tuple[int, bool]:
    """Source lane ``j`` and predicate ``pval`` of PTX ``shfl.sync`` (PTX ISA, 'shfl.sync').

    When ``pval`` is false the lane receives its own value.
    """
    bval = int(b) & 0x1F
    cval = c & 0x1F
    segmask = (c >> 8) & 0x1F
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    if mode == "up":
        j = lane - bval
        return j, j >= max_lane
    if mode == "down":
        j = lane + bval
    elif mode == "bfly":
        j = lane ^ bval
    else:  # idx
        j = min_lane | (bval & ~segmask)
    return j, j <= max_lane


def undefined_like(value):
    """What a lane reads from a lane that does not take part: undefined on the GPU.

    The simulator returns NaN (floats) or the type's minimum (integers) so that a result that
    depends on it shows up as wrong instead of passing by luck.
    """
    if isinstance(value, float | np.floating):
        return type(value)(np.nan)
    if isinstance(value, np.integer):
        return type(value)(np.iinfo(value.dtype).min)
    if isinstance(value, bool | np.bool_):
        return value
    return -(2**31)


def shuffle(kind: str, args: dict[int, tuple], mask: int) -> tuple[dict[int, object], int]:
    """``args[lane] = (value, b)`` for shfl_sync / shfl_up_sync / shfl_down_sync / shfl_xor_sync.

    Returns the results and how many lanes read from a lane named in ``mask`` that does not take
    part (it exited or does not exist): those reads, like reads from outside the mask, get
    :func:`undefined_like`.
    """
    mode, c = SHUFFLE_MODES[kind]
    out = {}
    undefined = 0
    for lane, (value, b) in args.items():
        j, pval = shuffle_source(mode, lane, b, c)
        if not pval:
            j = lane
        source = args.get(j)
        if source is not None and (mask >> j) & 1:
            out[lane] = source[0]
        else:
            out[lane] = undefined_like(value)
            undefined += (mask >> j) & 1
    return out, undefined


def vote(kind: str, args: dict[int, object], mask: int) -> dict[int, object]:
    """all_sync, any_sync, eq_sync (bool results) and ballot_sync (int32 bit mask) over the
    participating lanes."""
    preds = {lane: bool(p) for lane, p in args.items()}
    if kind == "all_sync":
        r = all(preds.values())
    elif kind == "any_sync":
        r = any(preds.values())
    elif kind == "eq_sync":
        r = len(set(preds.values())) == 1
    else:
        bits = sum(1 << lane for lane, p in preds.items() if p) & mask
        return dict.fromkeys(args, _INT32(np.uint32(bits).view(np.int32)))  # Numba: int32
    return dict.fromkeys(args, np.bool_(r))


def match_any(args: dict[int, object]) -> dict[int, object]:
    """Each lane gets the mask of lanes holding the same value (int32, as Numba types it)."""
    out = {}
    for lane, value in args.items():
        bits = sum(1 << other for other, v in args.items() if v == value)
        out[lane] = _INT32(np.uint32(bits).view(np.int32))
    return out


def match_all(args: dict[int, object]) -> dict[int, object]:
    """``(participating lanes, True)`` for every lane when all values are equal, else
    ``(0, False)``."""
    values = list(args.values())
    same = all(v == values[0] for v in values)
    bits = sum(1 << lane for lane in args) if same else 0
    return dict.fromkeys(args, (_INT32(np.uint32(bits).view(np.int32)), np.bool_(same)))


def lanes_bits(lanes) -> object:
    """A uint32 mask of ``lanes`` (activemask, lanemask_lt), as Numba types it."""
    return _UINT32(sum(1 << lane for lane in lanes))


def lanes_of(mask: int) -> list[int]:
    return [lane for lane in range(WARP_SIZE) if (mask >> lane) & 1]


def lane_ranges(lanes) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2, 5'``."""
    lanes = sorted(lanes)
    parts, start = [], None
    for i, lane in enumerate(lanes):
        if start is None:
            start = lane
        if i + 1 == len(lanes) or lanes[i + 1] != lane + 1:
            parts.append(str(start) if start == lane else f"{start}-{lane}")
            start = None
    return ", ".join(parts)
