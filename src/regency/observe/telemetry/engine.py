"""SQL over the whole job's telemetry: the controller's query engine (Apache DataFusion).

A query is planned in two steps. First the tables it names are fetched from every host that
keeps rows (the controller's own store and, through ``SERVICE_TELEMETRY_ROWS``, each host
agent the job attached), all hosts at once, each given ``scan_timeout`` seconds: a host that
does not answer in time (gone, stuck) leaves its rows out instead of failing the query. Then
those rows become Arrow record batches of every table of :data:`~.schema.TABLES` in a fresh
DataFusion session (so ``information_schema`` lists them all, empty or not), and the query
runs there as a query only: DDL (``CREATE EXTERNAL TABLE``, which would read files), DML and
statements are refused, so a query reads the job's telemetry and nothing else. Each query has
its own session, so queries from several threads run side by side.

DataFusion (and pyarrow) come with the ``regency[telemetry]`` extra; without it a query raises
``RuntimeError`` saying so.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from regency._errors import RegencyError
from regency._lowlevel import SERVICE_TELEMETRY_ROWS, Part, PeerLostError, runtime
from regency.observe.telemetry.hoststore import ScanRows
from regency.observe.telemetry.rows import Row
from regency.observe.telemetry.schema import TABLES

SCAN_TIMEOUT_S = 10.0
"""How long a query waits for a host's rows by default."""

log = logging.getLogger("regency.telemetry")

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class QueryError(RegencyError, ValueError):
    """A query the engine refused (a syntax error, an unknown column, ...), with its message."""


def tables_named(sql: str) -> list[str]:
    """The job's tables that ``sql`` may read: each whose name appears in it as a word."""
    words = {w.lower() for w in _WORD.findall(sql)}
    return [name for name in TABLES if name in words]


class _Scan:
    """One host's answer to a :class:`ScanRows`, taken on the I/O thread."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.done = threading.Event()
        self.rows: dict[str, list[Row]] = {}
        self.port = -1

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        runtime().close_port(self.port, [self.host])
        try:
            answer = pickle.loads(parts[0])
        except Exception:  # a malformed answer counts as none
            answer = {}
        if isinstance(answer, dict):
            self.rows = {k: v for k, v in answer.items() if k in TABLES and isinstance(v, list)}
        self.done.set()

    def peer_lost(self, addr: str, reason: str) -> None:
        runtime().close_port(self.port)
        self.done.set()


def scan_hosts(
    job: str, hosts: Iterable[str], tables: Sequence[str], timeout: float
) -> list[dict[str, list[Row]]]:
    """The rows of ``tables`` from every host agent in ``hosts``, asked all at once.

    A host that does not answer within ``timeout`` seconds is left out.
    """
    rt = runtime()
    scans = []
    for host in hosts:
        scan = _Scan(host)
        ref = rt.open_port(scan)
        scan.port = ref.port
        try:
            rt.send_control(host, SERVICE_TELEMETRY_ROWS, ScanRows(job, tuple(tables), ref))
        except PeerLostError:
            rt.close_port(ref.port)
            continue
        rt.losses.watch(ref.port, [host])
        scans.append(scan)
    found = []
    for scan in scans:
        if scan.done.wait(timeout):
            found.append(scan.rows)
        else:
            rt.close_port(scan.port)
    return found


def _datafusion() -> tuple[Any, Any]:
    """The ``datafusion`` and ``pyarrow`` modules (optional: imported on the first query)."""
    try:
        return importlib.import_module("datafusion"), importlib.import_module("pyarrow")
    except ImportError:
        raise RuntimeError(
            "SQL over the job's telemetry needs DataFusion: pip install 'regency[telemetry]'"
        ) from None


_ARROW_TYPES = {
    "BIGINT": "int64",
    "INTEGER": "int32",
    "UBIGINT": "uint64",
    "DOUBLE": "float64",
    "BOOLEAN": "bool_",
    "VARCHAR": "string",
}


def run(sql: str, parts: Iterable[dict[str, list[Row]]]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` over the union of ``parts`` (each a host's rows by table).

    Returns the column names and rows of its result; raises :class:`QueryError` for a query
    DataFusion refuses (statements that are not queries included).
    """
    datafusion, pa = _datafusion()
    merged: dict[str, list[Row]] = {}
    for part in parts:
        for table, rows in part.items():
            merged.setdefault(table, []).extend(rows)
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_information_schema(True))
    for table, columns in TABLES.items():
        schema = pa.schema([(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in columns])
        loaded = [row for row in merged.get(table, []) if len(row) == len(columns)]
        try:
            batch = _batch(pa, schema, loaded)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            # A row whose values do not fit the columns (a broken or hostile sender): keep the
            # rows that do rather than failing every query.
            good = [row for row in loaded if _fits(pa, schema, row)]
            log.warning(
                "telemetry: %d malformed rows of %s left out", len(loaded) - len(good), table
            )
            batch = _batch(pa, schema, good)
        ctx.register_record_batches(table, [[batch]])
    # A query reads the tables: no CREATE EXTERNAL TABLE (files), no INSERT, no SET.
    options = (
        datafusion.SQLOptions()
        .with_allow_ddl(False)
        .with_allow_dml(False)
        .with_allow_statements(False)
    )
    try:
        frame = ctx.sql_with_options(sql, options)
        result = pa.Table.from_batches(frame.collect(), schema=frame.schema())
    except Exception as exc:  # DataFusion's errors are plain ValueError/Exception
        raise QueryError(str(exc)) from None
    names = list(result.column_names)
    values = [column.to_pylist() for column in result.columns]
    return names, list(zip(*values, strict=True)) if values else []


def _batch(pa: Any, schema: Any, rows: list[Row]) -> Any:
    """``rows`` as one Arrow record batch of ``schema``."""
    data = [list(column) for column in zip(*rows, strict=True)] or [[] for _ in schema]
    arrays = [pa.array(values, type=field.type) for values, field in zip(data, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _fits(pa: Any, schema: Any, row: Row) -> bool:
    try:
        _batch(pa, schema, [row])
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return False
    return True


class QueryEngine:
    """The job's SQL engine in the controller: rows from its own store and every host's.

    ``local`` gives the controller's own rows of some tables; ``hosts`` the host agents to ask.
    """

    def __init__(
        self,
        job: str,
        local: Callable[[Sequence[str]], dict[str, list[Row]]],
        hosts: Callable[[], Iterable[str]],
        scan_timeout: float = SCAN_TIMEOUT_S,
    ) -> None:
        self.job = job
        self._local = local
        self._hosts = hosts
        self.scan_timeout = scan_timeout

    def query(
        self, sql: str, timeout: float | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one SQL statement over the whole job's tables: column names and rows.

        ``timeout``: how long to wait for each host's rows (default ``scan_timeout``).
        """
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError("a telemetry query needs SQL text")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"a query's timeout must be > 0 seconds, got {timeout!r}")
        tables = tables_named(sql)
        parts = [self._local(tables)]
        if tables:
            me = runtime().address
            hosts = [h for h in self._hosts() if h != me]
            wait = self.scan_timeout if timeout is None else timeout
            parts.extend(scan_hosts(self.job, hosts, tables, wait))
        return run(sql, parts)
