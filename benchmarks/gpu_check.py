"""One command for a machine with a GPU: the GPU tier, then the benchmarks that need a GPU, with
their output recorded in ``benchmarks/results/<device>-<date>.md`` and ``.json``.

    make gpu-check                          # or: python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --budget 480 --jobs 8

It runs with the Python it is started with (a GPU machine may have no network: nothing is
installed), says what is missing, and leaves out a part whose package is absent with that
reason in the results. Each part has a time limit, and parts stop being started once the budget
(seconds, default 480) is spent; what did not run is listed with why. The docs quote GPU figures
only from the results files this writes. It asserts nothing of its own: the tests' verdicts and
the benchmarks' tables are recorded as they print.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TAIL = 12_000  # characters of each part's output kept in the results


@dataclass
class Part:
    """One command of the check: what it needs, and what it gave."""

    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()  # importable packages it cannot run without
    limit_s: int = 300
    env: dict = field(default_factory=dict)
    status: str = "not run"  # "passed", "failed (rc N)", "timed out", "left out: why"
    seconds: float = 0.0
    output: str = ""


def parts(python: str, jobs: int) -> list[Part]:
    """What the check runs, in order: the tests first (every kernel family on the device), then
    the benchmarks' GPU steps."""
    pytest = [python, "-m", "pytest", "tests", "--ignore=tests/compile", "-q"]
    pytest += ["-p", "no:cacheprovider"]
    if jobs > 1:
        pytest += ["-n", str(jobs)]
    return [
        Part("GPU tier", pytest, ("numba", "pytest", "hypothesis"), 360, {"TESSERA_TIER": "gpu"}),
        Part("host cost per warm call", [python, "benchmarks/overhead.py", "gpu"], ("cupy",), 120),
        Part("matmul against cuBLAS", [python, "benchmarks/matmul.py", "gpu"], ("cupy",), 180),
        Part("attention", [python, "benchmarks/attention.py", "gpu"], ("cupy",), 120),
        Part("row ops against CuPy", [python, "-m", "tessera_tile", "bench"], ("cupy",), 120),
    ]


def environment(python: str) -> dict:
    """Versions, the device, and what is missing (asked of ``python``, the interpreter the parts
    run with)."""
    probe = r"""
import json, importlib.metadata as md
found = {}
for dist in ("numba-cuda", "numba", "cupy-cuda12x", "cupy-cuda13x", "cupy", "dask", "distributed",
             "pytest", "pytest-xdist", "hypothesis", "numpy", "cuda-python", "cuda-bindings"):
    try:
        found[dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass
device = None
try:
    from numba import cuda
    if cuda.is_available():
        d = cuda.get_current_device()
        name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
        device = {"name": name, "cc": list(d.compute_capability)}
        try:
            device["driver"] = list(cuda.cudadrv.driver.driver.get_version())
        except Exception:  # not every numba-cuda has it
            pass
except Exception as e:
    device = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps({"versions": found, "device": device}))
"""
    done = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=_real_env()
    )
    info = json.loads(done.stdout) if done.returncode == 0 else {"versions": {}, "device": None}
    info["python"] = platform.python_version()
    info["machine"] = platform.node()
    return info


def importable(python: str, package: str) -> bool:
    done = subprocess.run([python, "-c", f"import {package}"], capture_output=True, cwd=ROOT)
    return done.returncode == 0


def _real_env(extra: dict | None = None) -> dict:
    """The environment a part runs in: the repository importable, never the simulator."""
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def run_part(part: Part, python: str, left_s: float) -> None:
    missing = [p for p in part.needs if not importable(python, p)]
    if missing:
        part.status = f"left out: {', '.join(missing)} not importable by {python}"
        return
    if part.name == "GPU tier" and not importable(python, "xdist") and "-n" in part.argv:
        part.argv = part.argv[: part.argv.index("-n")]  # one process: pytest-xdist is absent
    limit = min(part.limit_s, int(left_s))
    if limit < 30:
        part.status = "left out: the budget was spent"
        return
    start = time.monotonic()
    try:
        done = subprocess.run(
            part.argv, cwd=ROOT, env=_real_env(part.env), capture_output=True, text=True,
            timeout=limit,
        )  # fmt: skip
        part.output = (done.stdout + done.stderr)[-TAIL:]
        part.status = "passed" if done.returncode == 0 else f"failed (rc {done.returncode})"
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"") + (e.stderr or b"")
        part.output = (out.decode(errors="replace") if isinstance(out, bytes) else out)[-TAIL:]
        part.status = f"timed out after {limit} s"
    part.seconds = round(time.monotonic() - start, 1)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def write_results(info: dict, done: list[Part], when: datetime.datetime) -> tuple[Path, Path]:
    """``<device>-<date>.md`` and ``.json`` under ``benchmarks/results``."""
    device = info.get("device") or {}
    stem = f"{slug(device.get('name', 'no-gpu'))}-{when:%Y-%m-%d}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    md, js = RESULTS / f"{stem}.md", RESULTS / f"{stem}.json"
    js.write_text(
        json.dumps(
            {
                "when": when.isoformat(timespec="seconds"),
                **info,
                "parts": [asdict(p) for p in done],
            },
            indent=2,
        )
        + "\n"
    )
    lines = [
        f"# GPU check: {device.get('name', 'no GPU')}, {when:%Y-%m-%d %H:%M} UTC",
        "",
        f"Device: {json.dumps(device)}  ",
        f"Python {info['python']}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(info.get("versions", {}).items())),
        "",
        "| part | status | seconds |",
        "|---|---|---|",
        *(f"| {p.name} | {p.status} | {p.seconds} |" for p in done),
    ]
    for p in done:
        lines += ["", f"## {p.name}", "", f"`{' '.join(p.argv)}`: {p.status}", ""]
        if p.output:
            lines += ["```", p.output.rstrip(), "```"]
    md.write_text("\n".join(lines) + "\n")
    return md, js


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=480, help="seconds for all parts")
    parser.add_argument("--jobs", type=int, default=8, help="GPU-tier test processes")
    parser.add_argument("--python", default=sys.executable, help="interpreter the parts run")
    args = parser.parse_args(argv)
    info = environment(args.python)
    device = info.get("device")
    if not device or "error" in device:
        why = (device or {}).get("error", "numba.cuda.is_available() is False")
        print(f"gpu-check: no usable GPU ({why}); nothing run, nothing written", file=sys.stderr)
        return 1
    print(f"gpu-check on {device['name']} (compute capability {device['cc']})", flush=True)
    start, done = time.monotonic(), []
    for part in parts(args.python, args.jobs):
        run_part(part, args.python, args.budget - (time.monotonic() - start))
        print(f"  {part.name}: {part.status} ({part.seconds} s)", flush=True)
        done.append(part)
    md, js = write_results(info, done, datetime.datetime.now(datetime.timezone.utc))
    print(f"wrote {md.relative_to(ROOT)} and {js.relative_to(ROOT)}")
    return 0 if all(p.status == "passed" or p.status.startswith("left out") for p in done) else 1


if __name__ == "__main__":
    sys.exit(main())
