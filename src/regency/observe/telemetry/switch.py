"""Switching telemetry on and off in this process, and in the controller's procs.

The runtime reaches this module through ``regency._hooks`` (its ``telemetry`` hook): it calls
:func:`follow` as a process starts with the ``telemetry`` setting on, when a proc is told to
by its controller (``SetTelemetry``), and as a process stops (to send what is left).

In every process telemetry is the runtime's probe plus a :class:`~.collector.Collector`. In the
controller (the root) the collector's batches, and those its procs send to its
``SERVICE_TELEMETRY``, go to the :class:`~.recorder.Recorder` and, when the environment asks,
to OTLP export; in a proc they go to the controller.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from regency import config
from regency._config_keys import (
    ENABLE_OTEL_TRACING,
    TELEMETRY_MAX_ROWS,
    TELEMETRY_RETENTION,
    TELEMETRY_TRACES_PER_S,
)
from regency._lowlevel import (
    SERVICE_PROC,
    SERVICE_TELEMETRY,
    SERVICE_TELEMETRY_ROWS,
    PeerLostError,
    Service,
    SetTelemetry,
    current_client,
    host_agent_address,
    live_proc_addresses,
    mesh_tree,
    root_address,
    runtime,
    tracing,
)
from regency.observe.telemetry import hoststore, otlp
from regency.observe.telemetry.client import QueryEngineClient
from regency.observe.telemetry.collector import Batch, Collector, identity
from regency.observe.telemetry.engine import QueryEngine
from regency.observe.telemetry.recorder import Recorder
from regency.observe.telemetry.rows import RowStore
from regency.observe.telemetry.snapshot import PeriodicSnapshots

log = logging.getLogger("regency.telemetry")

# What a proc is told when its controller switches telemetry (besides ``telemetry`` itself).
_FOLLOWED = (
    "telemetry_traces_per_s",
    "enable_otel_tracing",
    "enable_otel_metrics",
    "otel_metric_export_interval",
)


class _Sink:
    """The controller's end: records each batch, and exports it over OTLP when asked to.

    Its own table rows go to its own host store (it is the host agent of its machine), and
    the host agents its batches name are the hosts its query engine asks.
    """

    def __init__(self, job: str) -> None:
        self.job = job
        self.recorder = Recorder()
        self.otlp = otlp.OtlpExport() if otlp.wanted() else None

    def ingest(self, batch: Batch) -> None:
        rows = batch.pop("rows", None)
        if rows:
            _local_store(self.job).add(rows)
        for host in batch.pop("hosts", ()):
            _hosts.add(host)
        self.recorder.ingest(batch)
        if self.otlp is not None:
            self.otlp.export(batch)

    def stop(self) -> None:
        self.recorder.stop()
        if self.otlp is not None:
            self.otlp.stop()


class _Flushed:
    """Posted behind the procs' batches in the telemetry service: set once they are through."""

    def __init__(self) -> None:
        self.done = threading.Event()


_lock = threading.RLock()
_collector: Collector | None = None
_sink: _Sink | None = None
_service_added = False
_hosts: set[str] = set()  # the host agents this controller attached (they keep rows)
_root_recorded = False


def query_engine_client() -> QueryEngineClient:
    """``JobState.query_engine_client``: SQL over this controller's job.

    Its py-spy dumps are kept in the controller's own host's tables.
    """
    return QueryEngineClient(query_engine(), _local_store(runtime().job_id))


def _bounds() -> tuple[int, float]:
    """The bounds of a host's store: rows per table, retention in seconds."""
    return config.value(TELEMETRY_MAX_ROWS), config.value(TELEMETRY_RETENTION)


def _local_store(job: str) -> RowStore:
    return hoststore.store(job, *_bounds())


def serve_rows(rt: Any) -> None:
    """Keep this host's rows of the job's tables (a worker daemon, as it starts)."""
    hoststore.serve(rt)


def query_engine() -> QueryEngine:
    """The query engine over this controller's job: its own rows and every attached host's.

    Raises ``RuntimeError`` outside the controller.
    """
    rt = runtime()
    if root_address() != rt.address:
        raise RuntimeError("the job's telemetry is queried from its controller")
    job = rt.job_id
    return QueryEngine(job, lambda tables: _local_store(job).scan(tables), lambda: sorted(_hosts))


def start_snapshots(interval: float) -> PeriodicSnapshots:
    """Capture this controller's tree into the snapshot tables every ``interval`` seconds.

    Captures are kept while telemetry is on, until the returned object's ``stop()``.
    """
    job = runtime().job_id
    return PeriodicSnapshots(
        interval,
        lambda: mesh_tree() if running() else None,
        lambda rows: _local_store(job).add(rows),
    )


def running() -> bool:
    """Whether telemetry is on in this process."""
    return _collector is not None


def sink() -> _Sink | None:
    """The controller's sink while telemetry is on there."""
    return _sink


def follow(on: bool) -> None:
    """Start (``on``) or stop this process's telemetry; stopping sends what is left."""
    with _lock:
        if on and _collector is None:
            _start()
        elif not on and _collector is not None:
            _stop()


def _start() -> None:
    global _collector, _sink, _service_added
    rt = runtime()
    probe = tracing.Probe(config.value(TELEMETRY_TRACES_PER_S), config.value(ENABLE_OTEL_TRACING))
    if root_address() == rt.address:
        _sink = _Sink(rt.job_id)
        if not _service_added:
            rt.add_service(SERVICE_TELEMETRY, Service("regency-telemetry-in", _from_proc))
            _service_added = True
        hoststore.serve(rt)  # the controller is its own machine's host agent
        collector = Collector(probe, _sink.ingest, identity(rt.address, rt.job_id))
        _record_root(probe, rt.address)
    else:
        collector = Collector(probe, _to_root, identity(rt.address, rt.job_id))
    _collector = collector
    tracing.install(probe)
    collector.start()


def _record_root(probe: tracing.Probe, address: str) -> None:
    """Record the client once, as Monarch does: actor ``<root>``, ``Created`` then ``Client``."""
    global _root_recorded
    client = current_client()
    if _root_recorded or client is None:
        return
    _root_recorded = True
    # Its uid, the sender its sends and status events name.
    probe.actor(client.uid, tracing.entity_id(f"client:{address}"), 0, f"{address},client[0]",
                "<root>")  # fmt: skip
    probe.status(client.uid, "Created")
    probe.status(client.uid, "Client")


def _stop() -> None:
    global _collector, _sink
    tracing.install(None)
    collector, _collector = _collector, None
    if collector is not None:
        collector.stop()
    sink, _sink = _sink, None
    if sink is not None:
        flushed = _Flushed()  # the procs' batches that arrived before now are written too
        runtime().post_service(SERVICE_TELEMETRY, flushed)
        flushed.done.wait(10)
        sink.stop()


def _from_proc(request: Any) -> None:
    """A proc's batch (or our own flush marker), on the telemetry service's thread."""
    if isinstance(request, _Flushed):
        request.done.set()
        return
    sink = _sink
    if sink is not None and isinstance(request, dict):
        sink.ingest(request)


def _to_root(batch: Batch) -> None:
    """A proc's batch: its table rows to its host agent, the rest to the controller."""
    rt = runtime()
    rows = batch.pop("rows", None)
    if rows:
        max_rows, retention = _bounds()
        try:
            rt.send_control(
                host_agent_address(),
                SERVICE_TELEMETRY_ROWS,
                hoststore.AddRows(rt.job_id, rows, max_rows, retention),
            )
        except PeerLostError as exc:
            log.debug("telemetry rows dropped: the host agent is gone (%s)", exc)
    if not (batch["spans"] or batch["points"] or batch["failures"] or batch.get("hosts")):
        return
    try:  # the hosts it spawned procs on go too: the controller's queries ask them
        rt.send_control(root_address(), SERVICE_TELEMETRY, batch)
    except PeerLostError as exc:
        log.debug("telemetry batch dropped: the controller is gone (%s)", exc)


def _push_to_procs(on: bool) -> None:
    """Tell every live proc of this controller to follow its setting."""
    settings: dict[str, object] = {key: config.get(key) for key in _FOLLOWED}
    settings["telemetry"] = on
    rt = runtime()
    for addr in live_proc_addresses():
        with contextlib.suppress(PeerLostError):
            rt.send_control(addr, SERVICE_PROC, SetTelemetry(on, settings))


def flush(timeout: float = 10.0) -> None:
    """Record what this process has collected so far, now rather than within the interval.

    In the controller, wait until it is written. Procs' batches come on their own.
    """
    collector, sink = _collector, _sink
    if collector is not None:
        collector.flush()
    if sink is not None:
        sink.recorder.barrier(timeout)


def enable_telemetry() -> None:
    """Switch telemetry on in this controller and in every proc it runs, now and later."""
    config.configure(telemetry=True)
    follow(True)
    _push_to_procs(True)


def disable_telemetry() -> None:
    """Switch telemetry off here and in the procs; what was recorded stays in the database."""
    if running():
        _push_to_procs(False)
    config.configure(telemetry=False)
    follow(False)
