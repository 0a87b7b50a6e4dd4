"""Launches of the tensor-core matmul kernels (:mod:`.matmul_tc`, float16; :mod:`.matmul_tf32`,
float32 as TF32), on the host: grid, block, dynamic shared memory and global bytes
(:func:`plan`; :meth:`Plan.launch` launches with them), and the checks of their operands
(:func:`check_operands`; :func:`aligned_rows`, what the ``cp.async`` path needs).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import dynamic_shared
from ..._runtime import arrays as _arrays
from ..tc_tiles import TensorCoreConfig

__all__ = ["Plan", "aligned_rows", "check_operands", "plan"]

_DEFAULT = TensorCoreConfig()  # the float16 anchor, matmul_tc.ANCHOR


class Plan(NamedTuple):
    """Launch configuration and global bytes of one launch (what the profiler measures)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bytes_a: int  # A is read once per column of output tiles
    bytes_b: int  # B once per row of output tiles
    bytes_bias: int  # each warp reads its columns' bias once (warps_m times per block column)
    bytes_c: int  # C written once
    shared: int  # bytes of dynamic shared memory: the A and B rings

    @property
    def bytes_total(self) -> int:
        return self.bytes_a + self.bytes_b + self.bytes_bias + self.bytes_c

    def launch(self, kernel, *args, stream=0) -> None:
        """``kernel[grid, block, stream, shared](*args)``, opted in to its shared memory."""
        dynamic_shared.launch(kernel, self.grid, self.block, self.shared, args, stream)


def plan(batch: int, m: int, n: int, k: int, config: TensorCoreConfig = _DEFAULT) -> Plan:
    """Grid, block, dynamic shared memory and the global bytes a launch reads and writes for
    ``(batch, m, n, k)``
    (``config``: by default the float16 anchor, :data:`.matmul_tc.ANCHOR`).

    A grid with a zero extent means nothing to launch (batch, M or N is 0).
    """
    for name, v in (("batch", batch), ("m", m), ("n", n), ("k", k)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    tiles_m = -(-m // config.tile_m)
    tiles_n = -(-n // config.tile_n)
    bias = 4 * batch * tiles_m * n * config.warps_m if config.has_bias else 0
    item = config.itemsize
    return Plan(
        grid=(tiles_n, tiles_m, batch),
        block=(config.threads, 1, 1),
        bytes_a=item * batch * m * k * tiles_n,
        bytes_b=item * batch * k * n * tiles_m,
        bytes_bias=bias,
        bytes_c=item * batch * m * n,
        shared=config.shared_bytes,
    )


def aligned_rows(a, b, c) -> bool:
    """Whether the ``cp.async`` kernel (``async_copy=True``) can take these arrays: every row
    of A, B and C starts on 16 bytes (K and N multiples of 8 for float16, of 4 for float32,
    16-byte aligned base addresses, row and batch strides multiples of 16 bytes). Otherwise
    use ``async_copy=False``."""
    for name, x in (("a", a), ("b", b), ("c", c)):
        arg = x if isinstance(x, _arrays.Arg) else _arrays.read(x, name, scalars=False)
        if len(arg.shape) != 3:
            raise ValueError(f"{name} must be 3-d (batch, rows, cols), got shape {arg.shape}")
        chunk = 16 // arg.dtype.itemsize
        if arg.shape[2] % chunk or arg.address % 16 or any(s % 16 for s in arg.strides[:2]):
            return False
    return True


def check_operands(a, b, bias, c, dtype=np.float16) -> bool:
    """Validate the kernel's arguments before a launch; returns :func:`aligned_rows`.

    TypeError or ValueError naming the argument: ``a``, ``b``, ``c`` of ``dtype`` (float16;
    float32 for the TF32 kernel) and 3-d with the
    inner dimension contiguous, ``(batch, M, K) @ (batch, K, N) -> (batch, M, N)`` with one
    batch size (broadcast a single matrix with a stride-0 view), ``bias`` float32 1-d (``(N,)``
    when the kernel uses it: the caller checks that, it knows ``has_bias``).
    """
    args = {
        name: x if isinstance(x, _arrays.Arg) else _arrays.read(x, name, scalars=False)
        for name, x in (("a", a), ("b", b), ("bias", bias), ("c", c))
    }
    dtype = np.dtype(dtype)
    for name in ("a", "b", "c"):
        arg = args[name]
        if arg.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {arg.dtype}")
        if len(arg.shape) != 3:
            raise ValueError(f"{name} must be 3-d (batch, rows, cols), got shape {arg.shape}")
        if arg.shape[2] > 1 and arg.strides[2] != dtype.itemsize:
            raise ValueError(f"{name}: the inner dimension must be contiguous ([:, :, ::1])")
    if args["bias"].dtype != np.float32 or len(args["bias"].shape) != 1:
        raise TypeError(f"bias must be a 1-d float32 array, got {args['bias'].dtype}")
    (ba, m, k), (bb, k2, n), (bc, m2, n2) = args["a"].shape, args["b"].shape, args["c"].shape
    if k2 != k:
        raise ValueError(f"b has {k2} rows, a has {k} columns: inner dimensions differ")
    if ba != bb:
        raise ValueError(
            f"a has batch {ba}, b has batch {bb}: broadcast one to the other first (a stride-0 "
            "view, e.g. numpy.broadcast_to)"
        )
    if (bc, m2, n2) != (ba, m, n):
        raise ValueError(f"c has shape {args['c'].shape}, expected ({ba}, {m}, {n})")
    if bc > 1 and args["c"].strides[0] == 0 and m * n:
        raise ValueError("c: a batch stride of 0 would write every batch to the same matrix")
    return aligned_rows(args["a"], args["b"], args["c"])
