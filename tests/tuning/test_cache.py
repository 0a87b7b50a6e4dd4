"""The persistent caches: one atomic file per entry, shared by processes, ignoring (with one
warning) what is corrupt or from other versions, and running without a disk where it cannot
write. Tier-independent: nothing here launches a kernel."""

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from helpers import ROOT

import tessera_tile as tt
from tessera_tile._runtime import cache as _cache


def run_python(code: str, cache_dir, sim: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with its own cache directory."""
    env = dict(os.environ, TESSERA_TILE_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NUMBA_ENABLE_CUDASIM"] = "1" if sim else "0"
    env["PYTHONWARNINGS"] = "always::UserWarning"  # every CacheWarning, to count them
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )


@pytest.fixture
def cache(tmp_path):
    return _cache.DiskCache("unit", root=tmp_path)


def test_round_trip_across_processes(tmp_path):
    done = run_python(
        """
        from tessera_tile._runtime import cache as _cache
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


def cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, tt.CacheWarning)]


def flip_value(data: bytes) -> bytes:
    """Valid JSON still: the stored value 2 becomes 3, the checksum left as it was."""
    entry = json.loads(data)
    entry["value"] = {"index": 3}
    return json.dumps(entry).encode()


CORRUPTIONS = {
    "not UTF-8": (lambda data: data[:30] + b"\xff\xfe" + data[30:], "not UTF-8"),
    "truncated": (lambda data: data[: len(data) // 2], "not JSON, or truncated"),
    "flipped value": (flip_value, "checksum does not match"),
    "not an entry": (lambda data: b"[1, 2, 3]", "not an entry"),
    "a field missing": (lambda data: data.replace(b'"checksum"', b'"checksun"'), "fields"),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_each_corrupt_entry_warns_once_per_process_and_is_rewritten(tmp_path, corruption):
    corrupt, problem = CORRUPTIONS[corruption]
    first = _cache.DiskCache("unit", root=tmp_path)
    keys = [{"k": i} for i in range(3)]
    for k in keys:
        first.put(k, {"index": 2})
    paths = [first.directory / f"{_cache.digest(k)}.json" for k in keys[:2]]
    for path in paths:
        path.write_bytes(corrupt(path.read_bytes()))
    second = _cache.DiskCache("unit", root=tmp_path)  # another object of the same process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [cache.get(k) for cache in (first, second, first) for k in keys]
    assert got == [None, None, {"index": 2}] * 3
    messages = cache_warnings(caught)
    assert len(messages) == 2, messages  # one per corrupt entry, however often it is read
    for path in paths:
        (message,) = [m for m in messages if str(path) in m]
        assert problem in message
    for k in keys:
        first.put(k, {"index": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [second.get(k) for k in keys] == [{"index": 2}] * 3
    assert all(_cache.read_entry(p).status == "ok" for p in paths)


def test_an_entry_rewritten_then_corrupt_again_warns_again(cache):
    cache.put({"k": 1}, 1)
    (path,) = cache.directory.glob("*.json")
    for _ in range(2):
        path.write_bytes(b"\xff")
        with pytest.warns(_cache.CacheWarning, match="not UTF-8"):
            assert cache.get({"k": 1}) is None
        cache.put({"k": 1}, 1)
        assert cache.get({"k": 1}) == 1


def test_a_value_the_caller_refuses_is_a_corrupt_entry(tmp_path):
    cache = _cache.DiskCache("unit", root=tmp_path, validate=lambda v: isinstance(v["index"], int))
    cache.put({"k": 1}, {"index": "2"})  # a well-formed entry, with its checksum
    with pytest.warns(_cache.CacheWarning, match="wrong shape or types"):
        assert cache.get({"k": 1}) is None
    assert cache.entries() == []
    (listed,) = cache.entries(include_ignored=True)
    assert listed["status"] == "corrupt" and "wrong shape" in listed["problem"]


def written_by(cache, key, value, header: dict) -> None:
    """Store an entry as another version of the library would have written it."""
    entry = {"header": header, "key": key, "value": value}
    if header["format"] == _cache.FORMAT:
        entry["checksum"] = _cache.checksum(header, key, value)
    cache.directory.mkdir(parents=True, exist_ok=True)
    (cache.directory / f"{_cache.digest(key)}.json").write_text(json.dumps(entry))


@pytest.mark.parametrize(
    "header",
    [
        {"tessera_tile": "0.0.0-other"},  # another release
        {"numba_cuda": "0.0.0-other"},
        {"format": 1},  # the format before checksums: no checksum field
    ],
    ids=["tessera_tile", "numba_cuda", "format 1"],
)
def test_entries_of_other_versions_are_silent_misses_and_rewritten(cache, header):
    written_by(cache, {"k": 1}, 1, _cache.versions() | header)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not corrupt: nothing to warn of
        assert cache.get({"k": 1}) is None
        (listed,) = cache.entries(include_ignored=True)
        assert listed["status"] == "other version"
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


@contextlib.contextmanager
def read_only(directory: Path):
    """``directory`` and the directories below it read-only. Root ignores file modes: as root
    they are also made immutable (``chattr +i``), or the test is skipped, saying why."""
    dirs = [directory, *(p for p in directory.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    immutable = os.geteuid() == 0
    try:
        if immutable:
            try:
                done = subprocess.run(["chattr", "+i", *map(str, dirs)], capture_output=True)
            except FileNotFoundError:
                done = None
            if done is None or done.returncode != 0:
                immutable = False
                why = "no chattr" if done is None else done.stderr.decode().strip()
                pytest.skip(
                    f"running as root, which ignores file modes, and chattr +i fails ({why})"
                )
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", *map(str, dirs)], check=True)
        for d in dirs:
            d.chmod(0o755)


def test_a_read_only_cache_warns_once_in_all_and_is_still_read(tmp_path):
    _cache.DiskCache("a", root=tmp_path).put({"k": 1}, 1)
    with read_only(tmp_path):
        caches = [_cache.DiskCache(ns, root=tmp_path) for ns in ("a", "a", "b", "c")]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert [c.put({"k": 2}, 2) for c in caches] == [False] * 4
            assert [c.get({"k": 1}) for c in caches] == [1, 1, None, None]
    (message,) = cache_warnings(caught)
    assert "cannot write" in message and all(c.disabled for c in caches)


def test_a_corrupt_entry_in_a_read_only_cache_is_not_promised_a_rebuild(tmp_path):
    cache = _cache.DiskCache("a", root=tmp_path)
    cache.put({"k": 1}, 1)
    (path,) = (tmp_path / "a").glob("*.json")
    path.write_bytes(b"{not json")
    with read_only(tmp_path), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _cache.DiskCache("a", root=tmp_path).get({"k": 1}) is None
    (message,) = cache_warnings(caught)
    assert "is corrupt" in message and "read-only, so it is not rebuilt" in message, message
    assert "and rebuilt" not in message


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
    entries = _cache.DiskCache("autotune", root=tmp_path).entries(include_ignored=True)
    assert [e["status"] for e in entries] == ["ok"] * len(entries)  # none torn or corrupt
    buckets = {(2 ** (n % 10), _cache_bucket(n)) for n in range(1, 37)}
    assert len(entries) == len(buckets)  # every key of both processes, each once
    assert not list((tmp_path / "autotune").glob("*.tmp"))
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
