"""The actor API across ProcessJob hosts: each host a worker daemon in its own process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _worker_helpers import Probe, kill_and_check

from regency.actor import this_host
from regency.job import JobState, LocalJob, ProcessJob

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


@pytest.fixture(scope="module")
def hosts(job: ProcessJob) -> list[str]:
    return job._worker_addresses()["hosts"]


def test_spawn_call_values_per_rank(job: ProcessJob, hosts: list[str]) -> None:
    procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
    assert procs.sizes == {"hosts": 2, "gpus": 2}
    probes = procs.spawn("probes", Probe)
    found = probes.where.call().get(timeout=30)
    for point, where in found.items():
        assert where["rank"] == {"hosts": point["hosts"], "gpus": point["gpus"]}
        assert where["host"] == hosts[point["hosts"]], "this_host() is the worker's host"
    pids = [w["pid"] for w in found.values()]
    assert len(set(pids)) == 4
    assert os.getpid() not in pids
    values = probes.value.call(10).get(timeout=30)
    assert [v for _, v in values.items()] == [10, 20, 30, 40]
    # Ranks are relative to the slice a message is cast to.
    host1 = probes.slice(hosts=1)
    assert [v for _, v in host1.value.call(1).get(timeout=30).items()] == [1, 2]
    assert probes.slice(hosts=1, gpus=1).value.call_one(2).get(timeout=30) == 2
    assert {w["pid"] for w in host1.where.call().get(timeout=30).values()} == set(pids[2:])
    procs.stop().get(timeout=30)


def test_broadcast_then_call_keeps_order(job: ProcessJob) -> None:
    procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 1})
    probes = procs.spawn("sleepy", Probe)
    probes.sleep.broadcast(0.2)
    # A call after a broadcast from the same sender is handled after it, on every host.
    assert len(probes.value.call(1).get(timeout=30)) == 2
    procs.stop().get(timeout=30)


def test_ping_pong_between_hosts_and_back_to_this_host(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    procs = state.hosts.spawn_procs(per_host={"gpus": 1})
    local = this_host().spawn_procs().spawn("local", Probe)
    far = procs.slice(hosts=1).spawn("far", Probe, local)
    near = procs.slice(hosts=0).spawn("near", Probe, far)
    chain = near.ping.call_one(3).get(timeout=30)
    pids = {
        "near": near.where.call_one().get(timeout=30)["pid"],
        "far": far.where.call_one().get(timeout=30)["pid"],
        "local": local.where.call_one().get(timeout=30)["pid"],
    }
    # near (host 0) -> far (host 1) -> local (the controller's machine, through its gateway).
    assert chain == [pids["near"], pids["far"], pids["local"]]
    procs.stop().get(timeout=30)


def test_actor_spawns_procs_on_its_own_host(job: ProcessJob, hosts: list[str]) -> None:
    procs = job.state(cached_path=None).hosts.spawn_procs()
    probe = procs.slice(hosts=1).spawn("spawner", Probe)
    inner = probe.spawn_on_my_host.call_one().get(timeout=30)
    assert inner["host"] == hosts[1]
    assert inner["pid"] != probe.where.call_one().get(timeout=30)["pid"]
    procs.stop().get(timeout=30)


def test_job_state_names_its_meshes(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    assert isinstance(state, JobState)
    with pytest.raises(AttributeError, match=r"no mesh named 'workers'.*\['hosts'\]"):
        _ = state.workers


def test_local_job_is_this_host() -> None:
    job = LocalJob(hosts=("a", "b"))
    state = job.state(cached_path=None)
    for name in ("a", "b"):
        probe = getattr(state, name).spawn_procs().spawn(f"local_{name}", Probe)
        assert probe.where.call_one().get(timeout=30)["host"] == next(iter(this_host()._agents()))
    job.kill()
