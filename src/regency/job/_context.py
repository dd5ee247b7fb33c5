"""Job contexts: a job described once (``regency apply``), found again by later commands.

A *context* is a folder ``.regency/<name>/`` holding ``spec`` (the dotted path ``module.attr``
of a job object, written by :func:`set_current_job`) and ``state.pkl`` (the running job, written
by ``job.state()``). ``.regency/job_state.pkl`` (:data:`DEFAULT_JOB_PATH`) is a symlink to the
active context's ``state.pkl``, so everything that reads or writes the default job cache (a
script's ``job.state()``, ``regency exec``, ``regency kill``) works with the active context.
Monarch keeps the same layout under ``.monarch/``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from pathlib import Path

from regency._private_paths import (
    check_unswappable,
    private_dir,
    read_private_file,
    write_private_file,
)
from regency.job._trait import DEFAULT_JOB_PATH, JobTrait, job_load

STATE_FILE = "state.pkl"
SPEC_FILE = "spec"
DEFAULT_CONTEXT = "default"


def _link() -> Path:
    return Path(DEFAULT_JOB_PATH)


def _root() -> Path:
    return _link().parent


def _own_root() -> Path:
    """``.regency``: created private (0700) if missing, else checked that no one else can change it.

    An existing one of mode 0755 (as ``SlurmJob``'s log folder makes it) will do.
    """
    root = _root()
    if not root.exists():
        return private_dir(root)
    return _checked_root()


def _checked_root() -> Path:
    """``.regency``, refused (:class:`UnsafePathError`) when another user can change it."""
    root = _root()
    if root.exists():
        check_unswappable(root, closed=True)
    return root


def check_context_name(name: str) -> str:
    """``name`` when it can name a context folder, else :class:`ValueError` saying why."""
    if not name or name in (".", "..") or "/" in name or name.startswith("."):
        raise ValueError(
            f"context name {name!r} is not allowed: use a plain folder name (no '/', not "
            "starting with '.')"
        )
    if name == _link().name:
        raise ValueError(f"context name {name!r} is reserved")
    return name


def current_context() -> str | None:
    """The name of the active context, or ``None`` when ``.regency/job_state.pkl`` is no link."""
    link = _link()
    if not link.is_symlink():
        return None
    parts = Path(os.readlink(link)).parts
    if len(parts) == 2 and parts[1] == STATE_FILE:
        return parts[0]
    return None


def context_state(name: str) -> Path:
    """Where context ``name`` keeps its running job."""
    return _root() / check_context_name(name) / STATE_FILE


def _use(name: str) -> None:
    """Point the default job cache at context ``name``'s state.

    A plain cache file there moves into the ``default`` context first, as in Monarch.
    """
    link = _link()
    _own_root()
    if link.exists() and not link.is_symlink():
        private_dir(_root() / DEFAULT_CONTEXT)
        link.rename(_root() / DEFAULT_CONTEXT / STATE_FILE)
    private_dir(_root() / name)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(Path(name) / STATE_FILE)


def _ensure_link() -> str:
    """The active context's name, making ``default`` the active one if there is none yet."""
    name = current_context()
    if name is None:
        name = DEFAULT_CONTEXT
        _use(name)
    return name


def _spec_file() -> Path:
    return _root() / (current_context() or DEFAULT_CONTEXT) / SPEC_FILE


def set_current_job(module_path: str) -> None:
    """Save ``module_path`` (``module.attr``, e.g. ``myjob.job``) as the current context's job.

    Creates ``.regency/`` (mode 0700) and the ``default`` context on first use, and makes
    ``.regency/job_state.pkl`` a link to the active context's ``state.pkl``. Nothing is imported
    yet: :func:`load_current_job` does that.
    """
    _own_root()
    name = _ensure_link()
    spec = _root() / name / SPEC_FILE
    private_dir(spec.parent)
    write_private_file(spec, module_path.encode())


def _import_job(module_path: str) -> JobTrait:
    """The :class:`JobTrait` object at ``module.attr``, imported."""
    if "." not in module_path:
        raise ValueError(f"module_path must be 'module.attr', got {module_path!r}")
    module_name, attr = module_path.rsplit(".", 1)
    module = importlib.import_module(module_name)
    job = getattr(module, attr, None)
    if job is None:
        raise AttributeError(f"Module '{module_name}' has no '{attr}' attribute")
    if not isinstance(job, JobTrait):
        raise TypeError(f"'{module_path}' must be a JobTrait, got {type(job).__name__}")
    return job


def load_current_job() -> JobTrait:
    """A fresh job object from the current context's spec (its module imported anew).

    The job is not connected: its ``state()`` attaches to the running job the context cached
    (``.regency/job_state.pkl``), or applies it. Raises :class:`FileNotFoundError` when the
    context has no spec (run ``regency apply module.attr`` first), :class:`ValueError`,
    :class:`AttributeError` or :class:`TypeError` when the spec names no job object, and what
    importing its module raises. A ``.regency`` another user can change, or a spec file not
    private to this user, raises :class:`~regency._private_paths.UnsafePathError` before
    anything is imported (the spec names code to run).
    """
    _checked_root()
    spec = _spec_file()
    try:
        module_path = read_private_file(spec).decode().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No spec found at {spec}. Run 'regency apply <module.path>' first."
        ) from None
    return _import_job(module_path)


def context_create(name: str) -> None:
    """Create context ``name`` (an empty folder; :func:`context_use` activates it)."""
    check_context_name(name)
    private_dir(_own_root() / name)


def context_use(name: str) -> None:
    """Make ``name`` the active context (created if missing)."""
    _use(check_context_name(name))


def contexts() -> list[str]:
    """The names of the contexts, sorted."""
    root = _root()
    if not root.is_dir():
        return []
    return sorted(
        entry.name
        for entry in root.iterdir()
        if entry.is_dir() and not entry.is_symlink() and _is_context(entry)
    )


def _is_context(folder: Path) -> bool:
    """Whether ``folder`` of ``.regency/`` is a context (not, say, SlurmJob's log folder)."""
    names = {entry.name for entry in folder.iterdir()}
    return not names or bool(names & {SPEC_FILE, STATE_FILE}) or folder.name == current_context()


def context_rm(name: str) -> bool:
    """Remove context ``name``, killing the job it holds; ``False`` when there is none.

    If it was the active context, ``default`` becomes the active one.
    """
    folder = _checked_root() / check_context_name(name)
    if not folder.is_dir() or folder.is_symlink():
        return False
    state = folder / STATE_FILE
    if state.exists():
        with contextlib.suppress(Exception):  # a job that cannot be read or killed goes anyway
            job_load(state).kill()
    shutil.rmtree(folder)
    if current_context() == name:
        _use(DEFAULT_CONTEXT)
    return True
