"""The package's shape: small modules, a short top level, a public namespace without private
names, and an import that loads the simulator only under it. Read from the source and from fresh
interpreters, so it runs in any tier."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tessera_tile"
MAX_LINES = 600
MAX_TOP_LEVEL = 26


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.name))
def test_no_module_passes_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it"


def test_the_top_level_has_at_most_26_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL, f"{len(entries)} entries: {entries}"


def fresh(code: str, simulated: bool) -> dict:
    """What ``code`` (which prints one JSON value) prints in a new interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_ENABLE_CUDASIM"] = "1" if simulated else "0"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


IMPORT = """
import json, sys
import tessera_tile as tt
print(json.dumps({
    "private": [n for n in dir(tt) if n.startswith("_") and not n.startswith("__")],
    "modules": sorted(m for m in sys.modules if m.partition(".")[2].startswith("sim")),
}))
"""


def test_dir_shows_only_public_names():
    got = fresh(IMPORT, simulated=False)
    assert got["private"] == [], got["private"]


def test_the_simulator_is_imported_only_under_it():
    # on a GPU or offline, no part of it (the twin registry and the numba-cuda boundary are
    # the library's: _device/twins.py, _runtime/compat.py)
    outside = fresh(IMPORT, simulated=False)["modules"]
    assert outside == [], outside
    inside = fresh(IMPORT, simulated=True)["modules"]
    assert "tessera_tile.sim.engine" in inside, inside


IMPORT_OPS = """
import gc, json, sys, time
start = time.perf_counter()
import tessera_tile
top = time.perf_counter()
import tessera_tile.ops
ops = time.perf_counter()
from numba.cuda.dispatcher import CUDADispatcher
print(json.dumps({
    "top_ms": 1000 * (top - start), "ops_ms": 1000 * (ops - top),
    "simulator": sorted(m for m in sys.modules if m.partition(".")[2].startswith("sim")),
    "kernels": sorted(o.py_func.__qualname__ for o in gc.get_objects()
                      if isinstance(o, CUDADispatcher) and not o.targetoptions.get("device")),
}))
"""


def test_importing_the_ops_builds_no_kernel(record_property):
    """Kernels are built when a call (or the compile tier) first asks for them, not at import;
    and outside the simulator, no part of it is imported (the primitives' twins are its)."""
    got = fresh(IMPORT_OPS, simulated=False)
    assert got["simulator"] == [], got["simulator"]
    record_property(
        "resources",
        f"import tessera_tile {got['top_ms']:.0f} ms, then tessera_tile.ops {got['ops_ms']:.0f} "
        f"ms (one fresh interpreter, offline); kernels built: {len(got['kernels'])}",
    )
    assert got["kernels"] == [], got["kernels"]


def test_the_kernel_families_former_module_names_still_import():
    """``from tessera_tile.kernels import matmul_tc`` (the name before the families became
    packages) gives ``tessera_tile.kernels.matmul.tc``."""
    import importlib

    from tessera_tile import kernels

    assert len(kernels._FORMER) == 13
    for former, now in kernels._FORMER.items():
        assert getattr(kernels, former) is importlib.import_module(f"tessera_tile.kernels.{now}")
    with pytest.raises(AttributeError, match="no attribute 'matmul_fast'"):
        kernels.matmul_fast  # noqa: B018
