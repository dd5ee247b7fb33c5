"""Snapshot rows from a tree (``mesh_tree()``'s shape) and the periodic capture's thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from regency.observe.telemetry.rows import RowStore
from regency.observe.telemetry.schema import TABLES
from regency.observe.telemetry.snapshot import PeriodicSnapshots, snapshot_rows

HOST = "tcp://10.0.0.1:7000"
PROC_A = f"{HOST}/job-train-aaaa"
PROC_B = f"{HOST}/job-train-bbbb"


def _actor(proc: str, rank: int, state: str, failure: str | None = None) -> dict[str, Any]:
    return {
        "ref": f"actor-{rank}",
        "kind": "actor",
        "name": f"<root>.<m.W train{{'gpus': {rank}/2}}>",
        "full_name": f"{proc},train-00000000000000aa[{rank}]",
        "actor_mesh": "train",
        "class": "m.W",
        "rank": rank,
        "state": state,
        "failure": failure,
        "messages_handled": 3,
        "mailbox_depth": 0,
    }


def _tree() -> dict[str, Any]:
    return {
        "ref": "root",
        "kind": "root",
        "hosts": [
            {
                "address": HOST,
                "procs": [
                    {
                        "address": PROC_A,
                        "proc_mesh": "train",
                        "rank": 0,
                        "state": "running",
                        "reason": None,
                        "actors": [_actor(PROC_A, 0, "failed", "ValueError: boom")],
                    },
                    {
                        "address": PROC_B,
                        "proc_mesh": "train",
                        "rank": 1,
                        "state": "unknown",
                        "reason": "no answer within 5 s",
                        "actors": [_actor(PROC_B, 1, "unknown")],
                    },
                ],
            }
        ],
    }


def test_a_tree_becomes_linked_rows_of_every_snapshot_table() -> None:
    rows = snapshot_rows(_tree(), 1_000, 500)
    RowStore(100, 0).add(rows)  # every row fits its table
    assert set(rows) <= set(TABLES)
    ((sid, ts),) = rows["snapshots"]
    assert ts == 1_000
    kinds = {node: kind for _, node, kind, _ in rows["nodes"]}
    actor_a = f"{PROC_A},train-00000000000000aa[0]"
    assert kinds == {
        "root": "root",
        f"host:{HOST}": "host",
        PROC_A: "proc",
        PROC_B: "proc",
        actor_a: "actor",
        f"{PROC_B},train-00000000000000aa[1]": "actor",
    }
    links = {(parent, child) for _, parent, child, *_ in rows["children"]}
    assert ("root", f"host:{HOST}") in links
    assert (f"host:{HOST}", PROC_A) in links
    assert (PROC_A, actor_a) in links
    stopped = {child for _, _, child, _, _, is_stopped in rows["children"] if is_stopped}
    assert stopped == {actor_a}  # the failed actor has ended
    assert rows["root_nodes"][0][:4] == (sid, "root", 1, 500)
    assert rows["host_nodes"] == [(sid, f"host:{HOST}", HOST, 2)]
    proc_a = next(r for r in rows["proc_nodes"] if r[1] == PROC_A)
    assert proc_a[2:] == ("train-0", 1, None, False, 1)  # name, actors, cap, poisoned, failed
    assert rows["actor_failures"] == [
        (sid, actor_a, "ValueError: boom", actor_a, _actor(PROC_A, 0, "failed")["name"], None,
         False)
    ]  # fmt: skip
    assert rows["resolution_errors"] == [(sid, PROC_B, "unreachable", "no answer within 5 s")]
    assert {r[0] for table in rows.values() for r in table} == {sid}


def test_an_empty_tree_is_one_root_and_no_other_node() -> None:
    rows = snapshot_rows({"ref": "root", "hosts": []}, 7)
    assert [r[1:3] for r in rows["nodes"]] == [("root", "root")]
    assert rows["children"] == []
    assert rows["root_nodes"][0][2] == 0


def test_a_capture_comes_every_period_and_a_failed_one_does_not_stop_the_next() -> None:
    taken: list[dict[str, Any]] = []
    two = threading.Event()
    calls = 0

    def tree() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a proc went away mid-capture")
        return _tree()

    def sink(rows: dict[str, Any]) -> None:
        taken.append(rows)
        if len(taken) == 2:
            two.set()

    snapshots = PeriodicSnapshots(0.05, tree, sink)
    try:
        assert two.wait(10)
    finally:
        snapshots.stop()
    assert calls >= 3
    assert taken[0]["snapshots"][0][0] != taken[1]["snapshots"][0][0]


def test_nothing_is_captured_while_the_tree_is_none() -> None:
    asked = threading.Event()
    taken: list[dict[str, Any]] = []

    def tree() -> None:
        asked.set()

    snapshots = PeriodicSnapshots(0.01, tree, taken.append)
    try:
        assert asked.wait(10)
        snapshots.capture()
    finally:
        snapshots.stop()
    assert taken == []


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="a snapshot interval must be > 0 seconds, got 0"):
        PeriodicSnapshots(0, dict, lambda rows: None)
