"""The plan of the ``attention`` prebuilt op: validation, broadcasting, launches, ``explain`` and
``inspect`` (``ops.attention`` is this module's :func:`attention` as a prebuilt op; the
composer's attention stages call it too).

``attention(q, k, v)`` is ``softmax(q @ k^T * scale) @ v`` over ``(..., S, D)`` arrays in one
flash-style kernel per launch: float16 and bfloat16 on the tensor cores
(:mod:`tessera_tile.kernels.attention`; on sm_90a, head sizes 64 and 128, the warpgroup-MMA
kernel of :mod:`tessera_tile.kernels.attention.wgmma`), float32 in float32 SIMT
(:mod:`tessera_tile.kernels.attention.simt`). Batch
dimensions broadcast as in NumPy and become the grid's second axis as the matmul ops' do
(:mod:`.matmul_geometry`): nothing is copied.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from ... import dynamic_shared
from ..._runtime import arrays
from ..._runtime.launch import KernelLaunch
from ...autotune import autotune
from ...tile_ir import BFLOAT16
from .._calls import (
    HandWritten,
    Report,
    array_arg,
    device_like,
    distinct,
    view_dtype,
)
from ..matmul.geometry import (
    Matrix,
    array_type,
    as_matrix,
    first_address,
    geometry,
    layout,
    matrix_view,
    rows_aligned,
)
from . import simt
from . import tc as tensor_cores
from . import wgmma as warpgroups
from .tc import kv_rows

__all__ = ["attention"]

DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))


@dataclass(frozen=True)
class Family:
    """The kernels of one dtype: their module (``HEAD_DIMS``, ``default_config``), kernel
    factory and config type."""

    module: object
    factory: object
    config_type: type
    compute: str  # what explain says of the arithmetic
    unaligned: str  # how rows that are not 16-byte aligned are loaded
    int32_positions: bool  # the kernel counts query and key positions in int32
    choose: object  # (D, Sq) -> the default config
    tensor_cores: bool  # explain names rows per warp and the mma per ldmatrix


FAMILIES = {
    np.dtype(np.float16): Family(
        tensor_cores,
        tensor_cores.flash_attention,
        tensor_cores.AttentionConfig,
        "float16: tensor cores (mma.sync m16n8k16), float32 scores and statistics",
        "synchronous guarded loads instead of cp.async",
        True,
        tensor_cores.default_config,
        True,
    ),
    BFLOAT16: Family(
        tensor_cores,
        functools.partial(tensor_cores.flash_attention, bf16=True),
        tensor_cores.AttentionConfig,
        "bfloat16: tensor cores (mma.sync m16n8k16 .bf16), float32 scores and statistics",
        "synchronous guarded loads instead of cp.async",
        True,
        tensor_cores.default_config,
        True,
    ),
    np.dtype(np.float32): Family(
        simt,
        simt.simt_attention,
        simt.SimtAttentionConfig,
        "float32: computed in float32 (SIMT FFMA), no tensor cores",
        "4-byte cp.async copies of single elements instead of 16-byte ones",
        False,
        lambda d, _sq: simt.default_config(d),
        False,
    ),
}
WGMMA_COMPUTE = (
    "{dtype}: warpgroup MMA (sm_90a): S = Q K^T by wgmma m64n{kv}k16 with Q and K read from "
    "shared memory through descriptors, O += P V by wgmma m64n{d}k16 with P from registers; "
    "float32 scores and statistics"
)
INT32_MAX = 2**31 - 1
LOG2E = math.log2(math.e)
NAMES = ("q", "k", "v")


@dataclass(frozen=True)
class Launch:
    index: tuple  # the batch index of the launch's first matrix
    count: int  # matrices on the grid's second axis
    aligned: bool  # every row 16-byte aligned on a contiguous inner axis: cp.async copies
    signature: str


@dataclass
class Attention(HandWritten):
    """One call of ``attention``, validated: operands, broadcast batch, scale, kernel family."""

    q: arrays.Arg
    k: arrays.Arg
    v: arrays.Arg
    causal: bool
    scale: float
    config: object  # the family's config (None: its default for D)
    batch: tuple[int, ...]
    wgmma: bool  # aligned launches run the warpgroup-MMA kernel (sm_90a)

    @property
    def tuner(self):
        """The tuner whose choice the launches hold (a kept call is dropped when it clears)."""
        return TUNED_WGMMA if self.wgmma and self.config is None else None

    @property
    def dtype(self) -> np.dtype:
        return self.q.dtype

    @property
    def family(self) -> Family:
        """Tensor cores for float16, SIMT for float32."""
        return FAMILIES[self.dtype]

    @property
    def sq(self) -> int:
        return self.q.shape[-2]

    @property
    def sk(self) -> int:
        return self.k.shape[-2]

    @property
    def d(self) -> int:
        return self.q.shape[-1]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.sq, self.d)

    @property
    def empty(self) -> bool:
        return not (self.sq and math.prod(self.batch))

    def tile_config(self):
        """The given config; on the wgmma kernel the tuner's choice for these operands (the
        choice made for their shape bucket, else the model's: reports time nothing, a launch
        tunes first); else the family's default."""
        if self.config is not None:
            return self.config
        if self.wgmma:
            return TUNED_WGMMA.expected(self.q, self.k, self.v, self.causal)
        return self.family.choose(self.d, self.sq)

    def launch_config(self, aligned: bool):
        """The config of a launch: the call's; for the wgmma kernel's rows that ``cp.async``
        cannot copy, the mma.sync kernel's with the same query and key tiles (16-row warps)."""
        cfg = self.tile_config()
        if self.wgmma and not aligned:
            return tensor_cores.AttentionConfig(cfg.block_kv, cfg.block_q // 16, 2, 16)
        return cfg

    def kernel(self, aligned: bool):
        cfg = self.launch_config(aligned)
        if isinstance(cfg, warpgroups.WgmmaAttentionConfig):
            return warpgroups.wgmma_attention(self.d, self.causal, cfg, self.dtype == BFLOAT16)
        return self.family.factory(self.d, self.causal, aligned, cfg)

    @property
    def compute(self) -> str:
        """What explain says of the arithmetic."""
        if not self.wgmma:
            return self.family.compute
        cfg = self.tile_config()
        return WGMMA_COMPUTE.format(dtype=self.dtype.name, kv=cfg.block_kv, d=self.d)

    # launches ---------------------------------------------------------------------------
    def _matrices(self, recs) -> list[Matrix]:
        return [as_matrix(r, self.batch, None) for r in recs]

    def plan_launches(self, recs):
        """The geometry, the operands as matrices and the launches, for device records
        ``(q, k, v, o)`` (or stand-ins with their layout)."""
        mats = self._matrices(recs)
        geo = geometry(self.batch, mats)
        launches = []
        for index, _z0, count in geo.indices():
            one = count == 1
            zs = (0,) * 4 if one else geo.z_strides
            aligned = all(
                rows_aligned(m, z, first_address(r, m, index))
                for m, z, r in zip(mats, zs, recs, strict=True)
            )
            types = [
                array_type(self.dtype, 3, layout(m, count, z))
                for m, z in zip(mats, zs, strict=True)
            ]
            signature = f"void({', '.join(types)}, float32)"
            launches.append(Launch(index, count, aligned, signature))
        return geo, mats, launches

    def inputs(self) -> dict:
        return dict(zip(NAMES, (self.q, self.k, self.v), strict=True))

    def launches(self, records, result) -> list:
        """The launches on device records ``q``, ``k``, ``v`` and the result; on the wgmma
        kernel the first launch of a shape bucket tunes first (times, on a GPU)."""
        if self.empty:
            return []
        if self.config is None and self.wgmma:
            TUNED_WGMMA.choose(*records[:3], self.causal)
        geo, mats, planned = self.plan_launches([*records, result])
        scale_log2 = np.float32(self.scale * LOG2E)
        kind = view_dtype(self.dtype)
        out = []
        for launch in planned:
            views = [
                matrix_view(i, m, launch.index, launch.count, z, kind)
                for i, (m, z) in enumerate(zip(mats, geo.z_strides, strict=True))
            ]
            cfg = self.launch_config(launch.aligned)
            grid = (-(-self.sq // cfg.block_q), launch.count)
            kernel = self.kernel(launch.aligned)
            params = (*views, scale_log2)
            shared = cfg.shared_bytes(self.d)  # every family's tiles: dynamic shared memory
            out.append(KernelLaunch(kernel, grid, cfg.threads, params, launch.signature, shared))
        return out

    # reports ----------------------------------------------------------------------------
    def _stand_ins(self):
        """The device records a call would launch with: its operands' (host operands as their
        device copies), and a new result."""
        return [device_like(r) for r in (self.q, self.k, self.v)] + [
            arrays.placeholder(self.out_shape, self.dtype)
        ]

    def _kv_rows(self) -> list[int]:
        """K (and V) rows each block of query rows reads (kernels.attention.kv_rows)."""
        cfg = self.tile_config()
        return [
            kv_rows(m0, self.sq, self.sk, self.causal, cfg) for m0 in range(0, self.sq, cfg.block_q)
        ]

    def kv_tiles(self) -> tuple[int, int]:
        """K/V tiles the call processes, and how many it would without causal skipping."""
        cfg = self.tile_config()
        z = math.prod(self.batch)
        done = sum(-(-rows // cfg.block_kv) for rows in self._kv_rows())
        full = -(-self.sk // cfg.block_kv) * -(-self.sq // cfg.block_q)
        return z * done, z * full

    def predicted_bytes(self) -> int:
        """Q read once, K and V once per block of query rows up to its last visible key (whole
        tiles, none past Sk), O written once: what the profiler measures."""
        if self.empty:
            return 0
        z, item = math.prod(self.batch), self.dtype.itemsize
        return z * item * self.d * (2 * self.sq + 2 * sum(self._kv_rows()))

    def naive_bytes(self) -> int:
        """Three kernels, each reading and writing the minimum: S = Q K^T (writes the Sq x Sk
        scores), P = softmax(S) (reads and writes them), O = P V (reads them)."""
        z, item = math.prod(self.batch), self.dtype.itemsize
        qkvo = z * item * self.d * (2 * self.sq + 2 * self.sk)
        return qkvo + 4 * z * item * self.sq * self.sk

    def flops(self) -> int:
        """The two products of the tiles processed (masked tiles counted whole)."""
        cfg = self.tile_config()
        done, _ = self.kv_tiles()
        return 4 * done * cfg.block_q * cfg.block_kv * self.d

    def report(self) -> Report:
        stand_ins = self._stand_ins()
        launches = distinct(self.launches(stand_ins[:3], stand_ins[3]))
        cfg = self.tile_config()
        done, full = self.kv_tiles()
        reasons = [self.compute]
        if any(not launch.aligned for launch in self.plan_launches(stand_ins)[2]):
            fallback = self.family.unaligned
            if self.wgmma:
                fallback = (
                    "those launches run the mma.sync kernel (16-row warps, the same tiles) with "
                    f"{fallback}, as the wgmma kernel's tiles arrive by cp.async"
                )
            reasons.append(
                f"some rows are not 16-byte aligned on a contiguous inner axis: {fallback}"
            )
        reasons.append(
            f"one kernel per op (S = Q K^T, P = softmax(S), P V) would write and read the "
            f"{self.sq} x {self.sk} scores of each head: {self.naive_bytes()} B in all; here "
            "they stay on chip and the traffic is linear in S"
        )
        if self.causal:
            reasons.append(
                f"causal: {full - done} of {full} K/V tiles lie above the diagonal and are "
                "skipped (no load, no math)"
            )
        names = dict.fromkeys(launch.kernel.py_func.__name__ for launch in launches)
        rows = f"{cfg.block_q} query rows each"
        if self.wgmma:
            rows += " (64 per warpgroup: one m64 accumulator of scores and one of O)"
        elif self.family.tensor_cores:
            rows += (
                f" ({cfg.warp_rows} per warp: each ldmatrix.x4 of K or V feeds "
                f"{cfg.warp_rows // 8} mma)"
            )
        rows += f", {cfg.shared_bytes(self.d)} B of dynamic shared memory"
        stages = [
            f"{name}: softmax(q @ k^T * {self.scale:.4g}) @ v, Sq {self.sq} x "
            f"Sk {self.sk}, D {self.d}, batch {self.batch or '()'}; "
            f"{-(-self.sq // cfg.block_q) * math.prod(self.batch)} block(s) of {cfg.threads} "
            f"threads, {rows}; {done} K/V tiles of {cfg.block_kv} keys in all; the scores stay "
            "on chip (online softmax)"
            for name in names
        ]
        return Report(
            "flash attention",
            launches,
            stages,
            self.predicted_bytes(),
            self.naive_bytes(),
            reasons,
        )


# --------------------------------------------------------------------------------------------
# validation


def _operands(q, k, v):
    recs = [
        array_arg(x, name, DTYPES, "attention") for x, name in zip((q, k, v), NAMES, strict=True)
    ]
    for rec, name in zip(recs, NAMES, strict=True):
        if len(rec.shape) < 2:
            raise ValueError(f"{name} has shape {rec.shape}; attention takes (..., S, D) arrays")
    q, k, v = recs
    for rec, name in ((k, "k"), (v, "v")):
        if rec.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {rec.dtype}, q has {q.dtype}: they must match")
        if rec.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"{name} has head dimension {rec.shape[-1]}, q has {q.shape[-1]}: they must match"
            )
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has {v.shape[-2]} keys, k has {k.shape[-2]}: they must match")
    return recs


def _batch(q, k, v) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))
    except ValueError:
        raise ValueError(
            f"the batch shapes of q {q.shape[:-2]}, k {k.shape[:-2]} and v {v.shape[:-2]} do "
            "not broadcast"
        ) from None


def _scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def _uses_wgmma(dtype: np.dtype, d: int, config) -> bool:
    """Whether aligned launches run the warpgroup-MMA kernel: float16 or bfloat16 where kernels
    run on sm_90a (:func:`tessera_tile.dynamic_shared.wgmma`), a head size it takes, and no
    mma.sync config asked for."""
    return (
        dtype != np.float32
        and dynamic_shared.wgmma()
        and d in warpgroups.HEAD_DIMS
        and not isinstance(config, tensor_cores.AttentionConfig)
    )


def _config(config, family: Family, d: int, wgmma: bool):
    if config is None:
        return None
    expected = family.config_type
    allowed = (expected, warpgroups.WgmmaAttentionConfig) if wgmma else (expected,)
    if not isinstance(config, allowed):
        names = " or a ".join(f"{t.__module__}.{t.__name__}" for t in allowed)
        wgmma_note = ""
        if isinstance(config, warpgroups.WgmmaAttentionConfig):
            wgmma_note = (
                " (the warpgroup-MMA kernel runs on sm_90a, float16 or bfloat16, D in "
                f"{warpgroups.HEAD_DIMS})"
            )
        raise TypeError(
            f"config must be None or a {names} for these inputs, got "
            f"{type(config).__name__}{wgmma_note}"
        )
    try:
        config.validate(d)
    except ValueError as e:
        raise ValueError(f"config: {e}") from None
    return config


def attention(q, k, v, *, causal=False, scale=None, config=None):
    """``softmax(q @ k^T * scale) @ v`` in one flash-attention kernel: the ``Sq x Sk`` score
    matrix is never written to memory.

    ``q``: ``(..., Sq, D)``, ``k`` and ``v``: ``(..., Sk, D)``, leading dimensions broadcast
    as in NumPy; D in {16, 32, 64, 128}. ``scale`` defaults to ``1 / sqrt(D)``.
    ``causal=True`` masks key ``j > i + Sk - Sq``: aligned to the bottom right, as FlashAttention
    (2.1 on) and PyTorch's ``causal_lower_right`` (PyTorch's ``is_causal=True`` aligns to the
    top left: the two differ where Sq != Sk); tiles above the diagonal are skipped. A query
    row with no visible key (``Sk = 0``, or causal with ``Sq > Sk``) gives zeros, as
    PyTorch's math backend.

    float16 in, float16 out, on the tensor cores: scores, softmax statistics and O accumulated
    in float32, the probabilities rounded to float16 for ``P @ V``, O rounded once; float32 in,
    float32 out, computed in float32. NaN reaches every row that sees it; a +inf score makes
    its row NaN (``inf - inf``), a -inf score gives its key weight 0, and inf in v passes
    through ``P @ V``: IEEE arithmetic, as the unfused softmax computes. ``config``: an
    :class:`tessera_tile.kernels.attention.AttentionConfig` (float16, bfloat16),
    :class:`tessera_tile.kernels.attention.wgmma.WgmmaAttentionConfig` (the same, on sm_90a
    with D 64 or 128) or :class:`tessera_tile.kernels.attention.simt.SimtAttentionConfig`
    (float32); default, the family's :func:`default_config` for D (float16 and bfloat16: and
    Sq). On sm_90a (a GPU of compute capability 9.0, or the simulator standing for
    one) float16 and bfloat16 with D 64 or 128 run on the warpgroup-MMA kernel unless an
    ``AttentionConfig`` asks for the mma.sync one; its default config is then its tuner's
    choice (:data:`WGMMA_CHOICES`: the default, or the same with a producer warpgroup, timed
    on a GPU; the default without one). ``out=`` and ``stream=`` as for every op.
    """
    q, k, v = _operands(q, k, v)
    batch = _batch(q, k, v)
    d = q.shape[-1]
    family = FAMILIES[q.dtype]
    if d not in family.module.HEAD_DIMS:
        raise ValueError(
            f"q has head dimension {d}; attention supports D in {family.module.HEAD_DIMS}"
        )
    if not isinstance(causal, bool | np.bool_):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    wgmma = _uses_wgmma(q.dtype, d, config)
    call = Attention(
        q, k, v, bool(causal), _scale(scale, d), _config(config, family, d, wgmma), batch, wgmma
    )
    _check_positions(call)
    return call


def _check_positions(call: Attention) -> None:
    """The tensor-core kernel holds query and key positions in int32, up to two tiles past the
    end of a sequence (its last block and its masks): refuse lengths that would wrap."""
    if not call.family.int32_positions:
        return
    cfg = call.tile_config()
    limit = INT32_MAX - 2 * max(cfg.block_q, cfg.block_kv)
    for name, length in (("q", call.sq), ("k", call.sk)):
        if length > limit:
            raise ValueError(
                f"{name} has sequence length {length}: the float16 kernel counts positions "
                f"in int32, so at most {limit}"
            )


# --------------------------------------------------------------------------------------------
# the wgmma kernel's config: its default, or the same with a producer warpgroup, where it pays

# The default (overlapped, 64-key tiles) with two warpgroups of query rows and with one, each
# without and with a producer warpgroup. The model scores the pair of the default's warps for
# (D, Sq) alike and the other pair inf: without a GPU the default runs, and on one the first
# call of a shape bucket times the pair.
WGMMA_CHOICES = tuple(
    warpgroups.WgmmaAttentionConfig(64, warps, 3, True, producer)
    for warps in (8, 4)
    for producer in (False, True)
)


def wgmma_model(config, q, k, v, causal) -> float:
    """0 for the configs with the default's warps for these operands, inf for the others."""
    default = warpgroups.default_config(q.shape[-1], q.shape[-2])
    return 0.0 if config.num_warps == default.num_warps else math.inf


def _tuned_wgmma(q, k, v, causal, *, config):
    return attention(q, k, v, causal=causal, config=config).run(None, None)  # as the op


# named as the op it times (the tuner's disk key holds the name)
_tuned_wgmma.__qualname__ = _tuned_wgmma.__name__ = "attention"
_tuned_wgmma.__module__ = "tessera_tile.ops._attention"
TUNED_WGMMA = autotune(WGMMA_CHOICES, key=["q", "k", "v", "causal"], model=wgmma_model)(
    _tuned_wgmma
)
