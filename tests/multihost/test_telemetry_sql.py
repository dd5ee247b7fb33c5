"""SQL over the whole job's telemetry: every host keeps its rows, the controller queries all.

Two worker daemons (``ProcessJob``) are two hosts; their procs' rows stay with their host
agent, so the controller's answers come from both, and outlive the procs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator

import cloudpickle
import pytest
from _telemetry_helpers import rows_when

import regency.actor as actor_module
from regency import config
from regency.actor import Actor, SupervisionError, endpoint, get_meter, span
from regency.job import ProcessJob, TelemetryConfig

pytestmark = pytest.mark.timeout(180)
pytest.importorskip("datafusion")

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Worker(Actor):
    """Does nothing, or opens a user span."""

    @endpoint
    def ping(self) -> None:
        pass

    @endpoint
    def traced_step(self, name: str) -> None:
        with span(name):
            pass


@pytest.fixture
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2}).enable_telemetry(TelemetryConfig(retention_secs=600))
    with config.configured(otel_metric_export_interval="100ms"):
        try:
            yield job
        finally:
            job.kill()


def test_a_query_joins_rows_kept_on_both_hosts_and_still_answers_after_the_mesh_stopped(
    job: ProcessJob,
) -> None:
    state = job.state(cached_path=None)
    assert state.query_engine is None
    procs = state.hosts.spawn_procs(per_host={"workers": 2}, name="sql_procs")
    workers = procs.spawn("sql_workers", Worker)
    workers.initialized.get(timeout=60)
    for _ in range(3):
        workers.ping.call().get(timeout=60)

    received = (
        "SELECT a.rank, a.full_name, msg.from_actor_id FROM messages msg "
        "JOIN actors a ON msg.to_actor_id = a.id JOIN meshes m ON a.mesh_id = m.id "
        "WHERE m.given_name = 'sql_workers' AND msg.endpoint = 'ping'"
    )
    rows = rows_when(state, received, 12)
    assert len(rows) == 12  # 3 calls x 4 actors, received on two hosts
    assert sorted({r["rank"] for r in rows}) == [0, 1, 2, 3]
    agents = {h.agent for h in state.hosts._hosts}
    assert {r["full_name"].rpartition("/")[0] for r in rows} == agents
    sent = rows_when(
        state,
        "SELECT sm.sender_actor_id, sm.view_json FROM sent_messages sm "
        "JOIN meshes m ON sm.actor_mesh_id = m.id WHERE m.given_name = 'sql_workers'",
        3,
    )
    assert len(sent) == 3
    assert {r["from_actor_id"] for r in rows} == {s["sender_actor_id"] for s in sent}
    assert sent[0]["view_json"] == (  # Monarch's compact JSON text
        '{"labels":["hosts","workers"],"slice":{"offset":0,"sizes":[2,2],"strides":[2,1]}}'
    )
    view = json.loads(sent[0]["view_json"])
    assert view["labels"] == ["hosts", "workers"]
    assert view["slice"]["sizes"] == [2, 2]

    statuses = rows_when(
        state,
        "SELECT a.rank, ase.new_status FROM actor_status_events ase "
        "JOIN actors a ON ase.actor_id = a.id JOIN meshes m ON a.mesh_id = m.id "
        "WHERE m.given_name = 'sql_workers'",
        12,
    )
    assert {r["new_status"] for r in statuses} == {"Created", "Initializing", "Idle"}

    procs.stop().get(timeout=60)
    after = state.query_engine_client.query(received)["rows"]
    assert sorted((r["rank"], r["full_name"]) for r in after) == sorted(
        (r["rank"], r["full_name"]) for r in rows
    )


def test_meshes_record_their_class_shape_and_parent_view(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    procs = state.hosts.spawn_procs(per_host={"workers": 3}, name="view_procs")
    sliced = procs.slice(workers=slice(1, 3)).spawn("sliced_workers", Worker)
    sliced.initialized.get(timeout=60)
    meshes = {
        r["given_name"]: r
        for r in rows_when(
            state,
            "SELECT id, class, given_name, full_name, shape_json, parent_mesh_id, "
            "parent_view_json FROM meshes",
            3,
        )
    }
    host, proc, actor = meshes["hosts"], meshes["view_procs"], meshes["sliced_workers"]
    assert (host["class"], proc["class"], actor["class"]) == ("Host", "Proc", "Python<Worker>")
    assert actor["parent_mesh_id"] == proc["id"]
    assert proc["parent_mesh_id"] == host["id"]
    assert actor["full_name"].startswith("sliced_workers")
    assert actor["full_name"] != "sliced_workers"
    assert json.loads(actor["shape_json"]) == {
        "inner": {"labels": ["hosts", "workers"], "sizes": [2, 2]}
    }
    parent_view = json.loads(actor["parent_view_json"])
    assert parent_view["labels"] == ["hosts", "workers"]
    assert parent_view["slice"]["offset"] == 1
    assert parent_view["slice"]["sizes"] == [2, 2]
    ranks = rows_when(state, f"SELECT rank FROM actors WHERE mesh_id = {actor['id']}", 4)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]


def test_user_spans_and_pyspy_dumps_are_queryable(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    workers = state.hosts.spawn_procs(per_host={"workers": 1}).spawn("span_workers", Worker)
    workers.traced_step.call("step-7").get(timeout=60)
    spans = rows_when(
        state,
        "SELECT name, fields_json FROM spans WHERE fields_json LIKE '%step-7%'",
        2,
    )
    assert [r["name"] for r in spans] == ["python_user_span"] * 2  # one per host's worker
    assert {json.loads(r["fields_json"])["name"] for r in spans} == {"step-7"}

    dump = {"Ok": {"pid": 5, "binary": "python", "stack_traces": [{"thread_id": 1, "frames": [
        {"name": "train", "filename": "t.py", "line": 12}]}]}}  # fmt: skip
    client = state.query_engine_client
    assert client.store_pyspy_dump("dump-a", "hosts[0]", json.dumps(dump)) == {
        "status": "ok",
        "dump_id": "dump-a",
    }
    frames = client.query("SELECT name, line FROM pyspy_frames WHERE dump_id = 'dump-a'")
    assert frames["rows"] == [{"name": "train", "line": 12}]


def test_a_host_that_does_not_answer_is_left_out_after_the_timeout(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    workers = state.hosts.spawn_procs(per_host={"workers": 1}).spawn("quiet_workers", Worker)
    workers.ping.call().get(timeout=60)
    sql = (
        "SELECT a.full_name FROM messages msg JOIN actors a ON msg.to_actor_id = a.id "
        "JOIN meshes m ON a.mesh_id = m.id WHERE m.given_name = 'quiet_workers'"
    )
    assert len(rows_when(state, sql, 2)) == 2
    stopped = job._workers["hosts"][1].pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        start = time.monotonic()
        rows = state.query_engine_client.query(sql, timeout=1.0)["rows"]
        assert time.monotonic() - start < 10
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert len(rows) == 1  # only the answering host's message
    assert rows[0]["full_name"].startswith(state.hosts._hosts[0].agent)


def test_mailbox_posts_and_get_meter_rows_carry_monarchs_names_and_scope(
    job: ProcessJob,
) -> None:
    state = job.state(cached_path=None)
    workers = state.hosts.spawn_procs(per_host={"workers": 1}).spawn("posts_workers", Worker)
    for _ in range(3):
        workers.ping.call().get(timeout=60)
    get_meter().create_counter("example.requests").add(2, {"operation": "predict"})

    ranks = {
        r["id"]: r["rank"]
        for r in rows_when(
            state,
            "SELECT a.id, a.rank FROM actors a JOIN meshes m ON a.mesh_id = m.id "
            "WHERE m.given_name = 'posts_workers'",
            2,
        )
    }
    deadline = time.monotonic() + 30
    while True:  # each host's rows come with its procs' next interval
        posts = [
            r
            for r in state.query_engine_client.query(
                "SELECT attributes_json, resource_attributes_json, sum_u64, temporality, "
                "is_monotonic, scope_name FROM metric_sums WHERE name = 'mailbox.posts'"
            )["rows"]
            if json.loads(r["attributes_json"])["dest_actor_id"] in ranks
        ]
        reached = {ranks[json.loads(r["attributes_json"])["dest_actor_id"]] for r in posts}
        if reached == {0, 1} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reached == {0, 1}  # each worker, on its own host
    assert {r["temporality"] for r in posts} == {"delta"}
    assert all(r["is_monotonic"] and r["sum_u64"] > 0 for r in posts)
    assert {r["scope_name"] for r in posts} == {"regency"}
    (root,) = state.query_engine_client.query(
        "SELECT id FROM actors WHERE display_name = '<root>'"
    )["rows"]
    senders = {json.loads(r["attributes_json"]).get("actor_id") for r in posts}
    assert senders == {root["id"]}  # the controller sent the pings
    resource = json.loads(posts[0]["resource_attributes_json"])
    assert resource["telemetry.sdk.name"] == "opentelemetry"
    assert resource["service.name"] == "regency"

    (custom,) = rows_when(
        state,
        "SELECT scope_name, attributes_json, sum_u64 FROM metric_sums "
        "WHERE name = 'example.requests'",
    )
    assert custom["scope_name"] == "monarch"  # get_meter()'s meter is Monarch's "monarch"
    assert custom["sum_u64"] == 2
    assert json.loads(custom["attributes_json"]) == {"operation": "predict"}


def test_the_root_records_processing_when_supervision_refuses_its_call(job: ProcessJob) -> None:
    unhandled_fault_hook = actor_module.unhandled_fault_hook
    actor_module.unhandled_fault_hook = lambda failure: None
    try:
        state = job.state(cached_path=None)
        workers = state.hosts.spawn_procs(per_host={"workers": 1}).spawn("gone_workers", Worker)
        workers.ping.call().get(timeout=60)
        workers.stop().get(timeout=60)
        root_events = (
            "SELECT ase.new_status FROM actor_status_events ase "
            "JOIN actors a ON ase.actor_id = a.id WHERE a.display_name = '<root>'"
        )
        before = [r["new_status"] for r in rows_when(state, root_events, 2)]
        assert {"Created", "Client"} <= set(before)
        with pytest.raises(SupervisionError, match="stopped"):
            workers.ping.call().get(timeout=60)
        after = [r["new_status"] for r in rows_when(state, root_events, len(before) + 1)]
    finally:
        actor_module.unhandled_fault_hook = unhandled_fault_hook
    # One more (this controller's earlier tests may have made some): the refused call's.
    assert after.count("Processing") == before.count("Processing") + 1
    assert len(after) == len(before) + 1
    # The root's sends name it by the id of its actors row.
    sent = rows_when(
        state,
        "SELECT a.display_name FROM sent_messages sm JOIN actors a "
        "ON sm.sender_actor_id = a.id JOIN meshes m ON sm.actor_mesh_id = m.id "
        "WHERE m.given_name = 'gone_workers'",
        2,
    )
    assert {r["display_name"] for r in sent} == {"<root>"}
