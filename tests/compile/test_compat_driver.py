"""Smoke test of the numba-cuda driver names the device path relies on (_runtime/compat.py). They
exist only outside the simulator, so this runs in the compile tier."""

import inspect

from tessera_tile._runtime import compat


def test_driver_names_are_what_the_device_path_calls():
    device_ndarray, stream, device_memset = compat.driver_names()
    assert list(inspect.signature(device_ndarray).parameters)[:5] == [
        "shape", "strides", "dtype", "stream", "gpu_data",
    ]  # fmt: skip
    assert isinstance(stream, type) and hasattr(stream, "synchronize")
    assert list(inspect.signature(device_memset).parameters) == ["dst", "val", "size", "stream"]
