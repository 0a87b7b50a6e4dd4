"""Counting host<->device copies and device allocations, by instrumenting numba's own functions.

::

    with sim.transfers() as counts:
        y = fused(d_x)
    counts == {"to_device": 0, "copy_to_host": 0, "device_array": 1}

Works in the simulator and on a GPU alike: it wraps ``numba.cuda.to_device``,
``numba.cuda.device_array`` and the device array type's ``copy_to_host`` for the duration of
the ``with`` block (code must call them through ``numba.cuda``, as tessera_tile does).
"""

from __future__ import annotations

import contextlib
from collections import Counter


@contextlib.contextmanager
def transfers():
    """Count the host<->device copies and device allocations made inside."""
    from numba import cuda

    counts: Counter = Counter(to_device=0, copy_to_host=0, device_array=0)
    array_type = type(cuda.device_array(1))
    originals = [
        (cuda, "to_device", cuda.to_device),
        (cuda, "device_array", cuda.device_array),
        (array_type, "copy_to_host", array_type.copy_to_host),
    ]

    def counting(name, fn):
        def counted(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    for owner, name, fn in originals:
        setattr(owner, name, counting(name, fn))
    try:
        yield counts
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
