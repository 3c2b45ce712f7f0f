"""lowering: cache key + object code ⇄ files on disk (the persistent compilation cache).

Each entry is two files under `<root>/v<FORMAT>/<key[:2]>/`: `<key>.o`, our own object code as
LLVM emitted it, and `<key>.json`, its metadata (key, sha256 and size of the object, the entry
symbols, the kernel layout, created time), written last. Both are written to a temporary file in
the same directory and published with `os.replace`, so a reader never sees a partial file and
concurrent writers of one key are safe (the last one wins; a reader that pairs one writer's
metadata with another's object sees a checksum mismatch and recompiles). Nothing is ever
unpickled; object code is loaded only when its metadata names the requested key and its sha256
matches. Records (`store_record`) are JSON-only entries, `<key>.json` holding a checksummed
payload: the program and call records that let a fresh process skip the front end
(codegen/runtime/warm.py). The metadata file's mtime is its last use (`os.utime` on a hit); past
the size bound the least recently used entries are deleted (measured after every 1/64 of the
bound a process writes). Any OS error makes the cache step aside (one TensorLangWarning per
process): compiling never depends on it.

Root: TENSORLANG_CACHE_DIR, else the user cache directory (platformdirs). TENSORLANG_CACHE=0 turns
it off; TENSORLANG_CACHE_MAX_BYTES bounds it (default 512 MiB).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from tensorlang.errors import TensorLangWarning

from ..host import cache_size, gemm_blocking, host_cpu_features, host_cpu_name
from ..host.cpu import initialise_llvm

FORMAT = 1  # bump when the files' layout or the metadata's meaning changes
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
_warned = threading.Event()


# ------------------------------------------------------------------ where and whether


def enabled() -> bool:
    return os.environ.get("TENSORLANG_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def cache_root() -> Path:
    """The cache directory (whether or not it exists yet)."""
    explicit = os.environ.get("TENSORLANG_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    try:
        import platformdirs  # lazily: only a process that compiles needs it
    except ImportError:  # a checkout used without installing: XDG's default
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "tensorlang"
    return Path(platformdirs.user_cache_dir("tensorlang", appauthor=False))


def max_bytes() -> int:
    try:
        return max(0, int(os.environ.get("TENSORLANG_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)))
    except ValueError:
        return DEFAULT_MAX_BYTES


def _entries_dir() -> Path:
    return cache_root() / f"v{FORMAT}"


# ------------------------------------------------------------------ the key


@functools.cache
def _source_hash() -> str:
    """sha256 of the compiler's Python sources (every stage: a cached program record skips the
    front end too), so that a code change in development never loads stale code."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in ("tensorlang", "polyhedral", "scheduler", "codegen"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def _tensorlang_version() -> str:
    import tensorlang

    return str(tensorlang.__version__)


def environment() -> dict[str, object]:
    """Everything outside a plan's text that the machine code depends on."""
    initialise_llvm()
    return {
        "format": FORMAT,
        "triple": llvm.get_process_triple(),
        "cpu": host_cpu_name(),
        "features": host_cpu_features(),
        "caches": [cache_size(level) for level in (1, 2, 3)],
        "gemm": [repr(gemm_blocking(dtype)) for dtype in ("float32", "float64")],
        "tensorlang": _tensorlang_version(),
        "sources": _source_hash(),
        "llvmlite": llvmlite.__version__,
        "llvm": list(llvm.llvm_version_info),
        "python": sys.implementation.cache_tag,
    }


def cache_key(kind: str, **parts: object) -> str:
    """sha256 of a canonical JSON of `parts` and the environment."""
    record = {"kind": kind, "parts": parts, "environment": environment()}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------ reading and writing


def _paths(key: str) -> tuple[Path, Path]:
    folder = _entries_dir() / key[:2]
    return folder / f"{key}.o", folder / f"{key}.json"


def _warn_once(action: str, exc: BaseException) -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"tensorlang: the compilation cache in {cache_root()} cannot {action} ({exc}); "
            "compiling without it (set TENSORLANG_CACHE_DIR, or TENSORLANG_CACHE=0)",
            TensorLangWarning,
            stacklevel=4,
        )


def load(key: str) -> tuple[bytes, dict] | None:
    """The object code and metadata stored under `key`, or None: absent, or not trustworthy
    (unreadable, not our JSON, another key, a checksum or size mismatch)."""
    if not enabled():
        return None
    obj_path, meta_path = _paths(key)
    try:
        meta = json.loads(meta_path.read_text())
        data = obj_path.read_bytes()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):  # unreadable or garbage: rewritten on store
        return None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != FORMAT
        or meta.get("key") != key
        or meta.get("bytes") != len(data)
        or meta.get("sha256") != hashlib.sha256(data).hexdigest()
    ):
        return None
    try:
        os.utime(meta_path)  # last used: the LRU order
    except OSError:
        pass
    return data, meta


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def store(key: str, data: bytes, meta: Mapping[str, object]) -> bool:
    """Write an entry (object first, metadata last), then keep the cache under its bound.
    False when the cache is off or its directory is unusable (warned once)."""
    if not enabled():
        return False
    obj_path, meta_path = _paths(key)
    now = time.time()
    record = {
        **meta,
        "format": FORMAT,
        "key": key,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created": now,
    }
    try:
        cache_root().mkdir(mode=0o700, parents=True, exist_ok=True)  # private: it holds code we run
        obj_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_atomic(obj_path, data)
        text = json.dumps(record, sort_keys=True, indent=1).encode()
        _write_atomic(meta_path, text)
    except OSError as exc:
        _warn_once("be written", exc)
        return False
    _written(len(data) + len(text))
    return True


def _payload_digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def store_record(key: str, payload: Mapping[str, object]) -> bool:
    """A JSON-only entry (`<key>.json`, no object code): the facts a cache-warm process needs
    to skip the front end (codegen/runtime/warm.py). Atomic, checksummed, evicted like the rest."""
    if not enabled():
        return False
    _, meta_path = _paths(key)
    record = {
        "format": FORMAT,
        "key": key,
        "kind": "record",
        "payload": payload,
        "sha256": _payload_digest(payload),
        "created": time.time(),
    }
    try:
        cache_root().mkdir(mode=0o700, parents=True, exist_ok=True)
        meta_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = json.dumps(record, sort_keys=True).encode()
        _write_atomic(meta_path, text)
    except (OSError, TypeError, ValueError) as exc:
        _warn_once("be written", exc)
        return False
    _written(len(text))
    return True


def load_record(key: str) -> dict | None:
    """The payload stored by store_record under `key`, or None: absent, or not trustworthy."""
    if not enabled():
        return None
    _, meta_path = _paths(key)
    try:
        record = json.loads(meta_path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or record.get("key") != key
        or record.get("kind") != "record"
        or not isinstance(record.get("payload"), dict)
        or record.get("sha256") != _payload_digest(record["payload"])
    ):
        return None
    try:
        os.utime(meta_path)
    except OSError:
        pass
    return record["payload"]


# ------------------------------------------------------------------ size, eviction, info

# Bytes this process wrote since it last measured the cache. Measuring lists every entry, so it
# runs once 1/64 of the bound has been written (and on a process's first write), not per write:
# a test session writes thousands of entries. The cache may then pass its bound by that much per
# writing process, until the next measurement.
_unmeasured = [None]
_unmeasured_lock = threading.Lock()


def _written(nbytes: int) -> None:
    bound = max_bytes()
    with _unmeasured_lock:
        pending = _unmeasured[0]
        due = pending is None or pending + nbytes > bound // 64
        _unmeasured[0] = 0 if due else pending + nbytes
    if due:
        evict(bound)


def _entries() -> list[tuple[float, int, Path, Path]]:
    """(last used, bytes, metadata path, object path) of every entry, least recently used first;
    an object without metadata (a writer died between the two) counts as used when written."""
    found = {}
    root = _entries_dir()
    if not root.is_dir():
        return []
    for folder in root.iterdir():
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.startswith(".") or path.suffix not in (".o", ".json"):
                continue
            try:
                st = path.stat()
            except OSError:  # removed meanwhile by another process
                continue
            used, size = found.get(path.with_suffix(""), (0.0, 0))
            used = st.st_mtime if path.suffix == ".json" or not used else used
            found[path.with_suffix("")] = (used, size + st.st_size)
    ordered = sorted((used, size, stem) for stem, (used, size) in found.items())
    return [(used, size, stem.with_suffix(".json"), stem.with_suffix(".o")) for used, size, stem in ordered]


def evict(bound: int) -> None:
    """Delete least recently used entries until the cache holds at most `bound` bytes."""
    try:
        entries = _entries()
        total = sum(size for _, size, _, _ in entries)
        for _, size, meta_path, obj_path in entries:
            if total <= bound:
                break
            for path in (meta_path, obj_path):  # metadata first: a reader then misses cleanly
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            total -= size
    except OSError as exc:
        _warn_once("be trimmed", exc)


def info() -> dict[str, object]:
    """path, enabled, entries, bytes, max_bytes of the cache."""
    try:
        entries = _entries()
    except OSError:
        entries = []
    return {
        "path": str(cache_root()),
        "enabled": enabled(),
        "entries": len(entries),
        "bytes": sum(size for _, size, _, _ in entries),
        "max_bytes": max_bytes(),
    }


def clear() -> int:
    """Delete every entry of this cache format (other formats' folders too); the bytes freed."""
    freed = int(info()["bytes"])
    try:
        for folder in cache_root().iterdir():
            if folder.is_dir() and folder.name.startswith("v") and folder.name[1:].isdigit():
                shutil.rmtree(folder, ignore_errors=True)
    except OSError:  # no directory (nothing to clear) or an unreadable one
        pass
    return freed
