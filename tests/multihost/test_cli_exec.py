"""``regency exec`` and ``regency kill`` on a ProcessJob that a controller script cached."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import job_processes

from regency.job import ProcessJob, job_load
from regency.job._process import _alive

pytestmark = pytest.mark.timeout(60)

CACHE = Path(".regency") / "job_state.pkl"
# What a user runs first: a controller script that starts the job and exits, leaving it cached.
START = textwrap.dedent(
    """
    from regency.job import ProcessJob

    ProcessJob({"hosts": 2}).state()
    """
)
RANK = "echo $REGENCY_RANK_HOSTS/$REGENCY_SIZE_HOSTS"


def _start_job(cwd: Path) -> ProcessJob:
    (cwd / "start.py").write_text(START)
    subprocess.run(
        [sys.executable, "start.py"], cwd=cwd, check=True, timeout=45, capture_output=True
    )
    job = job_load(cwd / CACHE)
    assert isinstance(job, ProcessJob)
    return job


def _regency(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regency", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=45,
        check=False,
    )


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("exec")
    job = _start_job(cwd)
    try:
        yield cwd
    finally:
        job.kill()


def test_exec_all_runs_on_every_host_with_rank_env(job_dir: Path) -> None:
    done = _regency(job_dir, "exec", "--all", "--", "sh", "-c", RANK)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0] 0/2", "[1] 1/2"]


def test_exec_default_is_all_and_reuses_the_job(job_dir: Path) -> None:
    before = [w.pid for w in job_load(job_dir / CACHE)._workers["hosts"]]  # type: ignore[attr-defined]
    done = _regency(job_dir, "exec", "--", "sh", "-c", "echo $PPID >/dev/null; echo hi")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0] hi", "[1] hi"]
    after = [w.pid for w in job_load(job_dir / CACHE)._workers["hosts"]]  # type: ignore[attr-defined]
    assert after == before, "exec reconnects to the cached workers, it does not start new ones"


def test_exec_one_and_point_select_hosts(job_dir: Path) -> None:
    one = _regency(job_dir, "exec", "--one", "--", "sh", "-c", RANK)
    assert (one.returncode, one.stdout) == (0, "[0] 0/2\n"), one.stderr
    point = _regency(job_dir, "exec", "--point", "hosts=1", "--", "sh", "-c", RANK)
    assert (point.returncode, point.stdout) == (0, "[1] 1/2\n"), point.stderr
    bad = _regency(job_dir, "exec", "--point", "gpus=0", "--", "true")
    assert bad.returncode == 2
    assert "has no dimension 'gpus'" in bad.stderr


def test_failing_command_status_names_the_ranks(job_dir: Path) -> None:
    done = _regency(
        job_dir, "exec", "--", "sh", "-c", "echo oops >&2; exit $((3 + REGENCY_RANK_HOSTS))"
    )
    assert done.returncode == 3, "the first non-zero status, in rank order"
    assert sorted(line for line in done.stderr.splitlines() if "oops" in line) == [
        "[0] oops",
        "[1] oops",
    ]
    assert "failed on 2 of 2 hosts: rank 0 (exit status 3), rank 1 (exit status 4)" in done.stderr
    partial = _regency(job_dir, "exec", "--", "sh", "-c", "exit $REGENCY_RANK_HOSTS")
    assert partial.returncode == 1
    assert "failed on 1 of 2 hosts: rank 1 (exit status 1)" in partial.stderr
    missing = _regency(job_dir, "exec", "--one", "--", "no-such-command-here")
    assert missing.returncode == 127
    assert "cannot run 'no-such-command-here'" in missing.stderr


def test_collect_prints_per_rank_at_the_end(job_dir: Path) -> None:
    done = _regency(job_dir, "exec", "--collect", "--", "sh", "-c", "echo a; echo b")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "=== [0] exit status 0 ===",
        "a",
        "b",
        "=== [1] exit status 0 ===",
        "a",
        "b",
    ]


def test_output_streams_while_the_commands_run(job_dir: Path) -> None:
    # Each host prints a line, then blocks on a FIFO of its own that only this test writes to:
    # the first lines must arrive while the commands still run, and each rank's lines in order.
    for rank in (0, 1):
        os.mkfifo(job_dir / f"go{rank}")
    script = f"echo first; read x < {job_dir}/go$REGENCY_RANK_HOSTS; seq 1 50"
    proc = subprocess.Popen(
        [sys.executable, "-m", "regency", "exec", "--", "sh", "-c", script],
        cwd=job_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        assert {lines.get(timeout=30), lines.get(timeout=30)} == {"[0] first\n", "[1] first\n"}
        assert proc.poll() is None
        for rank in (0, 1):
            with open(job_dir / f"go{rank}", "w") as fifo:
                fifo.write("go\n")
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    rest = [lines.get_nowait().rstrip("\n") for _ in range(lines.qsize())]
    for rank in (0, 1):
        mine = [line.split()[1] for line in rest if line.startswith(f"[{rank}] ")]
        assert mine == [str(i) for i in range(1, 51)]
    assert proc.stderr is not None
    proc.stderr.close()
    proc.stdout.close()


def test_no_cached_job_is_a_clear_error(tmp_path: Path) -> None:
    done = _regency(tmp_path, "exec", "--", "true")
    assert done.returncode == 2
    assert "no job cached at .regency/job_state.pkl" in done.stderr
    other = _regency(tmp_path, "exec", "--job", "elsewhere.pkl", "--", "true")
    assert "no job cached at elsewhere.pkl" in other.stderr
    kill = _regency(tmp_path, "kill")
    assert kill.returncode == 2
    assert "no job cached" in kill.stderr


def test_kill_leaves_no_process_and_no_cache(tmp_path: Path) -> None:
    job = _start_job(tmp_path)
    try:
        members = job_processes(job)
        # Two workers; a cached job's workers stop their zygotes when the controller that
        # started them exits, and wait bare for the next one.
        assert len(members) >= 2, "two workers"
        done = _regency(tmp_path, "kill")
        assert done.returncode == 0, done.stderr
        left = [pid for pid, started in members if _alive(pid, started)]
        assert not left, f"processes left after regency kill: {left}"
        assert not (tmp_path / CACHE).exists()
        after = _regency(tmp_path, "exec", "--", "true")
        assert after.returncode == 2
        assert "no job cached" in after.stderr
    finally:
        job.kill()
