"""ProcessJob's state cache: a second controller process reconnects; kill() leaves nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _worker_helpers import job_processes, kill_and_check

from regency.job import ProcessJob, job_load

pytestmark = pytest.mark.timeout(120)

# A controller script: its actor class lives in its own __main__, so it reaches the worker hosts
# by value (cloudpickle), not by import.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from regency.actor import Actor, current_rank, endpoint
    from regency.job import ProcessJob

    class Greeter(Actor):
        def __init__(self, greeting):
            self.greeting = greeting

        @endpoint
        def greet(self):
            return f"{self.greeting} from {current_rank().rank} in {os.getpid()}"

    job = ProcessJob({"hosts": 2})
    state = job.state(cached_path=sys.argv[1])
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    greeters = procs.spawn("greeters", Greeter, sys.argv[2])
    replies = [v for _, v in greeters.greet.call().get(timeout=30).items()]
    workers = [w.pid for w in job._workers["hosts"]]
    print(json.dumps({"workers": workers, "replies": replies}), flush=True)
    """
)


def _run(script: Path, cache: Path, greeting: str) -> dict[str, list]:
    done = subprocess.run(
        [sys.executable, str(script), str(cache), greeting],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_second_run_reconnects_and_kill_leaves_nothing(tmp_path: Path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "state" / "job.pkl"
    try:
        first = _run(script, cache, "hello")
        assert stat.S_IMODE(cache.stat().st_mode) == 0o600
        second = _run(script, cache, "again")
    except BaseException:
        if cache.exists():
            job_load(cache).kill()
        raise
    job = job_load(cache)
    assert isinstance(job, ProcessJob)
    _check_runs(first, second, job)


def _check_runs(first: dict[str, list], second: dict[str, list], job: ProcessJob) -> None:
    try:
        _check_replies(first, second, job)
    finally:
        log_dir = job.log_dir
        # Two workers (their zygotes end, within seconds, with the controller that started them).
        assert len(job_processes(job)) >= 2, "two workers"
        kill_and_check(job)
        job.kill()  # idempotent
    assert not job._running()
    assert log_dir is not None
    assert not Path(log_dir).exists()


def _check_replies(first: dict[str, list], second: dict[str, list], job: ProcessJob) -> None:
    assert second["workers"] == first["workers"], "the second run reuses the running workers"
    for run, greeting in ((first, "hello"), (second, "again")):
        assert [r.split(" from ")[0] for r in run["replies"]] == [greeting] * 4
        assert [int(r.split()[-3]) for r in run["replies"]] == [0, 1, 2, 3]
    pids = {int(r.split()[-1]) for r in first["replies"] + second["replies"]}
    assert len(pids) == 8, "each run had procs of its own"
    assert all(os.getpid() != p for p in pids)
    assert job._running()
    assert job.log_dir is not None
    assert Path(job.log_dir).is_dir()


def test_a_different_spec_replaces_the_cached_job(tmp_path: Path) -> None:
    cache = tmp_path / "job.pkl"
    old = ProcessJob({"hosts": 1})
    old.state(cached_path=cache)
    old_worker = old._workers["hosts"][0]
    try:
        new = ProcessJob({"hosts": 1}, env={"FLAVOUR": "new"})
        new.state(cached_path=cache)
        try:
            assert not old._running(), "the cached job that cannot serve the new spec is killed"
            assert new._workers["hosts"][0].pid != old_worker.pid
            assert isinstance(job_load(cache), ProcessJob)
            assert job_load(cache).env == {"FLAVOUR": "new"}  # type: ignore[attr-defined]
        finally:
            new.kill()
    finally:
        old.kill()
