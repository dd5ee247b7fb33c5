"""Where this user's running controllers say what they serve: one file per controller.

A controller that serves the debugger or the admin API writes
``$TMPDIR/regency-<uid>/controllers/<pid>.json`` (the directory 0700 and checked to be this
user's, the file 0600) with, per service, its address and the token that admits a client; the
file goes when the service stops or the controller exits. ``regency debug`` and
``regency stacks`` find a controller there without being told its port. Only this user can
read the files: the token in them admits exactly what this user could do anyway.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regency._private_paths import (
    check_private_dir,
    private_dir,
    read_private_file,
    user_root,
    write_private_file,
)

_lock = threading.Lock()
_sections: dict[str, dict[str, Any]] = {}
_registered_exit = False


def controllers_dir() -> Path:
    """The directory of this user's controller files (not created here)."""
    return user_root() / "controllers"


def _own_file() -> Path:
    return controllers_dir() / f"{os.getpid()}.json"


def _write_locked() -> None:
    path = _own_file()
    if not _sections:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    private_dir(user_root())
    private_dir(controllers_dir())
    record = {
        "pid": os.getpid(),
        "program": " ".join(sys.argv[:2]) or sys.executable,
        "started": time.time(),
        **_sections,
    }
    write_private_file(path, json.dumps(record).encode())


def publish(section: str, info: dict[str, Any]) -> None:
    """Say that this controller serves ``section`` (e.g. ``"debug"``) as ``info`` describes."""
    global _registered_exit
    with _lock:
        _sections[section] = info
        _write_locked()
        if not _registered_exit:
            _registered_exit = True
            atexit.register(_withdraw_all)


def withdraw(section: str) -> None:
    """Say that this controller no longer serves ``section``."""
    with _lock:
        if _sections.pop(section, None) is not None:
            _write_locked()


def _withdraw_all() -> None:
    with _lock:
        _sections.clear()
        _write_locked()


@dataclass(frozen=True)
class Controller:
    """A running controller of this user, as its file describes it."""

    pid: int
    program: str
    started: float
    sections: dict[str, Any]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_controllers(section: str) -> list[Controller]:
    """The user's live controllers that serve ``section``, newest first.

    Files of controllers that are gone (killed before they could remove them) are removed. A
    directory that is not private to this user raises
    :class:`~regency._private_paths.UnsafePathError`.
    """
    found: list[Controller] = []
    try:
        folder = check_private_dir(controllers_dir())
    except FileNotFoundError:
        return found
    for path in folder.glob("*.json"):
        try:
            record = json.loads(read_private_file(path))
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, not private, or half written: never trusted
        if not _alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if section in record:
            sections = {k: v for k, v in record.items() if isinstance(v, dict)}
            program = str(record.get("program", ""))
            found.append(Controller(pid, program, float(record.get("started", 0)), sections))
    found.sort(key=lambda c: c.started, reverse=True)
    return found
