"""Host lifecycle as Monarch has it (issue 18, items 8, 10 and 13), on ProcessJob hosts.

``HostMesh.shutdown()`` ends the worker daemons (Monarch: "worker loops exit"); only the owned
mesh may do it; the mesh is unusable afterwards; ``async with hosts:`` runs it.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Iterator

import pytest
from _worker_helpers import (
    Failures,
    Probe,
    job_processes,
    kill_and_check,
    raw_worker,
    wait_gone,
)

from regency.actor import HostMesh, this_host
from regency.job import ProcessJob, attach_to_workers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


def hosts_of(job: ProcessJob) -> HostMesh:
    return job.state(cached_path=None).hosts


def test_shutdown_ends_the_worker_daemons(job: ProcessJob, failures: Failures) -> None:
    hosts = hosts_of(job)
    probes = hosts.spawn_procs(per_host={"gpus": 1}).spawn("probes", Probe)
    assert len(probes.where.call().get(timeout=30)) == 2
    members = job_processes(job)  # the workers, their zygotes and procs
    assert len(members) >= 4
    hosts.shutdown().get(timeout=60)
    for pid, started in members:  # a worker is done once it hung up; then its process exits
        wait_gone(pid, started, timeout=10)
    assert not job._running()
    assert failures.seen == [], "a shutdown is not a failure"


def test_a_shut_down_mesh_cannot_be_used(job: ProcessJob) -> None:
    hosts = hosts_of(job)
    hosts.shutdown().get(timeout=60)
    for use in (
        lambda: hosts.spawn_procs(per_host={"gpus": 1}),
        lambda: hosts.slice(hosts=0).spawn_procs(),
        hosts.stop,
        hosts.shutdown,
    ):
        with pytest.raises(RuntimeError, match=r"^HostMesh has already been shut down$"):
            use()


def test_only_the_owned_mesh_shuts_down(job: ProcessJob) -> None:
    hosts = hosts_of(job)
    for reference in (hosts.slice(hosts=0), this_host()):
        with pytest.raises(
            RuntimeError,
            match=r"^cannot shut down `HostMesh` that is a reference instead of owned$",
        ):
            reference.shutdown()
    with pytest.raises(
        RuntimeError, match=r"^cannot stop `HostMesh` that is a reference instead of owned$"
    ):
        hosts.slice(hosts=1).stop()
    # Refused requests left the hosts serving.
    probes = hosts.spawn_procs(per_host={"gpus": 1}).spawn("probes", Probe)
    assert len(probes.value.call(1).get(timeout=30)) == 2


def test_stop_drains_only_the_procs_spawned_through_that_mesh(job: ProcessJob) -> None:
    first, second = hosts_of(job), hosts_of(job)  # two attachments to the same workers
    assert first is not second
    ones = first.spawn_procs(per_host={"gpus": 1}).spawn("ones", Probe)
    twos = second.spawn_procs(per_host={"gpus": 1}).spawn("twos", Probe)
    pids_one = [w["pid"] for w in ones.where.call().get(timeout=30).values()]
    pids_two = [w["pid"] for w in twos.where.call().get(timeout=30).values()]
    first.stop().get(timeout=60)
    for pid in pids_one:
        wait_gone(pid, timeout=10)
    assert [w["pid"] for w in twos.where.call().get(timeout=30).values()] == pids_two
    second.stop().get(timeout=60)
    for pid in pids_two:
        wait_gone(pid, timeout=10)


def test_an_actor_spawns_on_its_host_picked_by_rank_from_this_host(job: ProcessJob) -> None:
    workers = job._worker_addresses()["hosts"]
    spawners = hosts_of(job).spawn_procs().spawn("spawners", Probe)
    outer = {w["pid"] for w in spawners.where.call().get(timeout=30).values()}
    nested = spawners.spawn_by_host_rank.call(2).get(timeout=60)
    for rank in range(2):
        where = nested.item(hosts=rank).where.call().get(timeout=30)
        assert [w["host"] for w in where.values()] == [workers[rank]] * 2
        assert not outer & {w["pid"] for w in where.values()}, "new procs, not the spawners"


def test_async_with_shuts_the_hosts_down(job: ProcessJob) -> None:
    hosts = hosts_of(job)
    members = job_processes(job)

    async def main() -> int:
        async with hosts:
            probes = hosts.spawn_procs(per_host={"gpus": 1}).spawn("probes", Probe)
            values = await probes.value.call(2)
        return sum(v for _, v in values.items())

    assert asyncio.run(main()) == 2 * 1 + 2 * 2
    for pid, started in members:
        wait_gone(pid, started, timeout=10)

    async def again() -> None:
        async with hosts:
            pass

    with pytest.raises(RuntimeError, match="already been shut down"):
        asyncio.run(again())


def test_kill_after_shutdown_and_kill_in_a_loop_say_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = ProcessJob({"hosts": 1}), ProcessJob({"hosts": 1})
    try:
        hosts_of(first).shutdown().get(timeout=60)

        async def main() -> None:
            probes = hosts_of(second).spawn_procs(per_host={"gpus": 1}).spawn("p", Probe)
            await probes.value.call(1)
            second.kill()  # synchronous by contract, also inside a coroutine

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            first.kill()
            asyncio.run(main())
        assert [r.getMessage() for r in caplog.records if r.name == "regency.job"] == []
    finally:
        first.kill()
        second.kill()


def test_shutdown_of_an_attached_worker_exits_it_with_code_0() -> None:
    secret = b"s" * 32
    with raw_worker(secret) as worker:
        hosts = attach_to_workers([worker.address], secret=secret)
        probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
        assert len(probes.value.call(1).get(timeout=30)) == 2
        hosts.shutdown().get(timeout=60)
        assert worker.proc.wait(30) == 0


UNTIL_SHUTDOWN = """
from regency.actor import run_worker_loop_until_shutdown
run_worker_loop_until_shutdown(address="tcp://127.0.0.1:0", ca="trust_all_connections")
print("the worker loop returned", flush=True)
"""


def test_run_worker_loop_until_shutdown_returns_when_the_host_mesh_shuts_down() -> None:
    secret = b"u" * 32
    argv = [sys.executable, "-c", UNTIL_SHUTDOWN]
    with raw_worker(secret, argv=argv) as worker:
        hosts = attach_to_workers([worker.address], secret=secret)
        probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
        assert len(probes.value.call(1).get(timeout=30)) == 2
        hosts.shutdown().get(timeout=60)
        assert worker.proc.wait(30) == 0
        assert worker.proc.stdout is not None
        assert worker.proc.stdout.read().decode() == "the worker loop returned\n"
