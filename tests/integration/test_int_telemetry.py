"""Telemetry (issue 14 part 2): spans across processes, the SQL recorder, the dashboard route.

Each test switches telemetry on in this controller (recording to a database of its own) and
off again, and spawns its procs while it is on unless it tests procs that were already there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regency import config
from regency.actor import Actor, ProcMesh, endpoint, get_meter, span
from regency.observe import AdminServer, start_admin
from regency.observe.telemetry import disable_telemetry, enable_telemetry, run_sql

pytestmark = pytest.mark.timeout(180)


class Worker(Actor):
    """Fast and slow endpoints, one that raises, and user spans and metrics."""

    @endpoint
    def ping(self, x: int) -> int:
        with span("inner work"):
            get_meter().create_counter("test.items").add(3, {"kind": "ping"})
            return x + 1

    @endpoint
    def slow(self) -> None:
        time.sleep(0.3)

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom on purpose")


class Relay(Actor):
    """An async actor whose endpoint calls another actor: that call joins the caller's trace."""

    def __init__(self, target: Any) -> None:
        self.target = target

    @endpoint
    async def relay(self, x: int) -> int:
        return await self.target.ping.call_one(x) + 1


def wait_for(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    """``what()`` once it is truthy (it is retried while it raises or is falsy)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = what()
        except Exception as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s; last: {last!r}")
        time.sleep(0.05)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    """Telemetry on, every call traced, recording to a database of this test's own."""
    path = tmp_path / "telemetry.db"
    with config.configured(
        telemetry_db=str(path), telemetry_traces_per_s=1e6, otel_metric_export_interval="100ms"
    ):
        enable_telemetry()
        try:
            yield path
        finally:
            disable_telemetry()


def rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return run_sql(sql, db, params)[1]


def test_one_call_over_four_procs_is_one_span_tree_across_processes(
    db: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    workers = make_procs(4).spawn("tree", Worker)
    assert list(workers.ping.call(1).get().values()) == [2, 2, 2, 2]
    (call,) = wait_for(
        lambda: rows(db, "SELECT trace_id, span_id, proc FROM spans WHERE name = 'call tree.ping'")
    )
    trace, call_id, controller = call

    def tree() -> list[tuple[Any, ...]]:
        found = rows(
            db,
            "SELECT kind, span_id, parent_id, proc, name, status FROM spans WHERE trace_id = ?",
            trace,
        )
        return found if len(found) == 18 else []  # call, send, 4 x (deliver, handle, span, reply)

    spans = wait_for(tree)
    by_kind: dict[str, list[tuple[Any, ...]]] = {}
    for row in spans:
        by_kind.setdefault(row[0], []).append(row)
    assert {k: len(v) for k, v in by_kind.items()} == {
        "call": 1, "send": 1, "deliver": 4, "handle": 4, "span": 4, "reply": 4
    }  # fmt: skip
    (send,) = by_kind["send"]
    assert send[2] == call_id
    assert send[3] == controller
    ids = {row[1]: row for row in spans}
    procs = set()
    for handle in by_kind["handle"]:
        deliver = ids[handle[2]]
        assert deliver[0] == "deliver"
        assert deliver[2] == send[1]
        assert handle[3] == deliver[3] != controller
        assert handle[4] == "handle tree.ping"
        assert handle[5] == "ok"
        procs.add(handle[3])
    assert len(procs) == 4
    for child in by_kind["span"] + by_kind["reply"]:
        parent = ids[child[2]]
        assert parent[0] == "handle"
        assert parent[3] == child[3]
    assert {row[4] for row in by_kind["span"]} == {"inner work"}


def test_a_call_made_inside_an_async_handler_is_a_child_in_the_same_trace(
    db: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    procs = make_procs(2)
    target = procs.slice(gpus=1).spawn("inner", Worker)
    relay = procs.slice(gpus=0).spawn("outer", Relay, target)
    assert relay.relay.call_one(1).get() == 3

    def spans() -> dict[str, tuple[Any, ...]]:
        found = rows(
            db,
            "SELECT name, trace_id, span_id, parent_id, proc FROM spans "
            "WHERE kind IN ('call', 'handle')",
        )
        by_name = {row[0]: row for row in found}
        wanted = {"call outer.relay", "handle outer.relay", "call inner.ping", "handle inner.ping"}
        return by_name if wanted <= set(by_name) else {}

    by_name = wait_for(spans)
    outer_handle, inner_call = by_name["handle outer.relay"], by_name["call inner.ping"]
    assert {row[1] for row in by_name.values()} == {by_name["call outer.relay"][1]}  # one trace
    assert inner_call[3] == outer_handle[2]  # the inner call's parent: the handler it ran in
    assert inner_call[4] == outer_handle[4] != by_name["handle inner.ping"][4]


def test_the_sql_recorder_finds_the_endpoint_made_slow_on_purpose(
    db: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    workers = make_procs(2).spawn("sql", Worker)
    for i in range(5):
        workers.ping.call(i).get()
    workers.slow.call().get()
    query = (
        "SELECT endpoint, SUM(count) AS handled, ROUND(SUM(sum) / SUM(count), 1) AS mean_ms "
        "FROM metrics WHERE name = 'regency.handle.duration' AND t > unixepoch('now') - 60 "
        "GROUP BY endpoint ORDER BY mean_ms DESC"
    )
    wait_for(lambda: rows(db, query) if [r[1] for r in rows(db, query)] == [2, 10] else None)
    cli = [sys.executable, "-m", "regency", "telemetry", "sql", "--db", str(db)]
    out = subprocess.run([*cli, query], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["endpoint", "handled", "mean_ms"]
    first = lines[2].split()
    assert first[0] == "sql.slow"
    assert first[1] == "2"  # one call to a mesh of two
    assert float(first[2]) >= 300
    assert lines[3].split()[:2] == ["sql.ping", "10"]
    assert lines[-1] == "(2 rows)"
    # The slowest handler, from the spans, as JSON.
    spans = subprocess.run(
        [*cli, "--json", "SELECT endpoint, MAX(duration_ms) AS ms FROM spans "
         "WHERE kind = 'handle' GROUP BY endpoint ORDER BY ms DESC LIMIT 1"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    slowest = json.loads(spans.stdout)
    assert slowest["endpoint"] == "sql.slow"
    assert slowest["ms"] >= 300
    # The user's counter, from the procs.
    wait_for(
        lambda: rows(db, "SELECT SUM(value) FROM metrics WHERE name = 'test.items'")[0][0] == 30
    )
    bad = subprocess.run(
        [*cli, "DELETE FROM spans"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 2
    assert "readonly" in bad.stderr


def test_telemetry_off_records_nothing_and_procs_follow_the_switch(
    tmp_path: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    path = tmp_path / "telemetry.db"
    with config.configured(
        telemetry_db=str(path), telemetry_traces_per_s=1e6, otel_metric_export_interval="100ms"
    ):
        workers = make_procs(2).spawn("off", Worker)  # spawned with telemetry off
        for i in range(3):
            workers.ping.call(i).get()
        workers.ping.broadcast(0)
        workers.slow.call().get()
        assert not path.exists()
        enable_telemetry()  # the running procs are told to follow
        try:

            def handled_on_both() -> list[tuple[Any, ...]]:
                # The procs hear of the switch by a control message: call until both have.
                with pytest.raises(Exception, match="boom on purpose"):
                    workers.boom.call().get()
                found = rows(path, "SELECT endpoint, proc, status FROM spans WHERE kind = 'handle'")
                return found if len({proc for _, proc, _ in found}) == 2 else []

            handled = wait_for(handled_on_both)
        finally:
            disable_telemetry()
    assert {(endpoint, status) for endpoint, _, status in handled} == {("off.boom", "error")}
    assert len({proc for _, proc, _ in handled}) == 2
    names = {r[0] for r in rows(path, "SELECT DISTINCT endpoint FROM metrics")}
    assert names <= {"off.boom", None}  # nothing of the calls made while it was off


def _get(admin: AdminServer, path: str, token: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(admin.url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_dashboard_route_needs_the_token_and_reports_endpoints_and_failures(
    tmp_path: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    admin = start_admin()
    try:
        route = "/v1/telemetry/endpoints?window_s=60"
        assert _get(admin, route, None)[0] == 401
        assert _get(admin, route, "0" * 64)[0] == 401
        status, off = _get(admin, route, admin.token)
        assert status == 200
        assert off["enabled"] is False
        assert off["endpoints"] == []
        assert off["failures"] == []
        assert off["window_s"] == 60
        assert off["bucket_s"] == 5
        with config.configured(
            telemetry_db=str(tmp_path / "t.db"),
            telemetry_traces_per_s=1e6,
            otel_metric_export_interval="100ms",
        ):
            enable_telemetry()
            try:
                procs = make_procs(2)
                assert procs.initialized.get(timeout=60)
                workers = procs.spawn("dash", Worker)
                for i in range(4):
                    workers.ping.call(i).get()
                workers.slow.call().get()
                workers.boom.broadcast()  # no reply path: the actors fail

                def report() -> dict[str, Any] | None:
                    body = _get(admin, route, admin.token)[1]
                    names = {e["name"] for e in body["endpoints"]}
                    done = {"dash.ping", "dash.slow", "dash.boom"} <= names and body["failures"]
                    return body if done else None

                body = wait_for(report)
                assert _get(admin, "/v1/telemetry/endpoints?window_s=-1", admin.token)[0] == 400
            finally:
                disable_telemetry()
    finally:
        admin.stop()
    assert body["enabled"] is True
    assert body["now"] == pytest.approx(time.time(), abs=60)
    by_name = {e["name"]: e for e in body["endpoints"]}
    slow, ping = by_name["dash.slow"], by_name["dash.ping"]
    assert slow["calls"] == 1
    assert slow["errors"] == 0
    assert slow["p50_ms"] >= 250
    assert slow["max_ms"] >= 300
    assert slow["p95_ms"] <= slow["max_ms"]
    assert ping["calls"] == 4
    assert ping["rate_per_s"] == pytest.approx(4 / 60, abs=1e-3)
    assert ping["p50_ms"] < slow["p50_ms"]
    assert sum(point["calls"] for point in ping["series"]) == 4
    assert all(set(p) == {"t", "calls", "p50_ms"} for p in ping["series"])
    assert all(b["t"] % 5 == 0 for b in ping["series"])
    assert by_name["dash.boom"]["p50_ms"] is None  # a broadcast has no reply to time
    failure = body["failures"][0]
    assert "dash" in failure["ref"]
    assert "boom on purpose" in failure["text"]
    assert set(failure) >= {"t", "ref", "text"}


def test_span_traced_and_the_meter_work_with_telemetry_off() -> None:
    from regency._lowlevel import tracing
    from regency.actor import traced

    assert tracing.probe is None  # off: every hook returns at its first check

    @traced
    def plain(x: int) -> int:
        return x + 1

    @traced(name="named")
    async def named(x: int) -> int:
        return x * 2

    with span("outside"):
        assert plain(1) == 2
    assert asyncio.run(named(3)) == 6
    assert plain.__name__ == "plain"
    with pytest.raises(TypeError, match="str name"):
        span(3)  # type: ignore[arg-type]
    get_meter().create_counter("unused").add(1)
    get_meter().create_histogram("unused.h").record(2.0)
    with pytest.raises(NotImplementedError):
        get_meter().create_observable_gauge("g", [])
    assert os.environ.get("REGENCY_TELEMETRY") in (None, "", "0")
