"""The persistent caches: one atomic file per entry, shared by processes, ignoring (with one
warning) what is corrupt or from other versions, and running without a disk where it cannot
write. Tier-independent: nothing here launches a kernel."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
from helpers import ROOT

from tessera_tile import _cache


def run_python(code: str, cache_dir, sim: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with its own cache directory."""
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NUMBA_ENABLE_CUDASIM"] = "1" if sim else "0"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


@pytest.fixture
def cache(tmp_path):
    return _cache.DiskCache("unit", root=tmp_path)


def test_round_trip_across_processes(tmp_path):
    done = run_python(
        """
        from tessera_tile import _cache
        assert _cache.DiskCache("unit").put({"op": "softmax", "bucket": [1024, 4]}, {"index": 2})
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    here = _cache.DiskCache("unit", root=tmp_path)
    assert here.get({"op": "softmax", "bucket": [1024, 4]}) == {"index": 2}
    assert here.get({"op": "softmax", "bucket": [2048, 4]}) is None
    (entry,) = here.entries()
    assert entry["key"] == {"op": "softmax", "bucket": [1024, 4]}


def test_corrupt_files_are_ignored_with_one_warning_and_rewritten(cache):
    keys = [{"k": i} for i in range(3)]
    for k in keys:
        cache.put(k, {"index": k["k"]})
    paths = sorted(cache.directory.glob("*.json"))
    paths[0].write_text(paths[0].read_text()[:20])  # truncated
    paths[1].write_text("not json at all")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [cache.get(k) for k in keys]
    assert sorted(map(str, got)).count("None") == 2
    assert len([w for w in caught if issubclass(w.category, _cache.CacheWarning)]) == 1
    assert "corrupt or truncated" in str(caught[0].message)
    for k in keys:
        cache.put(k, {"index": k["k"]})
    assert [cache.get(k) for k in keys] == [{"index": 0}, {"index": 1}, {"index": 2}]


def test_entries_of_other_versions_are_ignored_with_one_warning(cache):
    cache.put({"k": 1}, 1)
    (path,) = cache.directory.glob("*.json")
    entry = json.loads(path.read_text())
    entry["header"]["tessera_tile"] = "0.0.0-other"
    path.write_text(json.dumps(entry))
    with pytest.warns(_cache.CacheWarning, match="written by"):
        assert cache.get({"k": 1}) is None
    cache.put({"k": 1}, 2)
    assert cache.get({"k": 1}) == 2


def test_unwritable_directory_warns_once_and_runs_without_a_disk(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cache = _cache.DiskCache("unit", root=blocker / "below")  # a directory under a file
    with pytest.warns(_cache.CacheWarning, match="without a disk cache"):
        assert cache.put({"k": 1}, 1) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert cache.put({"k": 2}, 2) is False
        assert cache.get({"k": 1}) is None


def test_concurrent_writers_lose_nothing_and_tear_nothing(tmp_path):
    """Two processes tune the same launcher over overlapping shapes at once."""
    code = """
        import sys
        from dataclasses import dataclass
        import numpy as np
        import tessera_tile as tt

        @dataclass(frozen=True)
        class Cfg:
            block: int
            def cost(self, x):
                return abs(self.block - x.shape[0])

        @tt.autotune([Cfg(64), Cfg(128), Cfg(256), Cfg(512)], key=["x"])
        def launch(x, *, config):
            return config

        start = int(sys.argv[1])
        for n in range(start, start + 24):
            launch(np.zeros((2 ** (n % 10), n), np.float32))
        """
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(tmp_path), NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(start)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for start in (1, 13)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    disk = _cache.DiskCache("autotune", root=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn file would warn
        entries = disk.entries()
    buckets = {(2 ** (n % 10), _cache_bucket(n)) for n in range(1, 37)}
    assert len(entries) == len(buckets)  # every key of both processes, each once
    assert not list(disk.directory.glob("*.tmp"))
    for e in entries:
        rows = e["key"]["bucket"][0][1][0]
        assert (
            e["value"]["config"]
            == f"Cfg(block={min((64, 128, 256, 512), key=lambda b: (abs(b - rows), b))})"
        )


def _cache_bucket(n: int) -> int:
    from tessera_tile.autotune import bucket

    return bucket(n)


def test_clear_removes_entries_and_what_lives_beside_them(cache):
    cache.put({"k": 1}, 1)
    cache.put({"k": 2}, 2)
    (cache.directory / "src").mkdir()
    (cache.directory / "src" / "kernel.py").write_text("")  # as the kernel cache keeps sources
    assert cache.clear() == 2
    assert cache.entries() == [] and not cache.directory.exists()
    assert cache.clear() == 0
