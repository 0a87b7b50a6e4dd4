"""Prebuilt ops whose launch configuration :func:`tessera_tile.autotune` chooses.

::

    from tessera_tile import tuned

    c = tuned.matmul(a, b)                 # ops.matmul with the tuned TileConfig
    y = tuned.linear(x, w, bias, "gelu")   # ops.linear likewise

The first call per shape bucket and dtype tunes: the matmul's analytic model
(:func:`tessera_tile.tile_config.estimate`) ranks :data:`CONFIGS`; a GPU then times those the
model does not rank worse than the first (the SIMT default), and without one the model's choice
is kept. Later calls, in this process or another, read the choice from the cache.
``tessera-tile tune matmul --shape 4096x1024`` fills it ahead of time (the stand-ins of the
command: ``(M, K) @ (K, K)``).

Unlike :mod:`tessera_tile.ops`, which picks the model's default at every call, these consult the
tuning cache; the result is the same op, only its schedule differs.
"""

from __future__ import annotations

import math

import numpy as np

from . import ops, tile_config
from .autotune import autotune

__all__ = ["CONFIGS", "linear", "matmul"]

# The SIMT candidates (float32 tiles: float32 inputs, or float16 inputs widened) and the
# tensor-core tile (float16 inputs only). The first is the shipped default of the sweep.
CONFIGS = (*tile_config.CANDIDATES, tile_config.TENSOR_CORE_DEFAULT)


def model(config, x, w, *rest, **kwargs) -> float:
    """The analytic model's seconds for ``x @ w`` (inf for a config the inputs cannot use)."""
    dtype = np.dtype(x.dtype)
    if config.dtype == "float16" and dtype != np.float16:
        return math.inf
    m = int(np.prod(x.shape[:-1], dtype=np.int64)) if len(x.shape) > 1 else 1
    k, n = x.shape[-1], w.shape[-1]
    return tile_config.estimate(max(m, 1), max(n, 1), max(k, 1), 1, config, dtype.itemsize).seconds


def _matmul(a, b, *, config):
    return ops.matmul(a, b, config=config)


def _linear(x, w, bias=None, activation=None, *, config):
    return ops.linear(x, w, bias, activation, config=config)


_matmul.__qualname__ = _matmul.__name__ = "matmul"
_linear.__qualname__ = _linear.__name__ = "linear"
matmul = autotune(CONFIGS, key=["a", "b"], model=model)(_matmul)
linear = autotune(CONFIGS, key=["x", "w"], model=model)(_linear)
