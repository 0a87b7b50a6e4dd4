"""The ``tt.*`` array functions called outside a fused function: each runs as a fused function
of its own (one kernel on arrays, as CuPy's fused ufuncs run; NumPy's scalar on scalars). Arrays
and numbers are that fused function's arguments; the arguments that shape its kernel (axes,
``keepdims``, ``ddof``, dtypes, ``approximate``) are fixed in it, so it is made once per
function and set of those, and a new number is a new argument, not a new kernel."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from .trace import tracing

# parameters of the tt.* functions that shape the kernel: fixed in the fused function
STATIC = frozenset({"axis", "keepdims", "ddof", "dtype", "approximate", "axis1", "axis2"})


def outside_traces(fn: Callable, fuse: Callable) -> Callable:
    """``fn`` as it is inside a trace; outside one, ``fuse(fn)`` with the static arguments
    the call gives fixed, called on the others."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if tracing():
            return fn(*args, **kwargs)
        given = _signature(fn).bind(*args, **kwargs).arguments
        fixed = tuple((k, v) for k, v in given.items() if k in STATIC)
        passed = tuple(k for k in given if k not in STATIC)
        try:
            fused = _fused(fn, fuse, passed, fixed)
        except TypeError:  # an unhashable static argument: a list for an axis
            raise TypeError(
                f"tt.{fn.__name__}: pass {', '.join(k for k, _ in fixed)} as ints, tuples, "
                "booleans, dtypes or strings"
            ) from None
        return fused(*(given[k] for k in passed))

    return call


@functools.cache
def _signature(fn: Callable) -> inspect.Signature:
    """Read once per function; not held by the wrapper, whose closure fused functions that call
    it fingerprint."""
    return inspect.signature(fn)


@functools.lru_cache(maxsize=256)
def _fused(fn, fuse, passed: tuple, fixed: tuple):
    """The fused function of ``fn`` taking the arguments named ``passed``, ``fixed`` set."""
    static = dict(fixed)

    def one_op(*values):
        return fn(**dict(zip(passed, values, strict=True)), **static)

    one_op.__name__ = one_op.__qualname__ = fn.__name__
    return fuse(one_op)
