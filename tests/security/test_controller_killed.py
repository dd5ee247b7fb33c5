"""A SIGKILLed controller leaves nothing running on its hosts beyond what may serve a re-run.

When the controller goes, each worker stops the procs it started for it and its zygote within
seconds (docs/multihost.md, "When the controller goes"). A ``ProcessJob`` whose ``state()`` had
no cache, so that no later run can find its workers, loses its worker daemons too; one with a
cache keeps the bare daemons for a re-run to reconnect; a ``regency worker`` daemon serves the
next controller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import kill_group, raw_worker

from regency.actor import Actor, endpoint
from regency.job import attach_to_workers
from regency.job._process import _alive, _group_members
from regency.job._trait import job_load

pytestmark = pytest.mark.timeout(120)

GONE_WITHIN = 8.0  # procs stop in 1 s (then SIGKILL), the zygote at once; the rest is load

CONTROLLER = """
import json, os, sys, time
from regency.actor import Actor, endpoint
from regency.job import ProcessJob, attach_to_workers
from regency.job._process import _group_members

class Pid(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

mode, where = sys.argv[1], sys.argv[2]
if mode == "worker":
    hosts = attach_to_workers([where], secret=bytes.fromhex(os.environ["SECRET"]))
    worker_pid = int(sys.argv[3])
else:
    job = ProcessJob({"hosts": 1})
    hosts = job.state(cached_path=where if mode == "cached" else None).hosts
    (worker,) = job._workers["hosts"]
    worker_pid = worker.pid
procs = hosts.spawn_procs(per_host={"gpus": 2})
pids = sorted(procs.spawn("pid", Pid).pid.call().get(timeout=60).values())
print(json.dumps({"worker": worker_pid, "procs": pids,
                  "members": _group_members(worker_pid)}), flush=True)
time.sleep(600)  # until SIGKILLed
"""


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _run_and_kill(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    silence: float = 0.0,
) -> dict:  # type: ignore[type-arg]
    """Run the controller script until it reports its processes, then SIGKILL it; with
    ``silence``, SIGSTOP it first and give its workers that long to notice it fell silent."""
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    controller = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
    )
    try:
        assert controller.stdout is not None
        line = controller.stdout.readline().decode()
        assert line, controller.stderr.read().decode() if controller.stderr else ""
        found: dict = json.loads(line)  # type: ignore[type-arg]
        if silence:
            controller.send_signal(signal.SIGSTOP)
            members = [tuple(m) for m in found["members"]]
            found["left_while_stopped"] = _left(
                [m for m in members if m[0] != found["worker"]], silence
            )
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait(10)
        for pipe in (controller.stdout, controller.stderr):
            if pipe is not None:
                pipe.close()
    found["members"] = [tuple(m) for m in found["members"]]
    return found


def _left(members: list[tuple[int, int]], timeout: float) -> list[int]:
    """The pids of ``members`` still alive once ``timeout`` has passed (or none is)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, started in members if _alive(pid, started)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _zygotes(members: list[tuple[int, int]], found: dict) -> list[tuple[int, int]]:  # type: ignore[type-arg]
    return [m for m in members if m[0] != found["worker"] and m[0] not in found["procs"]]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Process groups to SIGKILL at teardown, whatever the test saw."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        kill_group(pgid)


def test_uncached_process_job_leaves_nothing(tmp_path: Path, leftovers: list[int]) -> None:
    found = _run_and_kill(tmp_path, "uncached", "-")
    leftovers.append(found["worker"])
    members = found["members"]
    assert {p for p, _ in members} >= {found["worker"], *found["procs"]}
    assert _zygotes(members, found), f"no zygote among {members}"
    assert _left(members, GONE_WITHIN) == [], "processes outlived the killed controller"


def test_a_silent_controller_is_noticed_by_missed_heartbeats(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """A stopped controller keeps its connections open: the worker notices the silence after
    ``heartbeat_timeout`` (5 s) and cleans up as for a killed one."""
    found = _run_and_kill(tmp_path, "uncached", "-", silence=5.0 + GONE_WITHIN)
    leftovers.append(found["worker"])
    assert found["left_while_stopped"] == [], "procs or zygote outlived the silent controller"


def test_cached_process_job_keeps_only_the_bare_worker_for_a_rerun(
    tmp_path: Path, leftovers: list[int]
) -> None:
    cache = tmp_path / "job.pkl"
    found = _run_and_kill(tmp_path, "cached", str(cache))
    worker = found["worker"]
    leftovers.append(worker)
    members = found["members"]
    zygotes = _zygotes(members, found)
    assert zygotes, f"no zygote among {members}"
    others = [m for m in members if m[0] != worker]
    assert _left(others, GONE_WITHIN) == [], "procs or zygote outlived the killed controller"
    assert [p for p, _ in _group_members(worker)] == [worker], "only the worker is left"
    # A re-run reconnects through the cache: the same worker, a fresh zygote, new procs.
    again = _run_and_kill(tmp_path, "cached", str(cache))
    assert again["worker"] == worker
    assert set(again["procs"]).isdisjoint(found["procs"])
    fresh = _zygotes(again["members"], again)
    assert fresh, f"no zygote among {again['members']}"
    assert not set(fresh) & set(zygotes), (fresh, zygotes)
    job_load(cache).kill()
    assert _left(again["members"], GONE_WITHIN) == [], "kill() left processes"


def test_worker_daemon_cleans_up_and_serves_the_next_controller(tmp_path: Path) -> None:
    secret = os.urandom(32)
    with raw_worker(secret) as worker:
        pid = worker.proc.pid
        found = _run_and_kill(
            tmp_path, "worker", worker.address, str(pid), env={"SECRET": secret.hex()}
        )
        members = found["members"]
        zygotes = _zygotes(members, found)
        assert zygotes, f"no zygote among {members}"
        others = [m for m in members if m[0] != pid]
        assert _left(others, GONE_WITHIN) == [], "procs or zygote outlived the killed controller"
        worker.wait_for_log("waiting for the next controller", GONE_WITHIN)
        assert worker.proc.poll() is None, "the daemon must keep serving"
        hosts = attach_to_workers([worker.address], secret=secret)
        try:
            procs = hosts.spawn_procs()
            proc = procs.spawn("pid", Pid).pid.call_one().get(timeout=60)
            fresh = _zygotes(_group_members(pid), {"worker": pid, "procs": [proc]})
            assert fresh, "no zygote for the next controller"
            assert not set(fresh) & set(zygotes), (fresh, zygotes)
        finally:
            hosts.shutdown().get(timeout=60)
