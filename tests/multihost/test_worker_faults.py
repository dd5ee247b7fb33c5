"""Hosts that die or fall silent: their ranks fail through supervision, other hosts serve on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from _worker_helpers import (
    Failures,
    Probe,
    host_processes,
    kill_and_check,
    stop_processes,
    wait_gone,
)

from regency import config
from regency.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host
from regency.job import ProcessJob
from regency.shape import Shape, Slice

pytestmark = pytest.mark.timeout(120)


class Owner(Actor):
    """Spawns procs on another host (from its own proc) and records its failures."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    @endpoint
    def spawn_on(self, host: int) -> list[int]:
        there = Shape(["hosts"], Slice(offset=host, sizes=[1], strides=[1]))
        procs = this_host()._new_with_shape(there).spawn_procs(per_host={"gpus": 1})
        self.probes = procs.spawn("owned", Probe)
        pids = self.probes.where.call().get(timeout=30)
        return [int(v["pid"]) for _, v in pids.items()]  # type: ignore[call-overload]

    @endpoint
    def seen(self) -> list[str]:
        return list(self.failures)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        return True


@pytest.fixture
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    yield job
    kill_and_check(job)


def test_worker_killed_mid_call_fails_its_ranks_only(job: ProcessJob, failures: Failures) -> None:
    hosts = job.state(cached_path=None).hosts
    lost = job._worker_addresses()["hosts"][1]
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    probes = procs.spawn("probes", Probe)
    probes.value.call(1).get(timeout=30)
    doomed = host_processes(job, "hosts", 1)
    pending = probes.slice(hosts=1).sleep.call(60)
    os.kill(job._workers["hosts"][1].pid, signal.SIGKILL)  # the daemon only: procs follow it
    with pytest.raises(SupervisionError) as info:
        pending.get(timeout=30)
    message = str(info.value)
    assert f"its host {lost} was lost" in message, message
    assert "at ranks [2, 3]" in message, message
    assert "probes.sleep()" in message
    # The other host keeps serving, and its procs are untouched.
    assert [v for _, v in probes.slice(hosts=0).value.call(1).get(timeout=30).items()] == [1, 2]
    for pid, started in doomed:
        wait_gone(pid, started)  # the dead worker's procs die with it
    with pytest.raises(SupervisionError, match=r"rank [23]"):
        probes.value.call(1).get(timeout=30)
    seen = failures.wait_for(2)
    assert any("crashed_ranks=[2]" in f for f in seen), seen
    assert any("crashed_ranks=[3]" in f for f in seen), seen
    assert all(lost in f for f in seen), seen


def test_stopped_host_is_declared_lost_within_the_heartbeat_timeout(
    job: ProcessJob, failures: Failures
) -> None:
    with config.configured(heartbeat_interval=0.25, heartbeat_timeout=1.5):
        hosts = job.state(cached_path=None).hosts
        lost = job._worker_addresses()["hosts"][1]
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        probes = procs.spawn("probes", Probe)
        probes.value.call(1).get(timeout=30)
        silent = host_processes(job, "hosts", 1)
        assert len(silent) >= 2, "the worker, its zygote and its proc"
        stop_processes([pid for pid, _ in silent])  # stopped, not closed: no FIN, no RST
        start = time.monotonic()
        pending = probes.slice(hosts=1).value.call(1)
        with pytest.raises(SupervisionError) as info:
            pending.get(timeout=30)
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert f"its host {lost} was lost" in message, message
        assert f"no heartbeat from {lost}" in message, message
        assert elapsed < 1.5 + 0.25 + 2.5, f"declared lost after {elapsed:.2f} s"
        assert probes.slice(hosts=0).value.call_one(5).get(timeout=30) == 5
        assert "crashed_ranks=[1]" in failures.wait_for(1)[0]


def test_stopped_host_is_found_by_a_proc_that_owns_procs_there(job: ProcessJob) -> None:
    """Procs send no heartbeats, except to a host agent they dial themselves: an actor that
    spawned procs on another host hears of that host falling silent within the timeout."""
    with config.configured(heartbeat_interval=0.25, heartbeat_timeout=1.5):
        hosts = job.state(cached_path=None).hosts
        lost = job._worker_addresses()["hosts"][1]
        owner = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("owner", Owner)
        owner = owner.slice(gpus=0)
        owned = owner.spawn_on.call_one(1).get(timeout=60)
        silent = host_processes(job, "hosts", 1)
        assert {pid for pid, _ in silent} >= set(owned), "the owned proc runs on host 1"
        stop_processes([pid for pid, _ in silent])  # stopped, not closed: no FIN, no RST
        start = time.monotonic()
        while not (seen := owner.seen.call_one().get(timeout=30)):
            assert time.monotonic() - start < 30, "the owner never heard of the stopped host"
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        assert f"its host {lost} was lost" in seen[0], seen
        assert f"no heartbeat from {lost}" in seen[0], seen
        assert elapsed < 1.5 + 0.25 + 2.5, f"heard after {elapsed:.2f} s"
