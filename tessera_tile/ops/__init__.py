"""Prebuilt fused ops on CuPy arrays, numba device arrays and NumPy arrays.

::

    from tessera_tile import ops

    y = ops.softmax(x)                      # x: CuPy in, CuPy out; NumPy in, NumPy out
    y = ops.layer_norm(x, w, b, out=y, stream=s)
    print(ops.softmax.explain(x))           # kernels, predicted traffic, source, no launch
    reports = ops.rms_norm.inspect(x, w, arch="sm_90")   # offline compile reports

Every op validates its arguments (each read once into an ``_arrays.Arg`` record) and raises
``TypeError`` or ``ValueError`` naming the argument before anything is launched, then dispatches
to a fused definition (``ops._definitions``) where the composer already makes the best kernel
(softmax, log-softmax, the norms, reductions), or to a hand-written kernel of
:mod:`tessera_tile.kernels` where one does better (cross-entropy's gather, the padded
transpose, the GEMMs, attention). Results follow the inputs (see
``docs/ops.md``); ``out=`` writes into a given array, ``stream=`` picks the stream; inputs are
never modified. float16 is computed in float32.
"""

from ._attention import attention
from ._cross_entropy import cross_entropy
from ._matmul import linear, matmul, mlp
from ._reductions import argmax, argmin, max, mean, min, std, sum, var  # noqa: A004
from ._rows import layer_norm, log_softmax, rms_norm, softmax
from ._transpose import transpose

__all__ = [
    "argmax", "argmin", "attention", "cross_entropy", "layer_norm", "linear", "log_softmax",
    "matmul", "max", "mean", "min", "mlp", "rms_norm", "softmax", "std", "sum", "transpose",
    "var",
]  # fmt: skip
