"""OTLP export: a controller started with REGENCY_TELEMETRY=1 and OTEL_EXPORTER_OTLP_ENDPOINT
sends its spans and metrics, and its procs', to a real OTLP/HTTP receiver run by the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.proto")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    from regency.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    echo = procs.spawn("otlp", Echo)
    assert list(echo.echo.call(7).get().values()) == [7, 7]
    procs.stop().get()
    print("done", flush=True)
    """
)


class Receiver:
    """An OTLP/HTTP receiver: decodes what arrives at /v1/traces and /v1/metrics."""

    def __init__(self) -> None:
        self.traces: list[Any] = []
        self.metrics: list[Any] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                assert self.headers["Content-Type"] == "application/x-protobuf"
                if self.path == "/v1/traces":
                    receiver.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def _attributes(resource: Any) -> dict[str, Any]:
    return {a.key: a.value.string_value or a.value.int_value for a in resource.attributes}


def test_spans_and_metrics_reach_an_otlp_receiver(receiver: Receiver, tmp_path: Path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(SCRIPT)
    env = {
        **__import__("os").environ,
        "REGENCY_TELEMETRY": "1",
        "REGENCY_TELEMETRY_DB": str(tmp_path / "t.db"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "otlp-test",
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
    # Exported before the controller's exit returned: nothing to wait for.
    spans = [
        (span, _attributes(rs.resource))
        for request in receiver.traces
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    by_name: dict[str, list[Any]] = {}
    for span, resource in spans:
        by_name.setdefault(span.name, []).append((span, resource))
    assert "call otlp.echo" in by_name, done.stderr
    ((call, call_resource),) = by_name["call otlp.echo"]
    ((send, _),) = by_name["send otlp.echo"]
    assert call_resource["service.name"] == "otlp-test"
    assert call.parent_span_id == b""
    assert send.parent_span_id == call.span_id
    handles = by_name["handle otlp.echo"]
    assert len(handles) == 2
    delivers = {span.span_id: (span, res) for span, res in by_name["deliver otlp.echo"]}
    procs = set()
    for handle, resource in handles:
        assert handle.trace_id == call.trace_id
        deliver, deliver_resource = delivers[handle.parent_span_id]
        assert deliver.parent_span_id == send.span_id  # a link across processes
        assert resource["regency.proc"] == deliver_resource["regency.proc"]
        assert resource["regency.proc"] != call_resource["regency.proc"]
        procs.add(resource["regency.proc"])
    assert len(procs) == 2
    metrics = {
        metric.name: metric
        for request in receiver.metrics
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    duration = metrics["regency.call.duration"]
    assert duration.unit == "ms"
    point = duration.histogram.data_points[0]
    assert point.count == 1
    assert {a.key: a.value.string_value for a in point.attributes}["regency.endpoint"] == (
        "otlp.echo"
    )
    assert metrics["regency.messages.handled"].sum.data_points[0].as_double >= 1
