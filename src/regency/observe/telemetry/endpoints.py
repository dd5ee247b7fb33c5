"""Per-endpoint call statistics of the last minutes, for the admin API's dashboard route.

That is ``GET /v1/telemetry/endpoints?window_s=60``; its schema is in docs/introspection.md.

Read from the recorder's ``metrics`` and ``failures`` tables, for this controller's job only:
``calls`` counts the calls and casts its processes sent to an endpoint (``call`` to a mesh of
four is one), ``errors`` the calls whose outcome was an error, and the latencies (from send to
reply, so calls only) are quantiles estimated from the merged histograms (within about 13 %).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from regency.observe.telemetry import switch
from regency.observe.telemetry.aggregate import merge_buckets, quantile
from regency.observe.telemetry.collector import CALL_DURATION, CALL_ERRORS, SENT
from regency.observe.telemetry.recorder import run_sql

BUCKET_S = 5
_FAILURES_MAX = 100


def _empty(window_s: float, now: float, enabled: bool) -> dict[str, Any]:
    return {
        "enabled": enabled,
        "window_s": window_s,
        "now": now,
        "bucket_s": BUCKET_S,
        "endpoints": [],
        "failures": [],
    }


def report(window_s: float, job: str) -> dict[str, Any]:
    """The statistics of ``job``'s endpoints over the last ``window_s`` seconds."""
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
    now = time.time()
    sink = switch.sink()
    if sink is None:
        return _empty(window_s, now, enabled=False)
    path = sink.recorder.path
    since = now - window_s
    _, points = run_sql(
        "SELECT endpoint, name, t, value, min, max, buckets FROM metrics WHERE job = ? AND "
        f"t + interval_s >= ? AND name IN ('{SENT}', '{CALL_DURATION}', '{CALL_ERRORS}') "
        "AND endpoint IS NOT NULL",
        path,
        (job, since),
    )
    first = math.floor(since / BUCKET_S) * BUCKET_S
    starts = range(int(first), int(now) + 1, BUCKET_S)
    stats: dict[str, dict[str, Any]] = {}
    series: dict[int, list[Any]]
    for endpoint, name, t, value, low, high, buckets in points:
        entry = stats.get(endpoint)
        if entry is None:
            series = {s: [0, []] for s in starts}
            entry = stats[endpoint] = {
                "calls": 0,
                "errors": 0,
                "min": None,
                "max": None,
                "buckets": [],
            }
            entry["series"] = series
        slot = entry["series"].get(int(math.floor(max(t, first) / BUCKET_S) * BUCKET_S))
        if name == SENT:
            entry["calls"] += int(value)
            if slot is not None:
                slot[0] += int(value)
        elif name == CALL_ERRORS:
            entry["errors"] += int(value)
        else:
            counts = json.loads(buckets)
            entry["buckets"].append(counts)
            entry["max"] = high if entry["max"] is None else max(entry["max"], high)
            entry["min"] = low if entry["min"] is None else min(entry["min"], low)
            if slot is not None:
                slot[1].append((counts, low, high))
    endpoints = []
    for endpoint in sorted(stats):
        entry = stats[endpoint]
        merged = merge_buckets(entry["buckets"])
        points_of_series = []
        for start, (calls, hists) in entry["series"].items():
            top = max((h for _, _, h in hists), default=None)
            bottom = min((low for _, low, _ in hists), default=None)
            merged_here = merge_buckets(c for c, _, _ in hists)
            p50 = quantile(merged_here, 0.5, top, bottom) if hists else None
            points_of_series.append({"t": start, "calls": calls, "p50_ms": _round(p50)})
        endpoints.append(
            {
                "name": endpoint,
                "calls": entry["calls"],
                "errors": entry["errors"],
                "rate_per_s": round(entry["calls"] / window_s, 3),
                "p50_ms": _round(quantile(merged, 0.5, entry["max"], entry["min"])),
                "p95_ms": _round(quantile(merged, 0.95, entry["max"], entry["min"])),
                "max_ms": _round(entry["max"]),
                "series": points_of_series,
            }
        )
    _, failures = run_sql(
        "SELECT t, ref, kind, text FROM failures WHERE job = ? AND t >= ? ORDER BY t DESC "
        f"LIMIT {_FAILURES_MAX}",
        path,
        (job, since),
    )
    result = _empty(window_s, now, enabled=True)
    result["endpoints"] = endpoints
    result["failures"] = [
        {"t": t, "ref": ref, "kind": kind, "text": text} for t, ref, kind, text in failures
    ]
    return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
