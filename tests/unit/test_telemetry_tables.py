"""The job's telemetry tables: the bounded row store, py-spy rows and the DuckDB query step."""

from __future__ import annotations

import importlib.util
import json

import pytest

from regency.observe.telemetry import engine, hoststore, rows
from regency.observe.telemetry.client import pyspy_rows
from regency.observe.telemetry.engine import QueryError, run, tables_named
from regency.observe.telemetry.rows import RowStore
from regency.observe.telemetry.schema import TABLES

needs_datafusion = pytest.mark.skipif(
    importlib.util.find_spec("datafusion") is None,
    reason="the query step needs DataFusion (the telemetry extra)",
)


def _actor(i: int) -> tuple[object, ...]:
    return (i, 1_000 + i, 7, i, f"proc{i},w[{i}]", "<w>")


def _message(i: int) -> tuple[object, ...]:
    return (100 + i, 2_000 + i, 1, i, "ping", 3)


@needs_datafusion
def test_a_query_sees_the_union_of_every_hosts_rows() -> None:
    host_a = {"actors": [_actor(0), _actor(1)], "messages": [_message(0)]}
    host_b = {"actors": [_actor(2)], "messages": [_message(2), _message(2)]}
    columns, rows = run(
        "SELECT a.id, COUNT(m.id) AS n FROM actors a LEFT JOIN messages m "
        "ON m.to_actor_id = a.id GROUP BY a.id ORDER BY a.id",
        [host_a, host_b],
    )
    assert columns == ["id", "n"]
    assert rows == [(0, 1), (1, 0), (2, 2)]


@needs_datafusion
def test_information_schema_lists_every_table_with_monarchs_columns_in_order() -> None:
    _, rows = run(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
        "ORDER BY table_name",
        [],
    )
    assert [r[0] for r in rows] == sorted(TABLES)
    _, rows = run(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'messages' "
        "ORDER BY ordinal_position",
        [],
    )
    assert [r[0] for r in rows] == [
        "id",
        "timestamp_us",
        "from_actor_id",
        "to_actor_id",
        "endpoint",
        "port_index",
    ]


@needs_datafusion
def test_a_bad_query_raises_query_error_with_the_engines_message() -> None:
    with pytest.raises(QueryError, match="no_such_table"):
        run("SELECT * FROM no_such_table", [])


@needs_datafusion
def test_a_query_cannot_read_the_controllers_files_nor_change_tables() -> None:
    with pytest.raises(QueryError, match="DDL not supported"):
        run("CREATE EXTERNAL TABLE pw STORED AS CSV LOCATION '/etc/passwd'", [])
    with pytest.raises(QueryError, match="DML not supported"):
        run("INSERT INTO actors VALUES (1, 2, 3, 4, 'a', 'b')", [])


@needs_datafusion
def test_columns_of_the_same_name_are_all_answered() -> None:
    columns, rows = run(
        "SELECT a.id, m.id FROM actors a JOIN messages m ON m.to_actor_id = a.id",
        [{"actors": [_actor(0)], "messages": [_message(0)]}],
    )
    assert len(columns) == 2
    assert rows == [(0, 100)]


@needs_datafusion
def test_rows_whose_values_do_not_fit_are_left_out_not_fatal() -> None:
    broken = ("not an id", 1, 2, 3, "x", "y")
    _, rows = run("SELECT id FROM actors ORDER BY id", [{"actors": [_actor(0), broken, (1,)]}])
    assert rows == [(0,)]


def test_only_the_tables_a_query_names_are_fetched() -> None:
    assert tables_named("SELECT a.id FROM actors a JOIN meshes m ON a.mesh_id = m.id") == [
        "actors",
        "meshes",
    ]
    assert tables_named("SELECT table_name FROM information_schema.tables") == []


def test_a_row_that_does_not_fit_its_table_is_refused_by_name() -> None:
    store = RowStore(10, 0)
    with pytest.raises(ValueError, match="a row of actors has 6 columns"):
        store.add({"actors": [(1, 2)]})
    with pytest.raises(ValueError, match="no telemetry table named 'nope'"):
        store.add({"nope": [(1,)]})


def test_each_table_keeps_at_most_max_rows_the_newest() -> None:
    store = RowStore(3, 0)
    store.add({"messages": [_message(i) for i in range(5)]})
    assert [row[0] for row in store.scan(["messages"])["messages"]] == [102, 103, 104]


class _Clock:
    """A monotonic clock the test moves by hand (retention ages rows by it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(rows, "time", fake)
    return fake


def test_retention_drops_old_events_but_keeps_actors_and_meshes(clock: _Clock) -> None:
    store = RowStore(100, 0.2)
    store.add({"actors": [_actor(0)], "messages": [_message(0)]})
    clock.now += 0.3
    store.add({"messages": [_message(1)]})
    found = store.scan(["actors", "messages"])
    assert found["actors"] == [_actor(0)]
    assert [row[0] for row in found["messages"]] == [101]


def test_a_worker_keeps_the_rows_of_its_last_four_jobs() -> None:
    for job in ("j1", "j2", "j3", "j4", "j5"):
        hoststore.store(f"test-{job}", 10, 0).add({"actors": [_actor(0)]})
    assert hoststore.existing("test-j1") is None
    kept = hoststore.existing("test-j5")
    assert kept is not None
    assert kept.counts()["actors"] == 1


def test_a_store_takes_the_latest_retention(clock: _Clock) -> None:
    hoststore.store("test-retention", 10, 3600).add({"messages": [_message(0)]})
    clock.now += 0.3
    later = hoststore.store("test-retention", 10, 0.2)
    assert later.scan(["messages"]) == {"messages": []}


@needs_datafusion
def test_a_pyspy_dump_becomes_rows_of_the_four_pyspy_tables() -> None:
    dump = {
        "Ok": {
            "pid": 42,
            "binary": "python3",
            "stack_traces": [
                {
                    "pid": 42,
                    "thread_id": 7,
                    "thread_name": "MainThread",
                    "os_thread_id": 9,
                    "active": True,
                    "owns_gil": False,
                    "frames": [
                        {"name": "inner", "filename": "a.py", "line": 3, "locals": [
                            {"name": "x", "addr": 1, "arg": True, "repr": "1"}]},
                        {"name": "main", "filename": "a.py", "line": 9},
                    ],
                }
            ],
        }
    }  # fmt: skip
    rows = pyspy_rows("d1", "proc[0]", json.dumps(dump))
    _, found = run(
        "SELECT f.name, f.line, d.proc_ref FROM pyspy_frames f JOIN pyspy_dumps d "
        "USING (dump_id) ORDER BY f.frame_depth",
        [rows],
    )
    assert found == [("inner", 3, "proc[0]"), ("main", 9, "proc[0]")]
    assert rows["pyspy_local_variables"] == [("d1", 7, 0, "x", 1, True, "1")]
    with pytest.raises(ValueError, match="py-spy's result"):
        pyspy_rows("d2", "proc[0]", json.dumps({"Err": "no such process"}))


def test_without_datafusion_a_query_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(engine.importlib, "import_module", missing)
    with pytest.raises(RuntimeError, match=r"pip install 'regency\[telemetry\]'"):
        run("SELECT 1", [])
