"""Persistent caches on disk: one file per entry, written atomically, safe across processes,
checked on every read.

Layout under :func:`tessera_tile._runtime.config.cache_dir` (``TESSERA_TILE_CACHE_DIR``
overrides it)::

    <cache dir>/<namespace>/<digest>.json    one entry: header, key, value, checksum
    <cache dir>/<namespace>/<digest>.lock    its lock (filelock), taken by writers only

``digest`` hashes the entry's key (a JSON-able structure: fingerprint, shape bucket, dtypes,
architecture...). The header holds the format, the library's version and a hash of its source
files (so that a checkout being edited never reuses what older code made), and numba-cuda's
version. ``checksum`` is the SHA-256 of the canonical JSON of header, key and value.

What a read finds:

* an entry of another format or other versions: a miss, silently (an upgrade or an edit of the
  library); the caller's next ``put`` rewrites it;
* a **corrupt entry**: bytes that are not UTF-8, not JSON (a truncated file), the wrong shape, a
  checksum that does not match its content (a flipped byte, a hand edit), or a value the
  caller's ``validate`` refuses: a miss, with one :class:`CacheWarning` per entry and process
  (however many objects read it), and the caller's next ``put`` rewrites it.

Writers write a temporary file in the same directory and ``os.replace`` it over the entry, under
the entry's lock: readers never see a torn file and need no lock; entries of different keys never
touch the same file, so two processes filling a cache at once lose nothing. A directory that
cannot be created or written gives one warning per process, and writes to it then stop (the
caches run in memory); what it holds is still read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from . import config as _config

FORMAT = 2  # 2: every entry carries a checksum of its content

_FIELDS = frozenset({"header", "key", "value", "checksum"})


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


def _canonical(obj) -> str:
    """One text per JSON value: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _plain(obj):
    """``obj`` as it reads back from JSON (tuples become lists, other objects strings)."""
    return json.loads(_canonical(obj))


def digest(key) -> str:
    """The file name of a key: a hash of its canonical JSON form."""
    return hashlib.blake2b(_canonical(key).encode(), digest_size=16).hexdigest()


def checksum(header, key, value) -> str:
    """What an entry's ``checksum`` must be: SHA-256 of the canonical JSON of its content."""
    content = {"header": header, "key": key, "value": value}
    return hashlib.sha256(_canonical(content).encode()).hexdigest()


# one report per problem and process, however many caches meet it -------------------------------
_reported: set[str] = set()
_unwritable: set[Path] = set()  # directories a write failed in
_lock = threading.Lock()


def _report(subject: str, message: str) -> None:
    """Warn about ``subject`` (an entry's path, a directory) once in this process."""
    with _lock:
        if subject in _reported:
            return
        _reported.add(subject)
    warnings.warn(message, CacheWarning, stacklevel=4)


def _report_corrupt(path: Path, problem: str) -> None:
    writable = path.parent not in _unwritable and os.access(path.parent, os.W_OK)
    then = (
        "ignored, and rebuilt"
        if writable
        else "ignored; the directory is read-only, so it is not rebuilt (set "
        "TESSERA_TILE_CACHE_DIR to a writable directory)"
    )
    _report(str(path), f"tessera_tile cache: {path} is corrupt ({problem}); {then}")


@dataclass(frozen=True)
class Read:
    """What one entry file holds: ``status`` is ``"ok"``, ``"missing"``, ``"other version"``
    or ``"corrupt"`` (then ``problem`` says why)."""

    status: str
    entry: dict | None = None
    problem: str = ""


def read_entry(path: Path) -> Read:
    """Read and check one entry file; never raises for what the file holds."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return Read("missing")
    except OSError as e:
        return Read("corrupt", problem=f"cannot be read: {e.strerror or e}")
    try:
        entry = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return Read("corrupt", problem="not UTF-8")
    except (ValueError, RecursionError):
        return Read("corrupt", problem="not JSON, or truncated")
    header = entry.get("header") if isinstance(entry, dict) else None
    if not isinstance(header, dict):
        return Read("corrupt", problem="not an entry")
    if header.get("format") != FORMAT:
        return Read("other version", entry)  # older or newer format: not ours to judge
    if set(entry) != _FIELDS:
        return Read("corrupt", problem=f"fields {sorted(entry)}, not {sorted(_FIELDS)}")
    if entry["checksum"] != checksum(header, entry["key"], entry["value"]):
        return Read("corrupt", problem="its checksum does not match its content")
    if header != versions():
        return Read("other version", entry)
    return Read("ok", entry)


class DiskCache:
    """Entries of one namespace (``"autotune"``, ``"kernels"``...) under the cache directory.

    ``validate(value) -> bool`` refuses values of the wrong shape or types (a corrupt entry)."""

    def __init__(
        self,
        namespace: str,
        root: Path | None = None,
        validate: Callable[[object], bool] | None = None,
    ):
        self.namespace = namespace
        self._root = root
        self._validate = validate

    @property
    def directory(self) -> Path:
        return (self._root or _config.cache_dir()) / self.namespace

    @property
    def disabled(self) -> bool:
        """True once a write to this directory failed in this process."""
        return self.directory in _unwritable

    def _path(self, key) -> Path:
        return self.directory / f"{digest(key)}.json"

    # reading ------------------------------------------------------------------------------
    def _read(self, path: Path) -> Read:
        got = read_entry(path)
        if got.status == "ok" and not _accepts(self._validate, got.entry["value"]):
            return Read("corrupt", problem="a value of the wrong shape or types")
        return got

    def get(self, key):
        """The value stored for ``key``, or None (missing, of other versions, or corrupt: then one
        warning per entry and process)."""
        path = self._path(key)
        got = self._read(path)
        if got.status == "corrupt":
            _report_corrupt(path, got.problem)
        if got.status != "ok" or got.entry["key"] != _plain(key):
            return None  # a digest collision is a miss too: the put overwrites it
        return got.entry["value"]

    def unreadable(self, key) -> None:
        """The caller could not use the value stored for ``key`` (a payload this build cannot
        rebuild): one warning per entry and process; the caller's next ``put`` rewrites it."""
        _report_corrupt(self._path(key), "its payload cannot be rebuilt")

    def entries(self, include_ignored: bool = False) -> list[dict]:
        """This namespace's entries of this version, ``{"key", "value", "path", "status",
        "problem"}``; with ``include_ignored``, also the files a read ignores (corrupt, or of other
        versions: no key or value then). Warns of nothing: listing is not using."""
        out = []
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.directory.glob("*.json")):
                got = self._read(path)
                if got.status == "ok" or include_ignored:
                    entry = got.entry if got.status == "ok" else {}
                    out.append(
                        {"key": entry.get("key"), "value": entry.get("value"), "path": path}
                        | {"status": got.status, "problem": got.problem}
                    )
        return out

    # writing ------------------------------------------------------------------------------
    def put(self, key, value) -> bool:
        """Store ``value`` (JSON-able) for ``key``; False when the cache runs without a disk."""
        directory = self.directory
        if directory in _unwritable:
            return False
        import filelock

        name = digest(key)
        content = _plain({"header": versions(), "key": key, "value": value})
        entry = {**content, "checksum": checksum(**content)}
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(directory / f"{name}.lock", timeout=30):
                _replace(directory, name, _canonical(entry))
        except (OSError, filelock.Timeout) as e:
            with _lock:
                _unwritable.add(directory)
            _report(
                str(self._root or _config.cache_dir()),
                f"tessera_tile cache: cannot write to {directory} ({e}); running without a "
                "disk cache (set TESSERA_TILE_CACHE_DIR to a writable directory)",
            )
            return False
        with _lock:  # a later fault of the rewritten entry is news again
            _reported.discard(str(directory / f"{name}.json"))
        return True

    def clear(self) -> int:
        """Remove this namespace's directory (entries, locks, and what callers keep beside them,
        such as kernel sources and numba-cuda's cache of them); returns how many entries went."""
        removed = len(list(self.directory.glob("*.json"))) if self.directory.is_dir() else 0
        shutil.rmtree(self.directory, ignore_errors=True)
        return removed


def _accepts(validate: Callable[[object], bool] | None, value) -> bool:
    if validate is None:
        return True
    try:
        return bool(validate(value))
    except Exception:  # a validator meeting a shape it did not foresee: refused
        return False


def _replace(directory: Path, name: str, text: str) -> None:
    """Write ``<name>.json`` atomically: a temporary file beside it, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, directory / f"{name}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
