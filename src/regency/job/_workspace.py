"""``sync_workspace``: ship a local directory of code to every host of a host mesh.

The directory is packed into a tar archive here (skipping ``.git``, ``__pycache__``, ``.venv``,
``.regency`` and ``*.pyc``; refusing symlinks that point outside it), sent in a message to one
actor per host, and unpacked there atomically: each content version goes into a directory of its
own, and the workspace path is a symlink switched to the new version with one ``rename``. Procs
spawned afterwards with ``bootstrap=workspace.bootstrap`` have it on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from regency._lowlevel import runtime
from regency._private_paths import (
    UnsafePathError,
    check_private_dir,
    check_unswappable,
    private_dir,
)
from regency.actor import Actor, HostMesh, endpoint

IGNORED_NAMES = frozenset({".git", "__pycache__", ".venv", ".regency"})
IGNORED_SUFFIXES = (".pyc",)
_STOP_TIMEOUT = 30.0


def pack(local_dir: str | Path) -> bytes:
    """A tar archive of ``local_dir``'s files (names relative to it), ignoring build clutter.

    Symlinks are kept when they point inside the directory and refused (``ValueError``)
    otherwise; other special files are skipped.
    """
    root = Path(local_dir).resolve(strict=True)
    if not root.is_dir():
        raise NotADirectoryError(f"workspace {local_dir} is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_NAMES)
            here = Path(dirpath)
            # Symlinks to directories are listed in dirnames and not followed: add them as links.
            for name in [*dirnames, *sorted(filenames)]:
                path = here / name
                if name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES):
                    continue
                if path.is_symlink():
                    _check_link(root, path)
                elif not path.is_file():
                    continue
                archive.add(path, arcname=str(path.relative_to(root)), recursive=False)
            dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    return buffer.getvalue()


def _check_link(root: Path, link: Path) -> None:
    """Refuse a symlink that is absolute or resolves outside ``root``."""
    target = os.readlink(link)
    resolved = (link.parent / target).resolve()
    if os.path.isabs(target) or not resolved.is_relative_to(root):
        raise ValueError(
            f"symlink {link} -> {target} points outside the workspace {root}; "
            "only relative links within it are shipped"
        )


def default_remote_dir(job_id: str, name: str) -> str:
    """Where a workspace goes on a host by default: per user and job, under its temp directory.

    That is ``<temp dir>/regency-workspaces-<uid>/<job id>/<name>``; the per-user directory is
    checked private (0700, owned by the user) when a workspace is unpacked there.
    """
    return os.path.join(_user_root(), job_id, name)


def _user_root() -> Path:
    """The directory of this user's default workspaces: ``<temp dir>/regency-workspaces-<uid>``."""
    return Path(tempfile.gettempdir()) / f"regency-workspaces-{os.geteuid()}"


def _check_default_root(target: Path) -> None:
    """Make sure a default workspace path lies in this user's private directory."""
    if target.is_relative_to(_user_root()):
        private_dir(_user_root())


def _resolve(remote_dir: str | None, job_id: str, name: str) -> Path:
    path = remote_dir if remote_dir is not None else default_remote_dir(job_id, name)
    return Path(os.path.abspath(os.path.expanduser(path)))


def unpack(data: bytes, target: Path) -> None:
    """Unpack a :func:`pack` archive so that ``target`` (a symlink) switches to it atomically.

    Each content version lives in ``.<name>.versions/<sha256>`` next to ``target``; older
    versions are removed once the link points at the new one. The versions directory (and the
    per-user root of a default path) must be private to this user (0700, owned by it), and no
    other user may write a directory above it without the sticky bit (they could swap the link
    or the versions directory):
    :class:`~regency._private_paths.UnsafePathError` otherwise, as another user may have planted
    code there.
    """
    if target.exists() and not target.is_symlink():
        raise FileExistsError(f"{target} exists and is not a workspace link; pick another path")
    digest = hashlib.sha256(data).hexdigest()[:32]
    _check_default_root(target)
    versions = private_dir(target.parent / f".{target.name}.versions")
    check_unswappable(versions)
    final = versions / digest
    if not final.is_dir():
        scratch = versions / f".tmp-{uuid.uuid4().hex}"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
            # The "data" filter refuses absolute names, links leaving the directory, devices.
            archive.extractall(scratch, filter="data")
        try:
            os.rename(scratch, final)
        except OSError:
            # Another host on this machine unpacked the same version first.
            shutil.rmtree(scratch, ignore_errors=True)
            if not final.is_dir():
                raise
    link = target.parent / f".{target.name}.link-{uuid.uuid4().hex}"
    os.symlink(os.path.relpath(final, target.parent), link)
    os.replace(link, target)
    for old in versions.iterdir():
        if old.name != digest and not old.name.startswith(".tmp-"):
            shutil.rmtree(old, ignore_errors=True)


class WorkspaceActor(Actor):
    """Unpacks a workspace archive on its host."""

    @endpoint
    def unpack(self, data: bytes, remote_dir: str | None, job_id: str, name: str) -> str:
        """Unpack ``data`` at the workspace path on this host; return that path."""
        target = _resolve(remote_dir, job_id, name)
        unpack(data, target)
        return str(target)


def _checked_version(target: Path) -> Path:
    """The version directory the workspace link ``target`` points at, resolved once.

    It must lie in its private versions directory, on a path no other user can swap (see
    :func:`unpack`). Raises :class:`~regency._private_paths.UnsafePathError` otherwise: another
    user may have planted it, or could swap it after this check.
    """
    if target.is_relative_to(_user_root()):
        check_private_dir(_user_root())
    versions = check_private_dir(target.parent / f".{target.name}.versions")
    real = Path(os.path.realpath(target, strict=True))
    if real.parent != Path(os.path.realpath(versions)):
        raise UnsafePathError(
            f"refusing to import from {target}: it points at {real}, outside its versions "
            f"directory {versions} (another user may have planted it)"
        )
    return check_unswappable(real)


@dataclass(frozen=True)
class AddToPath:
    """A ``spawn_procs(bootstrap=...)`` callable: put the workspace first on ``sys.path``.

    It resolves the workspace link once, on the host the proc runs on, and puts the checked
    version directory it points at (not the link, which could be switched later) first on
    ``sys.path`` and ``PYTHONPATH``, so that Python subprocesses of the proc see it as well.
    """

    remote_dir: str | None
    job_id: str
    name: str

    def __call__(self) -> None:
        """Prepend the workspace to ``sys.path`` and ``PYTHONPATH``."""
        import sys

        path = str(_checked_version(_resolve(self.remote_dir, self.job_id, self.name)))
        if path not in sys.path:
            sys.path.insert(0, path)
        current = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = path + (os.pathsep + current if current else "")


@dataclass(frozen=True)
class Workspace:
    """A directory shipped to hosts by :func:`sync_workspace`.

    ``paths`` is where it landed on each host (in host rank order); ``bootstrap`` is the
    callable to pass to ``spawn_procs(bootstrap=...)`` so that procs import from it.
    """

    paths: list[str]
    digest: str
    nbytes: int
    bootstrap: AddToPath


def sync_workspace(
    host_mesh: HostMesh,
    local_dir: str | Path,
    remote_dir: str | None = None,
    *,
    timeout: float | None = 120.0,
) -> Workspace:
    """Ship ``local_dir`` to every host of ``host_mesh``; return where it landed.

    The directory's files are packed here (without ``.git``, ``__pycache__``, ``.venv``,
    ``.regency`` or ``*.pyc``; a symlink pointing outside it raises ``ValueError``), sent to
    one actor per host and unpacked atomically at ``remote_dir`` on each host (a symlink to the
    unpacked version; ``~`` and relative paths are resolved on the host against the worker's
    home and working directory). By default that is
    ``<host temp dir>/regency-workspaces/<controller job id>/<local_dir's name>``. Syncing
    again replaces the content; procs spawned afterwards with
    ``spawn_procs(bootstrap=workspace.bootstrap)`` import from it (procs running already keep
    the modules they imported).
    """
    data = pack(local_dir)
    name = Path(local_dir).resolve().name
    job_id = runtime().job_id
    procs = host_mesh.spawn_procs(name="workspace")
    try:
        actors = procs.spawn("workspace", WorkspaceActor)
        paths = actors.unpack.call(data, remote_dir, job_id, name).get(timeout=timeout)
    finally:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=_STOP_TIMEOUT)
    return Workspace(
        paths=list(paths.values()),
        digest=hashlib.sha256(data).hexdigest()[:32],
        nbytes=len(data),
        bootstrap=AddToPath(remote_dir, job_id, name),
    )
