"""The job's table rows made from one collector interval's records (off the hot path).

The hooks append raw records (``tracing.ROW``, ``RECEIVED``, ``SENT``, user spans and metric
measurements); this turns them into rows of :data:`~.schema.TABLES`: a handled message into a
``messages`` row and its ``queued``/``active``/``complete`` (or ``failed``) status events, a
send into a ``sent_messages`` row with the view's region, a user span into a ``spans`` row, a
metric point into a ``metric_sums``/``metric_gauges``/``metric_histograms`` row.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable
from typing import Any

from regency._lowlevel import tracing
from regency.observe.telemetry.aggregate import BOUNDS_MS, COUNTER, GAUGE, HISTOGRAM, Point
from regency.observe.telemetry.rows import Row

_MASK = tracing.ID_MASK
_COMPACT = (",", ":")  # JSON columns are written as Monarch's (serde's) compact text
_bits = random.getrandbits


def _new_id() -> int:
    return _bits(63)


class TableRows:
    """Rows by table, filled from records."""

    def __init__(self) -> None:
        self.rows: dict[str, list[Row]] = {}

    def __bool__(self) -> bool:
        return any(self.rows.values())

    def _add(self, table: str, row: Row) -> None:
        self.rows.setdefault(table, []).append(row)

    def record(self, record: tuple[Any, ...]) -> None:
        """Take one ``ROW``, ``RECEIVED`` or ``SENT`` record."""
        kind = record[0]
        if kind == tracing.ROW:
            self._add(record[1], record[2])
        elif kind == tracing.RECEIVED:
            _, core, method, sender, started, ended, error = record
            message = _new_id()
            at = started // 1000
            self._add(
                "messages",
                (message, at, sender & _MASK, core.uid & _MASK, method, _port_index(method)),
            )
            self._add("message_status_events", (_new_id(), at, message, "queued"))
            self._add("message_status_events", (_new_id(), at, message, "active"))
            end = "failed" if error is not None else "complete"
            self._add("message_status_events", (_new_id(), ended // 1000, message, end))
        elif kind == tracing.SENT:
            _, sender, mesh_id, labels, offset, sizes, strides, at = record
            view = tracing.region_json(labels, offset, sizes, strides)
            self._add(
                "sent_messages",
                (_new_id(), at // 1000, sender & _MASK, mesh_id & _MASK, view, view),
            )

    def user_span(
        self, name: str, span_id: int, parent: int, start: int, error: str | None
    ) -> None:
        """A span the user opened (``span(name)``, ``@traced``), as Monarch names its rows."""
        fields: dict[str, Any] = {"name": name}
        if error is not None:
            fields["error"] = error
        self._add(
            "spans",
            (
                span_id & _MASK,
                "python_user_span",
                "regency.actor",
                "INFO",
                json.dumps(fields, separators=_COMPACT),
                start // 1000,
                (parent & _MASK) or None,
                None,
                None,
                None,
            ),
        )

    def points(
        self,
        points: Iterable[Point],
        since: float,
        now: float,
        resource: dict[str, Any],
        scope: str,
    ) -> None:
        """An interval's metric points (delta sums, last gauges, histograms) of ``scope``."""
        res = json.dumps(resource, sort_keys=True, separators=_COMPACT)
        start_us, end_us = int(since * 1e6), int(now * 1e6)
        for name, kind, endpoint, attributes, value, count, total, low, high, buckets in points:
            attrs = json.loads(attributes) if attributes else {}
            if endpoint is not None:
                attrs["endpoint"] = endpoint
            attrs_json = json.dumps(attrs, sort_keys=True, separators=_COMPACT)
            if kind == HISTOGRAM:
                self._add(
                    "metric_histograms",
                    (name, end_us, start_us, scope, "", "delta", attrs_json, res, count, total,
                     low, high, json.dumps(BOUNDS_MS, separators=_COMPACT), buckets or "[]"),
                )  # fmt: skip
            elif kind == GAUGE:
                self._add(
                    "metric_gauges",
                    (name, end_us, start_us, scope, "", attrs_json, res, value, None, None),
                )
            else:
                whole = float(value).is_integer()
                u64 = int(value) if whole and value >= 0 else None
                i64 = int(value) if whole else None
                self._add(
                    "metric_sums",
                    (name, end_us, start_us, scope, "", "delta", kind == COUNTER, attrs_json,
                     res, float(value), i64, u64),
                )  # fmt: skip


def _port_index(method: str) -> int:
    """The endpoint's port index: stable for an endpoint's name."""
    return zlib.crc32(method.encode())
