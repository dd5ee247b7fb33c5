"""OTLP export of the controller's telemetry, through the OpenTelemetry SDK's exporters.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces or metrics variant) is set as telemetry
starts in the controller; the SDK's exporters read the standard ``OTEL_EXPORTER_OTLP_*``
variables (endpoint, headers, timeout, compression). Protocol: OTLP/HTTP with protobuf. Every
batch the controller records (its own and its procs') goes out as well: its spans as SDK
spans through a ``BatchSpanProcessor``, its metric points as SDK ``MetricsData`` (delta sums,
gauges and explicit-bucket histograms over :data:`~.aggregate.BOUNDS_MS`). Each span and point
carries the resource of the process it came from (``service.name``, ``process.pid``,
``host.name``, ``regency.proc``, ``regency.job``). Sending happens on a thread of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from typing import Any

from regency.observe.telemetry.aggregate import BOUNDS_MS, COUNTER, GAUGE, HISTOGRAM

log = logging.getLogger("regency.telemetry")

_ENDPOINT_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
_UNITS = {"regency.messages.bytes": "By", "regency.mailbox.depth": "{message}"}


def wanted() -> bool:
    """Whether the environment asks for OTLP export."""
    return any(os.environ.get(name) for name in _ENDPOINT_VARIABLES)


class OtlpExport:
    """Sends batches to an OTLP/HTTP receiver from a thread of its own."""

    def __init__(self) -> None:
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        if protocol != "http/protobuf":
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: regency exports OTLP over HTTP "
                "with protobuf only (http/protobuf)"
            )
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ImportError(
                f"OTLP export needs the OpenTelemetry SDK and its OTLP/HTTP exporter ({exc}): "
                "pip install 'regency[telemetry]'"
            ) from exc
        from opentelemetry.sdk.resources import Resource

        # Made now: Resource.create runs its detectors on a thread pool, which is refused once
        # the interpreter is exiting (the last batches are sent from an exit hook).
        self._base = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "regency")}
        )
        self._spans = BatchSpanProcessor(OTLPSpanExporter())
        self._metrics = OTLPMetricExporter()
        self._resources: dict[tuple[str, str], Any] = {}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="regency-otlp", daemon=True)
        self._thread.start()

    def export(self, batch: dict[str, Any]) -> None:
        """Queue a batch for sending (any thread)."""
        self._queue.put(batch)

    def stop(self) -> None:
        """Send what is queued, then shut the exporters down."""
        self._queue.put(None)
        self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self._spans.shutdown()  # type: ignore[no-untyped-call]
        with contextlib.suppress(Exception):
            self._metrics.shutdown()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._send(batch)
            except Exception:
                log.exception("telemetry: OTLP export of a batch failed")

    def _resource(self, batch: dict[str, Any]) -> Any:
        from opentelemetry.sdk.resources import Resource

        key = (batch["job"], batch["proc"])
        resource = self._resources.get(key)
        if resource is None:
            resource = self._resources[key] = self._base.merge(
                Resource(
                    {
                        "process.pid": batch["pid"],
                        "host.name": batch["host"],
                        "regency.proc": batch["proc"],
                        "regency.job": batch["job"],
                    }
                )
            )
        return resource

    def _send(self, batch: dict[str, Any]) -> None:
        resource = self._resource(batch)
        scope = _scope()
        for row in batch["spans"]:
            self._spans.on_end(_span(row, resource, scope))
        if batch["points"]:
            data = _metrics_data(batch, resource, scope)
            self._metrics.export(data)


def _scope() -> Any:
    from importlib import metadata

    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    try:
        version: str | None = metadata.version("regency")
    except metadata.PackageNotFoundError:
        version = None
    return InstrumentationScope("regency", version)


_KINDS = {
    "call": "CLIENT",
    "send": "PRODUCER",
    "deliver": "CONSUMER",
    "handle": "SERVER",
}


def _span(row: tuple[Any, ...], resource: Any, scope: Any) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    trace_id, span_id, parent, name, kind, endpoint, actor, start, end, error = row
    flags = TraceFlags(TraceFlags.SAMPLED)
    attributes: dict[str, str] = {"regency.kind": kind}
    if endpoint is not None:
        attributes["regency.endpoint"] = endpoint
    if actor is not None:
        attributes["regency.actor"] = actor
    status = Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET)
    # ReadableSpan is the SDK's finished span, what span processors and exporters take: ours
    # are finished already (their times were taken on the hot path).
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags),
        parent=SpanContext(trace_id, parent, is_remote=True, trace_flags=flags) if parent else None,
        resource=resource,
        attributes=attributes,
        kind=getattr(SpanKind, _KINDS.get(kind, "INTERNAL")),
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


def _metrics_data(batch: dict[str, Any], resource: Any, scope: Any) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )

    start = int(batch["t"] * 1e9)
    end = int((batch["t"] + batch["interval_s"]) * 1e9)
    delta = AggregationTemporality.DELTA
    by_name: dict[tuple[str, str], list[Any]] = {}
    for name, kind, endpoint, attributes_json, value, count, total, low, high, buckets in batch[
        "points"
    ]:
        attributes = json.loads(attributes_json) if attributes_json else {}
        if endpoint is not None:
            attributes["regency.endpoint"] = endpoint
        if kind == HISTOGRAM:
            point: Any = HistogramDataPoint(
                attributes=attributes,
                start_time_unix_nano=start,
                time_unix_nano=end,
                count=count,
                sum=total,
                bucket_counts=json.loads(buckets),
                explicit_bounds=BOUNDS_MS,
                min=low,
                max=high,
            )
        else:
            point = NumberDataPoint(
                attributes=attributes,
                start_time_unix_nano=start,
                time_unix_nano=end,
                value=value,
            )
        by_name.setdefault((name, kind), []).append(point)
    metrics = []
    for (name, kind), points in by_name.items():
        data: Any
        if kind == HISTOGRAM:
            data = Histogram(data_points=points, aggregation_temporality=delta)
        elif kind == GAUGE:
            data = Gauge(data_points=points)
        else:
            data = Sum(
                data_points=points, aggregation_temporality=delta, is_monotonic=kind == COUNTER
            )
        unit = "ms" if kind == HISTOGRAM and name.startswith("regency.") else _UNITS.get(name)
        metrics.append(Metric(name=name, description=None, unit=unit, data=data))
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
                schema_url="",
            )
        ]
    )
