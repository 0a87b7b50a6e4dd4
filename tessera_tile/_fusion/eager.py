"""The ``tt.*`` array functions called outside a fused function: on arrays, each runs as a fused
function of its own (one kernel, as CuPy's fused ufuncs run), compiled once per combination of
its other arguments (axes, constants, dtypes)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .trace import tracing


def is_array(value) -> bool:
    """An array argument of a call: NumPy (not 0-d: that is a scalar, as in NumPy), a numba
    device array, anything with ``__cuda_array_interface__``, or a Dask array."""
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return (
        getattr(value, "__cuda_ndarray__", False)
        or hasattr(value, "__cuda_array_interface__")
        or type(value).__module__.startswith("dask.")
    )


def outside_traces(fn: Callable, fuse: Callable) -> Callable:
    """``fn`` as it is inside a trace; outside one, the fused function
    ``fuse(lambda *arrays: fn(...))`` of its array arguments, the others fixed (on scalars
    alone it computes on the host, as a fused function of scalars does: a NumPy scalar)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if tracing():
            return fn(*args, **kwargs)
        positions = tuple(i for i, a in enumerate(args) if is_array(a))
        names = tuple(k for k, v in kwargs.items() if is_array(v))
        fixed = (
            tuple((i, a) for i, a in enumerate(args) if i not in positions),
            tuple((k, v) for k, v in sorted(kwargs.items()) if k not in names),
        )
        try:
            fused = _fused(fn, fuse, positions, names, fixed)
        except TypeError:  # an unhashable argument: a list for an array or an axis
            odd = next(v for v in (*args, *kwargs.values()) if not _hashable(v))
            raise TypeError(
                f"tt.{fn.__name__}: a {type(odd).__name__} is neither an array (NumPy, CuPy, a "
                "numba device array) nor a scalar, axis tuple or dtype"
            ) from None
        return fused(*(args[i] for i in positions), *(kwargs[k] for k in names))

    return call


@functools.lru_cache(maxsize=256)
def _fused(fn, fuse, positions: tuple, names: tuple, fixed: tuple):
    """The fused function of ``fn`` with the arrays at ``positions`` (then the keywords
    ``names``) as its arguments and everything else fixed."""
    fixed_args, fixed_kwargs = dict(fixed[0]), dict(fixed[1])
    count = len(positions) + len(fixed_args)

    def one_op(*arrays):
        given = dict(zip(positions, arrays, strict=False))
        args = [given[i] if i in given else fixed_args[i] for i in range(count)]
        keywords = dict(zip(names, arrays[len(positions) :], strict=True))
        return fn(*args, **fixed_kwargs, **keywords)

    one_op.__name__ = one_op.__qualname__ = fn.__name__
    return fuse(one_op)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
