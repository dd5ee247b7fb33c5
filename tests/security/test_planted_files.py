"""Issue 12 §4: files another local user can plant are never imported or unpickled.

A second local user creates the workspace directory, a workspace version, or the job state
cache before the job's user does; regency must refuse them (``UnsafePathError``, a
``PermissionError``) instead of running the planted code as the job's user.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _attacker import Attacker, attacker, shared_dir

from regency._private_paths import UnsafePathError, private_dir, read_private_file
from regency.job import ProcessJob, load_current_job, set_current_job
from regency.job._context import context_rm, context_use
from regency.job._trait import job_load
from regency.job._workspace import AddToPath, _resolve, default_remote_dir, pack, unpack

pytestmark = pytest.mark.timeout(60)
__all__ = ["attacker", "shared_dir"]  # fixtures


class _RunsCode:
    """Pickles to a call of ``exec`` that writes a marker file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('planted code ran')",))


def _payload(marker: Path) -> bytes:
    return pickle.dumps(_RunsCode(marker))


def _code(root: Path) -> Path:
    code = root / "proj"
    code.mkdir()
    (code / "mod.py").write_text("VALUE = 'mine'\n")
    return code


# -- workspace -------------------------------------------------------------------------------


def test_planted_default_workspace_root_is_refused(
    attacker: Attacker, shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    target = _resolve(None, "job1", "proj")
    assert str(target) == default_remote_dir("job1", "proj")
    assert f"regency-workspaces-{os.geteuid()}" in str(target), "the default is per user"
    root = target.parent.parent
    attacker.sh(f"mkdir -m 0777 {root} && mkdir -p {target.parent}")
    with pytest.raises(UnsafePathError, match=rf"owned by uid {attacker.uid}, not by this user"):
        unpack(pack(_code(tmp_path)), target)
    assert not any(target.parent.iterdir()), "nothing was unpacked into the planted directory"


def test_planted_workspace_version_is_never_imported(
    attacker: Attacker, shared_dir: Path, tmp_path: Path
) -> None:
    """The attacker pre-creates the version directory a known workspace will unpack to."""
    data = pack(_code(tmp_path))
    target = shared_dir / "ws"
    versions = shared_dir / ".ws.versions"
    digest = hashlib.sha256(data).hexdigest()[:32]
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as archive:
        body = b"VALUE = 'planted'\n"
        info = tarfile.TarInfo("mod.py")
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    attacker.sh(
        f"mkdir -m 0777 {versions} && mkdir -m 0777 {versions}/{digest} && "
        f"tar -x -C {versions}/{digest}",
        stdin=evil.getvalue(),
    )
    with pytest.raises(UnsafePathError, match="owned by uid"):
        unpack(data, target)
    assert not target.exists()


def test_workspace_link_planted_elsewhere_is_not_put_on_sys_path(
    attacker: Attacker, shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = shared_dir / "ws"
    unpack(pack(_code(tmp_path)), target)
    assert (target / "mod.py").read_text() == "VALUE = 'mine'\n"
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    AddToPath(str(target), "job", "ws")()
    # The version directory the link resolved to, never the link (which can be switched later).
    assert sys.path[0] == os.path.realpath(target)
    assert Path(sys.path[0]).parent == (shared_dir / ".ws.versions").resolve()
    assert os.environ["PYTHONPATH"] == sys.path[0]
    # The attacker cannot write into the versions directory, but may own a look-alike link.
    attacker.sh(f"mkdir -m 0755 {shared_dir}/evil && ln -s evil {shared_dir}/ws2")
    private_dir(shared_dir / ".ws2.versions")
    with pytest.raises(UnsafePathError, match="outside its versions directory"):
        AddToPath(str(shared_dir / "ws2"), "job", "ws2")()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may write to *without* the sticky bit: anyone may rename or
    replace what it holds (and removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="regency-open-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_workspace_in_a_directory_others_can_write_is_refused(
    attacker: Attacker, open_dir: Path, tmp_path: Path
) -> None:
    target = open_dir / "ws"
    data = pack(_code(tmp_path))
    with pytest.raises(UnsafePathError) as info:
        unpack(data, target)
    assert str(info.value) == (
        f"refusing to use {open_dir / '.ws.versions'}: directory {open_dir} is writable by other "
        "users (mode 0777) and has no sticky bit, so they can swap what it holds; pick a path "
        "whose directories only you (or root) can write"
    )
    assert not target.exists()
    # A directory that another user owns is refused too, whatever its mode.
    theirs = open_dir / "theirs"
    attacker.sh(f"mkdir -m 0755 {theirs}")
    with pytest.raises(
        UnsafePathError, match=rf"directory {theirs} is owned by uid {attacker.uid}"
    ):
        unpack(data, theirs / "ws")


def test_swapped_workspace_link_never_runs_the_other_users_code(
    attacker: Attacker, open_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workspace was unpacked while its directory was private; later the directory is
    opened to everyone (no sticky bit) and another user switches the link to their own code."""
    module = f"ws_swap_{os.getpid()}"
    code = tmp_path / "proj"
    code.mkdir()
    (code / f"{module}.py").write_text("VALUE = 'mine'\n")
    open_dir.chmod(0o755)
    target = open_dir / "ws"
    unpack(pack(code), target)
    open_dir.chmod(0o777)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    with pytest.raises(UnsafePathError, match=rf"directory {open_dir} is writable by other users"):
        AddToPath(str(target), "job", "ws")()
    # What the other user can do to a link in such a directory, at any time after a check.
    marker = tmp_path / "pwned"
    attacker.sh(
        f"mkdir {open_dir}/evil && echo \"open('{marker}', 'w').write('ran')\" "
        f"> {open_dir}/evil/{module}.py && ln -s evil {open_dir}/ws.new && "
        f"mv -f -T {open_dir}/ws.new {target}"
    )
    assert os.readlink(target) == "evil", "the other user switched the link"
    importlib.invalidate_caches()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)
    assert not marker.exists(), "the other user's code ran as this user"


def test_versions_directory_is_private(shared_dir: Path, tmp_path: Path) -> None:
    unpack(pack(_code(tmp_path)), shared_dir / "ws")
    st = (shared_dir / ".ws.versions").stat()
    assert st.st_mode & 0o777 == 0o700
    assert st.st_uid == os.geteuid()


# -- job state cache -------------------------------------------------------------------------


def _plant_cache(attacker: Attacker, shared_dir: Path, marker: Path) -> Path:
    cache = shared_dir / ".regency" / "job_state.pkl"
    attacker.sh(
        f"mkdir -m 0777 {cache.parent} && cat > {cache} && chmod 0644 {cache}",
        stdin=_payload(marker),
    )
    return cache


def test_planted_job_cache_is_not_unpickled_by_state(
    attacker: Attacker, shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    cache = _plant_cache(attacker, shared_dir, marker)
    monkeypatch.chdir(shared_dir)
    job = ProcessJob({"hosts": 1})
    with pytest.raises(UnsafePathError, match=rf"owned by uid {attacker.uid}"):
        job.state()  # the default cache path, relative to the working directory
    assert not marker.exists(), "the planted pickle ran"
    assert cache.read_bytes() == _payload(marker), "the planted file is left for the user"
    assert not job._workers, "no job was started over the planted cache"  # type: ignore[attr-defined]


def test_planted_job_cache_is_not_unpickled_by_regency_exec(
    attacker: Attacker, shared_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    cache = _plant_cache(attacker, shared_dir, marker)
    done = subprocess.run(
        [sys.executable, "-m", "regency", "exec", "--job", str(cache), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0, done
    assert "owned by uid" in done.stderr, done.stderr
    assert not marker.exists(), "the planted pickle ran"


def test_planted_context_link_is_neither_followed_nor_used(
    attacker: Attacker, shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    root = shared_dir / ".regency"
    attacker.sh(
        f"mkdir -m 0777 {root} {root}/evil && cat > {root}/evil/state.pkl && "
        f"echo jobs.job > {root}/evil/spec && ln -s evil/state.pkl {root}/job_state.pkl",
        stdin=_payload(marker),
    )
    monkeypatch.chdir(shared_dir)
    with pytest.raises(UnsafePathError, match="symlink"):
        job_load(".regency/job_state.pkl")  # a link another user owns is not followed
    with pytest.raises(UnsafePathError, match="symlink"):
        ProcessJob({"hosts": 1}).state()
    with pytest.raises(UnsafePathError, match=rf"{root} is owned by uid {attacker.uid}"):
        set_current_job("jobs.job")  # never writes its spec into that folder
    with pytest.raises(UnsafePathError, match=rf"{root} is owned by uid {attacker.uid}"):
        load_current_job()  # never imports what that spec names
    with pytest.raises(UnsafePathError, match=rf"{root} is owned by uid {attacker.uid}"):
        context_use("evil")
    with pytest.raises(UnsafePathError, match=rf"{root} is owned by uid {attacker.uid}"):
        context_rm("evil")
    assert not marker.exists(), "the planted pickle ran"
    assert os.readlink(root / "job_state.pkl") == "evil/state.pkl", "left for the user"


def test_group_or_world_writable_cache_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cache = tmp_path / "job_state.pkl"
    cache.write_bytes(_payload(marker))
    for mode in (0o664, 0o646):
        cache.chmod(mode)
        with pytest.raises(UnsafePathError, match="writable by others"):
            job_load(cache)
    link = tmp_path / "link.pkl"
    link.symlink_to(cache)
    cache.chmod(0o600)
    with pytest.raises(UnsafePathError, match="symlink"):
        read_private_file(link)
    assert not marker.exists()


def test_dump_replaces_a_planted_file_instead_of_writing_through_it(
    attacker: Attacker, shared_dir: Path
) -> None:
    cache = shared_dir / "job_state.pkl"
    attacker.sh(f"touch {cache} && chmod 0666 {cache}")
    job = ProcessJob({"hosts": 1})
    job.dump(cache)
    st = cache.stat()
    assert st.st_uid == os.geteuid(), "the attacker's inode (which they can read) was reused"
    assert st.st_mode & 0o777 == 0o600
    assert job_load(cache).secret == job.secret


# -- telemetry database ------------------------------------------------------------------------


def _planted_database(attacker: Attacker, directory: Path, name: str) -> Path:
    """The other user creates an SQLite file with a row of theirs in ``directory``."""
    path = directory / name
    attacker.sh(
        f"python3 -c \"import sqlite3; c = sqlite3.connect('{path}'); "
        "c.execute('CREATE TABLE spans (job TEXT, name TEXT)'); "
        "c.execute(\\\"INSERT INTO spans VALUES ('x', 'planted row')\\\"); c.commit()\" && "
        f"chmod 0666 {path}"
    )
    return path


def test_telemetry_database_another_user_planted_is_refused(
    attacker: Attacker, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regency.observe.telemetry.recorder import Recorder, run_sql
    from regency.observe.telemetry.switch import enable_telemetry

    path = _planted_database(attacker, open_dir, "telemetry.db")
    open_dir.chmod(0o755)  # the directory is this user's and closed now; the file is not
    planted = path.read_bytes()
    text = (
        f"refusing to use telemetry database {path}: file {path} is owned by uid "
        f"{attacker.uid}, not by this user (uid {os.geteuid()}); another user may have planted "
        "it: remove it or pick another path"
    )
    with pytest.raises(UnsafePathError) as info:
        Recorder(path)
    assert str(info.value) == text
    with pytest.raises(UnsafePathError, match="owned by uid"):
        run_sql("SELECT name FROM spans", path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "regency",
            "telemetry",
            "sql",
            "--db",
            str(path),
            "SELECT * FROM spans",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done
    assert "planted row" not in done.stdout, "the other user's rows were shown"
    assert done.stderr.strip() == f"regency telemetry: {text}", done.stderr
    from regency import config

    with config.configured(telemetry_db=str(path)):
        with pytest.raises(UnsafePathError, match=f"file {path} is owned by uid {attacker.uid}"):
            enable_telemetry()
        config.configure(telemetry=False)
    assert path.read_bytes() == planted, "nothing was written into the planted file"


def test_telemetry_database_in_a_directory_others_can_write_is_refused(
    attacker: Attacker, shared_dir: Path, open_dir: Path
) -> None:
    """Even with the sticky bit (``/tmp``): the other user could create the file, or the
    ``-wal`` log SQLite replays on open, before this user does."""
    from regency.observe.telemetry.recorder import Recorder

    path = shared_dir / "telemetry.db"
    with pytest.raises(UnsafePathError) as info:
        Recorder(path)
    assert str(info.value) == (
        f"refusing to use {shared_dir}: directory {shared_dir} is writable by other users "
        "(mode 1777), who can create files in it; pick a path whose directories only you (or "
        "root) can write"
    )
    assert not path.exists()
    # A log planted beside the database before the directory was closed is refused too.
    wal = _planted_database(attacker, open_dir, "telemetry.db-wal")
    open_dir.chmod(0o755)
    with pytest.raises(UnsafePathError, match=f"file {wal} is owned by uid {attacker.uid}"):
        Recorder(open_dir / "telemetry.db")
    assert not (open_dir / "telemetry.db").exists()
