"""Telemetry: spans and metrics of every call, kept in a local SQL recorder, exported over OTLP.

Switch it on with ``job.enable_telemetry()`` (Monarch's switch), :func:`enable_telemetry` at
any time, ``regency.config.configure(telemetry=True)`` before the first use of the actor API,
or ``REGENCY_TELEMETRY=1``; the controller's procs on every host follow its setting. Off, the
runtime pays one check per message. See ``docs/introspection.md`` for the spans, metrics,
tables and the ``regency telemetry sql`` command.

Monarch's ``span``, ``traced`` and ``get_meter`` (exported by ``regency.actor``) live here.
"""

from regency._public import publish
from regency.observe.telemetry.meter import get_meter
from regency.observe.telemetry.recorder import database_path, run_sql
from regency.observe.telemetry.spans import span, traced
from regency.observe.telemetry.switch import (
    disable_telemetry,
    enable_telemetry,
    flush,
    query_engine,
    query_engine_client,
    running,
)

__all__ = [
    "database_path",
    "disable_telemetry",
    "enable_telemetry",
    "flush",
    "get_meter",
    "query_engine",
    "query_engine_client",
    "run_sql",
    "running",
    "span",
    "traced",
]

publish(__name__, globals())
