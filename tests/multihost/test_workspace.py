"""``regency.job.sync_workspace``: ship a directory of code to ProcessJob hosts and import it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import kill_and_check

from regency.actor import Actor, endpoint
from regency.job import ProcessJob, sync_workspace
from regency.job._workspace import pack

pytestmark = pytest.mark.timeout(60)


class Importer(Actor):
    """Imports the shipped module and says what it found."""

    @endpoint
    def shipped(self) -> tuple[str, str]:
        import shipped_mod  # type: ignore[import-not-found]

        return shipped_mod.VALUE, shipped_mod.__file__


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


def _workspace(root: Path, value: str) -> Path:
    code = root / "proj"
    code.mkdir(exist_ok=True)
    (code / "shipped_mod.py").write_text(f"VALUE = {value!r}\n")
    return code


def _imported(job: ProcessJob, bootstrap: object) -> list[tuple[str, str]]:
    procs = job.state(cached_path=None).hosts.spawn_procs(bootstrap=bootstrap)  # type: ignore[arg-type]
    try:
        found = procs.spawn("importer", Importer).shipped.call().get(timeout=30)
        return list(found.values())
    finally:
        procs.stop().get(timeout=30)


def test_synced_module_is_importable_on_every_host(job: ProcessJob, tmp_path: Path) -> None:
    code = _workspace(tmp_path, "one")
    for clutter in (".git/config", "__pycache__/x.pyc", ".venv/bin/python", "a.pyc"):
        (code / clutter).parent.mkdir(parents=True, exist_ok=True)
        (code / clutter).write_text("clutter")
    (code / "pkg").mkdir()
    (code / "pkg" / "data.txt").write_text("inside")
    (code / "link.txt").symlink_to("pkg/data.txt")
    remote = tmp_path / "remote" / "ws"
    ws = sync_workspace(job.state(cached_path=None).hosts, code, str(remote))
    assert ws.paths == [str(remote), str(remote)]
    found = _imported(job, ws.bootstrap)
    # Imported from the version the link pointed at when the proc started, never the link.
    version = Path(os.path.realpath(remote))
    assert version.parent == remote.parent / ".ws.versions"
    assert found == [("one", str(version / "shipped_mod.py"))] * 2
    shipped = sorted(str(p.relative_to(remote)) for p in remote.rglob("*"))
    assert shipped == ["link.txt", "pkg", "pkg/data.txt", "shipped_mod.py"]
    assert (remote / "link.txt").read_text() == "inside"


def test_resync_replaces_the_content(job: ProcessJob, tmp_path: Path) -> None:
    hosts = job.state(cached_path=None).hosts
    code = _workspace(tmp_path, "old")
    first = sync_workspace(hosts, code)
    try:
        assert [value for value, _ in _imported(job, first.bootstrap)] == ["old", "old"]
        _workspace(tmp_path, "new")
        second = sync_workspace(hosts, code)
        assert second.paths == first.paths, "the same path, switched to the new content"
        assert second.digest != first.digest
        assert [value for value, _ in _imported(job, second.bootstrap)] == ["new", "new"]
        versions = Path(first.paths[0]).parent / ".proj.versions"
        assert [p.name for p in versions.iterdir()] == [second.digest], "the old one is gone"
    finally:
        shutil.rmtree(Path(first.paths[0]).parent, ignore_errors=True)


def test_symlink_escaping_the_workspace_is_refused(job: ProcessJob, tmp_path: Path) -> None:
    code = _workspace(tmp_path, "x")
    (tmp_path / "secret.txt").write_text("not yours")
    (code / "escape.txt").symlink_to("../secret.txt")
    remote = tmp_path / "remote"
    with pytest.raises(ValueError, match="points outside the workspace"):
        sync_workspace(job.state(cached_path=None).hosts, code, str(remote))
    assert not remote.exists(), "nothing was shipped"
    (code / "escape.txt").unlink()
    (code / "abs.txt").symlink_to(tmp_path / "proj" / "shipped_mod.py")
    with pytest.raises(ValueError, match="points outside the workspace"):
        pack(code)
