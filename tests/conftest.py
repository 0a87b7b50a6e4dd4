"""Test tiers. Each tier runs in its own process (``tests/run_tiers.sh`` runs all three):

* ``sim``: ``NUMBA_ENABLE_CUDASIM=1 pytest tests --ignore=tests/compile``, correctness against
  NumPy in the simulator;
* ``gpu``: the same tests without the simulator, on a real device (skipped, with the reason, when
  there is none); tests marked ``sim_only`` (profiler, race detection...) are left out;
* ``compile``: ``pytest tests/compile``, real compilation for sm_80 and sm_90 (SASS, registers,
  spills, the layering and the guides' figures).

The sim and GPU tiers' tests, by area: ``primitives`` (memory, pipeline, warp, mma, wgmma,
mbarrier, bfloat16, dynamic shared memory), ``fusion`` (the composer, its kernels, launch plans
and caches), ``ops`` (the prebuilt ops, by family), ``simulator`` (the simulator against numba
and the PTX ISA), ``tuning`` (autotune and the persistent caches), ``dask``, ``guides`` (the
examples and the guides' snippets) and ``unit`` (no kernel runs).

A test that takes ``side`` runs on host and on device arrays; one marked ``device_only`` (a heavy
kernel case) on device arrays alone: the host path (copies around the same launches) is covered
by each op's and fused function's boundary tests.

Hypothesis profiles (``HYPOTHESIS_PROFILE``): ``deterministic``, the default and always in CI
(``CI`` set), draws the same examples on every run and machine (derandomised, no example
database, no shrinking: a failure shows the example as drawn); ``explore`` draws new random
examples, keeps failures in ``.hypothesis/`` and shrinks them. A failing example found once is
kept as an explicit case (``@example`` or a parametrised test).

Skipped tests are summarised as one line per reason. Everything the tests write (caches,
``tmp_path``) goes to one temporary directory per process, removed when the process ends.
"""

import atexit
import collections
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

# One directory per test process (xdist workers make their own), removed when it exits.
_TEMP = Path(tempfile.mkdtemp(prefix="tessera_tile_tests_"))
atexit.register(shutil.rmtree, _TEMP, ignore_errors=True)
# Persistent caches (tuning, programs, kernels) go there, never to the user's cache; a test that
# needs its own sets its own.
os.environ["TESSERA_TILE_CACHE_DIR"] = str(_TEMP / "cache")

# Simulated launches are slow: few, small examples, and no deadline.
_COMMON = dict(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deterministic",
    derandomize=True,
    database=None,
    phases=[phase for phase in Phase if phase not in (Phase.shrink, Phase.explain)],
    **_COMMON,
)
settings.register_profile("explore", **_COMMON)
_IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")  # CI services set CI=true
settings.load_profile(
    "deterministic" if _IN_CI else os.environ.get("HYPOTHESIS_PROFILE", "deterministic")
)


def _gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from numba import cuda

        if cuda.is_available():
            return None
        return "no CUDA GPU: numba.cuda.is_available() is False"
    except Exception as e:  # a missing driver raises on some versions
        return f"no CUDA GPU: {type(e).__name__}: {e}"


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook reads the option
def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sim_only(reason): holds only in the simulator (profiler, twins...), and why"
    )
    config.addinivalue_line(
        "markers",
        "device_only(reason): a heavy kernel case run on device arrays only; the op's host path "
        "(copies in and out around the same launches) is covered by its boundary tests",
    )
    if config.option.basetemp is None:  # unless given; xdist gives its workers a subdirectory
        config.option.basetemp = str(_TEMP / "tmp_path")


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


def skip_reason(report) -> str:
    """The reason of a skipped test's report, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason with its count (``-r`` leaves skips out: one line per test)."""
    skipped = terminalreporter.stats.get("skipped", [])
    counts = collections.Counter(skip_reason(report) for report in skipped)
    if counts:
        terminalreporter.section("skipped tests, per reason")
        for reason, count in counts.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")


def pytest_generate_tests(metafunc):
    """``side``: where the caller's arrays live. Fused functions and ops must work on host and
    device arrays; a test marked ``device_only`` runs the device side alone."""
    if "side" not in metafunc.fixturenames or _parametrizes_side(metafunc):
        return
    from helpers import SIDES

    device_only = metafunc.definition.get_closest_marker("device_only") is not None
    metafunc.parametrize("side", ["device"] if device_only else list(SIDES))


def _parametrizes_side(metafunc) -> bool:
    """Whether the test gives ``side`` itself (``@pytest.mark.parametrize("side", ...)``)."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
        if "side" in names:
            return True
    return False
