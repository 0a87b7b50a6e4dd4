"""Every snippet of the README and the guides that runs kernels runs as written and prints what
its document shows (issue 20). The compile tier runs the others (tests/compile/test_docs.py)."""

import os
import re
import subprocess
import sys

import pytest
from doc_snippets import DOCS, ROOT, check, snippets
from helpers import SIMULATED

KERNEL_SNIPPETS = [s for doc in DOCS for s in snippets(doc) if s.needs in ("kernels", "simulator")]


@pytest.mark.parametrize("snippet", KERNEL_SNIPPETS, ids=lambda s: s.id)
def test_snippet_runs_as_written(snippet, tmp_path):
    check(snippet, snippet.simulated(SIMULATED), tmp_path / "cache")


def test_the_readme_says_what_each_snippet_needs():
    """A reader learns from the README which snippets need the simulator or a GPU."""
    readme = snippets("README.md")
    kinds = {s.needs for s in readme}
    assert {"kernels", "simulator", "compiler", "nothing"} <= kinds, kinds
    text = (ROOT / "README.md").read_text()
    for marker in ("# needs a GPU, or NUMBA_ENABLE_CUDASIM=1", "# needs NUMBA_ENABLE_CUDASIM=1",
                   "# compiles offline"):  # fmt: skip
        assert f"`{marker}`" in text, f"the README does not explain {marker!r}"


def test_every_excerpt_says_what_it_needs():
    """A guide's snippet runs in the tests, or is marked an excerpt naming what it needs."""
    excerpts = [s for doc in DOCS for s in snippets(doc) if s.needs == "excerpt"]
    assert excerpts, "no excerpt found: the marker moved"
    for s in excerpts:
        said = s.source.splitlines()[0].removeprefix("# excerpt:").strip()
        assert len(said) > 10, f"{s.id}: say what the excerpt needs"
    assert "`# excerpt: ...`" in (ROOT / "README.md").read_text()


def test_make_demo_ends_with_one_line_per_check(tmp_path):
    """`make demo` (examples/demo.py) prints a short summary, not the compile reports."""
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    checks = [line for line in lines if re.search(r" (yes|NO) ", line)]
    assert len(lines) < 50 and len(checks) >= 20, done.stdout
    assert not [line for line in checks if " NO " in line], done.stdout
    assert "registers" not in done.stdout  # the compile reports are behind --reports
    assert "examples/demo.py --reports" in lines[-1]
