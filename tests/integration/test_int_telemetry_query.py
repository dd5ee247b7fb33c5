"""The job's telemetry tables on this machine (the controller is its host agent): status events,
message outcomes, the admin API's query route and ``regency telemetry sql --live``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regency import config
from regency.actor import Actor, ProcMesh, endpoint
from regency.observe import AdminServer, start_admin
from regency.observe.telemetry import disable_telemetry, enable_telemetry, query_engine_client

pytestmark = pytest.mark.timeout(180)
pytest.importorskip("datafusion")


class Worker(Actor):
    """One endpoint that answers, one that raises."""

    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom on purpose")


@pytest.fixture
def telemetry(tmp_path: Path) -> Iterator[None]:
    with config.configured(
        telemetry_db=str(tmp_path / "telemetry.db"), otel_metric_export_interval="100ms"
    ):
        enable_telemetry()
        try:
            yield
        finally:
            disable_telemetry()


def rows_of(sql: str, least: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The rows of ``sql`` once there are at least ``least`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        found: list[dict[str, Any]] = query_engine_client().query(sql)["rows"]
        if len(found) >= least or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_status_events_follow_an_actor_through_failure_and_stop(
    telemetry: None, make_procs: Callable[..., ProcMesh]
) -> None:
    procs = make_procs(2)
    failing = procs.spawn("failing", Worker)
    stopping = procs.spawn("stopping", Worker)
    failing.ping.call().get(timeout=60)
    stopping.ping.call().get(timeout=60)
    failing.boom.broadcast()  # no reply path: the actors fail
    stopping.stop().get(timeout=60)

    def statuses(mesh: str, least: int) -> dict[str, set[str]]:
        found = rows_of(
            "SELECT a.rank, ase.new_status, ase.reason FROM actor_status_events ase "
            "JOIN actors a ON ase.actor_id = a.id JOIN meshes m ON a.mesh_id = m.id "
            f"WHERE m.given_name = '{mesh}'",
            least,
        )
        by_rank: dict[str, set[str]] = {}
        for row in found:
            by_rank.setdefault(str(row["rank"]), set()).add(row["new_status"])
            if row["new_status"] in ("Failed", "Stopped"):
                assert row["reason"]
        return by_rank

    root = rows_of(
        "SELECT ase.new_status FROM actor_status_events ase JOIN actors a "
        "ON ase.actor_id = a.id WHERE a.display_name = '<root>'",
        2,
    )
    # (and a "Processing" per call supervision refused, if an earlier test made one)
    assert {r["new_status"] for r in root} - {"Processing"} == {"Created", "Client"}
    lifecycle = {"Created", "Initializing", "Idle"}
    assert statuses("failing", 10) == {r: lifecycle | {"Stopping", "Failed"} for r in "01"}
    assert statuses("stopping", 10) == {r: lifecycle | {"Stopping", "Stopped"} for r in "01"}
    outcomes = rows_of(
        "SELECT msg.endpoint, mse.status FROM message_status_events mse "
        "JOIN messages msg ON mse.message_id = msg.id JOIN actors a ON msg.to_actor_id = a.id "
        "JOIN meshes m ON a.mesh_id = m.id WHERE m.given_name = 'failing' "
        "AND mse.status IN ('complete', 'failed')",
        4,
    )
    assert sorted((r["endpoint"], r["status"]) for r in outcomes) == [
        ("boom", "failed"),
        ("boom", "failed"),
        ("ping", "complete"),
        ("ping", "complete"),
    ]


def test_nothing_is_recorded_while_telemetry_is_off(
    tmp_path: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    with config.configured(
        telemetry_db=str(tmp_path / "telemetry.db"), otel_metric_export_interval="100ms"
    ):
        quiet = make_procs(1).spawn("quiet", Worker)  # telemetry off
        quiet.ping.call().get(timeout=60)
        enable_telemetry()
        try:
            loud = make_procs(1).spawn("loud", Worker)
            loud.ping.call().get(timeout=60)
            received = (
                "SELECT m.given_name FROM messages msg JOIN actors a ON msg.to_actor_id = a.id "
                "JOIN meshes m ON a.mesh_id = m.id WHERE m.given_name IN ('quiet', 'loud')"
            )
            loud_only = rows_of(received)  # the loud one's message is in
            names = {r["given_name"] for r in rows_of("SELECT given_name FROM meshes")}
        finally:
            disable_telemetry()
    assert "quiet" not in names
    assert loud_only == [{"given_name": "loud"}]


def _get(admin: AdminServer, sql: str | None, token: str | None) -> tuple[int, Any]:
    path = "/v1/telemetry/query"
    if sql is not None:
        path += "?" + urllib.parse.urlencode({"sql": sql})
    request = urllib.request.Request(admin.url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_admin_route_and_the_cli_query_the_live_job(
    tmp_path: Path, make_procs: Callable[..., ProcMesh]
) -> None:
    sql = "SELECT given_name, class FROM meshes WHERE given_name = 'routed'"
    admin = start_admin()
    try:
        assert _get(admin, sql, None)[0] == 401
        status, body = _get(admin, sql, admin.token)
        assert status == 409
        assert body["error"] == "telemetry is off in this controller"
        with config.configured(
            telemetry_db=str(tmp_path / "t.db"), otel_metric_export_interval="100ms"
        ):
            enable_telemetry()
            try:
                make_procs(1).spawn("routed", Worker).ping.call().get(timeout=60)
                rows_of(sql)
                status, body = _get(admin, sql, admin.token)
                assert status == 200
                assert body == {
                    "columns": ["given_name", "class"],
                    "rows": [["routed", "Python<Worker>"]],
                    "truncated": False,
                }
                status, body = _get(admin, "SELECT nope FROM meshes", admin.token)
                assert status == 400
                assert "nope" in body["error"]
                assert _get(admin, None, admin.token)[0] == 400
                cli = [sys.executable, "-m", "regency", "telemetry", "sql", "--live"]
                pid = ["--pid", str(os.getpid())]
                out = subprocess.run(
                    [*cli, *pid, "--json", sql],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert out.returncode == 0, out.stderr
                assert json.loads(out.stdout) == {"given_name": "routed", "class": "Python<Worker>"}
                table = subprocess.run(
                    [*cli, *pid, sql], capture_output=True, text=True, timeout=60, check=True
                ).stdout.splitlines()
                assert table[0].split() == ["given_name", "class"]
                assert table[2].split() == ["routed", "Python<Worker>"]
                bad = subprocess.run(
                    [*cli, *pid, "DROP TABLE meshes"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert bad.returncode == 2
                assert "not supported" in bad.stderr
            finally:
                disable_telemetry()
    finally:
        admin.stop()


def test_procs_on_this_host_hang_under_a_this_host_mesh(
    telemetry: None, make_procs: Callable[..., ProcMesh]
) -> None:
    make_procs(2, name="local_procs").spawn("local_workers", Worker).ping.call().get(timeout=60)
    found = rows_of(
        "SELECT h.given_name AS host, h.class AS host_class, p.class AS proc_class, "
        "COUNT(agents.id) AS agents FROM meshes p JOIN meshes h ON p.parent_mesh_id = h.id "
        "JOIN actors agents ON agents.mesh_id = h.id WHERE p.given_name = 'local_procs' "
        "GROUP BY 1, 2, 3"
    )
    assert found == [{"host": "this_host", "host_class": "Host", "proc_class": "Proc", "agents": 1}]


def test_a_choose_records_the_one_actor_it_went_to_and_a_call_the_whole_view(
    telemetry: None, make_procs: Callable[..., ProcMesh]
) -> None:
    workers = make_procs(3).spawn("chosen", Worker)
    workers.ping.choose().get(timeout=60)
    workers.slice(gpus=slice(1, 3)).ping.call().get(timeout=60)
    sent = rows_of(
        "SELECT sm.view_json FROM sent_messages sm JOIN meshes m ON sm.actor_mesh_id = m.id "
        "WHERE m.given_name = 'chosen' ORDER BY sm.timestamp_us",
        2,
    )
    chosen, sliced = (json.loads(r["view_json"]) for r in sent)
    assert chosen["labels"] == []
    assert chosen["slice"]["sizes"] == []
    assert chosen["slice"]["offset"] in (0, 1, 2)
    assert sliced == {"labels": ["gpus"], "slice": {"offset": 1, "sizes": [2], "strides": [1]}}


def test_the_cli_says_which_flags_need_live() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "regency", "telemetry", "sql", "--pid", "1", "SELECT 1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "--url, --pid, --job and --secret-file go with --live" in out.stderr
