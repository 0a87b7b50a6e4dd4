"""tessera_tile: tile-level GPU programming with Numba CUDA.

Tile primitives as Numba CUDA device functions, a fusion composer, prebuilt fused ops, and a
warp-aware simulator to check all of it against NumPy without a GPU.
"""

from ._version import __version__

# Under NUMBA_ENABLE_CUDASIM=1 the warp-aware simulator replaces numba-cuda's launch path, so
# kernels that never import anything else from tessera_tile get warp operations too.
from .sim import _auto_install

_auto_install()

__all__ = ["__version__"]
