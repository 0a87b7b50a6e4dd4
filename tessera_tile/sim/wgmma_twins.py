"""The simulator twins of Hopper's warpgroup MMA (:mod:`tessera_tile.mma.wgmma`): matrix
descriptors, the shared-memory window the tensor cores read, and the fence / commit / wait and
``wgmma.mma_async`` twins with the PTX ISA's ordering rules (docs/tensor_cores.md, "Warpgroup
MMA")."""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable

import numpy as np

from .. import sim
from .._device.mma_layouts import (
    RESERVED_BITS,
    WARPGROUP,
    WGMMA_N,
    decode_descriptor,
    encode_descriptor,
    operand_addresses,
)
from ._base import format_site, transparent_code, user_site
from .mma_twins import _bf16_halves, _exact_sum, _halves, _layout
from .wgmma_window import SharedWindow

# ============================================================================================
# Warpgroup MMA (wgmma, sm_90a): matrix descriptors, the shared-memory window, the twins
# ============================================================================================
#
# A warpgroup is 4 consecutive warps of a block whose first warp's index is a multiple of 4
# (threads 128 g .. 128 g + 127 of the linear thread rank). Every wgmma instruction is
# ``.sync.aligned`` over the warpgroup: each warp arrives as a warp collective of the simulator
# (its 32 lanes converged), and then waits until the other 3 warps of its warpgroup have executed
# the same instruction (same kind, same source line, same position in the warp's sequence of
# wgmma instructions). The warpgroup's state (fences, groups in flight, accumulators) lives
# beside the running block, keyed by it.


class WgmmaError(sim.SimulationError):
    """A warpgroup MMA rule broken in the simulator (fence, wait, 128 threads, descriptors)."""


class _Op:
    """One wgmma.mma_async of a warpgroup: its group's fate and the shared bytes it read."""

    __slots__ = ("site", "committed", "retired", "reads", "n")

    def __init__(self, site, n):
        self.site, self.n = site, n
        self.committed = self.retired = False
        self.reads: list = []  # (window, addresses, words) to check unchanged at retirement


class WgmmaAccumulator:
    """One thread's accumulator registers of a wgmma.mma_async in the simulator: ``N / 2``
    float32 (the layout of :mod:`tessera_tile.mma`), readable as a tuple only once a
    ``wgmma_wait_group`` has retired the group holding its MMA. Reading it is a register
    access: a later ``wgmma_async`` that takes it as its accumulator needs a ``wgmma_fence``
    after the read."""

    __slots__ = ("_values", "_op", "_state", "read_fence")

    def __init__(self, values, op: _Op, state):
        self._values, self._op, self._state = values, op, state
        self.read_fence = -1  # the fence count when a thread last read these registers

    def _ready(self):
        if not self._op.retired:
            how = (
                "its group is still in flight (wgmma_wait_group with a smaller n)"
                if self._op.committed
                else "it was never committed (wgmma_commit_group, then wgmma_wait_group)"
            )
            raise WgmmaError(
                f"wgmma: the accumulator of the wgmma.mma_async at {format_site(self._op.site)} "
                f"is read before wgmma.wait_group retired it: {how}"
            )
        self.read_fence = self._state.fences
        return self._values

    def __getitem__(self, i):
        return self._ready()[i]

    def __iter__(self):
        return iter(self._ready())

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        state = "retired" if self._op.retired else "in flight"
        return f"<wgmma accumulator of {len(self._values)} float32, {state}>"


class _Record:
    """The k-th wgmma instruction of a warpgroup, as its warps arrive at it."""

    __slots__ = ("kind", "site", "arrived", "first", "op", "complete")

    def __init__(self, kind, site):
        self.kind, self.site = kind, site
        self.arrived: set[int] = set()
        self.first = None  # the first warp's warp-uniform operands, to compare the others'
        self.op = None
        self.complete = False


class _Warpgroup:
    def __init__(self, window: SharedWindow):
        self.window = window
        self.records: dict[int, _Record] = {}
        self.next = [0, 0, 0, 0]  # per warp: the index of its next wgmma instruction
        self.fences = 0
        self.fences_at_wait = 0
        self.uncommitted: list[_Op] = []
        self.groups: deque[list[_Op]] = deque()
        self.a_seen: dict[tuple[int, int], dict[int, object]] = {}  # plain A tuples used


_BLOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _warpgroup_of(block, index: int) -> _Warpgroup:
    per_block = _BLOCKS.get(block)
    if per_block is None:
        per_block = _BLOCKS[block] = {"window": SharedWindow(block)}
    wg = per_block.get(index)
    if wg is None:
        wg = per_block[index] = _Warpgroup(per_block["window"])
    return wg


def shared_window(block=None) -> SharedWindow:
    """The running block's shared window (for twins and tests)."""
    block = block if block is not None else sim.current_thread().block
    per_block = _BLOCKS.get(block)
    if per_block is None:
        per_block = _BLOCKS[block] = {"window": SharedWindow(block)}
    return per_block["window"]


_ACTIONS: dict[str, Callable] = {}  # kind -> warp action(wg, record, warp, args) -> results
_FINISH: dict[str, Callable] = {}  # kind -> warpgroup action(wg, record), at the 4th warp


def _arrive(kind: str):
    def compute(args: dict) -> dict:
        (block, wg_index, warp, site), _ = next(iter(args.values()))
        wg = _warpgroup_of(block, wg_index)
        k = wg.next[warp]
        wg.next[warp] += 1
        record = wg.records.get(k)
        if record is None:
            record = wg.records[k] = _Record(kind, site)
        elif (record.kind, record.site) != (kind, site):
            raise WgmmaError(
                f"wgmma: divergent warpgroup {wg_index}: warp {4 * wg_index + warp} executes "
                f"{kind} at {format_site(site)} where another warp of the warpgroup executed "
                f"{record.kind} at {format_site(record.site)}; a wgmma instruction is "
                ".sync.aligned over the warpgroup: its 4 warps execute the same instructions"
            )
        results = _ACTIONS[kind](wg, record, warp, {lane: a for lane, (_, a) in args.items()})
        record.arrived.add(warp)
        if len(record.arrived) == 4:
            _FINISH.get(kind, lambda wg, record: None)(wg, record)
            record.complete = True
            record.first = None
            del wg.records[k]
        return {lane: (record, results[lane]) for lane in args}

    sim.register_aligned(kind, compute)
    sim.register_aligned(kind + ".wait", lambda args: dict.fromkeys(args))
    return kind


def _warpgroup_collective(kind: str, arg):
    """Arrive at wgmma instruction ``kind`` with this thread's ``arg``; returns this thread's
    result once the 4 warps of its warpgroup have all executed it."""
    t = sim.current_thread()
    block = t.block
    wg_index, warp = divmod(t.warp, 4)
    if block.nthreads < WARPGROUP * (wg_index + 1):
        raise WgmmaError(
            f"wgmma: {kind} needs the 128 threads of warpgroup {wg_index} (threads "
            f"{WARPGROUP * wg_index}..{WARPGROUP * wg_index + 127}); the block has "
            f"{block.nthreads} threads. A warpgroup is 4 consecutive warps whose first warp's "
            "index is a multiple of 4"
        )
    site = user_site(2)
    record, result = sim.aligned_collective(kind, ((block, wg_index, warp, site), arg))
    if record.complete:
        return result
    base = 4 * wg_index
    last, unchanged = None, 0
    while not record.complete:
        missing = [w for w in range(4) if w not in record.arrived]
        threads = [u for w in missing for u in block.threads[32 * (base + w) : 32 * (base + w + 1)]]
        where = f"{kind} at {format_site(site)}"
        warps = ", ".join(str(base + w) for w in missing)
        if any(u.dead for u in threads):
            raise WgmmaError(
                f"wgmma: warp(s) {warps} of warpgroup {wg_index} exited without executing {where}"
                "; wgmma instructions need all 128 threads of the warpgroup, converged (a "
                "warpgroup is 4 consecutive warps starting at a warp index multiple of 4)"
            )
        waits = tuple(u.wait for u in threads)
        unchanged = unchanged + 1 if last is not None and all(
            a is b for a, b in zip(waits, last, strict=True)
        ) else 0  # fmt: skip
        last = waits
        if unchanged >= 2 or all(w is not None and w.kind == "syncthreads" for w in waits):
            elsewhere = sorted({(w.kind, format_site(w.site)) for w in waits if w is not None})
            raise WgmmaError(
                f"wgmma: warp(s) {warps} of warpgroup {wg_index} never reach {where}: they wait "
                f"in {', '.join(f'{k} at {s}' for k, s in elsewhere)}; wgmma instructions need "
                "all 128 threads of the warpgroup, converged"
            )
        sim.aligned_collective(kind + ".wait", None)
    return result


transparent_code.add(_warpgroup_collective.__code__)  # sites are the kernel's lines


# -- wgmma.fence, commit_group, wait_group ---------------------------------------------------


def _no_results(wg, record, warp, args):
    return dict.fromkeys(args)


def _fence_done(wg, record):
    wg.fences += 1


def _commit_done(wg, record):
    for op in wg.uncommitted:
        op.committed = True
    wg.groups.append(wg.uncommitted)  # an empty group too, as the PTX ISA defines
    wg.uncommitted = []


# The per-thread state of tessera_tile.pipeline's cp.async twins: copies issued and not yet
# waited for (``pending``, then ``committed`` groups of them), each ``(dst, dst_run, ...)``.
_CP_ASYNC_STATE = "tessera_tile.pipeline.cp_async"


def _copies_in_flight(window) -> np.ndarray:
    """``(n, 2)`` window byte ranges ``[start, end)`` of the cp.async copies into shared
    memory that the block's threads have issued and not waited for. The cp.async twins land a
    copy at its thread's wait_group; on a GPU it may land any time after its issue."""
    ranges = []
    for t in window.block.threads:
        copies = t.state.get(_CP_ASYNC_STATE)
        if copies is None:
            continue
        for dst, run, *_ in (*copies.pending, *(c for g in copies.committed for c in g)):
            last = run[-1]
            host = sim.element_address(dst, (*run[:-1], last.start))
            start = window.address(host)
            ranges.append((start, start + (last.stop - last.start) * dst.itemsize))
    return np.array(ranges, np.int64).reshape(-1, 2)


def _retire(op: _Op) -> None:
    in_flight = None
    for window, addresses, words, what in op.reads:
        now = window.read_u16(addresses, what)
        if not np.array_equal(now, words):
            raise WgmmaError(
                f"wgmma: shared memory that the wgmma.mma_async at {format_site(op.site)} reads "
                f"({what}) was written before wgmma.wait_group retired it; the tensor cores "
                "read it asynchronously until then"
            )
        in_flight = _copies_in_flight(window) if in_flight is None else in_flight
        if len(in_flight):
            read = np.unique(addresses)
            hits = np.searchsorted(read, in_flight[:, 1]) - np.searchsorted(read, in_flight[:, 0])
            if hits.any():
                raise WgmmaError(
                    f"wgmma: a cp.async into shared memory that the wgmma.mma_async at "
                    f"{format_site(op.site)} reads ({what}) is in flight (issued, not waited for) "
                    "when wgmma.wait_group retires it: it may land while the tensor cores read "
                    "(or before they read; the simulator lands it at the cp.async wait_group)"
                )
    op.reads = []
    op.retired = True


def _wait_action(wg, record, warp, args):
    ns = {int(n) for n, _ in args.values()}
    if len(ns) != 1:
        raise WgmmaError(f"wgmma: wait_group with different n in one warp: {sorted(ns)}")
    if record.first is None:
        record.first = ns
    elif record.first != ns:
        raise WgmmaError("wgmma: wait_group with different n in the warps of a warpgroup")
    return {lane: acc for lane, (_, acc) in args.items()}


def _wait_done(wg, record):
    (n,) = record.first
    while len(wg.groups) > n:
        for op in wg.groups.popleft():
            _retire(op)
    wg.fences_at_wait = wg.fences


_FENCE = _arrive("wgmma.fence")
_COMMIT = _arrive("wgmma.commit_group")
_WAIT = _arrive("wgmma.wait_group")
_ACTIONS.update({_FENCE: _no_results, _COMMIT: _no_results, _WAIT: _wait_action})
_FINISH.update({_FENCE: _fence_done, _COMMIT: _commit_done, _WAIT: _wait_done})


def _wgmma_fence_twin():
    _warpgroup_collective(_FENCE, None)


def _wgmma_commit_twin():
    _warpgroup_collective(_COMMIT, None)


def _wgmma_wait_twin(n, acc):
    if not 0 <= int(n) <= 7:
        raise WgmmaError(f"wgmma_wait_group: n must be in 0..7, got {n}")
    return _warpgroup_collective(_WAIT, (int(n), acc))


# -- wgmma.mma_async ----------------------------------------------------------------------------


def _wgmma_a_coord(lane: int, i: int) -> tuple[int, int]:
    """Element ``i`` (0..7) of a warp's A registers: the 16 x 16 A fragment of mma.m16n8k16."""
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def _wgmma_d_coord(lane: int, i: int) -> tuple[int, int]:
    """Accumulator ``i`` of a lane, in its warp's 16 rows: the 16 x 8 C layout of
    mma.m16n8k16 repeated over the N / 8 column blocks."""
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def _words_to_float(words: np.ndarray, bf16: bool) -> np.ndarray:
    if bf16:
        return (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return words.view(np.float16).astype(np.float64)


def _read_operand(wg, op, desc, rows, mn_major, bf16, what):
    fields = decode_descriptor(desc)
    if int(desc) & RESERVED_BITS:
        raise WgmmaError(f"wgmma: {what} descriptor 0x{int(desc):016x} sets reserved bits")
    if fields.base_offset:
        raise WgmmaError(
            f"wgmma: {what} descriptor has base offset {fields.base_offset}; the simulator "
            "models base offset 0 only (matrices whose swizzle pattern starts at its alignment)"
        )
    addresses = operand_addresses(fields, rows, mn_major)
    words = wg.window.read_u16(addresses, what)
    op.reads.append((wg.window, addresses, words, what))
    return _words_to_float(words, bf16)


def _check_registers(wg, record, warp, lane, a, acc, n):
    if wg.fences == 0:
        raise WgmmaError(
            "wgmma: wgmma.mma_async before any wgmma.fence of its warpgroup; the PTX ISA "
            "requires a wgmma.fence before the first wgmma.mma_async"
        )
    fresh = wg.fences > wg.fences_at_wait  # a fence since the latest wait_group
    if isinstance(acc, WgmmaAccumulator):
        if len(acc) != n // 2:
            raise WgmmaError(f"wgmma: an accumulator of {len(acc)} registers for m64n{n}k16")
        if acc.read_fence >= wg.fences:
            raise WgmmaError(
                "wgmma: the accumulator registers were read by a thread after the latest "
                "wgmma.fence; a wgmma_fence must separate register accesses from the "
                "wgmma.mma_async that uses those registers"
            )
    elif not fresh:
        raise WgmmaError(
            "wgmma: the accumulator is ordinary registers (not the pending result of a "
            "wgmma.mma_async) and no wgmma.fence came after the latest wgmma.wait_group; a "
            "wgmma_fence must separate register writes from the wgmma.mma_async reading them"
        )
    if isinstance(a, tuple):
        seen = wg.a_seen.setdefault((warp, lane), {})
        if not fresh and id(a) not in seen:
            raise WgmmaError(
                "wgmma: A registers written after the latest wgmma.fence (no fence since the "
                "latest wgmma.wait_group); a wgmma_fence must come between"
            )
        seen[id(a)] = a  # kept alive: the same tuple is the same, unwritten registers


def _mma_action(wg, record, warp, args):
    lanes = sorted(args)
    a0, b0, _, s0, flags = args[lanes[0]]
    n, bf16, scale_a, scale_b, trans_a, trans_b = flags
    from_registers = isinstance(a0, tuple)
    uniform = (None if from_registers else int(a0), int(b0), bool(s0), flags)
    for lane in lanes:
        a, b, _, s, f = args[lane]
        mine = (None if isinstance(a, tuple) else int(a), int(b), bool(s), f)
        if mine != uniform:
            raise WgmmaError(
                f"wgmma: lane {lane} of warp {warp} of its warpgroup passes other descriptors, "
                "scale-d or shape than the warp's first lane; they must be the same in every "
                "thread of the warpgroup"
            )
    if record.first is None:
        record.first = uniform
        record.op = _Op(record.site, n)
    elif record.first != uniform:
        raise WgmmaError(
            "wgmma: the warps of a warpgroup pass different descriptors, scale-d or shapes to "
            "one wgmma.mma_async; they must be the same in all 128 threads"
        )
    op = record.op
    for lane in lanes:
        a, _, acc, _, _ = args[lane]
        _check_registers(wg, record, warp, lane, a, acc, n)
    what = "B (descriptor)"
    b = _read_operand(wg, op, b0, n, bool(trans_b), bf16, what)  # [n, k]
    if from_registers:
        a_rows = np.empty((16, 16), np.float64)
        values = _bf16_halves if bf16 else _halves
        a_at = _layout(_wgmma_a_coord, 8)
        for lane in lanes:
            a_rows[a_at[0, lane], a_at[1, lane]] = values(args[lane][0], 4)
    else:
        a_full = _read_operand(wg, op, a0, 64, bool(trans_a), bf16, "A (descriptor)")
        a_rows = a_full[16 * warp : 16 * warp + 16]
    c = np.zeros((16, n), np.float64)
    rows, cols = _layout(_wgmma_d_coord, n // 2)
    if s0:
        for lane in lanes:
            acc = args[lane][2]
            regs = acc._values if isinstance(acc, WgmmaAccumulator) else tuple(acc)
            if len(regs) != n // 2:
                raise WgmmaError(f"wgmma: an accumulator of {len(regs)} registers for m64n{n}k16")
            c[rows[lane], cols[lane]] = np.array(regs, np.float32)
    d = _exact_sum(scale_a * a_rows, scale_b * b.T, c)
    return {lane: WgmmaAccumulator(tuple(d[rows[lane], cols[lane]]), op, wg) for lane in lanes}


def _mma_done(wg, record):
    wg.uncommitted.append(record.op)


_MMA = _arrive("wgmma.mma_async")
_ACTIONS[_MMA] = _mma_action
_FINISH[_MMA] = _mma_done


def wgmma_async_twin(bf16: bool):
    """The twin of ``wgmma_async`` (float16) or ``wgmma_async_bf16``."""

    def twin(a, b_desc, acc, scale_d, scale_a, scale_b, trans_a, trans_b):
        n = 2 * len(acc)
        if n not in WGMMA_N:
            raise WgmmaError(f"wgmma: N = {n} (an accumulator of {len(acc)}): not m64nNk16")
        if isinstance(a, tuple) and (len(a) != 4 or int(trans_a)):
            raise WgmmaError("wgmma: A from registers is 4 uint32 and cannot be transposed")
        for what, v, allowed in (
            ("scale_a", scale_a, (1, -1)),
            ("scale_b", scale_b, (1, -1)),
            ("trans_a", trans_a, (0, 1)),
            ("trans_b", trans_b, (0, 1)),
        ):
            if int(v) not in allowed:
                raise WgmmaError(f"wgmma: {what} must be one of {allowed}, got {v}")
        flags = (n, bf16, int(scale_a), int(scale_b), int(trans_a), int(trans_b))
        if not isinstance(a, tuple):
            a = np.uint64(int(a) & ((1 << 64) - 1))
        return _warpgroup_collective(_MMA, (a, b_desc, acc, scale_d, flags))

    twin.__name__ = twin.__qualname__ = "wgmma_async_bf16_twin" if bf16 else "wgmma_async_twin"
    return twin


def _wgmma_descriptor_twin(smem, index, leading_byte_offset, stride_byte_offset, swizzle):
    """The descriptor of the matrix starting at ``smem[index]``: its window address."""
    key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
    if not sim.in_shared_memory(smem):
        raise WgmmaError("wgmma_descriptor: the matrix must be in shared memory")
    if len(key) != smem.ndim or any(not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)):
        raise WgmmaError(f"wgmma_descriptor: index {key} out of bounds for {smem.shape}")
    host = sim.element_address(smem, key)
    address = shared_window().address(host)
    try:
        desc = encode_descriptor(address, leading_byte_offset, stride_byte_offset, swizzle)
    except ValueError as e:
        raise WgmmaError(f"wgmma_descriptor: {e}") from None
    return np.uint64(desc)
