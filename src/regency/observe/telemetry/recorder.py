"""The local recorder: recent spans, metric points and failures in an SQLite file.

One writer thread per controller takes batches from a queue and writes each in one transaction,
so nothing on the hot path waits for the disk. The file lives in this user's private directory
(``$TMPDIR/regency-<uid>/telemetry/telemetry.db``, the directory 0700, the file 0600) unless
the ``telemetry_db`` setting names another; several controllers of one user share it (their rows
carry their ``job``). Another user must not be able to plant, read or change it: see
:func:`check_place`. It is bounded: rows older than ``telemetry_retention`` seconds, and the oldest
rows past ``telemetry_max_rows`` per table, are deleted every few seconds.

The tables (times are seconds since the epoch; see ``docs/introspection.md``):

- ``spans``: job, trace_id, span_id, parent_id (hex; NULL for a trace's root), name, kind
  (``call``, ``send``, ``deliver``, ``handle``, ``reply``, ``span``), endpoint, actor, proc,
  start_time, end_time, duration_ms, status (``ok`` / ``error``), error.
- ``metrics``: job, proc, t, interval_s, name, kind (``counter``, ``updowncounter``, ``gauge``,
  ``histogram``), endpoint, attributes (JSON), value, count, sum, min, max, buckets (JSON
  counts over ``histogram_bounds``).
- ``failures``: job, proc, t, ref, kind (``failed`` / ``restarted``), text.
- ``histogram_bounds``: i, le_ms: the upper bound of histogram bucket ``i``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from regency import config
from regency._config_keys import TELEMETRY_DB, TELEMETRY_MAX_ROWS, TELEMETRY_RETENTION
from regency._private_paths import check_owned_file, check_unswappable, private_dir, user_root
from regency.observe.telemetry.aggregate import BOUNDS_MS

log = logging.getLogger("regency.telemetry")

_SWEEP_EVERY = 5.0
_BATCH_MAX = 256  # batches written in one transaction at most
# Batches waiting for the writer at most: when the disk or a lock stalls it, newer batches are
# dropped (counted, and said once a minute) rather than held in memory without bound.
QUEUE_MAX = 4096
_DROP_LOG_EVERY = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    job TEXT, trace_id TEXT, span_id TEXT, parent_id TEXT, name TEXT, kind TEXT,
    endpoint TEXT, actor TEXT, proc TEXT, start_time REAL, end_time REAL, duration_ms REAL,
    status TEXT, error TEXT);
CREATE INDEX IF NOT EXISTS spans_by_start ON spans (start_time);
CREATE INDEX IF NOT EXISTS spans_by_trace ON spans (trace_id);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT, proc TEXT, t REAL, interval_s REAL, name TEXT, kind TEXT, endpoint TEXT,
    attributes TEXT, value REAL, count INTEGER, sum REAL, min REAL, max REAL, buckets TEXT);
CREATE INDEX IF NOT EXISTS metrics_by_t ON metrics (t);
CREATE TABLE IF NOT EXISTS failures (job TEXT, proc TEXT, t REAL, ref TEXT, kind TEXT, text TEXT);
CREATE TABLE IF NOT EXISTS histogram_bounds (i INTEGER PRIMARY KEY, le_ms REAL);
"""
TABLES = ("spans", "metrics", "failures")


def database_path() -> Path:
    """Where the recorder keeps its file (the ``telemetry_db`` setting, or the private default)."""
    given = config.value(TELEMETRY_DB)
    if given:
        return Path(given).expanduser()
    return user_root() / "telemetry" / "telemetry.db"


# The database and the files SQLite keeps beside it (its write-ahead log is replayed on open).
_SIDE_FILES = ("", "-wal", "-shm", "-journal")


def check_place(path: Path) -> None:
    """Refuse a database another user could have planted, read or change.

    Its directory must be this user's (or root's) and writable by nobody else, sticky bit or
    not (another user could create the file or its ``-wal`` log first), on a path no other user
    can swap; the file and SQLite's side files, where they exist, must be regular files of this
    user that nobody else may write. Raises
    :class:`~regency._private_paths.UnsafePathError` naming the path and the owner or mode.
    """
    what = f"telemetry database {path}"
    check_unswappable(path.parent, closed=True)
    for suffix in _SIDE_FILES:
        check_owned_file(f"{path}{suffix}", what)


def _prepare_file(path: Path) -> None:
    """Make the directory (private, for the default place), check it, make the file (0600)."""
    if path == user_root() / "telemetry" / "telemetry.db":
        private_dir(user_root())
        private_dir(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    check_place(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def connect(path: Path, readonly: bool) -> sqlite3.Connection:
    """A connection to the recorder's file; read-only ones cannot change it."""
    if readonly:
        if not path.exists():
            raise FileNotFoundError(
                f"no telemetry database at {path}: switch telemetry on in a controller first "
                "(docs/introspection.md)"
            )
        check_place(path)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    else:
        conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(SCHEMA)
        conn.executemany(
            "INSERT OR REPLACE INTO histogram_bounds VALUES (?, ?)", list(enumerate(BOUNDS_MS))
        )
        conn.commit()
    return conn


def _hex(value: int, width: int) -> str | None:
    return format(value, f"0{width}x") if value else None


class Recorder:
    """Writes batches to the database on a thread of its own."""

    def __init__(self, path: Path | None = None, max_queued: int = QUEUE_MAX) -> None:
        self.path = path if path is not None else database_path()
        self.max_queued = max_queued
        self.dropped = 0  # batches refused because the writer was behind
        self._last_drop_log = 0.0
        _prepare_file(self.path)
        self._conn = connect(self.path, readonly=False)
        self._retention = config.value(TELEMETRY_RETENTION)
        self._max_rows = config.value(TELEMETRY_MAX_ROWS)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="regency-telemetry-db", daemon=True)
        self._thread.start()

    def ingest(self, batch: dict[str, Any]) -> None:
        """Queue a batch for writing (any thread); drop it when ``max_queued`` batches wait."""
        if self._queue.qsize() >= self.max_queued:
            self.dropped += 1
            now = time.monotonic()
            if now - self._last_drop_log >= _DROP_LOG_EVERY:
                self._last_drop_log = now
                log.warning(
                    "telemetry: the writer of %s is behind (%d batches waiting): dropped %d "
                    "batches so far",
                    self.path,
                    self.max_queued,
                    self.dropped,
                )
            return
        self._queue.put(batch)

    def barrier(self, timeout: float = 10.0) -> bool:
        """Wait until every batch queued before this call is written."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def stop(self) -> None:
        """Write what is queued, then close the database."""
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        last_sweep = time.monotonic()
        try:
            while True:
                try:
                    item = self._queue.get(timeout=_SWEEP_EVERY)
                except queue.Empty:
                    item = ...
                items = [item]
                while len(items) < _BATCH_MAX:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                batches = [i for i in items if isinstance(i, dict)]
                if batches:
                    self._write(batches)
                if time.monotonic() - last_sweep >= _SWEEP_EVERY:
                    self.sweep()
                    last_sweep = time.monotonic()
                for i in items:
                    if isinstance(i, threading.Event):
                        i.set()
                if any(i is None for i in items):
                    return
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()

    def _write(self, batches: list[dict[str, Any]]) -> None:
        spans: list[tuple[Any, ...]] = []
        points: list[tuple[Any, ...]] = []
        failures: list[tuple[Any, ...]] = []
        for b in batches:
            job, proc = b["job"], b["proc"]
            for trace, span, parent, name, kind, endpoint, actor, start, end, error in b["spans"]:
                spans.append(
                    (
                        job,
                        _hex(trace, 32),
                        _hex(span, 16),
                        _hex(parent, 16),
                        name,
                        kind,
                        endpoint,
                        actor,
                        proc,
                        start / 1e9,
                        end / 1e9,
                        (end - start) / 1e6,
                        "error" if error is not None else "ok",
                        error,
                    )
                )
            t, interval = b["t"], b["interval_s"]
            points.extend((job, proc, t, interval, *p) for p in b["points"])
            failures.extend((job, proc, *f) for f in b["failures"])
        try:
            with self._conn:
                self._conn.executemany(
                    "INSERT INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", spans
                )
                self._conn.executemany(
                    "INSERT INTO metrics VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", points
                )
                self._conn.executemany("INSERT INTO failures VALUES (?,?,?,?,?,?)", failures)
        except sqlite3.Error as exc:
            log.warning(
                "telemetry: %d batches not recorded in %s: %s", len(batches), self.path, exc
            )

    def sweep(self) -> None:
        """Delete rows past the retention age and the oldest past the row limit."""
        cutoff = time.time() - self._retention
        try:
            with self._conn:
                self._conn.execute("DELETE FROM spans WHERE end_time < ?", (cutoff,))
                self._conn.execute("DELETE FROM metrics WHERE t < ?", (cutoff,))
                self._conn.execute("DELETE FROM failures WHERE t < ?", (cutoff,))
                for table in TABLES:
                    self._conn.execute(
                        f"DELETE FROM {table} WHERE rowid <= (SELECT MAX(rowid) FROM {table}) - ?",
                        (self._max_rows,),
                    )
        except sqlite3.Error as exc:
            log.warning("telemetry: sweeping %s failed: %s", self.path, exc)


def run_sql(
    sql: str, path: Path | None = None, parameters: tuple[Any, ...] = ()
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only statement on the recorder's file: its column names and rows."""
    conn = connect(path if path is not None else database_path(), readonly=True)
    try:
        cursor = conn.execute(sql, parameters)
        columns = [d[0] for d in cursor.description or ()]
        return columns, cursor.fetchall()
    finally:
        conn.close()
