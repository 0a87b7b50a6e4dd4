"""The warpgroup-MMA matmul kernel's configuration (:mod:`.wgmma`): its tile, warpgroups,
stages and operand layouts, and what they need of shared memory and registers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._runtime import compat
from ..epilogue import ElementEpilogue
from ..tc_tiles import MAX_SHARED, WARP_SIZE
from ..wgmma_tiles import ALIGN, WARPGROUP

__all__ = ["B_BLOCK", "DEFAULT", "WgmmaConfig"]

B_BLOCK = 64  # columns of an MN-major tile per 128-byte swizzle row


class WgmmaConfig(NamedTuple):
    """One configuration of the wgmma kernel. It has the fields :func:`.matmul_tc_plan.plan`
    reads (``tile_m``, ``tile_n``, ``has_bias``, ``warps_m``, ``itemsize``, ``threads``,
    ``shared_bytes``), so that plan serves it."""

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    num_warps: int = 8
    num_stages: int = 4
    has_bias: bool = False
    bf16: bool = False
    producer: bool = False  # a warpgroup that only copies, before the num_warps that multiply
    # operands read transposed (module .wgmma_staging): A as (K, M), MN-major; B as (N, K),
    # K-major
    trans_a: bool = False
    trans_b: bool = False

    @property
    def itemsize(self) -> int:
        return 2

    @property
    def warpgroups(self) -> int:
        """The warpgroups that multiply (the producer's is not one of them)."""
        return self.num_warps // WARPGROUP

    @property
    def threads(self) -> int:
        return WARP_SIZE * (self.num_warps + (WARPGROUP if self.producer else 0))

    @property
    def copiers(self) -> int:
        """Threads that issue the copies: the producer warpgroup's, else all."""
        return WARP_SIZE * WARPGROUP if self.producer else self.threads

    @property
    def m_blocks(self) -> int:
        """64-row wgmma accumulators per warpgroup (1 or 2)."""
        return self.tile_m // self.warpgroups // 64

    @property
    def warps_m(self) -> int:
        """How many times a block reads each bias element of its columns: every warp holds
        all ``tile_n`` columns of 16 rows per 64-row block (the plan's bias bytes)."""
        return self.tile_m // 16

    @property
    def stage_bytes(self) -> int:
        return self.itemsize * self.tile_k * (self.tile_m + self.tile_n)

    @property
    def shared_bytes(self) -> int:
        """The ring, plus the slack that lets the kernel start it on a 1024-byte boundary
        (dynamic shared memory; a producer's mbarriers are :attr:`static_bytes` more)."""
        return self.num_stages * self.stage_bytes + ALIGN

    @property
    def static_bytes(self) -> int:
        """Static shared memory: with a producer, a full and an empty mbarrier per stage."""
        return 2 * 8 * self.num_stages if self.producer else 0

    @property
    def hgmma_per_k_tile(self) -> int:
        """wgmma.mma_async (m64 n{tile_n} k16) a warpgroup issues per k-tile."""
        return self.m_blocks * self.tile_k // 16

    def validate(self, activation=None) -> None:
        """Raise ``ValueError`` unless this config makes a kernel, ``TypeError`` unless
        ``activation`` is ``None``, a CUDA device function or an ElementEpilogue."""
        for name in ("tile_m", "tile_n", "tile_k", "num_warps", "num_stages"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_warps not in (4, 8):
            raise ValueError(
                f"num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps}"
            )
        if self.num_stages not in (3, 4):
            raise ValueError(f"num_stages must be 3 or 4, got {self.num_stages}")
        if self.tile_k not in (32, 64):
            raise ValueError(
                f"tile_k must be 32 or 64 (a 64- or 128-byte swizzled row), got {self.tile_k}"
            )
        if self.tile_m % (64 * self.warpgroups) or self.m_blocks not in (1, 2):
            raise ValueError(
                f"tile_m must be 64 or 128 rows per warpgroup ({self.warpgroups}), got "
                f"{self.tile_m}"
            )
        if self.tile_n % B_BLOCK or not B_BLOCK <= self.tile_n <= 256:
            raise ValueError(f"tile_n must be 64, 128, 192 or 256, got {self.tile_n}")
        if self.m_blocks * self.tile_n > 256:
            raise ValueError(
                f"{self.m_blocks} accumulators of 64 x {self.tile_n} per warpgroup are "
                f"{self.m_blocks * self.tile_n // 2} float32 per thread; at most 128 fit"
            )
        if self.shared_bytes + self.static_bytes > MAX_SHARED:
            raise ValueError(
                f"{self.num_stages} stages of {self.tile_m}x{self.tile_k} + "
                f"{self.tile_k}x{self.tile_n} tiles need {self.shared_bytes} B of shared "
                f"memory; no architecture gives a block more than {MAX_SHARED} B"
            )
        fn = activation.fn if isinstance(activation, ElementEpilogue) else activation
        if activation is not None and not compat.is_device_function(fn):
            raise TypeError(
                "activation must be a numba CUDA device function (cuda.jit(device=True)) taking "
                f"and returning float32, an ElementEpilogue, or None; got {activation!r}"
            )


DEFAULT = WgmmaConfig()  # 128 x 128 x 64, 2 warpgroups of 64 x 128, 4 stages
