"""Streams: where a call launches, and what it waits for first.

A call takes a numba stream, a CuPy stream or a raw ``cudaStream_t`` handle (an int; 0 is the
default stream). Without one, it runs on CuPy's current stream when any argument is a CuPy
array, else on the default stream. An interface array's version-3 ``stream`` field is honoured
as the protocol says (the consumer waits for that stream's work before reading), once per call
and only where it is not the stream the call launches on (:func:`wait_for_producers`).
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import cuda

from . import compat
from . import config as _config


def resolve_stream(stream, args: list, cupy: bool = False):
    """The stream a call launches on (see the module docstring); in the simulator, 0.
    ``cupy``: the call has CuPy arrays (whether or not ``args`` shows them)."""
    if stream is None:
        if cupy or any(a.family == "cupy" for a in args):
            from . import cupy as _cupy

            return _external(_cupy.current_stream_handle())
        if _config.SIMULATED:
            return 0
        return cuda.default_stream()
    if isinstance(stream, bool):
        raise TypeError("stream= must be a numba stream, a CuPy stream or an int handle")
    if isinstance(stream, int | np.integer):
        if stream < 0:
            raise ValueError(f"stream= handle must be >= 0, got {stream}")
        return _external(int(stream))
    if type(stream).__module__.partition(".")[0] == "cupy" and hasattr(stream, "ptr"):
        return _external(int(stream.ptr))
    if _is_numba_stream(stream):
        return 0 if _config.SIMULATED else stream
    raise TypeError(
        f"stream= must be a numba stream, a CuPy stream or a raw stream handle (int), "
        f"got {type(stream).__name__}"
    )


def _is_numba_stream(stream) -> bool:
    if _config.SIMULATED:
        return isinstance(stream, cuda.stream)  # a class in the simulator
    _, stream_type, _ = compat.driver_names()
    return isinstance(stream, stream_type)


def streams_to_wait_for(args, stream) -> list[int]:
    """The producer streams of interface arrays (``Arg.stream``) whose work a launch on
    ``stream`` must wait for: all but the launch's own (stream order covers that), as handles
    (1 the legacy default stream)."""
    ours = (int(stream.handle) if stream else 0) or 1
    return sorted({a.stream for a in args if a.stream is not None and a.stream != ours})


def wait_for_producers(args, stream) -> None:
    """The interface protocol's synchronisation before a launch reads the arrays: the host
    waits for each producer stream but the launch's own (numba-cuda's ``as_cuda_array``
    waits for every one, each call). Off under ``NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0``, as in
    numba-cuda."""
    if numba_config.CUDA_ARRAY_INTERFACE_SYNC:
        for handle in streams_to_wait_for(args, stream):
            _synchronize(handle)


def _synchronize(handle: int) -> None:
    if not _config.SIMULATED:  # the simulator runs every launch to its end: nothing to wait for
        cuda.external_stream(handle).synchronize()


def _external(handle: int):
    if _config.SIMULATED:
        return 0
    return cuda.default_stream() if handle == 0 else cuda.external_stream(handle)
