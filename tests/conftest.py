"""Suite-wide setup: failures that reach the test process's root are recorded, not fatal.

Regency's default ``unhandled_fault_hook`` ends the controller with exit code 1, which in the
pytest process would end the test run. Tests that check the default run their own controller
in a subprocess; the others can look at ``root_failures``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import regency.actor
from regency.actor import MeshFailure

root_failures: list[MeshFailure] = []


@pytest.fixture(autouse=True, scope="session")
def _record_root_failures() -> Iterator[list[MeshFailure]]:
    previous = regency.actor.unhandled_fault_hook
    regency.actor.unhandled_fault_hook = root_failures.append
    yield root_failures
    regency.actor.unhandled_fault_hook = previous


def _processes_in(folder: Path) -> list[int]:
    """The pids of the processes whose working directory is ``folder`` or below it."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cwd = Path(os.readlink(entry / "cwd"))
                if cwd == folder or folder in cwd.parents:
                    pids.append(int(entry.name))
    return pids


@pytest.fixture
def leftover_processes(tmp_path: Path) -> Iterator[Callable[[], list[int]]]:
    """A check for processes still working in ``tmp_path`` (job hosts that commands run there
    started); at teardown the process group of each one left is killed, so a failing test
    leaves no hosts behind."""
    yield lambda: _processes_in(tmp_path)
    for pid in _processes_in(tmp_path):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
