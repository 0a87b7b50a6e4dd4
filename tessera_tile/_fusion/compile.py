"""Compile and cache: generated source -> a lazy ``@cuda.jit`` kernel, once per schedule.

Set ``TESSERA_TILE_DUMP=1`` to print every generated source.

Persistent kernels: :class:`KernelCache` also keeps, on disk (namespace ``kernels`` of
:mod:`tessera_tile._runtime.cache`), each kernel's name, source, schedule and the device helpers it
calls, keyed by (stage fingerprint, variant, target); versions are in the entry's header. A
process that finds an entry rebuilds the kernel from it without generating code. The source is
written to a real file beside the entries and the kernel compiled from it with numba-cuda's own
on-disk cache enabled (``enable_caching``, as ``cuda.jit(cache=True)``), so on a GPU a later
process loads its PTX and cubin instead of running NVVM (see docs/tuning.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import linecache
import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import bfloat16, memory, warp
from .. import tile_ir as ir
from .._device import numerics as device
from .._runtime import cache as _cache
from .._runtime import compat
from .._runtime import config as _config
from .._runtime.memo import CountingCache
from . import persist
from .plan import Stage, StageKind
from .reductions import ReductionWriter
from .schedule import Schedule, Variant, schedule
from .templates import KernelWriter


@dataclass
class Generated:
    name: str
    source: str
    kernel: object
    schedule: Schedule


class KernelCache(CountingCache):
    """Compiled kernels by (stage fingerprint, variant, target), in memory and on disk."""

    def __init__(self, persistent: bool = True):
        super().__init__()
        self.disk = _cache.DiskCache(NAMESPACE) if persistent else None
        self.generated = 0  # kernels whose source this process wrote
        self.loaded = 0  # kernels rebuilt from the disk cache

    def kernel(self, stage: Stage, variant: Variant) -> Generated:
        return self.get((stage.key, variant, _config.TARGET), lambda: self._make(stage, variant))

    def _make(self, stage: Stage, variant: Variant) -> Generated:
        key = {"stage": stage.key, "variant": repr(variant), "target": _config.TARGET}
        entry = self.disk.get(key) if self.disk is not None else None
        if entry is not None:
            try:
                sched = dataclasses.replace(persist.load(entry["schedule"]), stage=stage)
                helpers = persist.load(entry["helpers"])
                got = build(entry["name"], entry["source"], sched, helpers, self._source_path)
            except Exception:  # an entry this build cannot rebuild: generate it anew
                self.disk.unreadable(key)
                got = None
            if got is not None:
                self.loaded += 1
                return got
        name, source, sched, helpers = write_source(stage, variant)
        self.generated += 1
        path_of = self._source_path if self.disk is not None else None
        got = build(name, source, sched, helpers, path_of)
        if self.disk is not None:
            with contextlib.suppress(pickle.PicklingError, TypeError, AttributeError):
                value = {
                    "name": name,
                    "source": source,
                    "schedule": persist.dump(sched),
                    "helpers": persist.dump(helpers),
                }
                self.disk.put(key, value)
        return got

    def _source_path(self, name: str, source: str) -> Path | None:
        """A real file holding ``source`` (numba-cuda caches only kernels defined in files);
        None where the cache directory cannot be written."""
        if self.disk is None or self.disk.disabled:
            return None
        path = self.disk.directory / "src" / f"{name}.py"
        try:
            # An unchanged file keeps its time stamp, which numba-cuda's cache index checks.
            if not path.exists() or path.read_bytes() != source.encode():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
        except OSError:
            return None
        return path


NAMESPACE = "kernels"


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
        "uint16": types.uint16,
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
        "bf16_to_f32": bfloat16.bf16_to_f32,
        "f32_to_bf16": bfloat16.f32_to_bf16,
        "load16": memory.load16,
        "store16": memory.store16,
        "load16_shared": memory.load16_shared,
        "store16_shared": memory.store16_shared,
        "warp_argmax": warp.warp_argmax,
        "warp_argmin": warp.warp_argmin,
        **device.MATH,
    }


def write_source(stage: Stage, variant: Variant):
    """Code generation: (kernel name, source, schedule, device helpers the source calls)."""
    name = kernel_name(stage, variant)
    sched = schedule(stage, variant)
    elementwise = variant.kind is StageKind.ELEMENTWISE
    writer = (KernelWriter if elementwise else ReductionWriter)(sched, name)
    return name, writer.write(), sched, writer.helpers


def build(name: str, source: str, sched: Schedule, helpers: dict, path_of=None) -> Generated:
    """The lazy ``@cuda.jit`` kernel of ``source``; compiled from a real file with numba-cuda's
    disk cache on when ``path_of(name, source)`` gives one."""
    path = path_of(name, source) if path_of is not None else None
    filename = str(path) if path is not None else f"<tessera_tile generated {name}>"
    if path is None:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    if _config.DUMP:
        print(source)
    namespace = {**_namespace(), **helpers}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    kernel = namespace[name]
    if path is not None and hasattr(kernel, "enable_caching"):  # not in the simulator
        kernel.enable_caching()
        guard_cache(kernel)
    return Generated(name, source, kernel, sched)


def guard_cache(kernel) -> None:
    """numba-cuda's disk cache never stops a launch. A kernel it cannot save (pickling, linking
    files) is one warning: it runs, and compiles again in the next process. Files it cannot
    load (a corrupt or truncated index or data file, which it would raise on at every launch)
    are one warning and a miss: the index is emptied, and the save after the compilation
    writes it anew. numba-cuda numbers its saves at the first launch of a signature."""
    name = kernel.__name__

    def wrap_save(save):
        def guarded_save(sig, data):
            failed = f"numba-cuda could not cache kernel {name}"
            then = "it runs, and compiles again in the next process"
            return _guarded(save, (sig, data), failed, then)

        return guarded_save

    def wrap_load(load, flush):
        def guarded_load(sig, target_context):
            failed = f"numba-cuda's cache of kernel {name} cannot be read"
            then = "it compiles again and is cached anew"
            return _guarded(load, (sig, target_context), failed, then, flush)

        return guarded_load

    compat.wrap_disk_cache(kernel, wrap_save, wrap_load)


def _guarded(call, args, failed: str, then: str, on_failure=None):
    try:
        return call(*args)
    except Exception as e:
        warnings.warn(f"tessera_tile: {failed} ({e}); {then}", _cache.CacheWarning, stacklevel=3)
        if on_failure is not None:
            with contextlib.suppress(Exception):  # an index it cannot rewrite: it stays a miss
                on_failure()
        return None


def generate(stage: Stage, variant: Variant) -> Generated:
    """Source and compiled (lazy) kernel of one stage variant, without the disk cache."""
    return build(*write_source(stage, variant))
