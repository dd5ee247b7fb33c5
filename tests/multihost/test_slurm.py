"""SlurmJob on the real two-node test cluster (scripts/slurm_cluster.sh; skipped without it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from _worker_helpers import all_cmdlines

from regency.actor import Actor, endpoint
from regency.job import SlurmJob, job_load

pytestmark = pytest.mark.timeout(120)

# The workers start fresh interpreters that cannot import this test module: ship its actor
# classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Where(Actor):
    """Reports the Slurm node and job its proc runs in."""

    @endpoint
    def node(self) -> tuple[str, str]:
        return os.environ.get("SLURMD_NODENAME", "?"), os.environ.get("SLURM_JOB_ID", "?")


MakeJob = Callable[..., SlurmJob]


@pytest.fixture
def job_name() -> str:
    return f"rgy-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_job(slurm_cluster: Any, tmp_path: Path, job_name: str) -> Iterator[MakeJob]:
    """SlurmJobs with test defaults; whatever they (or cached copies) started is cancelled."""
    jobs: list[SlurmJob] = []

    def make(meshes: dict[str, int], **kwargs: Any) -> SlurmJob:
        kwargs.setdefault("port", 0)  # both test nodes are this machine: ports must differ
        kwargs.setdefault("log_dir", tmp_path / "slurm-logs")
        kwargs.setdefault("job_name", job_name)
        kwargs.setdefault("time_limit", 10)
        kwargs.setdefault("job_start_timeout", 60)
        job = SlurmJob(meshes, **kwargs)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.kill()
    subprocess.run(["scancel", "--name", job_name], capture_output=True, timeout=30, check=False)


def _jobs_named(name: str) -> dict[str, str]:
    """job id -> state of every job with this name that slurmctld still remembers."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "--name", name, "-o", "%i %T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return dict(line.split() for line in out.splitlines())


def _processes_of_job(job_id: str) -> list[int]:
    """Pids of live processes started by Slurm job ``job_id`` (by SLURM_JOB_ID in environ)."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if marker in environ and "State:\tZ" not in status:
            pids.append(int(entry))
    return pids


def _nodes_of(job_state: Any, mesh: str) -> list[tuple[str, str]]:
    procs = getattr(job_state, mesh).spawn_procs(per_host={"gpus": 1})
    try:
        where = procs.spawn("where", Where)
        return list(where.node.call().get(timeout=60).values())
    finally:
        procs.stop().get(timeout=30)


def test_actors_run_on_both_nodes(make_job: MakeJob, tmp_path: Path) -> None:
    job = make_job({"hosts": 2})
    start = time.monotonic()
    job_state = job.state(cached_path=tmp_path / "job.pkl")
    assert job.job_id is not None
    nodes = _nodes_of(job_state, "hosts")
    print(f"\nSlurmJob: submit to first reply from both nodes {time.monotonic() - start:.2f}s")
    assert sorted(n for n, _ in nodes) == ["node1", "node2"]
    assert {j for _, j in nodes} == {job.job_id}
    # The secret travelled through the environment, on no command line.
    assert job.secret.hex() not in all_cmdlines()
    assert job.secret.hex() not in job.batch_script()
    assert all(job.secret.hex() not in arg for arg in job.sbatch_args())


def test_meshes_split_the_allocation_by_node(make_job: MakeJob, tmp_path: Path) -> None:
    job = make_job({"trainers": 1, "servers": 1})
    job_state = job.state(cached_path=tmp_path / "job.pkl")
    (trainer,) = _nodes_of(job_state, "trainers")
    (server,) = _nodes_of(job_state, "servers")
    assert {trainer[0], server[0]} == {"node1", "node2"}
    assert trainer[1] == server[1] == job.job_id  # one allocation
    assert len(_jobs_named(job.job_name)) == 1
    with pytest.raises(AttributeError, match="trainers"):
        _ = job_state.nonexistent


def test_kill_cancels_the_job_and_leaves_no_worker(make_job: MakeJob, tmp_path: Path) -> None:
    job = make_job({"hosts": 2})
    procs = job.state(cached_path=tmp_path / "job.pkl").hosts.spawn_procs(per_host={"gpus": 2})
    job_id = job.job_id
    assert job_id is not None
    assert len(procs.spawn("where", Where).node.call().get(timeout=60)) == 4
    assert len(_processes_of_job(job_id)) >= 2 + 4  # a worker on each node and its procs
    job.kill()
    assert _processes_of_job(job_id) == []
    assert _jobs_named(job.job_name).get(job_id, "CANCELLED") == "CANCELLED"
    job.kill()  # idempotent


def test_state_reuses_the_cached_allocation(make_job: MakeJob, tmp_path: Path) -> None:
    cache = tmp_path / "job.pkl"
    first = make_job({"hosts": 2})
    first.state(cached_path=cache)
    job_id = first.job_id
    assert job_id is not None

    # A second script run with the same spec reconnects: same job, no new sbatch.
    again = make_job({"hosts": 2})
    nodes = _nodes_of(again.state(cached_path=cache), "hosts")
    assert {j for _, j in nodes} == {job_id}
    assert list(_jobs_named(first.job_name)) == [job_id]
    assert job_load(cache).job_id == job_id

    # A different spec kills the cached job and submits a new one.
    other = make_job({"hosts": 1})
    ((_, new_id),) = _nodes_of(other.state(cached_path=cache), "hosts")
    jobs = _jobs_named(first.job_name)
    assert new_id != job_id
    assert jobs[new_id] == "RUNNING"
    assert jobs.get(job_id, "CANCELLED") == "CANCELLED"
    assert _processes_of_job(job_id) == []
    assert job_load(cache).job_id == new_id


def test_job_start_timeout_cancels_the_job(make_job: MakeJob, tmp_path: Path) -> None:
    # --begin holds the job in the queue (reason BeginTime) past the timeout.
    job = make_job({"hosts": 1}, slurm_args=("--begin=now+3600",), job_start_timeout=2)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not start within job_start_timeout=2s") as info:
        job.state(cached_path=tmp_path / "job.pkl")
    assert time.monotonic() - start < 20
    assert "PENDING" in str(info.value)
    assert "BeginTime" in str(info.value)
    assert "cancelled" in str(info.value)
    (state,) = _jobs_named(job.job_name).values()
    assert state == "CANCELLED"
    assert not (tmp_path / "job.pkl").exists()


def test_job_that_fails_to_start_workers_reports_why(make_job: MakeJob, tmp_path: Path) -> None:
    job = make_job({"hosts": 1}, python_exe="/nonexistent/python3")
    with pytest.raises(RuntimeError, match=r"ended before its workers listened") as info:
        job.state(cached_path=tmp_path / "job.pkl")
    assert "/nonexistent/python3" in str(info.value)


def test_submission_without_a_cluster_needs_nothing() -> None:
    """The sbatch command line and script are plain data: checked without Slurm."""
    job = SlurmJob(
        {"a": 2, "b": 1},
        port=0,
        time_limit="1:00:00",
        partition="gpu",
        exclusive=True,
        gpus_per_node=8,
        cpus_per_task=4,
        mem="16G",
        account="acct",
        qos="high",
        slurm_args=("--constraint=h100",),
        log_dir="/shared/logs",
    )
    args = job.sbatch_args()
    for expected in (
        "--nodes=3",
        "--time=1:00:00",
        "--partition=gpu",
        "--exclusive",
        "--gpus-per-node=8",
        "--cpus-per-task=4",
        "--mem=16G",
        "--account=acct",
        "--qos=high",
        "--export=ALL",
        "--output=/shared/logs/regency-%j.batch.out",
    ):
        assert expected in args
    assert args[-1] == "--constraint=h100"  # the user's arguments come last and win
    script = job.batch_script()
    assert "a=0-1 b=2-2" in script
    assert "--ntasks=3" in script
    assert "tcp://0.0.0.0:0" in script
    assert job.secret.hex() not in script + " ".join(args)
    with pytest.raises(ValueError, match="positive"):
        SlurmJob({"a": 0})
    with pytest.raises(ValueError, match="identifier"):
        SlurmJob({"a-b": 1})
