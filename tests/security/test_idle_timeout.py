"""Issue 12 §5: workers of a ProcessJob whose controller never comes back exit by themselves.

A script that crashes before ``job.kill()`` used to leave its workers (and their procs) running
for good; now a worker exits once no controller has been attached for its idle timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _worker_helpers import kill_and_check

from regency.actor import Actor, endpoint
from regency.job import ProcessJob, worker_command
from regency.job._process import DEFAULT_IDLE_TIMEOUT, _alive, _wait_gone

pytestmark = pytest.mark.timeout(90)

IDLE = 2.0
MARGIN = 20.0  # the worker stops its procs (up to their stop timeout), then exits

CRASHING = """
import json, os, sys
from regency.actor import Actor, endpoint
from regency.job import ProcessJob
from regency.job._process import _group_members

class Pid(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

job = ProcessJob({"hosts": 1}, idle_timeout=float(sys.argv[1]))
# Cached, so the worker waits for a re-run (an uncached one would exit with its controller).
hosts = job.state(cached_path=sys.argv[2]).hosts
procs = hosts.spawn_procs()
proc_pid = procs.spawn("pid", Pid).pid.call_one().get(timeout=30)
(worker,) = job._workers["hosts"]
# Taken before the crash: once the controller is gone its worker stops the procs at once.
members = _group_members(worker.pid)
print(json.dumps({"worker": [worker.pid, worker.started], "proc": proc_pid,
                  "members": members}), flush=True)
os._exit(3)  # crash: no job.kill(), no proc stop
"""


class Ping(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


def test_default_is_documented() -> None:
    assert DEFAULT_IDLE_TIMEOUT == 600.0
    assert "idle_timeout" in (ProcessJob.__doc__ or "")
    assert worker_command("tcp://127.0.0.1:0", idle_timeout=5)[-2:] == ["--idle-timeout", "5"]
    with pytest.raises(ValueError, match="idle_timeout"):
        ProcessJob({"hosts": 1}, idle_timeout=0)


def test_workers_of_a_crashed_controller_exit_after_the_idle_timeout(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    done = subprocess.run(
        [sys.executable, str(script), str(IDLE), str(tmp_path / "job.pkl")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    pid, started = found["worker"]
    members = [tuple(m) for m in found["members"]]  # the worker, its zygote and its procs
    assert any(p == found["proc"] for p, _ in members), members
    try:
        assert _wait_gone(pid, started, IDLE + MARGIN), "the orphaned worker is still running"
        for member, member_started in members:
            assert _wait_gone(member, member_started, 10), f"process {member} outlived it"
    finally:
        for member, member_started in members:
            if _alive(member, member_started):
                os.kill(member, 9)


def test_an_attached_controller_keeps_its_workers() -> None:
    job = ProcessJob({"hosts": 1}, idle_timeout=IDLE)
    try:
        hosts = job.state(cached_path=None).hosts
        (worker,) = job._workers["hosts"]
        assert not _wait_gone(worker.pid, worker.started, 2 * IDLE), "it exited while attached"
        procs = hosts.spawn_procs()
        assert procs.spawn("ping", Ping).ping.call_one().get(timeout=30) == "pong"
        procs.stop().get(timeout=30)
    finally:
        kill_and_check(job)


def test_worker_daemon_idle_timeout_option() -> None:
    env = {**os.environ, "REGENCY_JOB_SECRET": os.urandom(32).hex()}
    done = subprocess.run(
        worker_command("tcp://127.0.0.1:0", idle_timeout=IDLE),
        env=env,
        capture_output=True,
        text=True,
        timeout=IDLE + MARGIN,
        check=False,
    )
    assert done.returncode == 0, done
    assert "idle timeout" in done.stderr, done.stderr
    bad = subprocess.run(
        [*worker_command("tcp://127.0.0.1:0"), "--idle-timeout", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 2
    assert "--idle-timeout must be > 0" in bad.stderr
