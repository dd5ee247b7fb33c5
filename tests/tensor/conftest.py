"""Shared fixtures for the tensor engine tests: proc meshes shared per module, always stopped.

Spawned procs inherit the controller's ``sys.path``, so module-level functions of these test
files resolve by import path on the workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from regency.actor import ProcMesh, this_host

SPAWN_TIMEOUT = 60.0


def _stop(procs: ProcMesh) -> None:
    with contextlib.suppress(Exception):
        procs.stop().get(timeout=30.0)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """Two procs (``gpus=2``) shared by the tests of a module."""
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        assert mesh.initialized.get(timeout=SPAWN_TIMEOUT) is True
        yield mesh
    finally:
        _stop(mesh)


@pytest.fixture(scope="module")
def procs4() -> Iterator[ProcMesh]:
    """Four procs as ``{hosts=2, gpus=2}`` shared by the tests of a module."""
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        assert mesh.initialized.get(timeout=SPAWN_TIMEOUT) is True
        yield mesh
    finally:
        _stop(mesh)


@pytest.fixture
def make_procs() -> Iterator[Callable[[int], ProcMesh]]:
    """Procs private to one test (for tests that kill them)."""
    made: list[ProcMesh] = []

    def factory(n: int) -> ProcMesh:
        mesh = this_host().spawn_procs(per_host={"gpus": n})
        made.append(mesh)
        return mesh

    yield factory
    for mesh in made:
        _stop(mesh)
