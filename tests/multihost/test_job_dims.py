"""A job's host mesh keeps its ``hosts`` dimension; one host seen from inside has none.

As observed on Monarch 0.7.0 with two workers attached by ``attach_to_workers``: the host mesh
is ``{hosts: 2}``, ``spawn_procs`` adds ``per_host``'s dimensions after it (repeating ``hosts``
is a ``ValueError``), and ``this_host()`` / ``host_mesh`` of one proc are 0-dimensional.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _worker_helpers import kill_and_check

from regency.actor import Actor, context, endpoint, this_host
from regency.job import LocalJob, ProcessJob

pytestmark = pytest.mark.timeout(120)

T = 30.0


class Dims(Actor):
    """Reports the dimensions an actor on a job's host sees."""

    @endpoint
    def dims(self) -> dict[str, Any]:
        inst = context().actor_instance
        return {
            "rank": dict(inst.rank),
            "this_host": this_host().sizes,
            "proc_host": inst.proc.host_mesh.sizes,
        }


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


def test_job_host_mesh_keeps_its_hosts_dimension(job: ProcessJob) -> None:
    hosts = job.state(cached_path=None).hosts
    assert hosts.sizes == {"hosts": 2}
    assert hosts.slice(hosts=1).sizes == {}
    with pytest.raises(
        ValueError, match=r"per_host labels \['hosts'\] overlap with host labels \('hosts',\)"
    ):
        hosts.spawn_procs(per_host={"hosts": 2})
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        assert procs.sizes == {"hosts": 2, "gpus": 2}
        assert procs.slice(hosts=1, gpus=0).host_mesh.sizes == {}
        found = procs.spawn("dims", Dims).dims.call().get(timeout=T)
        assert found.sizes == {"hosts": 2, "gpus": 2}
        for point, got in found:
            assert got["rank"] == dict(point)
            assert got["this_host"] == got["proc_host"] == {}
    finally:
        procs.stop().get(timeout=T)


def test_local_job_meshes_are_this_host() -> None:
    job = LocalJob(hosts=("a",))
    try:
        assert job.state(cached_path=None).a.sizes == {}
    finally:
        job.kill()
