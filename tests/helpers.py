"""Helpers shared by the test tiers."""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def load_example(name: str):
    """Import ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    key = f"tessera_examples.{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


SIDES = ("host", "device")


def on(side: str, *arrays):
    """The arrays as a caller on ``side`` holds them: NumPy arrays, or numba device arrays
    (``cuda.to_device``; in the simulator its fake device arrays). Scalars stay scalars."""
    if side == "host":
        return arrays
    from numba import cuda

    return tuple(cuda.to_device(a) if isinstance(a, np.ndarray) and a.ndim else a for a in arrays)


def back(result, side: str):
    """A fused result as NumPy, checking it came back on the caller's side."""
    if isinstance(result, tuple):
        return tuple(back(r, side) for r in result)
    if side == "host":
        assert isinstance(result, np.ndarray), type(result)
        return result
    assert getattr(result, "__cuda_ndarray__", False), f"expected a device array, got {result!r}"
    return result.copy_to_host()
