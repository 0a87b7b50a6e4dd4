"""Everything CuPy-specific, in one place. CuPy is optional: it is imported only when a call
involves a CuPy array or stream."""

from __future__ import annotations


def current_stream_handle() -> int:
    """The raw handle of CuPy's current stream (0 for the null stream)."""
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def empty(shape, dtype):
    """An uninitialised CuPy array, from CuPy's memory pool (stream-ordered on its current
    stream)."""
    import cupy

    return cupy.empty(shape, dtype)
