"""benchmarks/gpu_check.py, the parts that need no GPU: running a part (left out, passed,
failed, out of budget) and the results files it writes."""

import importlib.util
import json
import sys

import pytest
from helpers import ROOT, SIMULATED

# loaded from its file: benchmarks/ on sys.path would let benchmarks/distributed.py hide the
# distributed package from the Dask tests' worker processes
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(_spec)  # for dataclasses
_spec.loader.exec_module(gpu_check)


def test_a_part_runs_and_records_its_verdict():
    py = sys.executable
    ok = gpu_check.Part("ok", [py, "-c", "print('hello')"])
    gpu_check.run_part(ok, py, left_s=60)
    assert ok.status == "passed" and "hello" in ok.output and ok.seconds >= 0
    bad = gpu_check.Part("bad", [py, "-c", "raise SystemExit(3)"])
    gpu_check.run_part(bad, py, left_s=60)
    assert bad.status == "failed (rc 3)"
    missing = gpu_check.Part("m", [py, "-c", "pass"], needs=("no_such_package_here",))
    gpu_check.run_part(missing, py, left_s=60)
    assert missing.status.startswith("left out: no_such_package_here not importable")
    late = gpu_check.Part("late", [py, "-c", "pass"])
    gpu_check.run_part(late, py, left_s=10)
    assert late.status == "left out: the budget was spent"


def test_a_part_never_runs_in_the_simulator(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    py = sys.executable
    part = gpu_check.Part(
        "env", [py, "-c", "import os; print(os.environ.get('NUMBA_ENABLE_CUDASIM'))"]
    )
    gpu_check.run_part(part, py, left_s=60)
    assert part.output.strip() == "None"


def test_the_results_files_hold_every_part(tmp_path, monkeypatch):
    import datetime

    monkeypatch.setattr(gpu_check, "RESULTS", tmp_path)
    info = {
        "python": "3.11",
        "versions": {"numba-cuda": "0.30"},
        "device": {"name": "NVIDIA H200", "cc": [9, 0]},
    }
    parts = [
        gpu_check.Part("GPU tier", ["pytest"], status="passed", seconds=1.5, output="3 passed")
    ]
    parts.append(gpu_check.Part("bench", ["x"], status="left out: cupy not importable by py"))
    when = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.timezone.utc)
    md, js = gpu_check.write_results(info, parts, when)
    assert md.name == "nvidia-h200-2026-11-28.md" and js.name == "nvidia-h200-2026-11-28.json"
    text = md.read_text()
    assert "| GPU tier | passed | 1.5 |" in text and "3 passed" in text
    assert "| bench | left out: cupy not importable by py | 0.0 |" in text
    data = json.loads(js.read_text())
    assert [p["status"] for p in data["parts"]] == ["passed", "left out: cupy not importable by py"]
    assert data["device"]["cc"] == [9, 0] and data["versions"] == {"numba-cuda": "0.30"}


@pytest.mark.sim_only("on a GPU it would run the whole check")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    assert SIMULATED
    monkeypatch.setattr(gpu_check, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_check, "environment", lambda python: {"device": None})
    assert gpu_check.main([]) == 1
    assert "no usable GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())
