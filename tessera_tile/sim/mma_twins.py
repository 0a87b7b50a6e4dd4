"""The simulator twins of :mod:`tessera_tile.mma`'s intrinsics and the PTX ISA's fragment
layouts they follow (which lane's register holds which element of A, B and C). ``ldmatrix`` and
``mma`` run as warp collectives of :mod:`tessera_tile.sim`; the TF32 ``mma`` sums as an H200's
tensor core does (the model is in :mod:`tessera_tile.mma`'s docstring).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import sim
from .._device.mma_layouts import ROW_BYTES, TF32_MASK
from .ints import narrow

# --------------------------------------------------------------------------------------------
# Layouts (the PTX ISA's fragment tables), used by the twins
# --------------------------------------------------------------------------------------------


def _a_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)


def _b_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return 2 * t + (i & 1) + 8 * (i >> 1), g


def _c_coord(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def _a_coord_tf32(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return g + 8 * (i & 1), t + 4 * (i >> 1)


def _b_coord_tf32(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane & 3
    return t + 4 * i, g


def _tf32_values(registers, count: int) -> np.ndarray:
    """The TF32 values the tensor core reads from ``count`` 32-bit registers (uint32 bit
    patterns or float32): the low 13 bits dropped (truncation toward zero)."""
    words = np.array(
        [
            np.float32(r).view(np.uint32) if isinstance(r, float | np.floating) else int(r)
            for r in registers
        ],
        dtype=np.int64,
    ).astype("<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return (words & TF32_MASK).view("<f4").astype(np.float64)


def _halves(registers, count: int) -> np.ndarray:
    """The float16 values of ``count`` packed registers (low half first)."""
    words = np.array([int(r) & 0xFFFFFFFF for r in registers], dtype="<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return words.view("<f2")


def _bf16_halves(registers, count: int) -> np.ndarray:
    """The bfloat16 values of ``count`` packed registers (low half first), as float32: a
    bfloat16 is the upper half of a float32."""
    words = np.array([int(r) & 0xFFFFFFFF for r in registers], dtype="<u4")
    if words.size != count:
        raise sim.SimulationError(f"expected a fragment of {count} registers, got {words.size}")
    return (words.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _pack(lo, hi) -> np.uint32:
    return np.uint32(int(lo) | (int(hi) << 16))  # narrowed (Numba's typing) by the caller


# --------------------------------------------------------------------------------------------
# Simulator twins
# --------------------------------------------------------------------------------------------


def _ldmatrix_compute(count: int, trans: bool):
    def compute(args: dict) -> dict:
        mats = [np.stack([args[8 * j + r] for r in range(8)]) for j in range(count)]
        out = {}
        for lane in args:
            g, t = lane >> 2, lane & 3
            regs = [
                _pack(m[2 * t, g], m[2 * t + 1, g])
                if trans
                else _pack(m[g, 2 * t], m[g, 2 * t + 1])
                for m in mats
            ]
            out[lane] = narrow(regs[0]) if count == 1 else tuple(map(narrow, regs))
        return out

    return compute


def _ldmatrix_twin(count: int, trans: bool):
    kind = f"ldmatrix.x{count}{'.trans' if trans else ''}"
    sim.register_aligned(kind, _ldmatrix_compute(count, trans))

    def twin(smem, index):
        lane = sim.current_thread().lane
        row = None
        if lane < 8 * count:  # only these lanes' addresses are used
            key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
            if smem.itemsize not in (2, 4) or (trans and smem.itemsize != 2):
                raise sim.SimulationError(
                    f"{kind}: needs 16-bit elements{'' if trans else ' (or 32-bit ones)'}, got "
                    f"{smem.dtype}"
                )
            per_row = ROW_BYTES // smem.itemsize
            if not sim.in_shared_memory(smem):
                raise sim.SimulationError(
                    f"{kind}: reads shared memory; lane {lane} passed another array"
                )
            if len(key) != smem.ndim or any(
                not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)
            ):
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row index {key} is out of bounds for {smem.shape}"
                )
            if sim.element_address(smem, key) % ROW_BYTES:
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row address (index {key}) is not 16-byte aligned "
                    "(ldmatrix needs 16-byte aligned rows)"
                )
            if smem.strides[-1] != smem.itemsize:
                raise sim.SimulationError(
                    f"{kind}: the last axis of {smem.shape} is not contiguous"
                )
            # a row is 16 bytes at an address: it may cross a row end of the array, not its end
            if not sim.in_allocation(smem, key, ROW_BYTES):
                raise sim.SimulationError(
                    f"{kind}: lane {lane}'s row {key} runs past the end of the shared array "
                    f"(shape {smem.shape})"
                )
            values = sim.load(smem, (*key[:-1], slice(key[-1], key[-1] + per_row)))
            row = np.asarray(values).view(np.uint16).copy()
        return sim.aligned_collective(kind, row)

    return twin


def _exact_sum(a, b, c) -> np.ndarray:
    """``a @ b + c`` summed exactly (float64) and rounded once to float32."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (a @ b + c).astype(np.float32)


def _tf32_sum(a, b, c) -> np.ndarray:
    """``a @ b + c`` as an H200's TF32 tensor core sums it (probed, see the module docstring):
    every addend truncated toward zero to a multiple of ``2**(E - 25)``, E the largest addend
    exponent (a product's: the sum of its operands' exponents), the terms added exactly, the
    sum rounded toward zero to float32. Rows or columns holding a NaN or an infinity take the
    exact sum's IEEE result."""
    products = a[:, :, None] * b[None, :, :]  # (16, k, 8): exact, 11-bit significands
    exponents = np.frexp(a)[1][:, :, None] + np.frexp(b)[1][None, :, :] - 2
    terms = np.concatenate([products, c[:, None, :]], axis=1)
    exponents = np.concatenate([exponents, np.frexp(c)[1][:, None, :] - 1], axis=1)
    nonzero = terms != 0
    largest = np.where(nonzero, exponents, np.iinfo(np.int32).min).max(axis=1, keepdims=True)
    unit = np.ldexp(1.0, np.where(nonzero.any(axis=1, keepdims=True), largest - 25, 0))
    with np.errstate(invalid="ignore", over="ignore"):
        total = (np.trunc(terms / unit) * unit).sum(axis=1)  # < 2**31 units: exact
        rounded = total.astype(np.float32)
    toward_zero = np.abs(rounded.astype(np.float64)) > np.abs(total)
    rounded[toward_zero] = np.nextafter(rounded[toward_zero], np.float32(0))
    # NaN and infinities as IEEE gives them; all-zero sums with IEEE's sign of zero
    ieee = ~np.isfinite(terms).all(axis=1) | ~nonzero.any(axis=1)
    rounded[ieee] = _exact_sum(a, b, c)[ieee]
    return rounded


@functools.cache
def _layout(coord, per_lane: int) -> np.ndarray:
    """``coord`` for every lane and register as an index array ``[2, lane, i]`` (rows, then
    columns), so a warp's fragments move with one indexing."""
    return np.array(
        [[coord(lane, i) for i in range(per_lane)] for lane in range(32)], np.intp
    ).transpose(2, 0, 1)


def _mma_twin_of(name: str, kind: str, k: int, values, a_coord, b_coord, accumulate=_exact_sum):
    """The twin of an ``m16n8k{k}`` mma: the warp's fragments gathered by the PTX layouts
    (``values`` unpacks a lane's registers), multiplied exactly and summed by ``accumulate``
    (float16: in float64, rounded once to float32, as the tensor core keeps at least float32
    precision in its sums; TF32: as the hardware sums)."""

    def compute(args: dict) -> dict:
        lanes, registers = list(args), list(args.values())
        n = len(lanes)
        a = np.empty((16, k), np.float64)
        b = np.empty((k, 8), np.float64)
        c = np.empty((16, 8), np.float64)
        va = values([r for ra, _, _ in registers for r in ra], 4 * n).reshape(n, -1)
        vb = values([r for _, rb, _ in registers for r in rb], 2 * n).reshape(n, -1)
        a[tuple(_layout(a_coord, va.shape[1])[:, lanes])] = va
        b[tuple(_layout(b_coord, vb.shape[1])[:, lanes])] = vb
        c_at = tuple(_layout(_c_coord, 4)[:, lanes])
        c[c_at] = [rc for _, _, rc in registers]
        d = accumulate(a, b, c)[c_at]
        return {lane: tuple(d[j]) for j, lane in enumerate(lanes)}

    sim.register_aligned(kind, compute)

    def twin(a, b, c):
        if len(a) != 4 or len(b) != 2 or len(c) != 4:
            raise sim.SimulationError(
                f"{name} takes 4 A, 2 B and 4 C registers, got {len(a)}, {len(b)}, {len(c)}"
            )
        c32 = tuple(np.float32(x) for x in c)
        return sim.aligned_collective(kind, (tuple(a), tuple(b), c32))

    twin.__name__ = twin.__qualname__ = f"{name}_twin"
    return twin


_mma_twin = _mma_twin_of("mma_m16n8k16", "mma.m16n8k16", 16, _halves, _a_coord, _b_coord)
# bfloat16: float16's fragment layout; products exact in float32 (8 x 8 significant bits)
_mma_bf16_twin = _mma_twin_of(
    "mma_m16n8k16_bf16", "mma.m16n8k16.bf16", 16, _bf16_halves, _a_coord, _b_coord
)
_mma_tf32_twin = _mma_twin_of(
    "mma_m16n8k8_tf32", "mma.m16n8k8.tf32", 8, _tf32_values, _a_coord_tf32, _b_coord_tf32,
    _tf32_sum,
)  # fmt: skip


def _to_tf32_twin(x):
    """``cvt.rna.tf32.f32``: round the low 13 bits away, to nearest, ties away from zero
    (adding half a TF32 ulp to the magnitude bits, then masking); inf and NaN pass."""
    v = np.float32(x)
    if not np.isfinite(v):
        return v
    bits = (int(v.view(np.uint32)) + 0x1000) & 0xFFFFE000  # may round up to inf, as cvt does
    return np.uint32(bits).view(np.float32)


def _pair_twin(name: str, dtype, space: str, convert=None):
    """The twin of a two-element vector store ``name`` of ``dtype`` into ``space`` memory;
    ``convert`` makes the stored values from float32 (default: a cast to ``dtype``)."""
    size = 2 * np.dtype(dtype).itemsize

    def twin(out, index, x0, x1):
        key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
        if out.dtype != dtype:
            raise sim.SimulationError(f"{name}: needs a {np.dtype(dtype)} array, got {out.dtype}")
        if out.strides[-1] != out.itemsize:
            raise sim.SimulationError(f"{name}: the last axis of {out.shape} is not contiguous")
        if sim.element_address(out, key) % size:
            raise sim.SimulationError(f"{name}: index {key} is not {size}-byte aligned")
        if sim.in_shared_memory(out) != (space == "shared"):
            other = "a global" if space == "shared" else "a shared"
            raise sim.SimulationError(f"{name} ({space}): got {other} array")
        with np.errstate(over="ignore"):  # beyond float16's range: inf, as cvt.rn does
            pair = np.array([x0, x1], np.float32)
            values = pair.astype(dtype) if convert is None else convert(pair)
        # an address range: it may cross a row end of the array, not its allocation
        sim.store(out, (*key[:-1], slice(key[-1], key[-1] + 2)), values)

    twin.__name__ = twin.__qualname__ = f"{name}_{space}_twin"
    return twin


def _shared_f32_load_twin(count: int):
    """The twin of ``ld.shared[.v2].f32``: the ``4 * count`` bytes at ``&smem[index]`` (a shared
    float32 array, aligned to them; two may cross a row end of the array, not its
    allocation)."""
    name = f"load_f32{'x2' if count == 2 else ''}_shared"
    size = 4 * count

    def twin(smem, index):
        key = tuple(int(i) for i in index) if isinstance(index, tuple) else (int(index),)
        if smem.dtype != np.float32:
            raise sim.SimulationError(f"{name}: needs a float32 array, got {smem.dtype}")
        if not sim.in_shared_memory(smem):
            raise sim.SimulationError(f"{name}: reads shared memory; got another array")
        if smem.strides[-1] != smem.itemsize:
            raise sim.SimulationError(f"{name}: the last axis of {smem.shape} is not contiguous")
        if len(key) != smem.ndim or any(
            not 0 <= i < n for i, n in zip(key, smem.shape, strict=True)
        ):
            raise sim.SimulationError(f"{name}: index {key} out of bounds for {smem.shape}")
        if sim.element_address(smem, key) % size:
            raise sim.SimulationError(f"{name}: index {key} is not {size}-byte aligned")
        if not sim.in_allocation(smem, key, size):
            raise sim.SimulationError(f"{name}: index {key} runs past the array's end")
        span = (*key[:-1], slice(key[-1], key[-1] + count))
        values = np.asarray(sim.load(smem, span), np.float32)
        return np.float32(values[0]) if count == 1 else tuple(np.float32(v) for v in values)

    twin.__name__ = twin.__qualname__ = f"_{name}_twin"
    return twin


_load_f32_shared_twin = _shared_f32_load_twin(1)
_load_f32x2_shared_twin = _shared_f32_load_twin(2)


def _pack_twin(lo, hi):
    with np.errstate(over="ignore"):  # beyond float16's range: inf, as cvt.rn does
        halves = np.array([lo, hi], np.float32).astype(np.float16).view(np.uint16)
    return narrow(_pack(halves[0], halves[1]))
