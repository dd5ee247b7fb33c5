"""Fault tests: shared helpers importable whatever pytest's import mode, and shared fixtures."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _fault_helpers import kill_all, wait_gone  # noqa: E402

import regency.actor  # noqa: E402
from regency.actor import MeshFailure, ProcMesh  # noqa: E402


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """Failures reaching this process's root, recorded by a replaced ``unhandled_fault_hook``."""
    seen: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture
def cleanup() -> Iterator[tuple[list[ProcMesh], list[int]]]:
    """Proc meshes to stop and pids to make sure of at teardown."""
    meshes: list[ProcMesh] = []
    pids: list[int] = []
    yield meshes, pids
    for procs in meshes:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=30)
    wait_gone(pids, 10)
    kill_all(pids)
