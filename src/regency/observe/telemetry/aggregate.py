"""Metric points: what a process counted during one flush interval, and quantiles of them.

Counters and up-down counters keep the sum of their increments in the interval, gauges the
largest value seen, histograms a count, sum, min, max and bucket counts over the fixed bounds
:data:`BOUNDS_MS` (ten per decade from 0.01 ms to 100 s, so a quantile read from the buckets is
within about 13 % of the true value). A point is keyed by metric name, endpoint and other
attributes (a JSON object, ``""`` when there are none).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BOUNDS_MS: tuple[float, ...] = tuple(float(f"{10 ** (k / 10):.3g}") for k in range(-20, 51))
"""Upper bounds (inclusive, in ms) of the histogram buckets; one more bucket holds the rest."""

COUNTER = "counter"
UPDOWN = "updowncounter"
GAUGE = "gauge"
HISTOGRAM = "histogram"

# Columns of a point, as stored (see recorder.py's ``metrics`` table).
Point = tuple[str, str, str | None, str, float, int, float, float | None, float | None, str | None]


def attributes_text(attributes: Mapping[str, Any] | None) -> str:
    """Attributes as the stable JSON text that keys a point (``""`` for none)."""
    if not attributes:
        return ""
    return json.dumps({str(k): v for k, v in attributes.items()}, sort_keys=True, default=str)


class Aggregator:
    """The points of one interval, built from the measurements of it."""

    def __init__(self) -> None:
        # (name, kind, endpoint, attributes) -> [value, count, sum, min, max, buckets]
        self._points: dict[tuple[str, str, str | None, str], list[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._points)

    def _point(self, name: str, kind: str, endpoint: str | None, attributes: str) -> list[Any]:
        key = (name, kind, endpoint, attributes)
        point = self._points.get(key)
        if point is None:
            buckets = [0] * (len(BOUNDS_MS) + 1) if kind == HISTOGRAM else None
            point = self._points[key] = [0.0, 0, 0.0, None, None, buckets]
        return point

    def add(
        self,
        name: str,
        endpoint: str | None,
        amount: float,
        attributes: str = "",
        kind: str = COUNTER,
        times: int = 1,
    ) -> None:
        """Add ``amount`` to a counter (or up-down counter), the sum of ``times`` increments."""
        point = self._point(name, kind, endpoint, attributes)
        point[0] += amount
        point[1] += times

    def gauge(
        self,
        name: str,
        endpoint: str | None,
        value: float,
        attributes: str = "",
        last: bool = False,
    ) -> None:
        """A gauge reading: the point keeps the largest of the interval (``last``: the last)."""
        point = self._point(name, GAUGE, endpoint, attributes)
        point[0] = value if point[1] == 0 or last else max(point[0], value)
        point[1] += 1

    def record(self, name: str, endpoint: str | None, value: float, attributes: str = "") -> None:
        """One histogram measurement (ms for regency's own)."""
        point = self._point(name, HISTOGRAM, endpoint, attributes)
        point[1] += 1
        point[2] += value
        point[3] = value if point[3] is None else min(point[3], value)
        point[4] = value if point[4] is None else max(point[4], value)
        point[5][bisect_left(BOUNDS_MS, value)] += 1

    def record_many(
        self, name: str, endpoint: str | None, values: list[float], attributes: str = ""
    ) -> None:
        """Several histogram measurements at once."""
        if not values:
            return
        point = self._point(name, HISTOGRAM, endpoint, attributes)
        point[1] += len(values)
        point[2] += sum(values)
        low, high = min(values), max(values)
        point[3] = low if point[3] is None else min(point[3], low)
        point[4] = high if point[4] is None else max(point[4], high)
        buckets = point[5]
        for i, n in Counter(bisect_left(BOUNDS_MS, v) for v in values).items():
            buckets[i] += n

    def points(self) -> list[Point]:
        """The interval's points, as stored (buckets as a JSON list)."""
        rows: list[Point] = []
        for (name, kind, endpoint, attributes), p in self._points.items():
            buckets = json.dumps(p[5]) if p[5] is not None else None
            rows.append((name, kind, endpoint, attributes, p[0], p[1], p[2], p[3], p[4], buckets))
        return rows


def merge_buckets(lists: Iterable[Sequence[int]]) -> list[int]:
    """Bucket counts of several histogram points added together."""
    total = [0] * (len(BOUNDS_MS) + 1)
    for counts in lists:
        for i, n in enumerate(counts):
            total[i] += n
    return total


def quantile(
    buckets: Sequence[int], q: float, top: float | None = None, bottom: float | None = None
) -> float | None:
    """The ``q`` quantile (0..1) estimated from bucket counts: linear within its bucket.

    ``top`` and ``bottom`` (the largest and smallest values seen) bound the estimate, and the
    last, open bucket.
    """
    count = sum(buckets)
    if count == 0:
        return None
    rank = q * count
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            low = BOUNDS_MS[i - 1] if i > 0 else 0.0
            high = BOUNDS_MS[i] if i < len(BOUNDS_MS) else (top if top is not None else low)
            if top is not None:
                high = min(high, top)
            if bottom is not None:
                low = max(low, bottom)
            low = min(low, high)
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return top
