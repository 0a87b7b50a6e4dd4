"""Persistent caches on disk: one file per entry, written atomically, safe across processes.

Layout under :func:`tessera_tile._config.cache_dir` (``TESSERA_TILE_CACHE_DIR`` overrides it)::

    <cache dir>/<namespace>/<digest>.json    one entry: header, key, value
    <cache dir>/<namespace>/<digest>.lock    its lock (filelock), taken by writers only

``digest`` hashes the entry's key (a JSON-able structure: fingerprint, shape bucket, dtypes,
architecture...). The header holds the format, the library's version and a hash of its source
files (so that a checkout being edited never reuses what older code made), and numba-cuda's
version: an entry written by other versions, or a file that does not parse (a crash mid-write
on a file system without atomic rename, a manual edit), is ignored with one warning per cache
and process, and the caller's next ``put`` rewrites it.

Writers write a temporary file in the same directory and ``os.replace`` it over the entry, under
the entry's lock: readers never see a torn file and need no lock; entries of different keys never
touch the same file, so two processes filling a cache at once lose nothing. A directory that
cannot be created or written gives one warning, and the cache then runs in memory only.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from . import _config
from ._version import __version__

FORMAT = 1


class CacheWarning(UserWarning):
    """A persistent cache entry was ignored, or the cache directory is unusable."""


@functools.cache
def versions() -> dict:
    """What an entry must have been written by to be used."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        numba_cuda = version("numba-cuda")
    except PackageNotFoundError:  # a source checkout without metadata
        numba_cuda = "unknown"
    return {
        "format": FORMAT,
        "tessera_tile": __version__,
        "source": _source_digest(),
        "numba_cuda": numba_cuda,
    }


def _source_digest() -> str:
    """A hash of the package's own source: between two releases (a checkout being worked on)
    a change of the tracer, planner or code generator must not reuse what the old code made."""
    root = Path(__file__).resolve().parent
    h = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def digest(key) -> str:
    """The file name of a key: a hash of its canonical JSON form."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class DiskCache:
    """Entries of one namespace (``"autotune"``, ``"kernels"``...) under the cache directory."""

    def __init__(self, namespace: str, root: Path | None = None):
        self.namespace = namespace
        self._root = root
        self._warned: set[str] = set()
        self.disabled = False

    @property
    def directory(self) -> Path:
        return (self._root or _config.cache_dir()) / self.namespace

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, CacheWarning, stacklevel=3)

    # reading ------------------------------------------------------------------------------
    def get(self, key):
        """The value stored for ``key``, or None (missing, unreadable, foreign or disabled)."""
        if self.disabled:
            return None
        path = self.directory / f"{digest(key)}.json"
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn_once("read", f"tessera_tile cache: cannot read {path.name} ({e}); ignored")
            return None
        entry = self._parse(text, path)
        if entry is None:
            return None
        if entry["key"] != json.loads(json.dumps(key, default=str)):
            return None  # a digest collision: treat as a miss, the put overwrites it
        return entry["value"]

    def _parse(self, text: str, path: Path) -> dict | None:
        try:
            entry = json.loads(text)
            header, _, _ = entry["header"], entry["key"], entry["value"]
        except (ValueError, TypeError, KeyError):
            self._warn_once(
                "corrupt",
                f"tessera_tile cache: {path} is corrupt or truncated; ignored, it will be "
                "rewritten",
            )
            return None
        if header != versions():
            self._warn_once(
                "foreign",
                f"tessera_tile cache: {path} was written by {header}, not {versions()}; "
                "ignored, it will be rewritten",
            )
            return None
        return entry

    def unreadable(self, key) -> None:
        """The caller could not use the value stored for ``key`` (a payload this build cannot
        rebuild): one warning; the caller's next ``put`` rewrites it."""
        self._warn_once(
            "corrupt",
            f"tessera_tile cache: the entry {digest(key)} of {self.directory} cannot be read "
            "back; ignored, it will be rewritten",
        )

    def entries(self) -> list[dict]:
        """Every readable entry of this version: ``{"key", "value", "path"}``."""
        out = []
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.directory.glob("*.json")):
                with contextlib.suppress(OSError):
                    entry = self._parse(path.read_text(), path)
                    if entry is not None:
                        out.append({"key": entry["key"], "value": entry["value"], "path": path})
        return out

    # writing ------------------------------------------------------------------------------
    def put(self, key, value) -> bool:
        """Store ``value`` (JSON-able) for ``key``; False when the cache runs without a disk."""
        if self.disabled:
            return False
        import filelock

        name = digest(key)
        entry = {"header": versions(), "key": key, "value": value}
        text = json.dumps(entry, sort_keys=True, default=str)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(self.directory / f"{name}.lock", timeout=30):
                fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "w") as f:
                        f.write(text)
                    os.replace(tmp, self.directory / f"{name}.json")
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
        except (OSError, filelock.Timeout) as e:
            self.disabled = True
            self._warn_once(
                "unwritable",
                f"tessera_tile cache: cannot write to {self.directory} ({e}); running without "
                "a disk cache (set TESSERA_TILE_CACHE_DIR to a writable directory)",
            )
            return False
        return True

    def clear(self) -> int:
        """Remove this namespace's directory (entries, locks, and what callers keep beside them,
        such as kernel sources and numba-cuda's cache of them); returns how many entries went."""
        removed = len(list(self.directory.glob("*.json"))) if self.directory.is_dir() else 0
        shutil.rmtree(self.directory, ignore_errors=True)
        return removed
