"""Cache look-up costs (printed, never asserted).

* an autotuned launcher's choice for arguments seen before (the in-process memo), for another
  shape of a bucket already tuned, and from the disk cache (a new launcher object, as in a new
  process);
* a fused function's first call in a new process, with a cold and with a warm persistent cache
  (``explain``: trace, plan and code generation, or their loading; no launch, no NVVM);
* a fused kernel's compilation in a first process and its loading from numba-cuda's cache in a
  second (the compile tier's test; both include numba-cuda's one-time start-up).

Run: ``python benchmarks/cache.py`` (no GPU needed; it uses a temporary cache directory).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Cfg:
    block: int
    warps: int

    def cost(self, a, b):
        return abs(self.block - a.shape[-1])


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def autotune_lookups() -> None:
    import tessera_tile as tt

    configs = [Cfg(b, w) for b in (64, 128, 256, 512) for w in (4, 8)]

    def launch(a, b, *, config):
        return config

    tuned = tt.autotune(configs, key=["a", "b"])(launch)
    a, b = np.zeros((4096, 1000), np.float16), np.zeros(1000, np.float16)
    tuned.choose(a, b)
    memo = per_call_us(lambda: tuned.choose(a, b), 100_000)
    print(f"autotune, memo hit (same shapes):          {memo:7.2f} us")
    others = [np.zeros((4096, n), np.float16) for n in range(513, 1024)]  # one bucket: 1024

    def bucket_hit():
        tuned._memo.clear()  # the exact shapes are new; the bucket is known
        for x in others:
            tuned.choose(x, b)

    bucket = per_call_us(bucket_hit, 20) / len(others)
    print(f"autotune, bucket hit (new exact shape):    {bucket:7.2f} us")

    def disk_hit():
        fresh = tt.autotune(configs, key=["a", "b"])(launch)
        fresh.choose(a, b)

    print(f"autotune, disk hit (new launcher object):  {per_call_us(disk_hit, 500):7.2f} us")


FIRST_CALL = """
    import time
    t0 = time.perf_counter()
    import numpy as np
    import tessera_tile as tt
    from tessera_tile import ops
    ops.transpose.explain(np.zeros((2, 2), np.float32))  # lazy imports, not cached: untimed
    t1 = time.perf_counter()
    x = np.zeros((4096, 1024), np.float32)
    w = np.ones(1024, np.float32)
    ops.layer_norm.explain(x, w, w)
    ops.softmax.explain(x)
    t2 = time.perf_counter()
    print(f"{(t2 - t1) * 1e3:.1f}")
    """


def first_calls() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TESSERA_TILE_CACHE_DIR=cache)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        for label in ("cold cache", "warm cache"):
            done = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(FIRST_CALL)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            print(
                f"new process, layer_norm + softmax explain, {label}: "
                f"{float(done.stdout.strip()):7.1f} ms"
            )


def compile_and_load() -> None:
    """The compile tier's two processes (tests/compile/test_cache_nvvm.py): the first compiles
    a fused kernel for sm_90 and saves it in numba-cuda's cache, the second loads it."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "tests"))
    path = ROOT / "tests" / "compile" / "test_cache_nvvm.py"
    spec = importlib.util.spec_from_file_location("cache_nvvm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as cache:
        for which in ("first", "second"):
            got = module.run(Path(cache), which)
            print(
                f"{which} process: kernel compiled or loaded in {got['seconds'] * 1e3:6.1f} ms "
                f"(NVVM runs: {got['nvvm']})"
            )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TESSERA_TILE_CACHE_DIR"] = tmp  # before tessera_tile reads it
        autotune_lookups()
    first_calls()
    compile_and_load()
