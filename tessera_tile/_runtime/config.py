"""Everything tessera_tile reads from its environment, read here and nowhere else.

* ``NUMBA_ENABLE_CUDASIM``: kernels run in the simulator. Read once, at import, as Numba reads
  it: it cannot change for a running process.
* ``TESSERA_TILE_DUMP``: print every generated kernel's source and every fused launch. Read
  once, at import (a launch must not pay for reading the environment).
* ``TESSERA_TILE_CACHE_DIR``: where persistent caches live (default: the user cache directory).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


SIMULATED: bool = _flag("NUMBA_ENABLE_CUDASIM")
TARGET: str = "sim" if SIMULATED else "cuda"  # part of every compiled-kernel cache key


DUMP: bool = _flag("TESSERA_TILE_DUMP")  # print generated sources and launches


def cache_dir() -> Path:
    """The directory of persistent caches."""
    override = os.environ.get("TESSERA_TILE_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tessera_tile"))


@functools.cache
def gpu_present() -> bool:
    """True when a real CUDA GPU is usable (never in the simulator)."""
    if SIMULATED:
        return False
    from numba import cuda

    try:
        return bool(cuda.is_available())
    except Exception:  # a missing driver raises on some numba-cuda versions
        return False
