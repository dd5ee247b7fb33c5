"""``regency apply`` / ``regency context`` run as a user would, and scripts that reuse the job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from regency.job import ProcessJob, job_load
from regency.job._process import _alive

pytestmark = pytest.mark.timeout(300)

JOBS = textwrap.dedent(
    """
    from regency.job import LocalJob, ProcessJob

    job = ProcessJob({"hosts": 2})
    other = ProcessJob({"hosts": 1})
    local = LocalJob()
    count = 3
    """
)
# A script that uses the applied job: it must attach to the same workers, not start new ones.
USE = textwrap.dedent(
    """
    import os
    from regency.actor import Actor, endpoint
    from regency.job import load_current_job

    class Parent(Actor):
        @endpoint
        def parent(self) -> int:
            return os.getppid()

    job = load_current_job()
    procs = job.state().hosts.spawn_procs()
    parents = procs.spawn("parent", Parent).parent.call().get()
    print(type(job).__name__, len(procs))
    procs.stop().get()
    """
)
RANK = "echo $REGENCY_RANK_HOSTS/$REGENCY_SIZE_HOSTS"


def _regency(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regency", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _workers(path: Path) -> list[tuple[int, int]]:
    job = job_load(path)
    assert isinstance(job, ProcessJob)
    return [(w.pid, w.started) for w in job._workers["hosts"]]


def _gone(workers: list[tuple[int, int]]) -> bool:
    return not any(_alive(pid, started) for pid, started in workers)


@pytest.fixture
def project(tmp_path: Path, leftover_processes: Callable[[], list[int]]) -> Path:
    """A project folder with job specs; hosts a failing test left there are killed after it."""
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "use.py").write_text(USE)
    return tmp_path


def test_apply_then_exec_scripts_and_kill_reuse_one_job(project: Path) -> None:
    applied = _regency(project, "apply", "jobs.job")
    workers: list[tuple[int, int]] = []
    try:
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.startswith("Job is ready (")
        link = project / ".regency" / "job_state.pkl"
        assert os.readlink(link) == "default/state.pkl"
        assert (project / ".regency/default/spec").read_text() == "jobs.job"
        workers = _workers(link)
        assert len(workers) == 2
        assert not _gone(workers)

        ran = _regency(project, "exec", "--", "sh", "-c", RANK)
        assert ran.returncode == 0, ran.stderr
        assert sorted(ran.stdout.splitlines()) == ["[0] 0/2", "[1] 1/2"]

        used = subprocess.run(
            [sys.executable, "use.py"],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert used.returncode == 0, used.stderr
        assert used.stdout == "ProcessJob 2\n"
        assert _workers(link) == workers, "the script attached to the applied workers"

        again = _regency(project, "apply")  # the saved spec, already running: nothing new
        assert again.returncode == 0, again.stderr
        assert _workers(link) == workers

        listed = _regency(project, "context", "ls")
        assert (listed.returncode, listed.stdout) == (0, "* default\n")

        killed = _regency(project, "kill")
        assert killed.returncode == 0, killed.stderr
        assert _gone(workers)
        assert link.is_symlink(), "kill removes the state, not the context link"
        assert not link.exists()
    finally:
        if not _gone(workers):
            job_load(project / ".regency/default/state.pkl").kill()


def test_contexts_hold_separate_jobs(project: Path) -> None:
    first = _regency(project, "apply", "jobs.job")
    assert first.returncode == 0, first.stderr
    default_workers = _workers(project / ".regency/default/state.pkl")
    other_workers: list[tuple[int, int]] = []
    try:
        created = _regency(project, "context", "create", "small")
        assert (created.returncode, created.stdout) == (0, "Created context 'small'\n")
        used = _regency(project, "context", "use", "small")
        assert (used.returncode, used.stdout) == (0, "Switched to context 'small'\n")
        no_spec = _regency(project, "apply")
        assert no_spec.returncode == 2
        assert "No spec found at .regency/small/spec" in no_spec.stderr
        second = _regency(project, "apply", "jobs.other")
        assert second.returncode == 0, second.stderr
        other_workers = _workers(project / ".regency/small/state.pkl")
        assert len(other_workers) == 1

        ran = _regency(project, "exec", "--", "sh", "-c", RANK)
        assert (ran.returncode, ran.stdout) == (0, "[0] 0/1\n"), ran.stderr
        listed = _regency(project, "context", "ls")
        assert listed.stdout == "  default\n* small\n"

        removed = _regency(project, "context", "rm", "small")
        assert (removed.returncode, removed.stdout) == (0, "Removed context 'small'\n")
        assert _gone(other_workers), "removing a context kills its job"
        assert not _gone(default_workers), "and only its job"
        assert _regency(project, "context", "ls").stdout == "* default\n"
        ran = _regency(project, "exec", "--", "sh", "-c", RANK)
        assert sorted(ran.stdout.splitlines()) == ["[0] 0/2", "[1] 1/2"], ran.stderr
    finally:
        for path in (project / ".regency/default/state.pkl", project / ".regency/small/state.pkl"):
            if path.exists():
                job_load(path).kill()


def test_kill_names_the_context_whose_job_to_kill(project: Path) -> None:
    assert _regency(project, "context", "use", "small").returncode == 0
    applied = _regency(project, "apply", "jobs.other")
    assert applied.returncode == 0, applied.stderr
    state = project / ".regency/small/state.pkl"
    workers = _workers(state)
    try:
        assert _regency(project, "context", "use", "default").returncode == 0
        killed = _regency(project, "kill", "small")
        assert killed.returncode == 0, killed.stderr
        assert "killed the ProcessJob cached at .regency/small/state.pkl" in killed.stderr
        assert _gone(workers)
        assert not state.exists()
        again = _regency(project, "kill", "small")
        assert again.returncode == 2
        assert "no job cached at .regency/small/state.pkl" in again.stderr
    finally:
        if not _gone(workers):
            job_load(state).kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("apply",), "No spec found at .regency/default/spec. Run 'regency apply"),
        (("apply", "jobs.py"), "name the job object as MODULE.ATTR, e.g. 'jobs.job'"),
        (("apply", "jobs.count"), "'jobs.count' must be a JobTrait, got int"),
        (("apply", "jobs.missing"), "Module 'jobs' has no 'missing' attribute"),
        (("apply", "nosuchmodule.job"), "No module named 'nosuchmodule'"),
        (("context", "rm", "nosuch"), "no context named 'nosuch'"),
        (("context", "use", "../up"), "context name '../up' is not allowed"),
        (("kill", "../up"), "context name '../up' is not allowed"),
    ],
)
def test_bad_input_is_named(project: Path, args: tuple[str, ...], message: str) -> None:
    done = _regency(project, *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (project / ".regency/default/spec").exists(), "a bad spec is not saved"
