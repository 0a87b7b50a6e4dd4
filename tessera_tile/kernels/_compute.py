"""The compute dtype of the fused definitions: float16 is computed in float32.

The composer rounds a float16-typed value to float16 where a reduction reads it (as NumPy
stores float16 arrays), so a definition that squares or exponentiates float16 values would
round, or overflow (``x * x`` past ``|x| = 256``), between steps. The prebuilt ops promise one
rounding at the end instead: their definitions widen x first and cast the result back.
"""

from __future__ import annotations

import numpy as np

from .. import fusion as tt


def widened(x):
    """``x`` in its compute dtype: float32 for float16, else ``x`` itself."""
    return tt.astype(x, np.float32) if x.dtype == np.float16 else x
