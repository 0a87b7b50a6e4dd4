"""The Python snippets of the README and the guides, as the tests run them.

A snippet is a fenced ``python`` block. Its first line says what it needs (the README explains
these markers to readers):

==============================================  ============================================
first line                                      how the tests run it
==============================================  ============================================
``# needs a GPU, or NUMBA_ENABLE_CUDASIM=1``    simulator tier (GPU tier: on the device)
``# needs NUMBA_ENABLE_CUDASIM=1``              simulator tier, always in the simulator
``# compiles offline``                          compile tier, without the simulator
``# continues the snippet above``               appended to the snippet before it
``# excerpt: what it needs``                    not run: part of a larger program
anything else                                   compile tier (it only plans)
==============================================  ============================================

A plain fenced block right after a snippet is what it prints; the tests compare the two. Each
snippet runs in its own Python process from the repository's root, as a reader runs it.

Regenerate the printed blocks of a document after a change that moves them (each snippet in the
mode its marker names; the simulator's on the CPU)::

    python tests/doc_snippets.py README.md docs/fusion.md
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every snippet of these runs, but an excerpt. docs/custom_kernels.md is not among them yet: its
# snippets are the files of a tutorial (my_transpose.py, then scripts that import it), which
# this harness cannot lay out.
DOCS = (
    "README.md", "docs/fusion.md", "docs/inspect.md", "docs/architecture.md", "docs/attention.md",
    "docs/distributed.md", "docs/matmul.md", "docs/ops.md", "docs/simulator.md",
    "docs/tensor_cores.md", "docs/tuning.md",
)  # fmt: skip
MARKERS = {
    "# needs a GPU, or NUMBA_ENABLE_CUDASIM=1": "kernels",
    "# needs NUMBA_ENABLE_CUDASIM=1": "simulator",
    "# compiles offline": "compiler",
    "# excerpt:": "excerpt",
}
CONTINUES = "# continues the snippet above"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int  # of its opening fence, 1-based
    source: str
    needs: str  # "kernels", "simulator", "compiler" or "nothing"
    output: str | None  # what the document shows it prints
    output_span: tuple[int, int] | None  # the output block's text in the document
    continues: bool = False  # appended to the snippet before it
    inherited: str = ""  # what the snippets it continues print first

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def simulated(self, tier_simulated: bool) -> bool:
        """Whether it runs in the simulator in a tier that does (or does not) simulate."""
        return self.needs == "simulator" or (self.needs == "kernels" and tier_simulated)


def _needs(first_line: str) -> str:
    return next((v for k, v in MARKERS.items() if first_line.startswith(k)), "nothing")


def snippets(doc: str) -> list[Snippet]:
    """The snippets of ``doc`` (a path relative to the repository's root), in order."""
    text = (ROOT / doc).read_text()
    blocks = list(FENCE.finditer(text))
    found: list[Snippet] = []
    for i, block in enumerate(blocks):
        if block.group(1) != "python":
            continue
        source = block.group(2)
        first = source.splitlines()[0] if source else ""
        needs, inherited, continues = _needs(first), "", first.startswith(CONTINUES)
        if continues:
            previous = found[-1]
            source, needs = previous.source + source, previous.needs
            inherited = previous.inherited + (previous.output or "")
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        follows = (
            after is not None
            and after.group(1) == ""
            and not text[block.end() : after.start()].strip()
        )
        found.append(
            Snippet(
                doc=doc,
                line=text.count("\n", 0, block.start()) + 1,
                source=source,
                needs=needs,
                output=after.group(2) if follows else None,
                output_span=after.span(2) if follows else None,
                continues=continues,
                inherited=inherited,
            )
        )
    return found


def run(snippet: Snippet, simulated: bool, cache_dir: Path) -> subprocess.CompletedProcess:
    """Run a snippet in a fresh process from the repository's root, with its own cache."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1" if simulated else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TESSERA_TILE_CACHE_DIR"] = str(cache_dir)
    return subprocess.run(
        [sys.executable, "-c", snippet.source],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def check(snippet: Snippet, simulated: bool, cache_dir: Path) -> None:
    """Assert the snippet runs, and prints what its document shows."""
    done = run(snippet, simulated, cache_dir)
    assert done.returncode == 0, f"{snippet.id} failed:\n{done.stderr[-3000:]}"
    if snippet.output is not None:
        assert done.stdout.strip() == (snippet.inherited + snippet.output).strip(), (
            f"{snippet.id} now prints (regenerate: python tests/doc_snippets.py {snippet.doc}):\n"
            f"{done.stdout}"
        )


def regenerate(doc: str) -> None:
    """Rewrite the printed blocks of ``doc`` with what its snippets print now."""
    text = (ROOT / doc).read_text()
    replacements, printed_before = [], ""
    with tempfile.TemporaryDirectory() as cache_dir:
        for snippet in snippets(doc):
            done = run(snippet, snippet.simulated(tier_simulated=True), Path(cache_dir))
            if done.returncode != 0:
                raise SystemExit(f"{snippet.id} failed:\n{done.stderr[-3000:]}")
            own = done.stdout[len(printed_before) :] if snippet.continues else done.stdout
            if snippet.output_span is not None:
                replacements.append((snippet.output_span, own.rstrip("\n") + "\n"))
            printed_before = done.stdout
    for (start, end), new in reversed(replacements):  # from the end: earlier spans stay valid
        text = text[:start] + new + text[end:]
    (ROOT / doc).write_text(text)


if __name__ == "__main__":
    for name in sys.argv[1:] or DOCS:
        regenerate(name)
