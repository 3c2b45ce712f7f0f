"""tune: trials and best records ⇄ an SQLite database in the cache directory (WAL, busy timeout).

Tables: `programs` (key → def name, description JSON), `trials` (every candidate measured: its
knobs as JSON, seconds, status "ok" | "wrong" | "crash" | "timeout" | "error", detail), `best`
(key → the trial tl.compile uses, with the confirmed time and the default's). Several processes
may write at once (SQLite's locking; WAL lets readers go on during a write). A row whose JSON
does not parse or names unknown knobs is skipped by every reader; a file SQLite cannot read is
moved aside (`tune.sqlite3.corrupt-<time>`) and a new database made.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ..lowering import disk_cache
from . import key as key_

FILENAME = "tune.sqlite3"
BUSY_MS = 30_000
SCHEMA = """
CREATE TABLE IF NOT EXISTS programs (
    key TEXT PRIMARY KEY, name TEXT NOT NULL, description TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, options TEXT NOT NULL,
    seconds REAL, status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS trials_key ON trials (key, status, seconds);
CREATE TABLE IF NOT EXISTS best (
    key TEXT PRIMARY KEY, trial INTEGER NOT NULL, options TEXT NOT NULL, seconds REAL NOT NULL,
    default_seconds REAL NOT NULL, updated REAL NOT NULL);
"""


def default_path() -> Path:
    return disk_cache.cache_root() / FILENAME


@dataclass(frozen=True)
class Trial:
    id: int
    knobs: dict  # parsed and checked (key.from_knobs accepts it)
    seconds: float | None
    status: str


@dataclass(frozen=True)
class Best:
    trial: int
    knobs: dict
    seconds: float
    default_seconds: float


def _valid_knobs(text: str) -> dict | None:
    try:
        knobs = json.loads(text)
        key_.from_knobs(knobs, key_.Options())
    except (ValueError, TypeError):
        return None
    return key_.normalise(knobs)  # records made before the later knobs: those at their defaults


class Database:
    """One connection to the tuning database (made, or rebuilt when corrupt, on opening)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError:  # not a database, or malformed: keep it aside, start again
            self._move_aside()
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
            row = conn.execute("PRAGMA quick_check").fetchone()
            if not row or row[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {row}")
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            path = Path(str(self.path) + suffix)
            if path.exists():
                try:
                    os.replace(path, Path(f"{self.path}.corrupt-{stamp}-{os.getpid()}{suffix}"))
                except OSError:
                    pass

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def add_program(self, key: str, name: str, description: dict) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO programs (key, name, description, created) VALUES (?, ?, ?, ?)",
            (key, name, json.dumps(description, sort_keys=True, default=str), time.time()),
        )

    def add_trial(self, key: str, knobs: dict, seconds: float | None, status: str, detail: str = "") -> int:
        cur = self._conn.execute(
            "INSERT INTO trials (key, options, seconds, status, detail, created) VALUES (?, ?, ?, ?, ?, ?)",
            (key, json.dumps(knobs, sort_keys=True), seconds, status, detail[:2000], time.time()),
        )
        return int(cur.lastrowid)

    def set_best(self, key: str, trial: int, knobs: dict, seconds: float, default_seconds: float) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO best (key, trial, options, seconds, default_seconds, updated) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (key, trial, json.dumps(knobs, sort_keys=True), seconds, default_seconds, time.time()),
        )

    # ------------------------------------------------------------------ reading

    def trials(self, key: str) -> list[Trial]:
        """Every readable trial of a key, oldest first (corrupt rows skipped)."""
        out = []
        for id_, text, seconds, status in self._conn.execute(
            "SELECT id, options, seconds, status FROM trials WHERE key = ? ORDER BY id", (key,)
        ):
            knobs = _valid_knobs(text) if isinstance(text, str) else None
            if knobs is None or (seconds is not None and not isinstance(seconds, float | int)):
                continue
            out.append(Trial(int(id_), knobs, None if seconds is None else float(seconds), str(status)))
        return out

    def best(self, key: str) -> Best | None:
        row = self._conn.execute(
            "SELECT trial, options, seconds, default_seconds FROM best WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        knobs = _valid_knobs(row[1]) if isinstance(row[1], str) else None
        if knobs is None or not all(isinstance(v, float | int) for v in (row[0], row[2], row[3])):
            return None
        return Best(int(row[0]), knobs, float(row[2]), float(row[3]))

    def programs(self) -> list[dict]:
        """A summary per key: name, sizes, dtypes, threads, trial counts, best and default times."""
        rows = []
        for key, name, text in self._conn.execute(
            "SELECT key, name, description FROM programs ORDER BY created"
        ):
            try:
                description = json.loads(text)
            except (TypeError, ValueError):
                description = {}
            counts = dict(
                self._conn.execute(
                    "SELECT status, COUNT(*) FROM trials WHERE key = ? GROUP BY status", (key,)
                )
            )
            best = self.best(key)
            rows.append(
                {
                    "key": key,
                    "name": name,
                    "sizes": description.get("sizes", {}) if isinstance(description, dict) else {},
                    "dtypes": description.get("dtypes", []) if isinstance(description, dict) else [],
                    "threads": description.get("threads") if isinstance(description, dict) else None,
                    "trials": sum(counts.values()),
                    "failed": sum(n for s, n in counts.items() if s != "ok"),
                    "best_s": best.seconds if best else None,
                    "default_s": best.default_seconds if best else None,
                    "options": best.knobs if best else None,
                }
            )
        return rows

    # ------------------------------------------------------------------ moving records

    def export(self) -> dict:
        """Every program, trial and best record as JSON (for `tensorlang tune --export`)."""
        programs = [
            {"key": k, "name": n, "description": json.loads(d)}
            for k, n, d in self._conn.execute("SELECT key, name, description FROM programs")
        ]
        trials = [
            {"key": k, "options": json.loads(o), "seconds": s, "status": st, "detail": de}
            for k, o, s, st, de in self._conn.execute(
                "SELECT key, options, seconds, status, detail FROM trials ORDER BY id"
            )
            if _valid_knobs(o) is not None
        ]
        best = [
            {"key": k, "options": json.loads(o), "seconds": s, "default_seconds": d}
            for k, o, s, d in self._conn.execute("SELECT key, options, seconds, default_seconds FROM best")
            if _valid_knobs(o) is not None
        ]
        return {"format": "tensorlang-tune/1", "programs": programs, "trials": trials, "best": best}

    def import_(self, data: dict) -> int:
        """Add an export's records (a best record replaces this machine's when it is faster, or
        when there is none). Returns the number of trials added."""
        if not isinstance(data, dict) or data.get("format") != "tensorlang-tune/1":
            raise ValueError("not a tensorlang tuning export (format tensorlang-tune/1)")
        added = 0
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for p in data.get("programs", []):
                self.add_program(str(p["key"]), str(p["name"]), p["description"])
            for t in data.get("trials", []):
                if _valid_knobs(json.dumps(t["options"])) is None:
                    continue
                self.add_trial(
                    str(t["key"]), t["options"], t["seconds"], str(t["status"]), str(t.get("detail", ""))
                )
                added += 1
            for b in data.get("best", []):
                if _valid_knobs(json.dumps(b["options"])) is None:
                    continue
                mine = self.best(str(b["key"]))
                if mine is None or float(b["seconds"]) < mine.seconds:
                    trial = self.add_trial(
                        str(b["key"]), b["options"], float(b["seconds"]), "ok", "imported best"
                    )
                    self.set_best(
                        str(b["key"]), trial, b["options"], float(b["seconds"]), float(b["default_seconds"])
                    )
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return added


def lookup_best(key: str, path: Path | None = None) -> Best | None:
    """The best record of a key, or None: no database file (never made here), no record, or any
    error reading it — compiling must never fail because of the tuning database."""
    path = path if path is not None else default_path()
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(path, timeout=BUSY_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            row = conn.execute(
                "SELECT trial, options, seconds, default_seconds FROM best WHERE key = ?", (key,)
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    knobs = _valid_knobs(row[1]) if isinstance(row[1], str) else None
    if knobs is None:
        return None
    try:
        return Best(int(row[0]), knobs, float(row[2]), float(row[3]))
    except (TypeError, ValueError):
        return None
