"""Warp-aware, instrumented extension of numba-cuda's CUDA simulator (filled in by its issue)."""

import os


def _auto_install() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        pass
