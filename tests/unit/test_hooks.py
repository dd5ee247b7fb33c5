"""The runtime's typed hooks upwards (regency._hooks), filled by the ``regency`` package."""

from __future__ import annotations

import pytest

import regency.actor
from regency import _hooks
from regency._runtime.actors.supervision.supervision import MeshFailure


def test_an_unregistered_hook_names_itself() -> None:
    hook: _hooks.Hook[_hooks.Boot] = _hooks.Hook("controller boot")
    with pytest.raises(RuntimeError, match="regency's controller boot is not registered"):
        hook.load()


def test_the_fault_hook_is_the_attribute_users_set_now(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", seen.append)
    assert _hooks.fault_hook.load() == seen.append


def test_the_composition_root_gives_each_hook_its_layer() -> None:
    import regency._runtime.actors.meshes.meshes as meshes
    import regency._runtime.host.controller as controller
    import regency.observe.pdb_session as pdb_session

    assert _hooks.boot.load() == controller.bootstrap_controller
    assert _hooks.proc_mesh.load() == meshes.this_proc_mesh
    assert _hooks.debugger.load() is pdb_session
