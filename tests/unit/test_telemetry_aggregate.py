"""Telemetry's metric points, quantiles from histogram buckets, and the trace budget."""

from __future__ import annotations

import json
import random

import pytest

from regency._runtime.actors.observe import tracing
from regency.observe.telemetry.aggregate import (
    BOUNDS_MS,
    Aggregator,
    attributes_text,
    merge_buckets,
    quantile,
)

pytestmark = pytest.mark.timeout(60)


def test_points_sum_counters_keep_gauge_maxima_and_fill_histograms() -> None:
    agg = Aggregator()
    assert not agg
    agg.add("sent", "m.e", 1)
    agg.add("sent", "m.e", 2)
    agg.gauge("depth", "m.e", 3, attributes_text({"actor": "a"}))
    agg.gauge("depth", "m.e", 1, attributes_text({"actor": "a"}))
    agg.gauge("user", None, 5, last=True)
    agg.gauge("user", None, 2, last=True)
    for value in (0.5, 2.0, 400.0):
        agg.record("latency", "m.e", value)
    points = {(p[0], p[2]): p for p in agg.points()}
    assert points[("sent", "m.e")][4:6] == (3.0, 2)
    assert points[("depth", "m.e")][3] == '{"actor": "a"}'
    assert points[("depth", "m.e")][4] == 3
    assert points[("user", None)][4] == 2
    _, kind, _, _, _, count, total, low, high, buckets = points[("latency", "m.e")]
    assert kind == "histogram"
    assert (count, total, low, high) == (3, 402.5, 0.5, 400.0)
    counts = json.loads(buckets)
    assert len(counts) == len(BOUNDS_MS) + 1
    assert sum(counts) == 3


def test_quantiles_from_buckets_are_within_the_bucket_width() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(1.0, 1.5) for _ in range(5000)]
    agg = Aggregator()
    for value in values:
        agg.record("x", None, value)
    (point,) = agg.points()
    buckets = json.loads(point[-1])
    ordered = sorted(values)
    for q in (0.5, 0.95, 0.99):
        exact = ordered[int(q * len(ordered)) - 1]
        estimate = quantile(buckets, q, max(values))
        assert estimate == pytest.approx(exact, rel=0.27)  # one bucket is 26 % wide
    assert quantile([0] * (len(BOUNDS_MS) + 1), 0.5) is None
    # A value past the last bound: the estimate stays within what was seen.
    assert quantile(merge_buckets([buckets, buckets]), 1.0, max(values)) <= max(values)


def test_the_trace_budget_admits_its_rate_per_interval() -> None:
    probe = tracing.Probe(traces_per_s=10.0, tracing=True)
    assert sum(probe.new_trace() for _ in range(100)) == 10  # the first second's worth
    assert probe.begin(timed=True)[1] is None  # spent: only counted
    probe.refill(0.5)  # the collector's next interval
    assert sum(probe.begin(timed=False)[1] is not None for _ in range(100)) == 5
    assert not tracing.Probe(10.0, tracing=False).new_trace()


def test_calls_inside_a_traced_span_join_its_trace() -> None:
    probe = tracing.Probe(traces_per_s=0.5, tracing=True)  # less than one trace per interval
    assert probe.begin(timed=True)[1] is None
    token = tracing.CURRENT.set((123, 456))
    try:
        _, trace = probe.begin(timed=True)
    finally:
        tracing.CURRENT.reset(token)
    assert trace is not None
    assert trace[0] == 123
    assert trace[3] == 456


def test_handled_messages_are_counted_per_actor_and_method() -> None:
    probe = tracing.Probe(traces_per_s=1.0, tracing=True)
    core = object()
    for failed in (False, True, False):
        probe.count(core, "step", failed)
    assert probe.counts == {core: {"step": [3, 1]}}
    mark = probe.handling((7, 8, 9), depth=2)
    assert tracing.CURRENT.get() == (7, mark[0][3])
    probe.handled(mark, core, "step", tracing.now(), ValueError("x"))
    assert tracing.CURRENT.get() is None
    assert probe.counts[core]["step"] == [4, 2]
    (record,) = probe.records
    assert record[0] == tracing.HANDLED
    assert record[-1] == "ValueError: x"
