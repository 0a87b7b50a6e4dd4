"""Test tiers. Each tier runs in its own process (``tests/run_tiers.sh`` runs all three):

* ``sim``: ``NUMBA_ENABLE_CUDASIM=1 pytest tests/sim``, correctness against NumPy in the simulator;
* ``gpu``: the same tests without the simulator, on a real device (skipped, with the reason, when
  there is none); tests marked ``sim_only`` (profiler, race detection...) are left out;
* ``compile``: ``pytest tests/compile``, real compilation for sm_80 and sm_90.
"""

import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

# Persistent caches (tuning, programs, kernels) go to a directory of this test process, never to
# the user's cache; set before tessera_tile is imported. A test that needs its own sets its own.
os.environ["TESSERA_TILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tessera_tile_test_cache_")

# Simulated launches are slow: few, small examples, and no deadline.
settings.register_profile(
    "tessera", max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("tessera")


def _gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from numba import cuda

        if cuda.is_available():
            return None
        return "no CUDA GPU: numba.cuda.is_available() is False"
    except Exception as e:  # a missing driver raises on some versions
        return f"no CUDA GPU: {type(e).__name__}: {e}"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sim_only(reason): holds only in the simulator (profiler, twins...), and why"
    )


def pytest_collection_modifyitems(config, items):
    tier = os.environ.get("TESSERA_TIER")
    if tier == "gpu":
        reason = _gpu_reason()
        for item in items:
            marker = item.get_closest_marker("sim_only")
            if marker is not None:
                why = marker.kwargs.get("reason", "needs the simulator")
                item.add_marker(pytest.mark.skip(reason=f"simulator-only test: {why}"))
            elif reason:
                item.add_marker(pytest.mark.skip(reason=reason))
    if tier == "gpu" and _gpu_reason():
        print(f"\nGPU tier skipped: {_gpu_reason()}")
