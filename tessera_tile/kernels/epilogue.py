"""Matmul epilogues: what runs on a float32 accumulator in registers before its single store.

An epilogue is any Numba CUDA device function ``f(x: float32) -> float32``. The matmul kernel
factories (:mod:`tessera_tile.kernels.matmul`, and the float16 tensor-core factory) take one as
``activation`` and call it on every accumulator element after the bias is added::

    acc (registers) -> acc + bias[col] -> activation(...) -> one store of C

so the activation costs no memory traffic. The factories close over the function, so any device
function works, including one the composer generates from a traced elementwise expression.

The named activations (``ACTIVATIONS``: a device function for each name of the one activation
table, :data:`tessera_tile.tile_ir.ACTIVATIONS`) follow PyTorch's definitions, computed in
float32 with float32 constants (a bare ``1.0`` would be float64 in Numba):

* ``relu``: ``max(x, 0)`` (NaN propagates, as ``torch.relu``);
* ``gelu``: ``0.5 x (1 + erf(x / sqrt 2))``, the exact form; ``math.erf`` on float32 is
  libdevice's ``erff`` (no float64);
* ``gelu_tanh``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``;
* ``silu``: ``x * sigmoid(x)`` = ``x * rcp(1 + exp(-x))``: libdevice's ``expf`` and one
  ``rcp.approx`` (at most 1 ulp, PTX ISA) instead of an IEEE division and its slow path (the
  composer's ``math='fast'`` reciprocal); ``exp(-x)`` overflowing to inf gives ``-0.0`` for very
  negative x, the limit.

In the simulator, ``exp`` is NumPy's (Python's ``math.exp`` raises on overflow where the GPU
returns inf), as in the composer's kernels.

``reference(name, x)`` is the table's NumPy meaning in float64, the tests' reference.

An :class:`ElementEpilogue` reads more than the accumulator: the composer generates one for a
matmul inside ``@tt.fuse`` (residuals, scalars, any elementwise chain). Its ``fn(x, z, row,
col, extras)`` gives ``C[z, row, col]`` from ``x`` (the accumulator, plus the bias if any), where
``extras`` is the kernel's fifth argument, a tuple of arrays and scalars; a kernel built with
one takes ``kernel(a, b, bias, c, extras)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from .. import tile_ir as ir
from .._device.numerics import MATH, rcp_approx

__all__ = ["ACTIVATIONS", "ElementEpilogue", "activation_function", "identity", "reference"]

ZERO = float32(0.0)
HALF = float32(0.5)
ONE = float32(1.0)
INV_SQRT2 = float32(ir.SQRT_HALF)
SQRT_2_OVER_PI = float32(ir.SQRT_2_OVER_PI)
GELU_CUBIC = float32(ir.GELU_CUBIC)
exp = MATH["exp"]  # math.exp on a GPU, numpy.exp in the simulator


@cuda.jit(device=True)
def identity(x):
    return x


@cuda.jit(device=True)
def relu(x):
    # x > 0 is False for NaN: return x then, so NaN propagates as in PyTorch.
    return x if not x < ZERO else ZERO


@cuda.jit(device=True)
def gelu(x):
    return HALF * x * (ONE + math.erf(x * INV_SQRT2))


@cuda.jit(device=True)
def gelu_tanh(x):
    inner = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)
    return HALF * x * (ONE + math.tanh(inner))


@cuda.jit(device=True)
def silu(x):
    return x * rcp_approx(ONE + exp(-x))


# the table's names, in its order; a name without a device function fails here, at import
ACTIVATIONS = {name: globals()[name] for name in ir.ACTIVATIONS}


class ElementEpilogue(NamedTuple):
    """A device function ``fn(x, z, row, col, extras) -> value`` of one C element (the module
    doc); ``name`` tags the kernels built with it. The composer guards each array access of
    ``fn`` by the array's own bounds: the kernels call it on edge elements they do not store.
    ``stores=False``: the kernel stores nothing (``fn`` writes every result itself; ``c`` gives
    the result's shape only)."""

    fn: object
    name: str
    stores: bool = True


def activation_function(name):
    """The device function of an activation name (``None``: :func:`identity`)."""
    if name is None:
        return identity
    return ACTIVATIONS[name]


def reference(name, x: np.ndarray) -> np.ndarray:
    """The activation in float64 NumPy (the tests' reference); ``None`` is the identity."""
    x = np.asarray(x, np.float64)
    if name is None:
        return x
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf: silu's limit, -0.0
        return ir.ACTIVATIONS[name].numpy(x)
