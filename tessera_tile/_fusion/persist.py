"""What the persistent kernel cache stores of a fused function, and the key it stores it under.

A second process's first call of a fused function finds there, by the key below, the traced
and planned :class:`~tessera_tile._fusion.runtime.Program` of its signature (no tracing, no
planning) and, per stage variant, the generated source of each kernel with the schedule it was
written from (no code generation). See docs/tuning.md for what else is cached and what is
proven without a GPU.

The key fingerprints the user's function from its code, never from its name alone: the
bytecode, constants, names, default values, closure values and the globals it reads, following
plain Python functions it calls. A value that is not plain data (numbers, strings, None,
enums, tuples of these, NumPy dtypes and scalars), a module, a ufunc, or a function or class
of tessera_tile, NumPy or the standard library makes the function unfingerprintable: it is
then never persisted (its behaviour could change without its code changing), and runs as
before with the in-process cache only.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import pickle
import types

import numpy as np

from .. import tile_ir as ir

_PLAIN = (int, float, complex, str, bytes, bool, type(None), np.generic, np.dtype)
_LIBRARIES = ("tessera_tile", "numpy", "math", "builtins", "operator", "functools")


class Unfingerprintable(Exception):
    """A function whose behaviour its code and plain values do not pin down."""


def fingerprint_function(fn) -> str | None:
    """A hash of what ``fn`` computes, or None when it cannot be fingerprinted reliably."""
    try:
        parts: list = []
        _function(fn, parts, set())
    except Unfingerprintable:
        return None
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()


def _function(fn, parts: list, seen: set) -> None:
    if id(fn) in seen:
        parts.append(("recursion", fn.__qualname__))
        return
    seen.add(id(fn))
    parts.append(("function", fn.__qualname__))
    _code(fn.__code__, parts)
    for value in (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).items()):
        parts.append(("default", _value(value, parts, seen)))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: a name bound later
            raise Unfingerprintable from None
        parts.append(("closure", _value(value, parts, seen)))
    for name in sorted(_global_names(fn.__code__)):
        if name in fn.__globals__:
            parts.append(("global", name, _value(fn.__globals__[name], parts, seen)))


def _code(co: types.CodeType, parts: list) -> None:
    parts.append((co.co_code, co.co_names, co.co_varnames, co.co_freevars))
    for const in co.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, parts)
        else:
            parts.append(("const", type(const).__name__, repr(const)))


def _global_names(co: types.CodeType) -> set:
    names = set(co.co_names)
    for const in co.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _value(value, parts: list, seen: set):
    if isinstance(value, (*_PLAIN, enum.Enum)):
        return (type(value).__name__, repr(value))
    if isinstance(value, tuple):
        return tuple(_value(v, parts, seen) for v in value)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, np.ufunc):
        return ("ufunc", value.__name__)
    fn = getattr(value, "fn", None)  # another fused function
    if isinstance(fn, types.FunctionType) and type(value).__module__.startswith("tessera_tile"):
        _function(fn, parts, seen)
        return ("fused", fn.__qualname__, getattr(value, "math", None))
    module = getattr(value, "__module__", None) or ""
    library = module.split(".")[0] in _LIBRARIES
    if isinstance(value, types.FunctionType):
        if not library:
            _function(value, parts, seen)  # a helper of the user's: its code is in the key
            return ("function", value.__qualname__)
        # tessera_tile's functions made by factories share a qualname: their name and closure
        # values tell them apart (tt.exp and tt.log are both _unary_fn.<locals>.fn)
        cells = tuple(_value(c.cell_contents, parts, seen) for c in value.__closure__ or ())
        return ("library", module, value.__qualname__, value.__name__, cells)
    if library and hasattr(value, "__qualname__"):  # classes, builtins
        return ("library", module, value.__qualname__)
    raise Unfingerprintable


# --------------------------------------------------------------------------------------------
# programs: pickled, with the id()-keyed maps re-keyed by node position


def _nodes_of(program) -> list:
    roots = list(program.trace.outputs)
    for stage in program.plan.stages:
        roots += [n for n, _ in stage.outputs]
    roots += list(program.plan.temps.values())
    roots += [node for node, _ in program.trace.counts.values()]
    return ir.walk(roots)


def dump_program(program) -> str:
    """The program as text (base64 of a pickle) for a JSON cache entry."""
    nodes = _nodes_of(program)
    index = {id(n): i for i, n in enumerate(nodes)}
    spaces = [
        {index[k]: v for k, v in stage.space.items() if k in index} for stage in program.plan.stages
    ]
    counts = {index[k]: v for k, v in program.trace.counts.items() if k in index}
    payload = pickle.dumps((program, nodes, spaces, counts), protocol=pickle.HIGHEST_PROTOCOL)
    return base64.b64encode(payload).decode()


def load_program(text: str):
    """The program :func:`dump_program` stored, its maps keyed by the new nodes' ids."""
    program, nodes, spaces, counts = pickle.loads(base64.b64decode(text))  # noqa: S301 - ours
    for stage, space in zip(program.plan.stages, spaces, strict=True):
        stage.space = {id(nodes[i]): v for i, v in space.items()}
    program.trace.counts = {id(nodes[i]): v for i, v in counts.items()}
    return program


def dump(obj) -> str:
    """Text of a pickle of ``obj``. Device helpers that writers make in factories are local
    functions: numba-cuda's copy of cloudpickle stores them by value (their code and closure);
    functions of importable modules stay references."""
    from numba.cuda import cloudpickle

    return base64.b64encode(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).decode()


def load(text: str):
    return pickle.loads(base64.b64decode(text))  # noqa: S301 - our own cache entries
