"""The introspection-snapshot tables of a real job: listed from the start, filled on a period.

A ``ProcessJob`` host (a worker daemon) runs the procs; the controller captures its tree into
the snapshot tables every ``snapshot_interval_secs`` and queries them with the job's SQL.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
from _telemetry_helpers import rows_when

from regency import config
from regency.actor import Actor, endpoint
from regency.job import JobState, ProcessJob, TelemetryConfig

pytestmark = pytest.mark.timeout(180)
pytest.importorskip("datafusion")

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SNAPSHOT_TABLES = [
    "actor_failures",
    "actor_inbound_orderings",
    "actor_nodes",
    "children",
    "host_nodes",
    "nodes",
    "ordering_sessions",
    "proc_nodes",
    "resolution_errors",
    "root_nodes",
    "snapshots",
]


class Worker(Actor):
    """Answers pings."""

    @endpoint
    def ping(self) -> int:
        return 1


@pytest.fixture
def make_job() -> Iterator[Any]:
    jobs: list[ProcessJob] = []

    def make(interval: float) -> JobState:
        job = ProcessJob({"hosts": 1}).enable_telemetry(
            TelemetryConfig(retention_secs=600, snapshot_interval_secs=interval)
        )
        jobs.append(job)
        return job.state(cached_path=None)

    with config.configured(otel_metric_export_interval="100ms"):
        try:
            yield make
        finally:
            for job in jobs:
                job.kill()


def test_the_snapshot_tables_are_listed_with_monarchs_columns_before_any_capture(
    make_job: Any,
) -> None:
    started_us = time.time_ns() // 1000
    state = make_job(30.0)  # the default period: no capture within this test
    tables = {
        r["table_name"]
        for r in state.query_engine_client.query(
            "SELECT table_name FROM information_schema.tables"
        )["rows"]
    }
    assert set(SNAPSHOT_TABLES) <= tables
    columns = state.query_engine_client.query(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'children' ORDER BY ordinal_position"
    )["rows"]
    assert [(c["column_name"], c["data_type"]) for c in columns] == [
        ("snapshot_id", "Utf8"),
        ("parent_id", "Utf8"),
        ("child_id", "Utf8"),
        ("child_sort_key", "Int64"),
        ("is_system", "Boolean"),
        ("is_stopped", "Boolean"),
    ]
    # Each is queryable; rows of earlier jobs of this controller may be there, none of this one.
    for table in SNAPSHOT_TABLES:
        state.query_engine_client.query(f"SELECT COUNT(*) AS n FROM {table}")
    (row,) = state.query_engine_client.query(
        f"SELECT COUNT(*) AS n FROM snapshots WHERE snapshot_ts >= {started_us}"
    )["rows"]
    assert row["n"] == 0  # this job's first capture is one period away


def test_a_periodic_capture_links_each_actor_to_its_proc_host_and_root(make_job: Any) -> None:
    state = make_job(0.5)
    procs = state.hosts.spawn_procs(per_host={"workers": 2}, name="snap_procs")
    workers = procs.spawn("snap_worker", Worker)
    workers.ping.call().get(timeout=60)
    answered_us = time.time_ns() // 1000  # a capture after this finds both actors running

    found = rows_when(
        state,
        "SELECT a.node_id, a.snapshot_id, a.actor_status, a.actor_type, pn.proc_name "
        "FROM actor_nodes a "
        "JOIN children ch ON ch.snapshot_id = a.snapshot_id AND ch.child_id = a.node_id "
        "JOIN nodes p ON p.snapshot_id = ch.snapshot_id AND p.node_id = ch.parent_id "
        "AND p.node_kind = 'proc' "
        "JOIN proc_nodes pn ON pn.snapshot_id = p.snapshot_id AND pn.node_id = p.node_id "
        "JOIN snapshots s ON s.snapshot_id = a.snapshot_id "
        "WHERE a.is_system = false AND pn.proc_name LIKE 'snap_procs%' "
        f"AND s.snapshot_ts > {answered_us} "
        "ORDER BY s.snapshot_ts DESC LIMIT 2",
        2,
    )
    assert len(found) == 2
    assert {r["proc_name"] for r in found} == {"snap_procs-0", "snap_procs-1"}
    assert {r["actor_status"] for r in found} == {"running"}
    assert {r["actor_type"] for r in found} == {f"{__name__}.Worker"}
    actor, snapshot = found[0]["node_id"], found[0]["snapshot_id"]

    ancestors = state.query_engine_client.query(
        f"""
        WITH RECURSIVE ancestors AS (
            SELECT ch.parent_id AS node_id, 1 AS depth FROM children ch
            WHERE ch.snapshot_id = '{snapshot}' AND ch.child_id = '{actor}'
            UNION ALL
            SELECT ch.parent_id, a.depth + 1 FROM ancestors a
            JOIN children ch ON ch.snapshot_id = '{snapshot}' AND ch.child_id = a.node_id
            WHERE a.depth < 10
        )
        SELECT a.node_id, n.node_kind FROM ancestors a
        LEFT JOIN nodes n ON n.snapshot_id = '{snapshot}' AND n.node_id = a.node_id
        ORDER BY a.depth
        """
    )["rows"]
    assert [r["node_kind"] for r in ancestors] == ["proc", "host", "root"]
    assert ancestors[-1]["node_id"] == "root"
    assert ancestors[1]["node_id"] == f"host:{state.hosts._hosts[0].agent}"

    # An actor's node is its row of the actors table, by full name.
    joined = state.query_engine_client.query(
        "SELECT m.given_name FROM actors x JOIN meshes m ON x.mesh_id = m.id "
        f"WHERE x.full_name = '{actor}'"
    )["rows"]
    assert joined == [{"given_name": "snap_worker"}]
    # The root counts every host this controller holds (earlier tests' too), one node each.
    (root,) = state.query_engine_client.query(
        f"SELECT num_hosts FROM root_nodes WHERE snapshot_id = '{snapshot}'"
    )["rows"]
    (hosts,) = state.query_engine_client.query(
        f"SELECT COUNT(*) AS n FROM host_nodes WHERE snapshot_id = '{snapshot}'"
    )["rows"]
    assert root["num_hosts"] == hosts["n"] >= 1
