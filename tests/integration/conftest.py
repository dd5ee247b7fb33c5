"""Shared fixtures for the integration tests: real proc meshes that are always stopped.

The test modules in this folder are imported by pytest's default ``prepend`` import mode, which
puts ``tests/integration`` on ``sys.path``. Spawned procs inherit the controller's ``sys.path``
and working directory, so actor classes defined at module level in a test file unpickle by
reference in the procs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from regency.actor import ProcMesh, this_host

SPAWN_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def _stop(procs: ProcMesh) -> None:
    with contextlib.suppress(Exception):
        procs.stop().get(timeout=STOP_TIMEOUT)


def spawn(gpus: int, **kwargs: object) -> ProcMesh:
    """Spawn ``gpus`` local procs and wait until they are up."""
    procs = this_host().spawn_procs(per_host={"gpus": gpus}, **kwargs)  # type: ignore[arg-type]
    return procs


@pytest.fixture(scope="module")
def procs4() -> Iterator[ProcMesh]:
    """Four procs shared by every test of a module (tests must not leave actors misbehaving)."""
    procs = spawn(4)
    try:
        assert procs.initialized.get(timeout=SPAWN_TIMEOUT) is True
        yield procs
    finally:
        _stop(procs)


@pytest.fixture
def make_procs() -> Iterator[Callable[..., ProcMesh]]:
    """A factory for procs private to one test; all of them are stopped at teardown."""
    made: list[ProcMesh] = []

    def factory(gpus: int, **kwargs: object) -> ProcMesh:
        procs = spawn(gpus, **kwargs)
        made.append(procs)
        return procs

    yield factory
    for procs in made:
        _stop(procs)
