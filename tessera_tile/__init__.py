"""tessera_tile: tile-level GPU programming with Numba CUDA.

Tile primitives as Numba CUDA device functions, a fusion composer, prebuilt fused ops, and a
warp-aware simulator to check all of it against NumPy without a GPU.
"""

from ._version import __version__

# Under NUMBA_ENABLE_CUDASIM=1 the warp-aware simulator replaces numba-cuda's launch path, so
# kernels that never import anything else from tessera_tile get warp operations too.
from .sim import _auto_install

_auto_install()

from .fusion import fuse  # noqa: E402 - after the simulator, which fused kernels may run in
from .fusion.trace import (  # noqa: E402
    abs,
    all,
    any,
    argmax,
    argmin,
    astype,
    ceil,
    clip,
    cos,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    gelu,
    isfinite,
    isinf,
    isnan,
    log,
    log1p,
    log2,
    logsumexp,
    max,
    maximum,
    mean,
    min,
    minimum,
    prod,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sin,
    sqrt,
    square,
    std,
    sum,
    tanh,
    var,
    where,
)

__all__ = [
    "__version__",
    "fuse",
    "abs",
    "all",
    "any",
    "argmax",
    "argmin",
    "astype",
    "ceil",
    "clip",
    "cos",
    "erf",
    "exp",
    "exp2",
    "expm1",
    "floor",
    "gelu",
    "isfinite",
    "isinf",
    "isnan",
    "log",
    "log1p",
    "log2",
    "logsumexp",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "prod",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "square",
    "std",
    "sum",
    "tanh",
    "var",
    "where",
]
