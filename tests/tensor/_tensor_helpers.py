"""Helpers the tensor engine tests import by name (a module of its own: ``conftest`` is not a
unique module name once several test directories have one)."""

from __future__ import annotations

from regency._tensor import engine
from regency.actor import ProcMesh


def flushes(mesh: ProcMesh) -> int:
    """Messages the engine has sent to ``mesh``'s workers so far."""
    root = engine.known_root(mesh)
    return root.flushes if root is not None else 0
