"""Copies between host and simulated device refuse what numba-cuda refuses on a GPU.

numba-cuda copies host memory through the buffer protocol (``host_pointer``), which NumPy does
not offer for ml_dtypes' types: ``cuda.to_device`` of a bfloat16 array, ``copy_to_device`` from
one and ``copy_to_host`` into one raise ``ValueError: cannot include dtype 'E' in a buffer`` (seen
on an H200, numba-cuda 0.30.4). The stock simulator copies with NumPy and accepts them, so a
bfloat16 path that works only in the simulator would pass its tests. Here the same copies ask
NumPy for the buffer first, and raise its error.
"""

from __future__ import annotations

import functools

import numpy as np

from .._runtime import compat
from . import device_arrays

_stock_to_device = compat.device_array_module().to_device
_stock_copy_to_device = compat.FakeCUDAArray.copy_to_device
_stock_copy_to_host = compat.FakeCUDAArray.copy_to_host


def _exported(host) -> None:
    """NumPy's ValueError where the buffer protocol refuses ``host`` (a GPU copy needs it)."""
    if isinstance(host, np.ndarray):
        memoryview(host)


@functools.wraps(_stock_to_device)
def _to_device(ary, stream=0, copy=True, to=None):
    _exported(ary)
    fake = _stock_to_device(ary, stream=stream, copy=copy, to=to)
    return device_arrays.allocated(fake) if to is None else fake  # a new allocation


def _copy_to_device(self, ary, stream=0):
    _exported(ary)
    return _stock_copy_to_device(self, ary, stream=stream)


def _copy_to_host(self, ary=None, stream=0):
    _exported(ary)
    return _stock_copy_to_host(self, ary, stream=stream)


def _set(to_device, copy_to_device, copy_to_host) -> None:
    compat.FakeCUDAArray.copy_to_device = copy_to_device
    compat.FakeCUDAArray.copy_to_host = copy_to_host
    for module in compat.device_array_modules():
        module.to_device = to_device


def patch() -> None:
    _set(_to_device, _copy_to_device, _copy_to_host)


def unpatch() -> None:
    _set(_stock_to_device, _stock_copy_to_device, _stock_copy_to_host)
