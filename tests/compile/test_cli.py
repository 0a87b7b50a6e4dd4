"""The tessera-tile command, each subcommand run as a user runs it: a subprocess of
``python -m tessera_tile`` (the console script is the same ``main``), with its own cache."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT


@pytest.fixture
def cli(tmp_path):
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(tmp_path / "cache"), NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    def run(*args, expect: int = 0) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "tessera_tile", *args],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert done.returncode == expect, (done.stdout, done.stderr)
        return done

    run.tmp = tmp_path
    run.env = env
    return run


def test_doctor_reports_tools_gpu_cupy_and_cache(cli):
    info = json.loads(cli("doctor", "--json").stdout)
    for key in ("numba-cuda", "nvvm", "ptxas", "nvdisasm"):
        assert info[key] and info[key] != "unknown", key
    assert info["cache_dir"] == str(cli.tmp / "cache") and info["cache_writable"] is True
    assert "gpu" in info and "cupy" in info
    text = cli("doctor").stdout
    assert "ptxas" in text and "cache_dir" in text


def test_inspect_compiles_a_kernel_from_a_file(cli):
    (cli.tmp / "kernels.py").write_text(
        textwrap.dedent(
            """
            from numba import cuda

            @cuda.jit
            def axpy(a, x, y):
                for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
                    y[i] = a * x[i] + y[i]
            """
        )
    )
    sig = "void(float32, float32[::1], float32[::1])"
    out = cli(
        "inspect", "kernels.py:axpy", "--signature", sig, "--arch", "sm_80",
        "--elements-per-iteration", "1", "--json",
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["arch"] == "sm_80" and report["spill_stores"] == 0
    assert report["registers"] > 0 and report["histogram"].get("FFMA", 0) >= 1
    assert report["loops"] and report["instructions_per_element"] > 0
    text = cli("inspect", "kernels.py:axpy", "--signature", sig).stdout
    assert "registers" in text and "occupancy" in text and "loops" in text
    err = cli("inspect", "kernels.py:nope", "--signature", sig, expect=2).stderr
    assert "defines no 'nope'" in err and "Usage:" in err


def test_explain_every_op(cli):
    """Every op's stand-ins (in this process, for speed: the subcommand runs as a subprocess
    below)."""
    from click.testing import CliRunner

    from tessera_tile import ops
    from tessera_tile.cli import main

    for name in ops.__all__:
        shape = "8x128x64" if name == "attention" else "64x256"  # (heads, S, D): D <= 128
        done = CliRunner().invoke(main, ["explain", name, "--shape", shape, "--json"])
        assert done.exit_code == 0, (name, done.output)
        data = json.loads(done.output)
        assert data["kernels"] >= 1 and data["bytes_fused"] >= 64 * 256 * 4, name
        if name != "transpose":
            assert data["flops"] >= 64 * 256, name
    text = cli("explain", "softmax", "--shape", "4096x1024", "--dtype", "float16").stdout
    assert "predicted global traffic 16777216 B" in text  # one read and one write of 2-byte x
    text = cli("explain", "layer_norm", "--shape", "8x100", "--dtype", "bfloat16").stdout
    assert "bfloat16[8, 100]" in text and "4096" not in text  # the IR at the call's shapes


def test_inspect_in_a_simulator_process_says_why_it_cannot(cli):
    cli.env["NUMBA_ENABLE_CUDASIM"] = "1"
    err = cli("inspect", "kernels.py:axpy", "--signature", "void()", expect=1).stderr
    assert "run it without NUMBA_ENABLE_CUDASIM=1" in err and "Traceback" not in err, err


def test_bad_ops_shapes_and_dtypes_are_usage_errors(cli):
    for args, message in [
        (("explain", "nope"), "unknown op 'nope'"),
        (("explain", "softmax", "--shape", "4x"), "is not a shape"),
        (("explain", "softmax", "--dtype", "int8"), "int8"),
        (("explain", "softmax", "--dtype", "int32"), "x has dtype int32"),
        (("tune", "nope"), "unknown op"),
    ]:
        err = cli(*args, expect=2).stderr
        assert "Usage: tessera-tile" in err and message in err, (args, err)


def test_tune_fills_the_cache_of_tunable_ops_and_says_when_there_is_none(cli):
    assert "no tunable configs" in cli("tune", "softmax", "--shape", "64x64").stdout
    got = json.loads(cli("tune", "matmul", "--shape", "512x256", "--json").stdout)
    assert got["chosen_by"] == "model" and got["config"].startswith("TileConfig(")
    half = json.loads(
        cli("tune", "linear", "--shape", "512x256", "--dtype", "float16", "--json").stdout
    )
    assert "dtype='float16'" in half["config"]  # the tensor-core tile for float16
    entries = json.loads(cli("cache", "list", "--json").stdout)["entries"]
    launchers = sorted(e["key"]["launcher"][0] for e in entries)  # the ops' default tuners
    assert launchers == ["tessera_tile.ops._matmul.linear", "tessera_tile.ops._matmul.matmul"]


FILL = """
    import numpy as np
    import tessera_tile as tt

    @tt.autotune(["a", "b"], key=["x"])
    def launch(x, *, config):
        return config

    assert launch(np.zeros(3)) == "a"
    """


def _fill(cli) -> subprocess.CompletedProcess:
    (cli.tmp / "fill.py").write_text(textwrap.dedent(FILL))
    env = _env(cli) | {"PYTHONWARNINGS": "always::UserWarning"}
    return subprocess.run(
        [sys.executable, "fill.py"],
        cwd=cli.tmp,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )


def test_cache_list_and_clear(cli):
    _fill(cli)
    listed = json.loads(cli("cache", "list", "--json").stdout)
    assert [e["cache"] for e in listed["entries"]] == ["autotune"]
    assert listed["entries"][0]["value"]["config"] == "'a'"
    text = cli("cache", "list").stdout
    assert "1 entr" in text
    (row,) = listed["entries"]
    # the whole key, the file and its size
    assert f"autotune/{row['file']} ({row['bytes']} B): {json.dumps(row['key'])}" in text, text
    assert row["bytes"] == (cli.tmp / "cache" / "autotune" / row["file"]).stat().st_size
    assert json.loads(cli("cache", "clear", "--json").stdout)["autotune"] == 1
    assert json.loads(cli("cache", "list", "--json").stdout)["entries"] == []


def _edit_choice(data: bytes) -> bytes:
    """Valid JSON still: the stored choice edited by hand."""
    entry = json.loads(data)
    entry["value"]["chosen_by"] = "by hand"
    return json.dumps(entry).encode()


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (lambda data: b"\xff" + data, "not UTF-8"),
        (lambda data: data[:-9], "not JSON, or truncated"),
        (_edit_choice, "its checksum"),
    ],
    ids=["not UTF-8", "truncated", "edited value"],
)
def test_cache_list_shows_corrupt_entries_as_such(cli, corrupt, problem):
    _fill(cli)
    (path,) = (cli.tmp / "cache" / "autotune").glob("*.json")
    path.write_bytes(corrupt(path.read_bytes()))
    listed = json.loads(cli("cache", "list", "--json").stdout)
    assert listed["entries"] == []
    (ignored,) = listed["ignored"]
    assert (ignored["cache"], ignored["file"], ignored["status"]) == (
        "autotune",
        path.name,
        "corrupt",
    )
    assert problem in ignored["problem"]
    text = cli("cache", "list").stdout
    assert "0 entr" in text and f"autotune/{path.name}: corrupt ({problem}" in text
    warned = [line for line in _fill(cli).stderr.splitlines() if "CacheWarning" in line]
    assert len(warned) == 1 and path.name in warned[0]  # the next use: one warning, rebuilt
    listed = json.loads(cli("cache", "list", "--json").stdout)
    assert listed["ignored"] == [] and listed["entries"][0]["value"]["config"] == "'a'"


def _env(cli):
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(cli.tmp / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_bench_without_a_gpu_gives_the_static_report(cli):
    data = json.loads(cli("bench", "softmax", "rms_norm", "--shape", "64x256", "--json").stdout)
    assert data["measured"] is False
    assert [r["kernel"].split()[0] for r in data["rows"]] == ["softmax", "rms_norm"]
    assert all(r["bound"] == "memory" and r["roofline_ms"] > 0 for r in data["rows"])
    assert "no GPU" in cli("bench", "softmax", "--shape", "64x256").stdout


def test_bench_and_explain_with_no_arguments_use_each_ops_default_shape(cli):
    """issue 20: `bench` alone exited 2, its one default shape 4096x1024 being no attention
    shape (D = 1024)."""
    from tessera_tile import ops

    data = json.loads(cli("bench", "--json").stdout)
    assert sorted(r["kernel"].split()[0] for r in data["rows"]) == sorted(ops.__all__)
    assert all(r["roofline_ms"] > 0 for r in data["rows"])
    explained = json.loads(cli("explain", "attention", "--json").stdout)
    assert explained["shape"] == [16, 4096, 64] and explained["kernels"] == 1
    assert json.loads(cli("explain", "softmax", "--json").stdout)["shape"] == [4096, 1024]


def test_report_writes_a_roofline_png(cli):
    pytest.importorskip("matplotlib", reason="the report is the optional extra [report]")
    data = json.loads(
        cli("report", "--device", "h100", "--out", "roof.png", "--shape", "8x128", "--json").stdout
    )
    png = (cli.tmp / "roof.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    from tessera_tile import ops

    rows = {r["op"]: r for r in data["rows"]}
    assert set(rows) == set(ops.__all__)
    # Measured: softmax of 8 x 128 float32 reads x once and writes y once.
    assert rows["softmax"]["bytes"] == 2 * 8 * 128 * 4
    axes = data["axes"]
    assert axes["xscale"] == axes["yscale"] == "log"
    assert "FLOP / byte" in axes["xlabel"] and "GFLOP/s" in axes["ylabel"]
    intensities = [r["flops"] / r["bytes"] for r in rows.values() if r["flops"]]
    assert axes["xlim"][0] < min(intensities) and max(intensities) < axes["xlim"][1]
    assert axes["ylim"][1] > 67e3  # the H100's FP32 roof, in GFLOP/s, is on the plot
    assert "transpose" not in axes["placed"] and "softmax" in axes["placed"]
