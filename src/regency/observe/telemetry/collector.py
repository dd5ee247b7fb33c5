"""Each process's collector: turns the probe's records into spans, metric points and failures.

A thread wakes every ``otel_metric_export_interval`` (Monarch's key, 1 s by default), drains
the records the runtime's hooks appended (``_lowlevel.tracing``), and hands one batch to its
sink: the controller's recorder, or (in a proc) a control message to the controller. So the
hot path only appends tuples; ids, names, histograms and spans are made here.

A batch is a plain dict (it crosses processes pickled): ``job``, ``proc`` (the process's
address), ``pid``, ``host``, ``t`` and ``interval_s`` (the interval its points cover),
``spans`` (rows, ids as ints), ``points`` (:data:`~.aggregate.Point`), ``failures``
(``(time, ref, kind, text)``), ``rows`` (the job's table rows, by table: they go to this
process's host agent, see :mod:`.hoststore`) and ``hosts`` (host agents attached, in the
controller).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from typing import Any

from regency import config
from regency._config_keys import ENABLE_OTEL_METRICS, OTEL_METRIC_EXPORT_INTERVAL
from regency._lowlevel import tracing
from regency.observe.telemetry.aggregate import GAUGE, HISTOGRAM, Aggregator, attributes_text
from regency.observe.telemetry.meter import METER_NAME
from regency.observe.telemetry.tablerows import TableRows

log = logging.getLogger("regency.telemetry")

Batch = dict[str, Any]
# A span row: trace id, span id, parent id (0: none), name, kind, endpoint, actor, start and end
# (ns since the epoch), error text (None: ok).
SpanRow = tuple[int, int, int, str, str, str | None, str | None, int, int, str | None]

# regency's own metrics.
SENT = "regency.messages.sent"
BYTES = "regency.messages.bytes"
HANDLED = "regency.messages.handled"
CALL_DURATION = "regency.call.duration"
CALL_ERRORS = "regency.call.errors"
HANDLE_DURATION = "regency.handle.duration"
ENDPOINT_ERRORS = "regency.endpoint.errors"
MAILBOX_DEPTH = "regency.mailbox.depth"
FAILURES = "regency.actor.failures"
RESTARTS = "regency.mesh.restarts"
# Monarch's name for what it counts too: messages posted to an actor's mailbox, by sender
# (``actor_id``) and receiver (``dest_actor_id``), the ids of the job's ``actors`` table.
MAILBOX_POSTS = "mailbox.posts"
OWN_SCOPE = "regency"

_MS = 1e-6  # ns -> ms
_TABLE_RECORDS = frozenset({tracing.ROW, tracing.RECEIVED, tracing.SENT})


class Collector:
    """Drains ``probe`` every interval into a batch for ``sink`` (on a thread of its own)."""

    def __init__(
        self, probe: tracing.Probe, sink: Callable[[Batch], None], identity: dict[str, Any]
    ) -> None:
        self._probe = probe
        self._sink = sink
        self._identity = identity
        self._metrics = config.value(ENABLE_OTEL_METRICS)
        # The resource attributes of its metric rows (OpenTelemetry's names).
        self._resource = {
            "service.name": "regency",
            **_sdk(),
            "host.name": identity.get("host"),
            "process.pid": identity.get("pid"),
        }
        self._interval = max(0.05, config.seconds(OTEL_METRIC_EXPORT_INTERVAL))
        self._since = time.time()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one drain at a time (the thread, or a final flush)
        self._names: dict[int, str] = {}  # id(actor core) -> its name, for this interval
        # (actor core, method) -> (handled, failed) as counted at the last flush
        self._seen: dict[tuple[Any, str], tuple[int, int]] = {}
        self._thread = threading.Thread(target=self._run, name="regency-telemetry", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and hand over what is left."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._probe.refill(self._interval)
            try:
                self.flush()
            except Exception:
                log.exception("telemetry: a batch was lost")

    def flush(self) -> None:
        """Drain the records now and hand them to the sink as one batch (if there are any)."""
        with self._lock:
            records = self._probe.records
            taken = [records.popleft() for _ in range(len(records))]
            now = time.time()
            since, self._since = self._since, now
            batch = self._convert(taken, since, now)
            if not (
                batch["spans"] or batch["points"] or batch["failures"] or batch["rows"]
                or batch["hosts"]
            ):  # fmt: skip
                return
        self._sink(batch)

    def _convert(self, records: list[tuple[Any, ...]], since: float, now: float) -> Batch:
        spans: list[SpanRow] = []
        failures: list[tuple[float, str, str, str]] = []
        agg = Aggregator()
        custom = Aggregator()  # get_meter()'s instruments
        posts: Counter[tuple[int, int]] = Counter()  # (sender uid, receiver uid) -> messages
        calls: list[tuple[Any, ...]] = []
        handled: list[tuple[Any, ...]] = []
        rows = TableRows()
        hosts: list[str] = []
        self._names.clear()
        for record in records:
            kind = record[0]
            if kind in _TABLE_RECORDS:
                rows.record(record)
                if kind == tracing.RECEIVED:
                    posts[(record[3], record[1].uid)] += 1
            elif kind == tracing.HOST:
                hosts.append(record[1])
            elif kind == tracing.CALL:
                calls.append(record)
            elif kind == tracing.HANDLED:
                handled.append(record)
            elif kind == tracing.SPAN:
                _, name, actor, trace_id, span_id, parent, start, end, error = record
                actor_name = self._name(actor)
                spans.append(
                    (trace_id, span_id, parent, name, "span", None, actor_name, start, end, error)
                )
                rows.user_span(name, span_id, parent, start, error)
            elif kind == tracing.FAILURE:
                _, actor, text, at = record
                failures.append((at / 1e9, actor, "failed", text))
                agg.add(FAILURES, None, 1)
            elif kind == tracing.RESTART:
                _, mesh, ranks, at = record
                failures.append((at / 1e9, mesh, "restarted", f"restarted ranks {list(ranks)}"))
                agg.add(RESTARTS, mesh, 1)
            elif kind == tracing.MEASURE:
                self._measure(record, custom)
        _calls(calls, agg, spans)
        self._handled(handled, agg, spans)
        _posts(posts, agg)
        own = agg.points() if self._metrics else []
        theirs = custom.points() if self._metrics else []
        rows.points(own, since, now, self._resource, OWN_SCOPE)
        rows.points(theirs, since, now, self._resource, METER_NAME)
        points = own + theirs
        return {
            **self._identity,
            "t": since,
            "interval_s": now - since,
            "spans": spans,
            "points": points,
            "failures": failures,
            "rows": rows.rows,
            "hosts": hosts,
        }

    @staticmethod
    def _measure(record: tuple[Any, ...], agg: Aggregator) -> None:
        _, name, instrument, value, attributes, _ = record
        attrs = attributes_text(attributes)
        if instrument == HISTOGRAM:
            agg.record(name, None, value, attrs)
        elif instrument == GAUGE:
            agg.gauge(name, None, value, attrs, last=True)
        else:
            agg.add(name, None, value, attrs, instrument)

    def _name(self, actor: Any) -> str | None:
        if actor is None:
            return None
        name = self._names.get(id(actor))
        if name is None:
            name = self._names[id(actor)] = str(actor)
        return name

    def _handled(
        self, records: list[tuple[Any, ...]], agg: Aggregator, spans: list[SpanRow]
    ) -> None:
        """Metrics of the messages handled here: counts of all, times and spans of the traced."""
        for core, per in list(self._probe.counts.items()):
            for method, (count, failed) in list(per.items()):
                seen = self._seen.get((core, method), (0, 0))
                if count != seen[0]:
                    name = f"{core.name}.{method}"
                    agg.add(HANDLED, name, count - seen[0], times=count - seen[0])
                    if failed != seen[1]:
                        agg.add(ENDPOINT_ERRORS, name, failed - seen[1], times=failed - seen[1])
                    self._seen[(core, method)] = (count, failed)
            if core.stopped or core.failed is not None:  # it handles nothing more
                self._probe.counts.pop(core, None)
                for method in per:
                    self._seen.pop((core, method), None)
        # (actor, method) -> [handler times in ns, deepest mailbox], of traced messages
        per_traced: dict[tuple[Any, str], list[Any]] = {}
        for _, core, method, trace, start, settle, end, depth, error in records:
            entry = per_traced.get((core, method))
            if entry is None:
                entry = per_traced[(core, method)] = [[], 0]
            entry[0].append(settle - start)
            entry[1] = max(entry[1], depth)
            name = f"{core.name}.{method}"
            _handle_spans(name, self._name(core), trace, start, settle, end, error, spans)
        for (core, method), (times, depth) in per_traced.items():
            name = f"{core.name}.{method}"
            agg.record_many(HANDLE_DURATION, name, [t * _MS for t in times])
            agg.gauge(MAILBOX_DEPTH, name, depth, attributes_text({"actor": self._name(core)}))


def _posts(posts: Counter[tuple[int, int]], agg: Aggregator) -> None:
    """``mailbox.posts``: the messages each receiver here took from each sender."""
    for (sender, receiver), count in posts.items():
        attributes: dict[str, int] = {"dest_actor_id": receiver & tracing.ID_MASK}
        if sender:  # 0: not sent by an actor
            attributes["actor_id"] = sender & tracing.ID_MASK
        agg.add(MAILBOX_POSTS, None, count, attributes_text(attributes), times=count)


@functools.cache
def _sdk() -> dict[str, str]:
    """OpenTelemetry's ``telemetry.sdk.*`` resource attributes, with its installed version.

    Its API records the user's metrics (``get_meter()``) and its SDK exports over OTLP.
    """
    found = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry"}
    for package in ("opentelemetry-sdk", "opentelemetry-api"):
        try:
            found["telemetry.sdk.version"] = metadata.version(package)
            break
        except metadata.PackageNotFoundError:
            continue
    return found


def _calls(records: list[tuple[Any, ...]], agg: Aggregator, spans: list[SpanRow]) -> None:
    # endpoint -> [messages, bytes, call times in ns, failed calls]
    per: dict[str, list[Any]] = {}
    for _, name, start, sent, end, ndest, nbytes, error, trace in records:
        entry = per.get(name)
        if entry is None:
            entry = per[name] = [0, 0, [], 0]
        entry[0] += 1
        entry[1] += nbytes * ndest
        if end:  # a call's reply came (0: a cast)
            entry[2].append(end - start)
            if error:
                entry[3] += 1
        if trace is not None:
            trace_id, call_id, send_id, parent = trace
            status = "the call failed" if error else None
            spans.append(
                (trace_id, call_id, parent, f"call {name}", "call", name, None, start,
                 end or sent, status)
            )  # fmt: skip
            spans.append(
                (trace_id, send_id, call_id, f"send {name}", "send", name, None, start, sent, None)
            )
    for name, (count, nbytes, times, errors) in per.items():
        agg.add(SENT, name, count, times=count)
        agg.add(BYTES, name, nbytes, times=count)
        agg.record_many(CALL_DURATION, name, [t * _MS for t in times])
        if errors:
            agg.add(CALL_ERRORS, name, errors, times=errors)


def _handle_spans(
    name: str,
    actor: str | None,
    trace: tuple[int, int, int, int],
    start: int,
    settle: int,
    end: int,
    error: str | None,
    spans: list[SpanRow],
) -> None:
    """A traced message's deliver, handle and reply spans."""
    trace_id, send_id, sent, handle_id = trace
    deliver_id = tracing.new_span_id()
    spans.append(
        (
            trace_id,
            deliver_id,
            send_id,
            f"deliver {name}",
            "deliver",
            name,
            actor,
            sent,
            start,
            None,
        )
    )
    spans.append(
        (
            trace_id,
            handle_id,
            deliver_id,
            f"handle {name}",
            "handle",
            name,
            actor,
            start,
            end,
            error,
        )
    )
    spans.append(
        (trace_id, tracing.new_span_id(), handle_id, f"reply {name}", "reply", name, actor,
         settle, end, None)
    )  # fmt: skip


def identity(address: str, job: str) -> dict[str, Any]:
    """What every batch of this process says about where it comes from."""
    return {"job": job, "proc": address, "pid": os.getpid(), "host": socket.gethostname()}
