"""CuPy's unfused chains of the prebuilt ops (one CuPy kernel per step), the baseline of
``tessera-tile bench`` on a GPU, and a CUDA-event timer."""

from __future__ import annotations

import numpy as np


def _softmax(xp, x):
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax(xp, x):
    s = x - x.max(axis=-1, keepdims=True)
    return s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))


def _layer_norm(xp, x, w, b):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / xp.sqrt(v + 1e-5) * w + b


def _rms_norm(xp, x, w):
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


def _cross_entropy(xp, logits, targets):
    m = logits.max(axis=-1, keepdims=True)
    lse = xp.log(xp.exp(logits - m).sum(axis=-1)) + m[:, 0]
    return (lse - logits[xp.arange(logits.shape[0]), targets]).mean()


REFERENCE = {
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "cross_entropy": _cross_entropy,
    "transpose": lambda xp, x: xp.ascontiguousarray(x.T),
}


def _method(name: str):
    return lambda xp, x: getattr(x, name)()


for _name in ("sum", "mean", "max", "min", "var", "std", "argmax", "argmin"):
    REFERENCE[_name] = _method(_name)


def time_ms(run, warmup: int = 3, repeat: int = 20) -> float:
    """Median milliseconds of ``run()`` between two CUDA events."""
    from numba import cuda

    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start, stop = cuda.event(), cuda.event()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))
