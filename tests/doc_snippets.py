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
``# name.py`` (a tutorial's file)               written to a directory of its own, in order;
                                                the ``$ python name.py`` block after it runs
                                                there, as the command says, and is compared
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
# Every snippet of these runs but an excerpt; a tutorial's files run as its commands say.
DOCS = (
    "README.md", "docs/fusion.md", "docs/inspect.md", "docs/architecture.md", "docs/attention.md",
    "docs/custom_kernels.md", "docs/distributed.md", "docs/matmul.md", "docs/ops.md",
    "docs/simulator.md", "docs/tensor_cores.md", "docs/training.md", "docs/tuning.md",
)  # fmt: skip
MARKERS = {
    "# needs a GPU, or NUMBA_ENABLE_CUDASIM=1": "kernels",
    "# needs NUMBA_ENABLE_CUDASIM=1": "simulator",
    "# compiles offline": "compiler",
    "# excerpt:": "excerpt",
}
TUTORIAL_FILE = re.compile(r"# ([\w/.-]+\.py)$")  # a tutorial's file: "# my_transpose.py"
CONSOLE = re.compile(
    r"\$ ((?:\w+=\S+ )*)python (\S+\.py)\n"
)  # "$ NUMBA_ENABLE_CUDASIM=1 python x.py"
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
    if TUTORIAL_FILE.fullmatch(first_line):
        return "file"
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


def printed(text: str) -> str:
    """What a block shows: without trailing spaces on its lines (rich pads its tables)."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


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
        assert printed(done.stdout) == printed(snippet.inherited + snippet.output), (
            f"{snippet.id} now prints (regenerate: python tests/doc_snippets.py {snippet.doc}):\n"
            f"{done.stdout}"
        )


def run_tutorial(doc: str, workdir: Path):
    """Write ``doc``'s tutorial files into ``workdir`` in order; after each file followed by a
    ``$ python name.py`` block, run that command there. Yields ``(snippet, command, done)`` per
    command run (``command``: its env and script)."""
    for snippet in snippets(doc):
        if snippet.needs != "file":
            continue
        name = TUTORIAL_FILE.fullmatch(snippet.source.splitlines()[0]).group(1)
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(snippet.source)
        console = CONSOLE.match(snippet.output or "")
        if console is None:
            continue
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
        env.update(v.split("=", 1) for v in console.group(1).split())
        env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(ROOT), env.get("PYTHONPATH", "")])
        env["TESSERA_TILE_CACHE_DIR"] = str(workdir / ".cache")
        done = subprocess.run(
            [sys.executable, console.group(2)], cwd=workdir, env=env, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        yield snippet, console, done


def check_tutorial(doc: str, workdir: Path) -> None:
    """Assert every command of ``doc``'s tutorial runs and prints what the document shows."""
    ran = 0
    for snippet, console, done in run_tutorial(doc, workdir):
        assert done.returncode == 0, f"{snippet.id} failed:\n{done.stderr[-3000:]}"
        shown = snippet.output[console.end() :]
        assert printed(done.stdout) == printed(shown), (
            f"{snippet.id} now prints (regenerate: python tests/doc_snippets.py {doc}):\n"
            f"{done.stdout}"
        )
        ran += 1
    assert ran, f"{doc} has no tutorial command"


def _regenerate_tutorial(doc: str, replacements: list) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        for snippet, console, done in run_tutorial(doc, Path(workdir)):
            if done.returncode != 0:
                raise SystemExit(f"{snippet.id} failed:\n{done.stderr[-3000:]}")
            start = snippet.output_span[0] + console.end()
            replacements.append(((start, snippet.output_span[1]), printed(done.stdout) + "\n"))


def regenerate(doc: str) -> None:
    """Rewrite the printed blocks of ``doc`` with what its snippets print now."""
    text = (ROOT / doc).read_text()
    replacements, printed_before = [], ""
    with tempfile.TemporaryDirectory() as cache_dir:
        for snippet in snippets(doc):
            if snippet.needs in ("excerpt", "file"):
                continue
            done = run(snippet, snippet.simulated(tier_simulated=True), Path(cache_dir))
            if done.returncode != 0:
                raise SystemExit(f"{snippet.id} failed:\n{done.stderr[-3000:]}")
            own = done.stdout[len(printed_before) :] if snippet.continues else done.stdout
            if snippet.output_span is not None:
                replacements.append((snippet.output_span, printed(own) + "\n"))
            printed_before = done.stdout
    _regenerate_tutorial(doc, replacements)
    replacements.sort()
    for (start, end), new in reversed(replacements):  # from the end: earlier spans stay valid
        text = text[:start] + new + text[end:]
    (ROOT / doc).write_text(text)


if __name__ == "__main__":
    for name in sys.argv[1:] or DOCS:
        regenerate(name)
