"""The tuners behind the matmul ops' default configs, by name.

::

    from tessera_tile import tuned

    c = tuned.matmul(a, b)                 # ops.matmul with the TileConfig tt.autotune chose
    tuned.matmul.choose(a, b)              # that TileConfig
    y = tuned.linear(x, w, bias, "gelu")   # ops.linear likewise
    tuned.matmul_tf32.choose(a, b)         # the TF32 tiles of precision="tf32" calls

``ops.linear`` called without ``config=`` takes ``linear``'s choice, ``ops.matmul`` and
``ops.mlp`` take ``matmul``'s (``matmul_tf32``'s with ``precision="tf32"``): the first call per
shape bucket and dtype tunes (the analytic model,
:func:`tessera_tile.tile_config.estimate`, ranks :data:`CONFIGS`; a GPU then times those the
model does not rank worse than the first, the SIMT default; without one the model's choice is
kept), and later calls, in this process or another, read it from the cache.
``tessera-tile tune matmul --shape 4096x1024`` (or ``tune linear``) fills a tuner's cache ahead
of time (the stand-ins of the command: ``(M, K) @ (K, K)``).
"""

from __future__ import annotations

from .kernels.matmul.calls import TUNED_LINEAR as linear
from .kernels.matmul.calls import TUNED_MATMUL as matmul
from .kernels.matmul.calls import TUNED_MATMUL_TF32 as matmul_tf32
from .kernels.matmul.calls import tile_model as model
from .tile_config import CHOICES as CONFIGS

__all__ = ["CONFIGS", "linear", "matmul", "matmul_tf32", "model"]
