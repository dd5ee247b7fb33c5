"""``JobState.query_engine_client``: Monarch's handle to the job's telemetry SQL.

``query(sql)`` answers ``{"columns": [...], "rows": [{column: value}, ...]}`` over every host's
rows (see :mod:`.engine`); ``store_pyspy_dump`` keeps a py-spy dump (py-spy's JSON result,
``{"Ok": {...}}``) in the ``pyspy_*`` tables of the controller's host.
"""

from __future__ import annotations

import json
import time
from typing import Any

from regency.observe.telemetry.engine import QueryEngine
from regency.observe.telemetry.rows import Row, RowStore


class QueryEngineClient:
    """Runs SQL over the job's telemetry tables from the controller (Monarch's name)."""

    def __init__(self, engine: QueryEngine, store: RowStore) -> None:
        self._engine = engine
        self._store = store

    def query(self, sql: str, timeout: float | None = None) -> dict[str, Any]:
        """Run ``sql``: ``{"columns": names, "rows": [dict per row]}``.

        ``timeout`` bounds the wait for each host's rows (default: the engine's). A query the
        engine refuses raises :class:`~regency.observe.telemetry.engine.QueryError`.
        """
        columns, rows = self._engine.query(sql, timeout)
        return {"columns": columns, "rows": [dict(zip(columns, row, strict=True)) for row in rows]}

    def store_pyspy_dump(
        self, dump_id: str, proc_ref: str, pyspy_result_json: str
    ) -> dict[str, Any]:
        """Keep a py-spy dump of the proc ``proc_ref`` as ``dump_id``: ``{"status": "ok"}``.

        Raises ``ValueError`` for text that is not py-spy's JSON result.
        """
        if not isinstance(dump_id, str) or not dump_id:
            raise ValueError("store_pyspy_dump needs a non-empty dump_id")
        self._store.add(pyspy_rows(dump_id, proc_ref, pyspy_result_json))
        return {"status": "ok", "dump_id": dump_id}


def pyspy_rows(dump_id: str, proc_ref: str, text: str) -> dict[str, list[Row]]:
    """The ``pyspy_*`` table rows of one py-spy JSON result (``{"Ok": dump}``)."""
    try:
        result = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a py-spy dump must be JSON text: {exc}") from None
    if not isinstance(result, dict) or not isinstance(result.get("Ok"), dict):
        raise ValueError(f"a py-spy dump is py-spy's result {{'Ok': {{...}}}}, got {text[:80]!r}")
    dump = result["Ok"]
    pid = int(dump.get("pid", 0))
    rows: dict[str, list[Row]] = {
        "pyspy_dumps": [
            (dump_id, time.time_ns() // 1000, pid, str(dump.get("binary", "")), proc_ref)
        ],
        "pyspy_stack_traces": [],
        "pyspy_frames": [],
        "pyspy_local_variables": [],
    }
    for trace in dump.get("stack_traces") or ():
        thread = int(trace.get("thread_id", 0))
        rows["pyspy_stack_traces"].append(
            (
                dump_id,
                int(trace.get("pid", pid)),
                thread,
                trace.get("thread_name"),
                trace.get("os_thread_id"),
                bool(trace.get("active")),
                bool(trace.get("owns_gil")),
            )
        )
        for depth, frame in enumerate(trace.get("frames") or ()):
            rows["pyspy_frames"].append(
                (
                    dump_id,
                    thread,
                    depth,
                    str(frame.get("name", "")),
                    str(frame.get("filename", "")),
                    frame.get("module"),
                    frame.get("short_filename"),
                    int(frame.get("line", 0)),
                    bool(frame.get("is_entry")),
                )
            )
            for local in frame.get("locals") or ():
                rows["pyspy_local_variables"].append(
                    (
                        dump_id,
                        thread,
                        depth,
                        str(local.get("name", "")),
                        int(local.get("addr", 0)),
                        bool(local.get("arg")),
                        local.get("repr"),
                    )
                )
    return rows
