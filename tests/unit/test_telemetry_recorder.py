"""The local recorder's file (private, bounded) and ``regency telemetry sql``."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest

from regency import config
from regency.cli import main
from regency.observe.telemetry import recorder
from regency.observe.telemetry.recorder import Recorder, run_sql

pytestmark = pytest.mark.timeout(60)


def _batch(job: str, *starts: float) -> dict[str, Any]:
    spans = []
    for i, t in enumerate(starts):
        start = int(t * 1e9)
        spans.append(
            (1, i + 1, 0, f"call m.e{i}", "call", f"m.e{i}", None, start, start + 10**6, None)
        )
    return {
        "job": job, "proc": "unix:@p", "pid": 1, "host": "h", "t": starts[0], "interval_s": 1.0,
        "spans": spans, "points": [], "failures": [(starts[0], "actor", "failed", "boom")],
    }  # fmt: skip


def test_the_default_file_is_private_and_rows_are_bounded_by_age_and_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "user_root", lambda: tmp_path / "regency-user")
    with config.configured(telemetry_retention=60.0, telemetry_max_rows=3):
        rec = Recorder()
        try:
            assert rec.path == tmp_path / "regency-user" / "telemetry" / "telemetry.db"
            assert stat.S_IMODE(rec.path.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(rec.path.stat().st_mode) == 0o600
            now = time.time()
            rec.ingest(_batch("old", now - 3600))
            rec.ingest(_batch("new", now - 4, now - 3, now - 2, now - 1))
            assert rec.barrier()
            assert len(run_sql("SELECT * FROM spans", rec.path)[1]) == 5
            rec.sweep()
            names = run_sql("SELECT name FROM spans ORDER BY start_time", rec.path)[1]
            assert [n for (n,) in names] == ["call m.e1", "call m.e2", "call m.e3"]
            jobs = run_sql("SELECT job FROM failures", rec.path)[1]
            assert jobs == [("new",)]  # the old one was past the retention age
        finally:
            rec.stop()


def test_the_cli_prints_rows_and_refuses_writes_and_missing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.db"
    assert main(["telemetry", "sql", "--db", str(db), "SELECT 1"]) == 1
    assert "no telemetry database" in capsys.readouterr().err
    rec = Recorder(db)
    rec.ingest(_batch("job", time.time()))
    rec.barrier()
    rec.stop()
    assert main(["telemetry", "sql", "--db", str(db), "SELECT name, kind FROM spans"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "kind"]
    assert out[2].split() == ["call", "m.e0", "call"]
    assert out[-1] == "(1 row)"
    assert (
        main(
            [
                "telemetry",
                "sql",
                "--db",
                str(db),
                "--json",
                "SELECT le_ms FROM histogram_bounds LIMIT 1",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == '{"le_ms": 0.01}'
    assert main(["telemetry", "sql", "--db", str(db), "DROP TABLE spans"]) == 2
    assert "readonly" in capsys.readouterr().err
    assert main(["telemetry", "sql", "--db", str(db), "SELEKT"]) == 2
    assert "syntax error" in capsys.readouterr().err


def test_a_stalled_writer_drops_new_batches_instead_of_holding_them_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3

    rec = Recorder(tmp_path / "t.db", max_queued=4)
    blocker = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")  # the writer now waits for the lock
        now = time.time()
        rec.ingest(_batch("first", now))
        deadline = time.monotonic() + 10
        while rec._queue.qsize():  # the writer took it and waits in its transaction
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for i in range(7):
            rec.ingest(_batch(f"later{i}", now))
        assert rec.dropped == 3
        assert "dropped 1 batches so far" in caplog.text
        blocker.execute("COMMIT")
        assert rec.barrier()
        jobs = run_sql("SELECT DISTINCT job FROM spans ORDER BY job", rec.path)[1]
        assert [j for (j,) in jobs] == ["first", "later0", "later1", "later2", "later3"]
    finally:
        blocker.close()
        rec.stop()
