"""Job contexts: ``set_current_job`` / ``load_current_job`` and the ``.regency`` link layout."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from regency._private_paths import UnsafePathError
from regency.job import DEFAULT_JOB_PATH, LocalJob, job_load, load_current_job, set_current_job
from regency.job import _context as contexts

pytestmark = pytest.mark.timeout(30)

JOB_MODULE = """
from regency.job import LocalJob

job = LocalJob(("trainers",))
count = 3
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project folder as the current directory, holding ``ctxjob.py``, importable."""
    (tmp_path / "ctxjob.py").write_text(JOB_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("ctxjob", None)


def test_set_then_load_current_job(project: Path) -> None:
    set_current_job("ctxjob.job")
    link = project / DEFAULT_JOB_PATH
    assert link.is_symlink()
    assert os.readlink(link) == "default/state.pkl"
    assert (project / ".regency/default/spec").read_text() == "ctxjob.job"
    assert (project / ".regency").stat().st_mode & 0o777 == 0o700
    job = load_current_job()
    assert isinstance(job, LocalJob)
    assert job.hosts == ("trainers",)
    assert job.apply_id is None  # a spec, not connected
    assert contexts.current_context() == "default"


def test_load_without_spec_says_to_apply(project: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_current_job()
    assert str(info.value) == (
        "No spec found at .regency/default/spec. Run 'regency apply <module.path>' first."
    )


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("nodot", ValueError, "module_path must be 'module.attr', got 'nodot'"),
        ("ctxjob.nope", AttributeError, "Module 'ctxjob' has no 'nope' attribute"),
        ("ctxjob.count", TypeError, "'ctxjob.count' must be a JobTrait, got int"),
        ("nosuchmodule.job", ModuleNotFoundError, "No module named 'nosuchmodule'"),
    ],
)
def test_load_names_what_is_wrong_with_the_spec(
    project: Path, spec: str, error: type[Exception], message: str
) -> None:
    set_current_job(spec)
    with pytest.raises(error) as info:
        load_current_job()
    assert message in str(info.value)


def test_state_writes_through_the_context_link(project: Path) -> None:
    set_current_job("ctxjob.job")
    job = load_current_job()
    state = job.state()
    assert state.trainers is not None
    link = project / DEFAULT_JOB_PATH
    assert link.is_symlink(), "the link stays; the context's state file is written"
    assert (project / ".regency/default/state.pkl").is_file()
    assert isinstance(job_load(DEFAULT_JOB_PATH), LocalJob)
    job.kill()


def test_a_plain_cache_file_moves_into_the_default_context(project: Path) -> None:
    LocalJob().dump(DEFAULT_JOB_PATH)
    set_current_job("ctxjob.job")
    assert (project / DEFAULT_JOB_PATH).is_symlink()
    assert isinstance(job_load(project / ".regency/default/state.pkl"), LocalJob)


def test_contexts_switch_and_remove(project: Path) -> None:
    set_current_job("ctxjob.job")
    contexts.context_create("other")
    contexts.context_use("other")
    assert contexts.current_context() == "other"
    assert contexts.contexts() == ["default", "other"]
    with pytest.raises(FileNotFoundError, match=r"\.regency/other/spec"):
        load_current_job()  # each context has its own spec
    set_current_job("ctxjob.job")
    assert contexts.context_rm("other")
    assert contexts.current_context() == "default"
    assert contexts.contexts() == ["default"]
    assert not contexts.context_rm("other")


@pytest.mark.parametrize("name", ["", ".", "..", "../up", "a/b", ".hidden", "job_state.pkl"])
def test_context_names_that_are_no_folder_name_are_refused(project: Path, name: str) -> None:
    with pytest.raises(ValueError, match="context name"):
        contexts.context_use(name)
    with pytest.raises(ValueError, match="context name"):
        contexts.context_rm(name)


def test_a_link_leaving_the_folder_is_not_followed(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    LocalJob().dump(elsewhere / "state.pkl")
    (project / ".regency").mkdir(mode=0o700)
    (project / DEFAULT_JOB_PATH).symlink_to(elsewhere / "state.pkl")
    with pytest.raises(UnsafePathError, match="symlink"):
        job_load(DEFAULT_JOB_PATH)
    (project / DEFAULT_JOB_PATH).unlink()
    (project / DEFAULT_JOB_PATH).symlink_to(Path("..") / "elsewhere" / "state.pkl")
    with pytest.raises(UnsafePathError, match="symlink"):
        job_load(DEFAULT_JOB_PATH)


def test_an_existing_folder_only_this_user_writes_is_used(project: Path) -> None:
    (project / ".regency" / "slurm").mkdir(parents=True)
    (project / ".regency" / "slurm" / "regency_job-1.out").write_text("log")  # no context
    (project / ".regency").chmod(0o755)  # as a SlurmJob's log folder leaves it
    set_current_job("ctxjob.job")
    assert isinstance(load_current_job(), LocalJob)
    assert contexts.contexts() == ["default"]


def test_a_folder_others_may_write_is_refused(project: Path) -> None:
    (project / ".regency").mkdir()
    (project / ".regency").chmod(0o777)
    with pytest.raises(UnsafePathError, match="writable by other users"):
        set_current_job("ctxjob.job")
    assert not (project / DEFAULT_JOB_PATH).is_symlink()


@pytest.mark.parametrize(
    "target", ["/etc/state.pkl", "other.pkl", "ctx/other.pkl", "a/b/state.pkl", "../state.pkl"]
)
def test_only_a_link_to_a_context_state_is_followed(project: Path, target: str) -> None:
    (project / ".regency").mkdir(mode=0o700)
    (project / DEFAULT_JOB_PATH).symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        job_load(DEFAULT_JOB_PATH)
