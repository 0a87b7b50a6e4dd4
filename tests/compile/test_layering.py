"""The package's imports follow its layers (README, "Layering"; docs/architecture.md), and no two
modules import each other, not even inside functions; only the package's top (``__init__``, above
every layer) imports its own modules by name through ``importlib``. Read from the source, so it
runs in any tier."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tessera_tile"

# The layer order, written here only (the README and docs/architecture.md quote it; a test in
# test_docs.py checks they do). Lower numbers are lower layers; a module may import its own
# layer or lower ones. A key names a top-level module or package, or one module inside a package
# (the longest matching key wins).
LAYERS = {
    "_version": 0, "_runtime.config": 0, "_runtime.cupy": 0, "_runtime.cache": 0,
    "_runtime.target": 0, "_runtime.compat": 0,
    "_device.banks": 0, "_device.twins": 0, "_device.mma_layouts": 0,
    "sim": 1, "_runtime": 1, "autotune": 1, "dynamic_shared": 1,
    "inspect": 2, "_device.intrinsics": 2,
    "tile_ir": 3, "tile_config": 3,
    "memory": 4, "pipeline": 4, "mbarrier": 4, "warp": 4, "mma": 4, "profiling": 4,
    "_device": 4, "bfloat16": 4,
    "kernels": 5,
    "_fusion": 6, "fusion": 6,
    "ops": 7,
    "cli": 8, "__main__": 8, "tuned": 8, "dask": 8,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    root = PACKAGE.parent
    return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()


def imports_of(path: Path) -> set[str]:
    """Every tessera_tile module ``path`` imports, at any depth of its code."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tessera_tile")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("tessera_tile"):
                target = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if is_module(sub) else target)
    return found - {name}


def layer_key(name: str) -> str | None:
    """The LAYERS key of module ``name`` (the longest that matches), None for the package."""
    parts = name.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return None


def layer(name: str) -> int:
    key = layer_key(name)
    return LAYERS[key] if key else 99  # the package itself is the top


GRAPH = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    unknown = {n for n in GRAPH if n != "tessera_tile" and layer_key(n) is None}
    assert not unknown, f"add these to LAYERS (and to the README's Layering section): {unknown}"


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if n != "tessera_tile"))
def test_imports_point_down(name):
    upward = {t for t in GRAPH[name] if layer(t) > layer(name)}
    assert not upward, f"{name} (layer {layer(name)}) imports a higher layer: {upward}"


def importlib_calls(path: Path) -> list[str]:
    """The ``import_module`` calls of ``path`` that name a module of this package (a string or
    f-string starting with ``tessera_tile`` or ``.``): imports the layering above cannot see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.JoinedStr) and first.values:
                first = first.values[0]
            text = first.value if isinstance(first, ast.Constant) else ""
            if isinstance(text, str) and text.startswith(("tessera_tile", ".")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_package_top_imports_its_modules_through_importlib():
    found = {
        module_name(p): calls
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "__init__.py" and (calls := importlib_calls(p))
    }
    assert not found, f"import them (downward) instead: {found}"
    top = importlib_calls(PACKAGE / "__init__.py")
    assert top, "the check reads nothing: the package's lazy submodules use import_module"


def test_no_two_modules_import_each_other():
    def cycle_from(start):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in GRAPH.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in path and nxt != "tessera_tile":
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, GRAPH) if c]
    assert not cycles, f"import cycles: {cycles[:3]}"


def quoted_order() -> str:
    """LAYERS as the README and docs/architecture.md quote it: one line per layer."""
    by_layer: dict[int, list[str]] = {}
    for key, level in LAYERS.items():
        by_layer.setdefault(level, []).append(key)
    return "\n".join(f"{level}  {'  '.join(keys)}" for level, keys in sorted(by_layer.items()))


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_the_docs_quote_the_layer_order(doc):
    text = (PACKAGE.parent / doc).read_text()
    quotes = re.findall(r"<!-- layers -->\n```\n(.*?)\n```", text, re.S)
    assert quotes == [quoted_order()], f"{doc} must quote LAYERS as:\n{quoted_order()}"
