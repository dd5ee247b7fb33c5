"""Mesh dimensions and reprs as Monarch 0.7.0 has them (issue 18 items 1 and 5).

Each expectation was observed on Monarch side by side: ``this_host()`` has no dimensions, so
``spawn_procs(per_host=...)`` has exactly ``per_host``'s; a ``ValueMesh`` prints its extent and
its ``(point, value)`` pairs pretty-printed; an ``ActorMesh`` prints its class and shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import (
    Actor,
    ActorMesh,
    ProcMesh,
    ValueMesh,
    context,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)
from regency.shape import Shape, Slice

pytestmark = pytest.mark.timeout(60)

T = 30.0


class Seen(Actor):
    """Reports the dimensions an actor sees from inside."""

    @endpoint
    def seen(self) -> dict[str, Any]:
        inst = context().actor_instance
        return {
            "rank": dict(inst.rank),
            "current_rank": str(current_rank()),
            "instance": str(inst),
            "this_host": this_host().sizes,
            "this_proc": this_proc().sizes,
            "proc_host": inst.proc.host_mesh.sizes,
        }

    @endpoint
    def seven(self) -> int:
        return 7


@pytest.fixture(scope="module")
def procs3() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    yield procs
    procs.stop().get(timeout=T)


@pytest.fixture(scope="module")
def seen(procs3: ProcMesh) -> ActorMesh[Seen]:
    return procs3.spawn("seen", Seen)


def test_this_host_has_no_dimensions() -> None:
    host = this_host()
    assert host.sizes == {}
    assert str(host.extent) == "{}"
    assert len(host) == 1
    assert host.slice().sizes == {}
    with pytest.raises(TypeError, match="hosts"):
        host.slice(hosts=0)


def test_per_host_dims_are_the_whole_shape(procs3: ProcMesh, seen: ActorMesh[Seen]) -> None:
    assert procs3.sizes == {"gpus": 3}
    assert seen.sizes == {"gpus": 3}
    values = seen.seven.call().get(timeout=T)
    assert values.sizes == {"gpus": 3}
    assert values.item(gpus=1) == 7
    assert seen.slice(gpus=slice(0, 2)).sizes == {"gpus": 2}
    assert seen.rename(gpus="x").sizes == {"x": 3}
    assert seen.split(gpus=("x", "y"), y=3).sizes == {"x": 1, "y": 3}
    assert seen.flatten("r").sizes == {"r": 3}
    assert seen.slice(gpus=2).seven.call().get(timeout=T).item() == 7


def test_an_actor_sees_no_host_dimension(seen: ActorMesh[Seen]) -> None:
    module = Seen.__module__
    for i, (point, got) in enumerate(seen.seen.call().get(timeout=T)):
        assert dict(point) == got["rank"] == {"gpus": i}
        assert got["current_rank"] == f"{{'gpus': {i}/3}}"
        assert got["instance"] == f"<root>.<{module}.Seen seen{{'gpus': {i}/3}}>"
        assert got["this_host"] == got["this_proc"] == got["proc_host"] == {}


def test_per_host_may_name_hosts_on_this_host(seen: ActorMesh[Seen]) -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2})
    try:
        assert procs.sizes == {"hosts": 1, "gpus": 2}
        mesh = procs.spawn("named", Seen)
        assert mesh.seven.call().get(timeout=T).item(hosts=0, gpus=1) == 7
    finally:
        procs.stop().get(timeout=T)


def test_spawn_procs_without_per_host_is_zero_dimensional() -> None:
    procs = this_host().spawn_procs()
    try:
        assert procs.sizes == {}
        one = procs.spawn("one", Seen)
        got = one.seen.call().get(timeout=T)
        assert got.sizes == {}
        seen = got.item()
        assert seen["rank"] == {}
        assert seen["current_rank"] == "{}"
        # No rank part for an actor of a 0-dimensional mesh, as in Monarch.
        assert seen["instance"] == f"<root>.<{Seen.__module__}.Seen one>"
        assert procs.host_mesh.sizes == {}
    finally:
        procs.stop().get(timeout=T)


def test_host_mesh_of_a_proc(procs3: ProcMesh) -> None:
    assert procs3.slice(gpus=0).host_mesh.sizes == {}
    assert this_proc().sizes == {}
    assert this_proc().host_mesh.sizes == {}
    with pytest.raises(NotImplementedError):
        _ = procs3.host_mesh


def test_value_mesh_repr_is_monarchs_layout(seen: ActorMesh[Seen]) -> None:
    values = seen.slice(gpus=slice(0, 2)).seven.call().get(timeout=T)
    assert repr(values) == "ValueMesh({gpus: 2}):\n  (({'gpus': 0/2}, 7), ({'gpus': 1/2}, 7))"
    made = ValueMesh(Shape(["x", "y"], Slice.new_row_major([2, 2])), [1, "two", [3.0], {"k": 4}])
    assert str(made) == (
        "ValueMesh({x: 2, y: 2}):\n"
        "  (({'x': 0/2, 'y': 0/2}, 1),\n"
        "   ({'x': 0/2, 'y': 1/2}, 'two'),\n"
        "   ({'x': 1/2, 'y': 0/2}, [3.0]),\n"
        "   ({'x': 1/2, 'y': 1/2}, {'k': 4}))"
    )
    assert repr(ValueMesh(Shape.unity(), [5])) == "ValueMesh({}):\n  (({}, 5),)"


def test_actor_mesh_repr_names_class_and_shape(seen: ActorMesh[Seen]) -> None:
    cls = f"<class '{Seen.__module__}.Seen'>"
    assert repr(seen) == f"ActorMesh(class={cls}, shape={{gpus=3}})"
    assert repr(seen.slice(gpus=0)) == f"ActorMesh(class={cls}, shape={{}})"
    assert repr(seen.slice(gpus=slice(0, 1))) == f"ActorMesh(class={cls}, shape={{gpus=1}})"


def test_dimension_errors_start_with_monarchs_text() -> None:
    values = ValueMesh(Shape(["x", "y"], Slice.new_row_major([2, 3])), list(range(6)))
    with pytest.raises(TypeError, match=r"^Shape does not have dimension labeled 'z'; .*'x', 'y'"):
        values.slice(z=0)
    with pytest.raises(IndexError, match=r"^index out of range: index 5 for dimension 'x'"):
        values.slice(x=5)
    with pytest.raises(KeyError, match=r"item has extra dimensions: \['z'\]"):
        values.item(x=0, y=0, z=1)
    with pytest.raises(ValueError, match=r"^Duplicate dimension name 'y'"):
        values.rename(x="y")
    with pytest.raises(
        ValueError, match=r"^cannot flatten sparse mesh: ndslice.strides=\[3, 1\] != dense_strides"
    ):
        values.slice(y=slice(0, 2)).flatten("r")
    with pytest.raises(KeyError, match="does not have dimension 'z'"):
        values.size("z")
