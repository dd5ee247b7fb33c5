"""Monarch's API surface on live meshes (issue 18 item 12): endpoint names, spawn_procs options.

Expected behaviour was read off torchmonarch 0.7.0 running the same scenarios.
"""

from __future__ import annotations

import pytest

from regency.actor import Actor, ProcMesh, endpoint, this_proc

pytestmark = pytest.mark.timeout(120)


class MeshWords(Actor):
    """Endpoints named like attributes Monarch's ActorMesh does not have."""

    @endpoint
    def shape(self) -> str:
        return "my shape"

    @endpoint
    def restarts(self) -> int:
        return 41

    @endpoint
    def restarted(self, n: int) -> int:
        return n + 1


def test_endpoints_named_shape_restarts_restarted_work() -> None:
    mesh = this_proc().spawn("words", MeshWords)
    try:
        assert mesh.shape.call_one().get(timeout=30) == "my shape"
        assert mesh.restarts.call_one().get(timeout=30) == 41
        assert mesh.restarted.call_one(1).get(timeout=30) == 2
        view = mesh.slice()
        assert view.shape.call_one().get(timeout=30) == "my shape"
    finally:
        mesh.stop().get(timeout=30)


class Plain(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def test_a_mesh_without_such_endpoints_keeps_its_attributes(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("plain", Plain)
    try:
        assert dict(mesh.shape.extent)["gpus"] == 4
        assert mesh.restarts == 0
    finally:
        mesh.stop().get(timeout=30)


@pytest.mark.parametrize(
    "name",
    [
        "stop",
        "slice",
        "initialized",
        "size",
        "sizes",
        "extent",
        "flatten",
        "rename",
        "split",
        "_class",
        "_name",
        "_shape",
        "_proc_mesh",
    ],
)
def test_endpoint_names_monarch_refuses(name: str) -> None:
    def method(self: Actor) -> int:
        return 1

    method.__name__ = name
    cls = type(f"Clash_{name.strip('_')}", (Actor,), {name: endpoint(method)})
    expected = f"ActorMesh has an attribute that collides with an endpoint name: attribute={name}"
    with pytest.raises(ValueError, match=expected):
        this_proc().spawn("clash", cls)
