"""monarch.job: LocalJob and ProcessJob (monarch-api.md §1.3)."""

from __future__ import annotations

import os
import pickle
import sys

import pytest
from compat_impl import IMPL, actor, job
from compat_util import CALL_TIMEOUT

Actor = actor.Actor
endpoint = actor.endpoint


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, dict[str, int]]:
        return os.getpid(), dict(actor.current_rank())


def test_default_job_path_names_the_cache_file():
    assert job.DEFAULT_JOB_PATH.endswith("/job_state.pkl")


@pytest.mark.deviation("regency's job cache lives under .regency/", skip="regency")
def test_default_job_path_is_dot_monarch():
    assert job.DEFAULT_JOB_PATH == ".monarch/job_state.pkl"


def test_job_exports():
    for name in (
        "JobTrait",
        "JobState",
        "LocalJob",
        "ProcessJob",
        "SlurmJob",
        "job_load",
        "job_loads",
        "exec_command",
    ):
        assert hasattr(job, name), name
    assert issubclass(job.LocalJob, job.JobTrait)
    assert issubclass(job.ProcessJob, job.JobTrait)


def test_local_job_mesh_is_this_host():
    state = job.LocalJob().state(cached_path=None)
    hosts = state.hosts
    assert hosts.sizes == {}
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("lj", Where)
        vm = mesh.where.call().get(timeout=CALL_TIMEOUT)
        assert [r for _, r in vm.values()] == [{"gpus": 0}, {"gpus": 1}]
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_local_job_named_meshes():
    state = job.LocalJob(hosts=("trainers", "evals")).state(cached_path=None)
    assert state.trainers.sizes == {}
    assert state.evals.sizes == {}


def test_local_job_unknown_mesh_is_attribute_error():
    state = job.LocalJob().state(cached_path=None)
    with pytest.raises(AttributeError, match="nope"):
        state.nope


def test_local_job_pickles():
    back = job.job_loads(job.LocalJob().dumps())
    assert isinstance(back, job.LocalJob)
    assert isinstance(pickle.loads(pickle.dumps(job.LocalJob())), job.LocalJob)


@pytest.fixture(scope="module")
def process_job():
    j = job.ProcessJob({"hosts": 2})
    state = j.state(cached_path=None)
    try:
        yield j, state
    finally:
        j.kill()


@pytest.mark.timeout(120)
def test_process_job_host_mesh_has_hosts_dim(process_job):
    _, state = process_job
    assert state.hosts.sizes == {"hosts": 2}


@pytest.mark.timeout(120)
def test_process_job_spawns_procs_on_each_host(process_job):
    _, state = process_job
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    try:
        assert procs.sizes == {"hosts": 2, "gpus": 2}
        mesh = procs.spawn("pj", Where)
        vm = mesh.where.call().get(timeout=CALL_TIMEOUT)
        ranks = [r for _, r in vm.values()]
        assert ranks == [{"hosts": h, "gpus": g} for h in range(2) for g in range(2)]
        assert len({pid for pid, _ in vm.values()}) == 4
        assert os.getpid() not in {pid for pid, _ in vm.values()}
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


@pytest.mark.timeout(120)
def test_process_job_host_slice(process_job):
    _, state = process_job
    one = state.hosts.slice(hosts=1)
    assert one.sizes == {}
    procs = one.spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("pj1", Where)
        assert mesh.where.call().get(timeout=CALL_TIMEOUT).item(gpus=0)[1] == {"gpus": 0}
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


@pytest.mark.timeout(120)
def test_process_job_host_slice_cannot_shut_down(process_job):
    _, state = process_job
    with pytest.raises(RuntimeError, match="reference instead of owned"):
        state.hosts.slice(hosts=0).shutdown().get(timeout=CALL_TIMEOUT)


CONTEXT_JOB_MODULE = """
from {impl}.job import LocalJob

job = LocalJob(("trainers",))
count = 3
"""


@pytest.fixture
def job_project(tmp_path, monkeypatch):
    """A project folder as the current directory with an importable job module."""
    (tmp_path / "compat_ctxjob.py").write_text(CONTEXT_JOB_MODULE.format(impl=IMPL))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("compat_ctxjob", None)


def test_load_current_job_without_a_spec_says_to_apply(job_project):
    with pytest.raises(FileNotFoundError) as info:
        job.load_current_job()
    folder = os.path.dirname(job.DEFAULT_JOB_PATH)
    assert str(info.value) == (
        f"No spec found at {folder}/default/spec. Run '{IMPL} apply <module.path>' first."
    )


def test_set_current_job_links_the_cache_to_the_default_context(job_project):
    job.set_current_job("compat_ctxjob.job")
    assert os.readlink(job.DEFAULT_JOB_PATH) == "default/state.pkl"
    spec = os.path.join(os.path.dirname(job.DEFAULT_JOB_PATH), "default", "spec")
    with open(spec) as f:
        assert f.read() == "compat_ctxjob.job"
    loaded = job.load_current_job()
    assert isinstance(loaded, job.LocalJob)
    assert loaded.apply_id is None


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("nodot", ValueError, "module_path must be 'module.attr', got 'nodot'"),
        ("compat_ctxjob.nope", AttributeError, "Module 'compat_ctxjob' has no 'nope' attribute"),
        ("compat_ctxjob.count", TypeError, "'compat_ctxjob.count' must be a JobTrait, got int"),
    ],
)
def test_load_current_job_names_a_bad_spec(job_project, spec, error, message):
    job.set_current_job(spec)
    with pytest.raises(error) as info:
        job.load_current_job()
    assert str(info.value) == message


def test_active_once_applied():
    local = job.LocalJob()
    assert local.active is False
    local.state(cached_path=None)
    assert local.active is True
    local.kill()
