"""The launch geometry of the matmul ops: operands as stacks of matrices over a broadcast batch.

Batched operands broadcast as in NumPy: the batch dimensions of size 1 or missing get stride 0
(nothing is copied), adjacent batch dimensions merge when every operand's strides allow, the
innermost merged run becomes the grid's z axis (chunks of at most 65,535) and any dimensions
left outside it are launched one after another. Also here: which copy width an operand allows
and the Numba type a view of it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..._runtime import arrays
from ..._runtime.launch import View
from ...tile_ir import storage_dtype

__all__ = [
    "MAX_GRID_YZ", "Geometry", "Matrix", "array_type", "as_matrix", "copy_bytes",
    "first_address", "geometry", "inner_contiguous", "layout", "matrix_view",
    "rows_aligned", "transpose",
]  # fmt: skip

MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Matrix:
    """One operand as the kernel sees it: a stack of matrices over the broadcast batch.

    ``rows``/``cols`` and their byte strides; ``batch_strides``: one per broadcast batch
    dimension (0 where the operand broadcasts)."""

    rows: int
    cols: int
    row_stride: int
    col_stride: int
    batch_strides: tuple[int, ...]
    itemsize: int


def as_matrix(rec: arrays.Arg, batch: tuple[int, ...], vector: str | None) -> Matrix:
    """``rec`` as a :class:`Matrix`; ``vector`` says how a 1-D operand becomes 2-D (``"row"``:
    ``(1, K)`` as NumPy does for the left operand, ``"col"``: ``(K, 1)`` for the right one)."""
    shape, strides = list(rec.shape), list(rec.strides)
    if vector == "row":
        shape, strides = [1, *shape], [0, *strides]
    elif vector == "col":
        shape, strides = [*shape, 1], [*strides, 0]
    own = len(shape) - 2
    offset = len(batch) - own
    batch_strides = []
    for d, size in enumerate(batch):
        o = d - offset
        batch_strides.append(strides[o] if o >= 0 and shape[o] == size and size > 1 else 0)
    return Matrix(
        shape[-2], shape[-1], strides[-2], strides[-1], tuple(batch_strides), rec.dtype.itemsize
    )


@dataclass(frozen=True)
class Geometry:
    """How a batched call splits into launches: ``outer`` batch dimensions launched one after
    another, a merged ``z`` run of batch dimensions on the grid's z axis."""

    batch: tuple[int, ...]
    outer: tuple[int, ...]  # the broadcast dimensions launched one by one
    run: tuple[int, ...]  # the dimensions merged onto z, outermost first
    z_strides: tuple[int, ...]  # per operand, the byte stride of z

    @property
    def z(self) -> int:
        return math.prod(self.batch[d] for d in self.run)

    def indices(self):
        """(batch index, z0, z count) of each launch: the index of the first matrix of it."""
        z = self.z
        for outer in np.ndindex(*(self.batch[d] for d in self.outer)):
            for z0 in range(0, z, MAX_GRID_YZ):
                index = [0] * len(self.batch)
                for d, i in zip(self.outer, outer, strict=True):
                    index[d] = i
                run_index = np.unravel_index(z0, tuple(self.batch[d] for d in self.run) or (1,))
                for d, i in zip(self.run, run_index, strict=False):
                    index[d] = int(i)
                yield tuple(index), z0, min(MAX_GRID_YZ, z - z0)


def geometry(batch: tuple[int, ...], mats: list[Matrix]) -> Geometry:
    dims = [d for d, size in enumerate(batch) if size > 1]
    run: list[int] = []
    for d in reversed(dims):  # grow the merged run outwards while every stride allows
        if run:
            inner = run[0]
            if any(m.batch_strides[d] != m.batch_strides[inner] * batch[inner] for m in mats):
                break
        run.insert(0, d)
    outer = tuple(d for d in dims if d not in run)
    z_strides = tuple(m.batch_strides[run[-1]] if run else 0 for m in mats)
    return Geometry(batch, outer, tuple(run), z_strides)


def matrix_view(array: int, mat: Matrix, index, z_count: int, z_stride: int, dtype=None) -> View:
    """The (z, rows, cols) view of the call's array ``array`` in one launch, from batch
    ``index`` on: made from the record's strides, never by indexing the device array (numba's
    ``DeviceNDArray.__getitem__``, its dummyarray, gives size 1 along stride-0 axes, and raises
    on any view into a 0-byte (null) allocation, e.g. ``[0]`` of a (2, 3, 0) array)."""
    offset = sum(i * s for i, s in zip(index, mat.batch_strides, strict=True))
    shape = (z_count, mat.rows, mat.cols)
    return View(array, shape, (z_stride, mat.row_stride, mat.col_stride), offset, dtype)


def transpose(mat: Matrix) -> Matrix:
    """``mat`` with its rows and columns swapped (a view: the strides swap)."""
    return Matrix(
        mat.cols, mat.rows, mat.col_stride, mat.row_stride, mat.batch_strides, mat.itemsize
    )


def first_address(rec: arrays.Arg, mat: Matrix, index) -> int:
    offset = sum(index[d] * s for d, s in enumerate(mat.batch_strides))
    return rec.address + offset


def layout(mat: Matrix, z_count: int, z_stride: int) -> str:
    """'C' when the (z, rows, cols) view is C-contiguous by NumPy's rule (size-1 dims free)."""
    want = arrays.contiguous_strides((z_count, mat.rows, mat.cols), mat.itemsize)
    have = (z_stride, mat.row_stride, mat.col_stride)
    sizes = (z_count, mat.rows, mat.cols)
    return "C" if all(n <= 1 or h == w for n, h, w in zip(sizes, have, want, strict=True)) else "A"


def inner_contiguous(mat: Matrix) -> bool:
    """A row is contiguous (a matrix without elements has any strides: NumPy gives 0)."""
    return mat.cols <= 1 or mat.rows == 0 or mat.col_stride == mat.itemsize


def rows_aligned(mat: Matrix, z_stride: int, address: int) -> bool:
    """Every row of every matrix starts 16-byte aligned on a contiguous inner axis
    (``z_stride``: 0 when the launch holds one matrix)."""
    return inner_contiguous(mat) and all(s % 16 == 0 for s in (mat.row_stride, z_stride, address))


def copy_bytes(mat: Matrix, z_stride: int, address: int, dtype: np.dtype) -> int:
    """The float32 SIMT kernel's cp.async width: 16 bytes on aligned rows, else 4."""
    return 16 if dtype == np.float32 and rows_aligned(mat, z_stride, address) else 4


def array_type(dtype: np.dtype, ndim: int, layout: str) -> str:
    """A Numba array type as signature text: ``float32[:, :, ::1]`` (C) or ``float32[:, :, :]``."""
    axes = [":"] * ndim
    if layout == "C":
        axes[-1] = "::1"
    return f"{storage_dtype(dtype).name}[{', '.join(axes)}]"
