"""``@tessera_tile.autotune``: pick a launcher's config per shape bucket, once, and remember it.

::

    @tt.autotune(configs=[Cfg(64, 4), Cfg(128, 4), Cfg(128, 8)], key=["a", "b"])
    def launch(a, b, out, *, config):
        kernel_for(config)[grid(a, config), config.threads](a, b, out)

    launch(a, b, out)     # first call per key: tune; later calls: a dictionary look-up

``configs[0]`` is the shipped default. ``key`` names the launcher's arguments whose shapes and
dtypes select an entry (see :func:`bucket` for the shape buckets). What happens on a miss:

* every config gets a score from ``model(config, *args, **kwargs)`` (lower is better). Configs
  the model ranks worse than the default are pruned: tuning never picks one unless a
  measurement says so (the default itself is always a candidate). A score of inf says a config
  cannot take these arguments: it is never a candidate, nor timed, the default included (then
  every finite score is one);
* with a GPU, each remaining config is launched ``warmup`` times, then timed ``repeat`` times
  with CUDA events; the median wins, and the entry is recorded as ``"measured"``;
* without a GPU (or in the simulator), the best-ranked config wins (ties go to the earlier
  config, so the default wins them) and the entry is recorded as ``"model"``: a run on a GPU
  does not use it (its key names another architecture) and tunes again.

The default model asks each config for ``config.cost(*args, **kwargs)`` when the config has such
a method; otherwise every config scores the same, so without a GPU the default is used.

A choice found in the in-process memo or in the persistent cache (``cache=True``; see
:mod:`tessera_tile._runtime.cache`) is used without calling the model or timing anything. A progress
bar (rich, on stderr) shows while a sweep ranks or times configs.
"""

from __future__ import annotations

import functools
import inspect as _pyinspect
import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from ._runtime import cache as _cache
from ._runtime import config as _config
from ._runtime import target as _target

__all__ = ["Autotuned", "autotune", "bucket"]

NAMESPACE = "autotune"


def bucket(n: int) -> int:
    """The shape bucket of one dimension: the next power of two (0 stays 0, 1 stays 1).

    Shapes 513..1024 share the entry of 1024; each dimension is bucketed on its own.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"a dimension cannot be negative, got {n}")
    return 0 if n == 0 else 1 << (n - 1).bit_length()


def key_part(value) -> list:
    """What one keyed argument contributes: arrays by bucketed shape and dtype; integers by
    bucket; other values by type and repr."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return ["array", [bucket(n) for n in shape], np.dtype(dtype).str]
    if isinstance(value, (bool, np.bool_)):
        return ["bool", bool(value)]
    if isinstance(value, (int, np.integer)):
        return ["int", bucket(abs(int(value)))]
    return [type(value).__name__, repr(value)]


def _arch() -> str:
    """The architecture tuning results are measured on ("none" without a GPU)."""
    return _target.current().name if _config.gpu_present() else "none"


def _default_model(config, *args, **kwargs) -> float:
    cost = getattr(config, "cost", None)
    return float(cost(*args, **kwargs)) if callable(cost) else 0.0


class Autotuned:
    """A launcher wrapped by :func:`autotune`; call it as the launcher without ``config``."""

    def __init__(self, launch, configs, key, model, cache, warmup, repeat):
        self.launch = launch
        self.configs = list(configs)
        if not self.configs:
            raise ValueError("configs is empty: give at least the default config")
        for c in self.configs:
            if not isinstance(c, Hashable):
                raise TypeError(f"configs must be hashable, got {type(c).__name__}")
        if isinstance(key, str):
            key = [key]
        params = list(_pyinspect.signature(launch).parameters)
        if "config" not in params:
            raise TypeError(f"{launch.__name__} must take a 'config' argument")
        missing = [k for k in key if k not in params]
        if missing:
            raise ValueError(f"key names {missing}, which {launch.__name__} does not take")
        self.key = tuple(key)
        self._positions = tuple(params.index(k) for k in self.key)
        self.model = model or _default_model
        self.warmup, self.repeat = int(warmup), int(repeat)
        self.disk = _cache.DiskCache(NAMESPACE, validate=self._valid_entry) if cache else None
        self._memo: dict = {}  # exact shapes and dtypes -> config (the fast path)
        self._buckets: dict = {}  # digest of the bucketed key -> config
        # What the persistent key names besides the arguments: the launcher and its configs.
        configs_repr = repr(self.configs)
        self.fingerprint = [
            f"{launch.__module__}.{launch.__qualname__}",
            _cache.digest(configs_repr),
        ]
        self.stats = {"tuned": 0, "memo_hits": 0, "disk_hits": 0}
        self.generation = 0  # counts clear(): a caller that kept a choice sees it dropped
        functools.update_wrapper(self, launch)

    # the fast path ------------------------------------------------------------------------
    def _key(self, args, kwargs) -> tuple:
        parts = []
        for name, pos in zip(self.key, self._positions, strict=True):
            value = args[pos] if pos < len(args) else kwargs[name]
            shape = getattr(value, "shape", None)
            parts.append((shape, str(getattr(value, "dtype", ""))) if shape is not None else value)
        return tuple(parts)

    def __call__(self, *args, **kwargs):
        config = self.choose(*args, **kwargs)
        return self.launch(*args, config=config, **kwargs)

    def choose(self, *args, **kwargs):
        """The config a call with these arguments uses (tuning on the first call of a key)."""
        memo_key = self._key(args, kwargs)
        got = self._memo.get(memo_key)
        if got is not None:
            self.stats["memo_hits"] += 1
            return got
        config = self._miss(args, kwargs)
        self._memo[memo_key] = config
        return config

    def expected(self, *args, **kwargs):
        """The config a call would use, launching nothing: the choice already made for this key
        (in memory or on disk), else the model's (not recorded). For reports such as
        ``explain``, which must not time anything."""
        got = self._memo.get(self._key(args, kwargs))
        if got is not None:
            return got
        key = self.disk_key(args, kwargs)
        got = self._buckets.get(_cache.digest(key))
        if got is not None:
            return got
        entry = self.disk.get(key) if self.disk is not None else None
        if entry is not None and _fits(entry):
            return self.configs[entry["index"]]
        scores, candidates = self._rank(args, kwargs)
        return self.configs[min(candidates, key=lambda i: (scores[i], i))]

    def _rank(self, args, kwargs) -> tuple[list, list]:
        """The model's scores of every config, and the configs it does not rank worse than
        the shipped default (``configs[0]``), less those it scores inf (they cannot take these
        arguments; where all do, the default alone). Ranking takes microseconds: no progress
        bar."""
        scores = [float(self.model(c, *args, **kwargs)) for c in self.configs]
        feasible = [i for i, s in enumerate(scores) if math.isfinite(s)]
        if not feasible:
            return scores, [0]
        if 0 not in feasible:  # e.g. float16 inputs, where the default is a float32 tile
            return scores, feasible
        return scores, [i for i in feasible if scores[i] <= scores[0]]

    # a miss: the disk, then tuning ---------------------------------------------------------
    def disk_key(self, args, kwargs) -> dict:
        values = [
            args[pos] if pos < len(args) else kwargs[name]
            for name, pos in zip(self.key, self._positions, strict=True)
        ]
        return {
            "launcher": self.fingerprint,
            "bucket": [key_part(v) for v in values],
            "arch": _arch(),
        }

    def _miss(self, args, kwargs):
        key = self.disk_key(args, kwargs)
        bucketed = _cache.digest(key)  # another exact shape of a bucket already chosen
        if bucketed in self._buckets:
            return self._buckets[bucketed]
        config = self._lookup_or_tune(key, args, kwargs)
        self._buckets[bucketed] = config
        return config

    def _lookup_or_tune(self, key, args, kwargs):
        if self.disk is not None:
            entry = self.disk.get(key)
            # a model-chosen entry is not used where a GPU could measure, nor one whose config
            # cannot take these arguments (timed before such configs were pruned)
            if (
                entry is not None
                and not (entry["chosen_by"] == "model" and _config.gpu_present())
                and _fits(entry)
            ):
                self.stats["disk_hits"] += 1
                return self.configs[entry["index"]]
        index, chosen_by, scores, times = self.tune(args, kwargs)
        self.stats["tuned"] += 1
        if self.disk is not None:
            self.disk.put(
                key,
                {
                    "index": index,
                    "config": repr(self.configs[index]),
                    "chosen_by": chosen_by,
                    "scores": scores,
                    "times_ms": times,
                },
            )
        return self.configs[index]

    def _valid_entry(self, value) -> bool:
        """An entry this launcher wrote: the index of one of its configs, which the entry
        names, chosen by the model or measured, with a score per config (anything else is a
        corrupt entry, rebuilt)."""
        index, scores = value["index"], value["scores"]
        return (
            type(index) is int
            and 0 <= index < len(self.configs)
            and value["config"] == repr(self.configs[index])
            and value["chosen_by"] in ("model", "measured")
            and isinstance(scores, list)
            and len(scores) == len(self.configs)
            and all(type(x) in (int, float) for x in scores)
        )

    def tune(self, args, kwargs) -> tuple[int, str, list, list | None]:
        """(winner index, "measured" or "model", model scores, median times in ms or None)."""
        name = getattr(self.launch, "__qualname__", "launcher")
        scores, candidates = self._rank(args, kwargs)
        if not _config.gpu_present() or len(candidates) == 1:
            best = min(candidates, key=lambda i: (scores[i], i))
            return best, "model", scores, None
        times: list = [None] * len(self.configs)
        error = None
        with _progress(f"autotune {name}: timing", len(candidates)) as step:
            for i in candidates:
                times[i], error = _time_config(
                    self.launch, args, kwargs, self.configs[i], self.warmup, self.repeat
                )
                step()
        timed = [i for i in candidates if math.isfinite(times[i])]
        if not timed:  # the call itself is refused (bad arguments): its own error
            raise error
        return min(timed, key=lambda i: (times[i], i)), "measured", scores, times

    def clear(self) -> None:
        """Forget the in-process choices (the disk cache stays; see ``tessera-tile cache``)."""
        self._memo.clear()
        self._buckets.clear()
        self.generation += 1


def _fits(entry) -> bool:
    """The entry's config was not scored inf when it was chosen (one that was cannot take the
    arguments: timed and picked before such configs were pruned)."""
    return math.isfinite(entry["scores"][entry["index"]])


def autotune(
    configs: Sequence[Hashable],
    key: Sequence[str] | str,
    *,
    model: Callable[..., float] | None = None,
    cache: bool = True,
    warmup: int = 3,
    repeat: int = 20,
):
    """Decorate a launcher ``launch(*args, config)`` to choose its config per key (see the
    module docstring). ``configs[0]`` is the shipped default; ``key``: argument names;
    ``model(config, *args, **kwargs) -> float``, lower is better; ``cache``: keep choices on
    disk too; ``warmup``, ``repeat``: launches before and during timing, on a GPU."""
    return lambda launch: Autotuned(launch, configs, key, model, cache, warmup, repeat)


def _time_config(launch, args, kwargs, config, warmup: int, repeat: int):
    """(median milliseconds of one launch with CUDA events, None), or (inf, the error) where
    the config cannot launch."""
    from numba import cuda

    try:
        for _ in range(warmup):
            launch(*args, config=config, **kwargs)
        times = []
        for _ in range(repeat):
            start, stop = cuda.event(), cuda.event()
            start.record()
            launch(*args, config=config, **kwargs)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    except Exception as e:  # a config the device refuses (too much shared memory, threads...)
        return math.inf, e
    return float(np.median(times)), None


class _progress:
    """A rich progress bar on stderr for one sweep; ``step()`` advances it."""

    def __init__(self, description: str, total: int):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=Console(stderr=True),
        )
        self._task = self._bar.add_task(description, total=total)

    def __enter__(self):
        self._bar.start()
        return lambda: self._bar.advance(self._task)

    def __exit__(self, *exc):
        self._bar.stop()
