"""The matmul family as prebuilt ops: their plans are :mod:`tessera_tile.kernels.matmul.calls`;
their gradients the composer's differentiation of the same products written as fused
definitions (:mod:`tessera_tile.ops._definitions`)."""

from .._runtime import arrays
from ..kernels.matmul import calls as matmul_calls
from . import _definitions
from ._contract import Fused, PrebuiltOp


def _records(*values_and_names) -> tuple:
    return tuple(arrays.read(v, name, scalars=False) for v, name in values_and_names)


def _matmul_gradient(a, b, *, config=None, precision=None):
    definition = _definitions.linear(None, False, precision)
    return Fused(definition, _records((a, "a"), (b, "b")))


def _linear_gradient(x, w, bias=None, activation=None, *, config=None, precision=None):
    definition = _definitions.linear(activation, bias is not None, precision)
    present = [(v, n) for v, n in ((x, "x"), (w, "w"), (bias, "bias")) if v is not None]
    return Fused(definition, _records(*present))


def _mlp_gradient(x, w1, b1, w2, b2, activation="gelu", *, precision=None):
    definition = _definitions.mlp(activation, b1 is not None, b2 is not None, precision)
    named = ((x, "x"), (w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))
    return Fused(definition, _records(*[(v, n) for v, n in named if v is not None]))


matmul = PrebuiltOp(matmul_calls.matmul, gradient=_matmul_gradient)
linear = PrebuiltOp(matmul_calls.linear, gradient=_linear_gradient)
mlp = PrebuiltOp(matmul_calls.mlp, gradient=_mlp_gradient)
