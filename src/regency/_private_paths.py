"""Files and directories that other local users must not be able to plant.

A shared machine's temporary directory, or a working directory others can write to, lets
another user create a path before we do. Whatever regency later imports or unpickles from such a
path runs as the job's user, so every such path is checked here first:

- :func:`private_dir` makes (or accepts) a directory that is a real directory, owned by the
  current user, with mode 0700; anything else raises :class:`UnsafePathError`.
- :func:`check_unswappable` resolves a path once and refuses it when another user could swap
  what it names: a directory on the way that they own, or may write without the sticky bit.
- :func:`check_owned_file` refuses a file another user owns or may write (a planted one).
- :func:`read_private_file` reads a file only when it is a regular file owned by the current user
  that neither group nor others may write (checked on the opened descriptor, so the check and
  the read are about the same file).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
import tempfile
from pathlib import Path

from regency._errors import RegencyError


class UnsafePathError(RegencyError, PermissionError):
    """A path regency would trust is not private to the current user."""


def _file_problem(st: os.stat_result, target: Path) -> str | None:
    """What makes ``target`` (its ``st``) unsafe to trust as a private file, or None."""
    problem = _owner_problem(st, "file", target)
    if problem is None and not stat.S_ISREG(st.st_mode):
        problem = f"{target} is not a regular file"
    return problem


def _owner_problem(st: os.stat_result, what: str, path: Path) -> str | None:
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _group_is_private(gid: int) -> bool:
    """Whether group ``gid`` is this user's own, so that its write bit lets nobody else in.

    That is the user-private-group scheme: the group is named after the user and has no other
    member.
    """
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


def _writable_by_others(st: os.stat_result) -> bool:
    """Whether someone besides the owner (and root) may write the file or directory."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _group_is_private(st.st_gid)


def _swap_problem(directory: Path, st: os.stat_result) -> str | None:
    if st.st_uid not in (os.geteuid(), 0):
        return f"directory {directory} is owned by uid {st.st_uid}, who can swap what it holds"
    if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
        return (
            f"directory {directory} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):04o}) and has no sticky bit, so they can swap what it holds"
        )
    return None


def check_unswappable(path: str | Path, *, closed: bool = False) -> Path:
    """``path`` resolved once (symlinks followed), checked that no other user can swap it.

    Every directory from it up to ``/`` must be owned by this user or root and writable by
    nobody else, unless it has the sticky bit (as ``/tmp`` has: others may add entries there but
    not rename or remove this user's). ``closed``: ``path``'s own directory may not be writable
    by others even with the sticky bit (they could create the files that are to come there).
    Raises :class:`UnsafePathError` naming the directory and its owner or mode, and
    ``FileNotFoundError`` when ``path`` does not exist.
    """
    real = Path(os.path.realpath(path, strict=True))
    directory = real if real.is_dir() else real.parent
    for step in (directory, *directory.parents):
        st = os.stat(step)
        problem = _swap_problem(step, st)
        if problem is None and closed and step == directory and _writable_by_others(st):
            problem = (
                f"directory {step} is writable by other users (mode "
                f"{stat.S_IMODE(st.st_mode):04o}), who can create files in it"
            )
        if problem is not None:
            raise UnsafePathError(
                f"refusing to use {path}: {problem}; pick a path whose directories only you "
                "(or root) can write"
            )
    return real


def check_owned_file(path: str | Path, what: str) -> None:
    """Refuse a file another user may have planted or may change.

    That is ``path`` (named ``what`` in the error) when it exists as a symlink or something
    other than a regular file, is owned by another user, or is writable by others.
    """
    target = Path(path)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    problem = _file_problem(st, target)
    if problem is not None:
        raise UnsafePathError(
            f"refusing to use {what}: {problem}; another user may have planted it: remove it "
            "or pick another path"
        )


def user_root() -> Path:
    """The user's own directory under the temporary directory: ``$TMPDIR/regency-<uid>``.

    It is not created here: make it with :func:`private_dir`.
    """
    return Path(tempfile.gettempdir()) / f"regency-{os.geteuid()}"


def private_dir(path: str | Path) -> Path:
    """``path`` as a directory private to this user (0700), creating it (and parents) if needed.

    Raises :class:`UnsafePathError` when it exists as a symlink or non-directory, belongs to
    another user, or is not mode 0700: another user may have planted it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(target, 0o700)
    return check_private_dir(target)


def check_private_dir(path: str | Path) -> Path:
    """``path``, checked to be an existing directory private to this user.

    Raises :class:`UnsafePathError` as :func:`private_dir` does, and ``FileNotFoundError`` when
    it does not exist.
    """
    target = Path(path)
    st = os.lstat(target)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(
            f"refusing to use {target}: it is not a directory (another user may have planted "
            "it); remove it or pick another path"
        )
    problem = _owner_problem(st, "directory", target)
    if problem is None and stat.S_IMODE(st.st_mode) & 0o077:
        problem = f"directory {target} is not private (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem is not None:
        raise UnsafePathError(
            f"refusing to use {problem}; regency needs it 0700 and owned by this user: remove "
            "it or pick another path"
        )
    return target


def read_private_file(path: str | Path) -> bytes:
    """The bytes of ``path``, a regular file owned by this user that only it may write.

    Raises ``FileNotFoundError`` when it does not exist and :class:`UnsafePathError` when it is
    a symlink, not a regular file, owned by someone else, or group- or world-writable.
    """
    target = Path(path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if os.path.islink(target):
            raise UnsafePathError(f"refusing to read {target}: it is a symlink") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        problem = _file_problem(st, target)
        if problem is not None:
            raise UnsafePathError(
                f"refusing to read {problem}; another user may have planted it: remove it"
            )
        return f.read()


def write_private_file(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a new file of mode 0600, replacing any file there atomically.

    A file planted at ``path`` by someone else is replaced, never written through (its owner
    could read it otherwise).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
        os.replace(scratch, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise
