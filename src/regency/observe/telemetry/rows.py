"""One host's rows of the job's telemetry tables, in memory and bounded.

Each table keeps at most ``max_rows`` rows (the oldest go first) and, except the entity tables
(actors, meshes), only rows younger than ``retention_s`` seconds (0: no age limit), so a host's
memory stays bounded however long the job runs. Rows outlive the procs that made them: they
are kept by the host, so queries still see a mesh that stopped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping

from regency.observe.telemetry.schema import ENTITY_TABLES, TABLES, check_row

Row = tuple[object, ...]


class RowStore:
    """The rows of every table, each with the time it was added (for retention)."""

    def __init__(self, max_rows: int, retention_s: float) -> None:
        if max_rows <= 0:
            raise ValueError(f"max_rows must be positive, got {max_rows!r}")
        self.max_rows = max_rows
        self.retention_s = max(0.0, retention_s)
        self._lock = threading.Lock()
        self._tables: dict[str, deque[tuple[float, Row]]] = {
            name: deque(maxlen=max_rows) for name in TABLES
        }

    def add(self, rows: Mapping[str, Iterable[Row]]) -> None:
        """Add rows by table name; a row that does not fit its table raises ``ValueError``."""
        now = time.monotonic()
        checked = {table: list(table_rows) for table, table_rows in rows.items()}
        for table, table_rows in checked.items():
            for row in table_rows:
                check_row(table, row)
        with self._lock:
            for table, table_rows in checked.items():
                self._tables[table].extend((now, row) for row in table_rows)

    def scan(self, tables: Iterable[str]) -> dict[str, list[Row]]:
        """The live rows of ``tables`` (unknown names are left out), after retention."""
        self.expire()
        with self._lock:
            return {
                name: [row for _, row in self._tables[name]] for name in tables if name in TABLES
            }

    def expire(self) -> None:
        """Drop the rows older than the retention period (none from the entity tables)."""
        if not self.retention_s:
            return
        cutoff = time.monotonic() - self.retention_s
        with self._lock:
            for name, rows in self._tables.items():
                if name in ENTITY_TABLES:
                    continue
                while rows and rows[0][0] < cutoff:
                    rows.popleft()

    def counts(self) -> dict[str, int]:
        """How many rows each table holds."""
        with self._lock:
            return {name: len(rows) for name, rows in self._tables.items()}
