"""The figures the README and the guides quote are what the code gives today (issue 20).

Snippets that compile offline or only plan run as written and print what their document shows
(the simulator tier runs those that run kernels: tests/guides/test_doc_snippets.py); the figures
quoted in prose and tables (registers, instruction counts, FLOP/byte) are recomputed here with
the commands the documents name, so a change that moves them fails until the text follows.
"""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from doc_snippets import DOCS, ROOT, check, check_tutorial, snippets

import tessera_tile as tt
from tessera_tile import ops
from tessera_tile.cli import roofline as _roofline
from tessera_tile.tile_config import default_config, estimated_registers

OFFLINE_SNIPPETS = [s for doc in DOCS for s in snippets(doc) if s.needs in ("compiler", "nothing")]


def text_of(doc: str) -> str:
    """A document with its line breaks and runs of spaces as single spaces (prose wraps)."""
    return " ".join((ROOT / doc).read_text().split())


def quoted(doc: str, figure: str) -> None:
    assert " ".join(figure.split()) in text_of(doc), f"{doc} should say {figure!r}"


@pytest.mark.parametrize("snippet", OFFLINE_SNIPPETS, ids=lambda s: s.id)
def test_snippet_runs_as_written(snippet, tmp_path):
    check(snippet, simulated=False, cache_dir=tmp_path / "cache")


TUTORIALS = [doc for doc in DOCS if any(s.needs == "file" for s in snippets(doc))]


@pytest.mark.parametrize("doc", TUTORIALS)
def test_tutorial_runs_as_written(doc, tmp_path):
    """A tutorial's files, written in order; each ``$ python file.py`` runs as its block says
    (in the simulator where it sets NUMBA_ENABLE_CUDASIM=1) and prints what the guide shows."""
    check_tutorial(doc, tmp_path)


def test_the_readmes_inspect_command_prints_what_it_shows(tmp_path):
    """The `tessera-tile inspect` console example, on the examples/axpy.py it names."""
    block = (ROOT / "README.md").read_text().split("$ tessera-tile inspect ", 1)[1]
    command, _, rest = block.partition("\n      ")  # the command continues on one more line
    flags, _, shown = rest.partition("\n")
    shown = shown.split("\n```", 1)[0]
    argv = (command.rstrip(" \\") + " " + flags).replace('"', "").split(" --")
    target, options = argv[0], [f"--{o}" for o in argv[1:]]
    args = [a for o in options for a in o.split(" ", 1)]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", TESSERA_TILE_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tessera_tile", "inspect", target, *args],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == shown.strip(), done.stdout


def test_roofline_intensities_quoted_in_the_docs():
    """`tessera-tile report`'s FLOP/byte of the matmul family (its lowest) and of attention."""
    rows = {r["op"]: r for r in _roofline.measure()}
    assert "attention" in rows

    def intensity(*names):
        return f"{min(rows[n]['flops'] / rows[n]['bytes'] for n in names):.1f}"

    family, attention = intensity(*_roofline.MATMUL_OPS), intensity("attention")
    quoted("README.md", f"sits at {family} FLOP/byte")
    quoted("README.md", f"128 x 64 float16, at {attention}")
    quoted("docs/tuning.md", f"the 128-cube GEMMs sit at {family} FLOP/byte")
    quoted("docs/tuning.md", f"attention (one head of 128 x 64) at {attention}")


def benchmark(name: str, monkeypatch):
    """A script of benchmarks/ as a module (its helpers are its neighbours)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# docs/fusion.md's SASS table: the label of each row benchmarks/fusion.py sass prints
FUSION_ROWS = {
    ("chain", "float32"): "now (sigmoid: one `MUFU.EX2` and one `MUFU.RCP`, `.ftz`)",
    ("chain", "float16"): "float16 (8 per `LDG.E.128`; was 2-byte loads, 97/element)",
    ("softmax", "float32"): "now (row in registers)",
    ("softmax", "float16"): "float16",
    ("softmax", "bfloat16"): "bfloat16 (widened by a shift, rounded in pairs)",
}


def test_fusion_sass_figures_quoted_in_the_docs(monkeypatch):
    for figure in benchmark("fusion", monkeypatch).sass_figures():
        report, per = figure["report"], figure["per_element"]
        key = (figure["op"], figure["dtype"])
        if key in FUSION_ROWS:
            label = f"`@tt.fuse`, same, {FUSION_ROWS[key]}"
            row = f"| {label} | {report.registers} | {report.instructions} | {per:.2f} |"
            quoted("docs/fusion.md", row)
        else:  # layer norm, in prose
            quoted(
                "docs/fusion.md",
                f"{report.instructions} instructions, {report.registers} registers",
            )
            quoted("docs/fusion.md", f"so {per:.1f} instructions per element over the whole kernel")


def test_inspect_guides_softmax_table():
    """docs/inspect.md: the loops of a long-row fused softmax, one row per streaming pass."""

    def softmax(x):
        m = tt.max(x, axis=-1, keepdims=True)
        e = tt.exp(x - m)
        return e / tt.sum(e, axis=-1, keepdims=True)

    (report,) = tt.fuse(softmax).inspect(np.zeros((64, 32768), np.float32), arch="sm_90")
    streaming = [lp for lp in report.loops if lp.innermost and lp.count("LDG.E.128")]
    assert len(streaming) == 2, report
    online, write = sorted(streaming, key=lambda lp: lp.count("STG"))  # the write pass stores
    total = 0.0
    for name, loop in (("online max and exp-sum", online), ("write `e / sum`", write)):
        elements = 4 * loop.count("LDG.E.128")  # float32: 4 per 16-byte load
        per = report.instructions_per_element(elements, loop)
        total += per
        opcodes = loop.key_opcodes(("LDG.E.128", "MUFU.EX2", "STG.E.128"))
        row = f"| {name} (`{opcodes}`) | {loop.instructions} | {elements} | {per:.2f} |"
        quoted("docs/inspect.md", row)
    quoted("docs/inspect.md", f"| steady state | | | {total:.2f} |")


def test_linear_explain_says_its_blocks_per_sm_are_the_models_estimate():
    """issue 20: the README's linear said "2 block(s)/SM" beside ptxas's 155 registers (1 block
    per SM). explain compiles nothing: it must call its figure an estimate and name the
    registers it assumed, which differ from the compiled kernel's here."""
    x = np.zeros((4096, 1024), np.float32)
    w = np.zeros((1024, 4096), np.float32)
    b = np.zeros(4096, np.float32)
    config = default_config(4096, 4096, 1024)
    (stage,) = ops.linear.explain(x, w, b, "gelu").stages
    assumed = estimated_registers(config)
    assert f"model estimate, assuming {assumed} registers/thread" in stage, stage
    (report,) = ops.linear.inspect(x, w, b, "gelu", arch="sm_90")
    assert report.registers != assumed  # the epilogue's registers: why the label matters
    resident = re.search(r"(\d+) block\(s\)/SM", stage).group(1)
    assert int(resident) * config.threads / 2048 > report.occupancy  # the model's, not ptxas's
