"""Compile and cache: generated source -> a lazy ``@cuda.jit`` kernel, once per schedule.

Set ``TESSERA_TILE_DUMP=1`` to print every generated source.
"""

from __future__ import annotations

import hashlib
import linecache
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from .. import _config, memory, warp
from .. import tile_ir as ir
from . import device
from .plan import Stage
from .reductions import ReductionWriter
from .schedule import Schedule, Variant, schedule
from .templates import KernelWriter


@dataclass
class Generated:
    name: str
    source: str
    kernel: object
    schedule: Schedule


class CountingCache:
    """A thread-safe memo that counts its hits and misses (tests assert the counts)."""

    def __init__(self):
        self._entries: dict = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, make: Callable[[], object]):
        with self._lock:
            got = self._entries.get(key)
            if got is not None:
                self.hits += 1
                return got
            self.misses += 1
            got = self._entries[key] = make()
            return got

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


class KernelCache(CountingCache):
    """Compiled kernels by (stage fingerprint, variant, target)."""

    def kernel(self, stage: Stage, variant: Variant) -> Generated:
        return self.get((stage.key, variant, _config.TARGET), lambda: generate(stage, variant))


def kernel_name(stage: Stage, variant: Variant) -> str:
    ops = [n.op.name.lower() for n in stage.nodes if n.op not in ir.LEAF]
    head = "_".join(dict.fromkeys(ops))[:40] or "copy"
    digest = hashlib.blake2b(f"{stage.key}{variant}".encode(), digest_size=4).hexdigest()
    return f"fused_{variant.kind}_{head}_{digest}"


def _namespace() -> dict:
    """What generated sources refer to, besides the helpers a writer registers."""
    from numba import cuda, types

    return {
        "cuda": cuda,
        "np": np,
        "inf": float("inf"),
        "boolean": types.boolean,
        "int32": types.int32,
        "int64": types.int64,
        "uint32": types.uint32,
        "uint64": types.uint64,
        "float16": types.float16,
        "float32": types.float32,
        "float64": types.float64,
        "max_nan": device.max_nan,
        "exp_approx": device.exp_approx,
        "rcp_approx": device.rcp_approx,
        "rcp_approx_ftz": device.rcp_approx_ftz,
        "rsqrt_approx": device.rsqrt_approx,
        "min_nan": device.min_nan,
        "floordiv_int": device.floordiv_int,
        "floordiv_float": device.floordiv_float,
        "mod_int": device.mod_int,
        "mod_float": device.mod_float,
        "pow_int": device.pow_int,
        "load16": memory.load16,
        "store16": memory.store16,
        "load16_shared": memory.load16_shared,
        "store16_shared": memory.store16_shared,
        "warp_argmax": warp.warp_argmax,
        "warp_argmin": warp.warp_argmin,
        **device.MATH,
    }


def generate(stage: Stage, variant: Variant) -> Generated:
    """Source and compiled (lazy) kernel of one stage variant."""
    name = kernel_name(stage, variant)
    sched = schedule(stage, variant)
    writer = (KernelWriter if variant.kind == "elementwise" else ReductionWriter)(sched, name)
    source = writer.write()
    filename = f"<tessera_tile generated {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    if _config.dump_source():
        print(source)
    namespace = {**_namespace(), **writer.helpers}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    return Generated(name, source, namespace[name], sched)
