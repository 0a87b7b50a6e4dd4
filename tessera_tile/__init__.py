"""tessera_tile: tile-level GPU programming with Numba CUDA.

Tile primitives as Numba CUDA device functions, a fusion composer, prebuilt fused ops, and a
warp-aware simulator to check all of it against NumPy without a GPU.
"""

from ._runtime import config as _config
from ._version import __version__

# Under NUMBA_ENABLE_CUDASIM=1 the warp-aware simulator replaces numba-cuda's launch path, so
# kernels that never import anything else from tessera_tile get warp operations too; without
# it, the simulator is not imported.
if _config.SIMULATED:
    from .sim import install as _install_simulator

    _install_simulator()

import importlib as _importlib  # noqa: E402

from . import fusion  # noqa: E402 - after the simulator, which fused kernels may run in
from ._fusion.autodiff import grad, vjp  # noqa: E402 - gradients of fused functions
from ._runtime.arrays import host_to_device as to_device  # noqa: E402 - bfloat16 too, unlike numba's
from ._runtime.cache import CacheWarning  # noqa: E402 - what the persistent caches warn of
from .autotune import autotune  # noqa: E402 - the function; the module stays importable by name
from .fusion import (  # noqa: E402
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
    fuse,
    gelu,
    isfinite,
    isinf,
    isnan,
    log,
    log1p,
    log2,
    logsumexp,
    matmul,
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
    swapaxes,
    tanh,
    tri,
    var,
    where,
)
from .tile_config import TileConfig  # noqa: E402 - the schedule of the matmul ops

# A fused function called with Dask arrays goes to tessera_tile.dask (the optional extra).
fusion.set_dask_loader(lambda: _importlib.import_module("tessera_tile.dask"))

# Submodules reachable as attributes (tt.inspect, tt.memory...), imported on first use: the
# compile-only and primitive modules cost nothing to a user who only fuses.
_SUBMODULES = (
    "bfloat16", "dask", "dynamic_shared", "inspect", "kernels", "mbarrier", "memory", "mma", "ops",
    "pipeline", "profiling", "sim", "tile_config", "tile_ir", "tuned", "warp",
)  # fmt: skip


def profile(device: str = "h100"):
    """Time (on a GPU) or explain (without one) the fused launches of a ``with`` block, against
    ``device``'s peaks (``"a100"``, ``"h100"``, ``"h200"``); see :mod:`tessera_tile.profiling`."""
    from .profiling import profile as _profile

    return _profile(device=device)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tessera_tile' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and submodules only (imported private modules are attributes too)."""
    return sorted({*__all__, *_SUBMODULES})


__all__ = [
    "__version__",
    "TileConfig",
    "CacheWarning",
    "fusion",
    "fuse",
    "vjp",
    "grad",
    "autotune",
    "profile",
    "to_device",
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
    "matmul",
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
    "swapaxes",
    "tanh",
    "tri",
    "var",
    "where",
]
