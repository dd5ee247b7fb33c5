"""Telemetry: spans and metrics of calls, in a local recorder, over OTLP, and SQL over the job.

Spans and metrics of every call go to a local SQL recorder and, when asked, over OTLP; every
host keeps Monarch's tables of the job (actors, meshes, messages, ...), which
:func:`query_engine_client` queries together with SQL.

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
