"""The shape of ``cuda.shared.array`` and ``cuda.local.array`` must be known when Numba types the
kernel: a literal, a global or closure name (or an item of one), a tuple of those, or arithmetic
on literals alone (Python folds it). ``N * 2``, ``-N`` or ``cfg.n`` with ``N`` a global and
``cfg`` a named tuple fail Numba's typing (numba-cuda 0.30: ``TypingError``), so the simulator
refuses them too, reading the call's source once per call site.

Left lenient: a local name (``n = N * 2``, then ``shape=n``) is taken as Numba takes a local
assigned a literal; a call site without source (``exec``) is not checked.
"""

from __future__ import annotations

import ast
import functools
import linecache
import types

from .._runtime.compat import NumbaTypeError

_CHECKED: set = set()  # (code, instruction) of the call sites whose shape was found constant


def check(frame, what: str) -> None:
    """Raise Numba's ``NumbaTypeError`` when the call being made in ``frame`` gives ``what`` a
    shape Numba cannot type."""
    code = frame.f_code
    if (code, frame.f_lasti) in _CHECKED:  # local arrays: every thread, every call
        return
    node = _shape_node(code, frame.f_lasti)
    if node is None or _constant(node, frame):
        _CHECKED.add((code, frame.f_lasti))
    else:
        raise NumbaTypeError(
            f"{what}: the shape {ast.unparse(node)!r} ({code.co_filename}:{node.lineno}) is not "
            "a constant Numba can type: use a literal, a global or closure name, or a tuple of "
            "them (numba-cuda refuses it with a TypingError)"
        )


def _shape_node(code: types.CodeType, lasti: int) -> ast.expr | None:
    """The shape argument of the call at instruction ``lasti`` of ``code``, from its source."""
    start, end, col, end_col = list(code.co_positions())[lasti // 2]
    lines = linecache.getlines(code.co_filename)
    if start is None or not lines:
        return None
    try:
        tree = _parse(code.co_filename, len(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (
            node.lineno,
            node.end_lineno,
            node.col_offset,
            node.end_col_offset,
        ) == (start, end, col, end_col):
            shape = node.args[0] if node.args else None
            return shape or next((k.value for k in node.keywords if k.arg == "shape"), None)
    return None


@functools.cache
def _parse(filename: str, lines: int) -> ast.Module:
    """``filename`` parsed once per length (a file written again is parsed again)."""
    return ast.parse("".join(linecache.getlines(filename)))


def _constant(node: ast.expr, frame) -> bool:
    if isinstance(node, ast.Constant | ast.Name | ast.Subscript):
        return True
    if isinstance(node, ast.Tuple):
        return all(_constant(item, frame) for item in node.elts)
    if isinstance(node, ast.Attribute):  # a module's constant, not a field of an object
        base = node.value
        return isinstance(base, ast.Name) and isinstance(_value(base.id, frame), types.ModuleType)
    if isinstance(node, ast.BinOp | ast.UnaryOp):  # Python folds arithmetic on literals alone
        return all(
            isinstance(n, ast.Constant)
            for n in ast.walk(node)
            if isinstance(n, ast.expr) and not isinstance(n, ast.BinOp | ast.UnaryOp)
        )
    return False


def _value(name: str, frame):
    if name in frame.f_locals:
        return frame.f_locals[name]
    return frame.f_globals.get(name, frame.f_builtins.get(name))
