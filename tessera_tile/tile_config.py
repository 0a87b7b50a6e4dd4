"""``TileConfig``: the schedule of a tiled matmul, and the analytic model that picks a default.

A config is a frozen dataclass compared and hashed by value, so it can key kernel caches (one
compiled kernel per distinct config) and, later, an autotuner's table (``config.key`` is its
plain value identity, ``config.fingerprint`` a short stable hash of it)::

    from tessera_tile import TileConfig
    cfg = TileConfig(tile_m=128, tile_n=128, tile_k=8, num_warps=8, num_stages=3)

    +------- tile_n -------+         a block of num_warps * 32 threads computes a
    |                      |         tile_m x tile_n tile of C; each thread holds a
  tile_m   C tile          |         thread_m x thread_n register tile of it; the K axis
    |                      |         streams through num_stages shared-memory stages of
    +----------------------+         tile_k columns of A and tile_k rows of B

**Validation on construction** (``ValueError`` naming the field): positive ints; ``num_warps``
1, 2, 4, 8 or 16 (or 12 for float16 tiles: the warp-specialised warpgroup-MMA kernel, a
producer warpgroup and two that multiply) and ``num_stages`` 2, 3 or 4 (what
:func:`tessera_tile.pipeline.ring_buffer` supports); for ``dtype="float32"`` (the SIMT kernel,
which also serves float16 inputs given such a config, widening them into float32 tiles) the
register tile must be 4 x 4, 4 x 8, 8 x 4 or 8 x 8 and the thread grid must divide the warp
layout (``threads_n`` 8, 16 or 32 lanes per tile row, so a quarter-warp never spans two rows of
the C tile), ``tile_k`` a multiple of 4 (one ``LDS.128`` of A holds 4 k values); for
``dtype="float16"`` (the tensor-core kernel's tiles) ``tile_m`` and ``tile_k`` multiples of 16
and ``tile_n`` of 8 (mma.sync m16n8k16); for ``dtype="tf32"`` (float32 tiles read as TF32 by
the tensor cores, ``precision="tf32"``) ``tile_m`` a multiple of 16, ``tile_k`` of 8 and
``tile_n`` of 32 (mma.sync m16n8k8; 8 chunks per B row for its conflict-free swizzle); the
exact warp arrangement being the tensor-core kernels' to check.

**Shared memory.** The SIMT kernel's tiles are static shared arrays up to 48 KiB per block
(:data:`STATIC_SHARED_LIMIT`), and views of dynamic shared memory past it; the tensor-core
kernels (float16, bfloat16, TF32) stage their tiles in dynamic shared memory. A block may use
dynamic shared memory up to its architecture's limit once the kernel opts in
(:mod:`tessera_tile.dynamic_shared`: sm_80 163 KiB, sm_86 and sm_89 99 KiB, sm_90 227 KiB, from
the CUDA C++ Programming Guide). A ``TileConfig`` is checked on construction against the largest
of these (no GPU runs more); an op refuses a config over its device's limit when it plans the
call, and the default model only picks configs that fit the target.

**The default** for a problem (:func:`default_config`) is chosen by an analytic model (see
``docs/matmul.md``): for each candidate that fits the target architecture, blocks resident per
SM from registers (an estimate of the kernel's use), shared memory (the architecture's per-SM
capacity) and warps; the blocks the busiest of the 132 SMs of an H100 runs; the time of its
compute (its tiles' FLOP at 1/132 of the peak of its unit: 67 TFLOP/s of float32 FFMA, 989 of
float16 and 494 of TF32 tensor cores, slowed when fewer than 4 warps, one per scheduler, are
resident) and of the traffic (A read once per column of C tiles, B once per row of them, C
written once, at 3.35 TB/s); the larger of the two is the candidate's time, and the fastest
wins (equal times: the fewer bytes, then the larger tile, listed first). The throughputs are
the H100's on every architecture: only which tiles fit, and how many per SM, follow the target.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import astuple, dataclass, fields, replace

from . import dynamic_shared
from ._runtime import target as _target
from .dynamic_shared import BLOCK_LIMIT as ARCH_SHARED_LIMIT
from .dynamic_shared import MAX_BLOCK_LIMIT as MAX_SHARED
from .dynamic_shared import STATIC_LIMIT as STATIC_SHARED_LIMIT

__all__ = [
    "ARCH_SHARED_LIMIT",
    "CANDIDATES",
    "STATIC_SHARED_LIMIT",
    "TENSOR_CORE_CANDIDATES",
    "TF32_CANDIDATES",
    "WGMMA_CANDIDATES",
    "TileConfig",
    "default_config",
    "estimate",
]

WARP = 32
WARP_SPECIALISED = 12  # num_warps of the warpgroup-MMA kernel with a producer warpgroup
REGISTER_TILES = ((4, 4), (4, 8), (8, 4), (8, 8))  # (thread_m, thread_n) the SIMT kernel supports
STAGED_BYTES = {"float32": 4, "float16": 2, "tf32": 4}
TENSOR_STEPS = {  # tile dtype -> (tile_m, tile_n, tile_k) multiples, and the mma shape
    "float16": ((16, 8, 16), "m16n8k16"),
    "tf32": ((16, 32, 8), "m16n8k8 TF32"),
}

# The machine the default model is written for: an H100 SXM.
SMS = 132
FP32_FLOPS = 67e12  # float32 FFMA, SIMT
FP16_TENSOR_FLOPS = 989e12  # dense float16 on tensor cores, float32 accumulation
TF32_TENSOR_FLOPS = 494e12  # dense TF32 on tensor cores (half the float16 rate)
DRAM_BYTES_PER_S = 3.35e12
SM_REGISTERS = 65536
SM_WARPS = 64
SM_BLOCKS = 32


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"TileConfig {name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"TileConfig {name} must be positive, got {value}")
    return value


@dataclass(frozen=True)
class TileConfig:
    """The schedule knobs of a tiled matmul (see the module docstring).

    Parameters
    ----------
    tile_m, tile_n:
        the C tile one block computes.
    tile_k:
        the K step: columns of A and rows of B per shared-memory stage.
    num_warps:
        warps per block (``threads = 32 * num_warps``): 1, 2, 4, 8 or 16; or 12 for float16
        tiles, the warpgroup-MMA kernel's warp-specialised variant (sm_90a only): a producer
        warpgroup that copies and two that multiply.
    num_stages:
        shared-memory stages of the ``cp.async`` ring (2, 3 or 4): ``num_stages - 1`` tiles in
        flight while one is multiplied.
    dtype:
        the dtype of the staged tiles: ``"float32"`` for the SIMT kernel (float32 inputs, or
        float16 inputs widened into float32 tiles), ``"float16"`` for the tensor-core kernel
        (float16 inputs; their default), ``"tf32"`` for the TF32 tensor-core kernel (float32
        inputs with ``precision="tf32"``).
    """

    tile_m: int
    tile_n: int
    tile_k: int
    num_warps: int
    num_stages: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for f in fields(self)[:5]:
            _positive_int(f.name, getattr(self, f.name))
        specialised = self.num_warps == WARP_SPECIALISED and self.dtype == "float16"
        if self.num_warps not in (1, 2, 4, 8, 16) and not specialised:
            raise ValueError(
                "TileConfig num_warps must be 1, 2, 4, 8 or 16 (or 12 for float16 tiles: the "
                f"warp-specialised warpgroup-MMA kernel), got {self.num_warps}"
            )
        if self.num_stages not in (2, 3, 4):
            raise ValueError(f"TileConfig num_stages must be 2, 3 or 4, got {self.num_stages}")
        if self.dtype not in STAGED_BYTES:
            raise ValueError(
                f"TileConfig dtype must be one of {sorted(STAGED_BYTES)}, got {self.dtype!r}"
            )
        if self.dtype == "float32":
            self._check_simt_layout()
        else:
            steps, shape = TENSOR_STEPS[self.dtype]
            for name, step in zip(("tile_m", "tile_n", "tile_k"), steps, strict=True):
                if getattr(self, name) % step:
                    raise ValueError(
                        f"TileConfig {name} must be a multiple of {step} for {self.dtype} "
                        f"tensor-core tiles (mma {shape}), got {getattr(self, name)}"
                    )
        if self.shared_bytes > MAX_SHARED:
            raise ValueError(
                f"TileConfig {self.tile_m}x{self.tile_n}x{self.tile_k} with {self.num_stages} "
                f"stages needs {self.shared_bytes} B of shared memory; no architecture gives a "
                f"block more than {MAX_SHARED} B"
            )

    def fits(self, arch: str | None = None) -> bool:
        """Whether ``arch`` (None: the device kernels run on) can run this config's kernel:
        its shared memory within the architecture's limit of dynamic shared memory (the SIMT
        kernel's static arrays up to 48 KiB fit every architecture)."""
        return self.shared_bytes <= dynamic_shared.limit(arch)

    def _check_simt_layout(self) -> None:
        threads = self.threads
        per_thread, rest = divmod(self.tile_m * self.tile_n, threads)
        if rest or per_thread not in (16, 32, 64):
            raise ValueError(
                f"TileConfig {self.tile_m}x{self.tile_n} over {threads} threads gives "
                f"{self.tile_m * self.tile_n / threads:g} elements per thread; the SIMT kernel's "
                "register tiles hold 16, 32 or 64 (4x4, 4x8 or 8x4, 8x8)"
            )
        if self._simt_register_tile() is None:
            raise ValueError(
                f"TileConfig {self.tile_m}x{self.tile_n} with {threads} threads fits no "
                "register tile whose thread grid has 8, 16 or 32 threads per row of the C tile "
                "(a quarter-warp must lie within one row)"
            )
        if self.tile_k % 4:
            raise ValueError(f"TileConfig tile_k must be a multiple of 4, got {self.tile_k}")

    def _simt_register_tile(self) -> tuple[int, int] | None:
        per_thread = self.tile_m * self.tile_n // self.threads
        for tm, tn in REGISTER_TILES:
            fits = tm * tn == per_thread and self.tile_m % tm == 0 and self.tile_n % tn == 0
            if fits and self.tile_n // tn in (8, 16, 32):
                return tm, tn
        return None

    # derived figures ------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return WARP * self.num_warps

    @property
    def register_tile(self) -> tuple[int, int]:
        """``(thread_m, thread_n)``: the C elements one thread accumulates (SIMT kernel)."""
        return self._simt_register_tile()

    @property
    def staged_itemsize(self) -> int:
        return STAGED_BYTES[self.dtype]

    @property
    def shared_bytes(self) -> int:
        """Shared memory of the kernel: the A and B rings (the tensor-core kernels' dynamic
        shared memory), plus the SIMT kernel's float32 bias row (static arrays)."""
        ring = self.num_stages * (self.tile_m + self.tile_n) * self.tile_k
        bias_row = self.tile_n * 4 if self.dtype == "float32" else 0
        return ring * self.staged_itemsize + bias_row

    @property
    def key(self) -> tuple:
        """The plain value identity (what caches and an autotuner's table key on)."""
        return astuple(self)

    @property
    def fingerprint(self) -> str:
        """A short hash of :attr:`key`, stable across processes."""
        return hashlib.sha256(repr(self.key).encode()).hexdigest()[:12]

    def __str__(self) -> str:
        return (
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}, {self.num_warps} warps, "
            f"{self.num_stages} stages ({self.dtype} tiles)"
        )


# --------------------------------------------------------------------------------------------
# the default model

# Largest first: ties go to the tile with the most reuse. All 8 x 8 per thread: 16 FFMA per
# shared load in the main loop (smaller register tiles have 8 to 10.7).
CANDIDATES = (
    TileConfig(128, 128, 8, 8, 3),
    TileConfig(128, 64, 8, 4, 3),
    TileConfig(64, 128, 8, 4, 3),
    TileConfig(64, 64, 8, 2, 3),
)


def estimated_registers(config: TileConfig) -> int:
    """Registers per thread the kernel is expected to use. SIMT: the accumulators, the A and B
    fragments of one k step, and about 24 for addresses, indices and the pipeline (the compile
    tier checks the estimate against ptxas, within 25%). Tensor cores: the float32
    accumulators, a quarter as many fragment registers, and 64 for addresses (224 for the
    128 x 128 tile of 4 warps, which ptxas fits in 222-224)."""
    if config.dtype != "float32":  # the tensor-core kernels (TF32: 164 for 128 x 128, 8 warps)
        acc = config.tile_m * config.tile_n // config.threads
        return acc + acc // 4 + 64
    tm, tn = config.register_tile
    return tm * tn + tm * 4 + tn + 24


def blocks_per_sm(config: TileConfig, arch: str | None = "sm_90") -> int:
    regs = -(-estimated_registers(config) * WARP // 256) * 256  # per warp, in units of 256
    by_regs = SM_REGISTERS // (regs * config.num_warps)
    sm = _target.target(arch)
    by_smem = sm.sm_shared // (config.shared_bytes + sm.reserved_shared)
    return max(0, min(by_regs, by_smem, SM_WARPS // config.num_warps, SM_BLOCKS))


@dataclass(frozen=True)
class Estimate:
    """The model's figures for one config on one problem (a model, not a measurement)."""

    config: TileConfig
    tiles: int
    waves: int
    blocks_per_sm: int
    bytes: int
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)


def traffic_bytes(m: int, n: int, k: int, batch: int, config: TileConfig, itemsize: int) -> int:
    """Global bytes of the tiled matmul: A once per column of C tiles, B once per row of them,
    C written once."""
    cols, rows = -(-n // config.tile_n), -(-m // config.tile_m)
    return batch * itemsize * (m * k * cols + k * n * rows + m * n)


def estimate(
    m: int,
    n: int,
    k: int,
    batch: int,
    config: TileConfig,
    itemsize: int = 4,
    arch: str | None = "sm_90",
):
    """The analytic model's estimate for ``config`` on a ``batch`` of ``(m, k) @ (k, n)``
    (blocks per SM from ``arch``'s shared memory per SM). A warp-specialised config is
    modelled as its two warpgroups that multiply (what a producer warpgroup buys is latency,
    which this model does not see)."""
    if config.num_warps == WARP_SPECIALISED:
        config = replace(config, num_warps=8)
    resident = blocks_per_sm(config, arch)
    tiles = batch * -(-m // config.tile_m) * -(-n // config.tile_n)
    per_sm = -(-tiles // SMS)  # blocks the busiest SM runs, `resident` at a time
    waves = max(1, -(-per_sm // max(resident, 1)))
    # An SM issues FFMA at full rate only with at least one warp per scheduler (4); with
    # fewer, issue slots stay empty (each warp's 64 accumulators keep it from stalling).
    warps = min(resident, per_sm) * config.num_warps
    issue = min(1.0, warps / 4)
    tile_flops = 2 * config.tile_m * config.tile_n * k
    peak = {"float16": FP16_TENSOR_FLOPS, "tf32": TF32_TENSOR_FLOPS}.get(config.dtype, FP32_FLOPS)
    compute = per_sm * tile_flops / (peak / SMS) / issue
    nbytes = traffic_bytes(m, n, k, batch, config, itemsize)
    return Estimate(config, tiles, waves, resident, nbytes, compute, nbytes / DRAM_BYTES_PER_S)


# float16 (and bfloat16): the tensor-core kernel's tiles, in dynamic shared memory. The anchor's
# 128 x 128 x 32 (4 warps of 64 x 64, 3 stages: 4.0 HMMA per ldmatrix, 48 KiB) is the default
# where nothing larger pays; 128 x 256 and 256 x 128 (8 warps of 64 x 64, 72 KiB) read A or B
# half as often; CUTLASS's Ampere tile, 256 x 128 x 64 in 3 stages (144 KiB), also halves the
# barriers per k, where the architecture holds it (sm_80, sm_90; not sm_86 or sm_89); a 4th
# stage keeps one more tile in flight.
TENSOR_CORE_DEFAULT = TileConfig(128, 128, 32, 4, 3, dtype="float16")
TENSOR_CORE_CANDIDATES = (
    TileConfig(256, 128, 64, 8, 3, dtype="float16"),
    TileConfig(128, 256, 32, 8, 3, dtype="float16"),
    TileConfig(256, 128, 32, 8, 3, dtype="float16"),
    TileConfig(128, 256, 32, 8, 4, dtype="float16"),
    TileConfig(128, 128, 32, 4, 4, dtype="float16"),
    TENSOR_CORE_DEFAULT,
)

# float32 with precision="tf32": the TF32 tensor-core kernel's tiles, 4 warps of 64 x 64 (the
# float16 arrangement: twice the mma per fragment loaded of 8 warps of 64 x 32), 128 x 128 x 32
# (96 KiB) and x 16 (48 KiB), and 128 x 64 x 16
TF32_CANDIDATES = (
    TileConfig(128, 128, 32, 4, 3, dtype="tf32"),
    TileConfig(128, 128, 16, 4, 3, dtype="tf32"),
    TileConfig(128, 64, 16, 4, 3, dtype="tf32"),
)

# float16 and bfloat16 on the warpgroup-MMA kernel (sm_90a) only: its fastest tiles, with
# k-tiles of 64. Measured on an H200 (float16 4096^3, the kernel alone, median of 10 launches):
# 128 x 256 x 64 with 8 warps 0.378 ms in 4 stages and 0.388 in 3, 128 x 128 x 64 (8 warps, 3
# stages) 0.390, against 0.413 for 128 x 128 x 32 and 0.424 for 256 x 128 x 64, the best of
# the tiles above. The model scores them inf elsewhere (the mma.sync kernels keep their own).
# After them, the same tiles warp-specialised (12 warps: a producer warpgroup and two that
# multiply), not yet timed on a GPU: the model ties each with its 8-warp twin, so only a
# measurement picks one.
WGMMA_CANDIDATES = (
    TileConfig(128, 256, 64, 8, 4, dtype="float16"),
    TileConfig(128, 256, 64, 8, 3, dtype="float16"),
    TileConfig(128, 128, 64, 8, 3, dtype="float16"),
    TileConfig(128, 256, 64, WARP_SPECIALISED, 4, dtype="float16"),
    TileConfig(128, 256, 64, WARP_SPECIALISED, 3, dtype="float16"),
    TileConfig(128, 128, 64, WARP_SPECIALISED, 4, dtype="float16"),
)

# Every config the matmul ops choose among: the SIMT candidates (float32 tiles), the
# warpgroup-MMA kernel's own (before the other float16 tiles: the model ties them with those of
# the same shape, and ties go to the first), the tensor-core tiles (float16 inputs; float32
# inputs with precision="tf32"). The first is the shipped default.
CHOICES = (*CANDIDATES, *WGMMA_CANDIDATES, *TENSOR_CORE_CANDIDATES, *TF32_CANDIDATES)
PRECISIONS = (None, "tf32")


def tile_dtype(dtype="float32", precision: str | None = None) -> str:
    """The tile dtype that inputs of ``dtype`` run on: ``"float16"`` for float16 (tensor
    cores), ``"tf32"`` for float32 with ``precision="tf32"``, else ``"float32"`` (SIMT)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if str(dtype) in ("float16", "bfloat16"):  # the same tiles, mma .f16 or .bf16
        return "float16"
    return "tf32" if precision == "tf32" else "float32"


def score(
    config: TileConfig, m: int, n: int, k: int, batch: int = 1, dtype="float32",
    precision: str | None = None, arch: str | None = None,
) -> float:  # fmt: skip
    """The model's seconds for ``config`` on this problem, inf where the inputs cannot use its
    tiles (:func:`tile_dtype`: float16 inputs take the tensor-core tile, float32 the SIMT ones,
    or the TF32 ones with ``precision="tf32"``), ``arch`` (None: the device kernels run on,
    :func:`tessera_tile.dynamic_shared.arch`) cannot hold them, or they are
    :data:`WGMMA_CANDIDATES` where the warpgroup-MMA kernel does not run; equal times are told
    apart by the bytes moved (a picosecond per gigabyte)."""
    if config.dtype != tile_dtype(dtype, precision) or not config.fits(arch):
        return math.inf
    wgmma_only = config in WGMMA_CANDIDATES or config.num_warps == WARP_SPECIALISED
    if wgmma_only and not _target.target(arch).wgmma:
        return math.inf
    item = 2 if config.dtype == "float16" else 4
    e = estimate(max(m, 1), max(n, 1), max(k, 1), max(batch, 1), config, item, arch)
    return e.seconds + e.bytes * 1e-21


def default_config(
    m: int, n: int, k: int, batch: int = 1, dtype: str = "float32",
    precision: str | None = None, arch: str | None = None,
) -> TileConfig:  # fmt: skip
    """The config the model says is fastest for this problem on ``arch`` (None: the device
    kernels run on; see the module docstring): among :data:`CANDIDATES` for float32,
    :data:`TENSOR_CORE_CANDIDATES` for float16 and bfloat16, :data:`TF32_CANDIDATES` for
    float32 with ``precision="tf32"``."""
    return min(CHOICES, key=lambda c: score(c, m, n, k, batch, dtype, precision, arch))


def waves_text(e: Estimate) -> str:
    """The model's figures as ``explain`` prints them, labelled as an estimate: explain compiles
    nothing, so the blocks per SM come from :func:`estimated_registers` (the plain product's;
    an epilogue adds some), not from ptxas (``inspect()`` gives its count)."""
    regs = estimated_registers(e.config)
    return (
        f"{e.tiles} tiles; model estimate, assuming {regs} registers/thread (the plain "
        f"product's; ptxas's count is in inspect()): {e.blocks_per_sm} block(s)/SM, "
        f"{e.waves} wave(s) over {SMS} SMs, bound {e.seconds * 1e6:.3g} us "
        f"({'compute' if e.compute_s >= e.memory_s else 'memory'})"
    )
