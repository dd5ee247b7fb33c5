"""Spawned procs inherit the controller's effective settings as they were at ``spawn_procs``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from regency import config
from regency.actor import Actor, ProcMesh, endpoint, this_host

pytestmark = pytest.mark.timeout(60)


class Settings(Actor):
    @endpoint
    def settings(self) -> dict[str, Any]:
        return config.get_global_config()


@pytest.fixture
def spawned() -> Iterator[list[ProcMesh]]:
    """Proc meshes to stop at the end; also restores this process's configure() values."""
    saved = config.get_runtime_config()
    meshes: list[ProcMesh] = []
    yield meshes
    config.clear_runtime_config()
    config.configure(**saved)
    for procs in meshes:
        procs.stop().get(timeout=30)


def _settings(procs: ProcMesh) -> list[dict[str, Any]]:
    mesh = procs.spawn("settings", Settings)
    return list(mesh.settings.call().get(timeout=30).values())


def test_configure_before_spawn_reaches_every_proc(spawned: list[ProcMesh]) -> None:
    config.configure(stop_timeout=7.5, connect_timeout=3)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    for seen in _settings(procs):
        assert seen["stop_timeout"] == 7.5
        assert seen["connect_timeout"] == 3.0


def test_environment_variable_reaches_every_proc(
    spawned: list[ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGENCY_CONNECT_TIMEOUT", "42")
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    spawned.append(procs)
    (seen,) = _settings(procs)
    assert seen["connect_timeout"] == 42.0


def test_settings_are_taken_when_spawn_procs_is_called(spawned: list[ProcMesh]) -> None:
    # spawn_procs returns at once and the procs start in the background; the settings they get
    # must still be the ones in force at the call, not whatever holds when they actually start.
    with config.configured(stop_timeout=6.5):
        procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    for seen in _settings(procs):
        assert seen["stop_timeout"] == 6.5, (
            f"the proc got stop_timeout={seen['stop_timeout']}, not the value configured "
            "around spawn_procs"
        )


def test_procs_do_not_read_their_own_environment_over_the_controllers(
    spawned: list[ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGENCY_CONNECT_TIMEOUT", "9")
    config.configure(connect_timeout=4)
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    spawned.append(procs)
    (seen,) = _settings(procs)
    assert seen["connect_timeout"] == 4.0
    assert os.environ["REGENCY_CONNECT_TIMEOUT"] == "9"
