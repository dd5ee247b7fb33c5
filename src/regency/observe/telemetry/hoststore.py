"""A host's share of the job's telemetry tables: the rows its procs made, kept by its host agent.

Every host agent (the worker daemon of a host; the controller for its own machine) serves
``SERVICE_TELEMETRY_ROWS``: procs send it their rows (:class:`AddRows`) every collector
interval, and the controller's query engine asks it for the rows of the tables a query reads
(:class:`ScanRows`, answered on a port). The rows stay when the procs that made them stop.
A worker daemon that serves several jobs in turn keeps the rows of the last few only.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NoReturn

from regency._lowlevel import SERVICE_TELEMETRY_ROWS, PeerLostError, PortRef, Service
from regency.observe.telemetry.rows import Row, RowStore

log = logging.getLogger("regency.telemetry")

_JOBS_KEPT = 4  # a worker daemon keeps the rows of this many jobs (the latest)


@dataclass(frozen=True, slots=True)
class AddRows:
    """Rows for the host's store of job ``job`` (by table), with the job's bounds."""

    job: str
    rows: dict[str, list[Row]]
    max_rows: int
    retention_s: float


@dataclass(frozen=True, slots=True)
class ScanRows:
    """Ask for the rows of ``tables`` of job ``job``.

    Answered on ``reply`` with a pickled ``{table: rows}`` (empty if the host has none).
    """

    job: str
    tables: tuple[str, ...]
    reply: PortRef


_lock = threading.Lock()
_stores: OrderedDict[str, RowStore] = OrderedDict()
_served: set[int] = set()  # id() of the runtimes serving the service


def store(job: str, max_rows: int, retention_s: float) -> RowStore:
    """The store of ``job`` in this process, made with these bounds if new.

    An existing store takes the latest retention; its row limit stays.
    """
    with _lock:
        found = _stores.get(job)
        if found is None:
            found = _stores[job] = RowStore(max_rows, retention_s)
            while len(_stores) > _JOBS_KEPT:
                _stores.popitem(last=False)
        else:
            found.retention_s = max(0.0, retention_s)
        return found


def existing(job: str) -> RowStore | None:
    """The store of ``job`` in this process, if it has one."""
    with _lock:
        return _stores.get(job)


def serve(rt: Any) -> None:
    """Serve ``SERVICE_TELEMETRY_ROWS`` on the runtime ``rt`` (once)."""
    with _lock:
        if id(rt) in _served:
            return
        _served.add(id(rt))
    rt.add_service(
        SERVICE_TELEMETRY_ROWS, Service("regency-telemetry-rows", lambda r: _handle(rt, r))
    )


RowsRequest = AddRows | ScanRows


def _handle(rt: Any, request: object) -> None:
    if isinstance(request, RowsRequest):
        _serve(rt, request)
    else:
        log.warning("telemetry rows service got an unknown request %r", type(request).__name__)


def _serve(rt: Any, request: RowsRequest) -> None:
    match request:
        case AddRows():
            try:
                store(request.job, request.max_rows, request.retention_s).add(request.rows)
            except ValueError as exc:
                log.warning("telemetry: rows refused: %s", exc)
        case ScanRows():
            found = existing(request.job)
            answer: dict[str, Any] = found.scan(request.tables) if found is not None else {}
            with contextlib.suppress(PeerLostError):
                rt.send_port(request.reply, 0, 0, [pickle.dumps(answer, protocol=5)])
        case _:
            _unhandled(request)


def _unhandled(request: NoReturn) -> NoReturn:
    """The last case of the exhaustive ``match``: mypy proves it unreachable."""
    raise AssertionError(f"unhandled request {request!r}")
