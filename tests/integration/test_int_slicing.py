"""Slicing and reshaping actor and proc meshes; what an actor sees of its own position
(monarch-api.md §1.1 "Context & identity", "MeshTrait", §2.6)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import (
    Actor,
    ActorMesh,
    ProcMesh,
    context,
    current_rank,
    current_size,
    endpoint,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0


class Where(Actor):
    """Reports where it runs and where the current message was cast."""

    @endpoint
    def where(self) -> dict[str, Any]:
        ctx = context()
        inst = ctx.actor_instance
        return {
            "message_rank": dict(ctx.message_rank),
            "message_linear": ctx.message_rank.rank,
            "spawn_rank": dict(inst.rank),
            "spawn_linear": inst.rank.rank,
            "current_rank": dict(current_rank()),
            "current_rank_is_message_rank": current_rank() == ctx.message_rank,
            "current_size": current_size(),
            "instance": str(inst),
            "pid": os.getpid(),
        }


@pytest.fixture(scope="module")
def where(procs4: ProcMesh) -> Iterator[ActorMesh[Where]]:
    mesh = procs4.spawn("where", Where)
    yield mesh
    mesh.stop().get(timeout=T)


def _spawn_ranks(mesh: ActorMesh[Where]) -> list[int]:
    return [w["spawn_rank"]["gpus"] for w in mesh.where.call().get(timeout=T).values()]


def test_whole_mesh_message_rank_equals_spawn_rank(where: ActorMesh[Where]) -> None:
    for i, (point, w) in enumerate(where.where.call().get(timeout=T)):
        assert w["spawn_rank"] == {"gpus": i}
        assert w["message_rank"] == dict(point) == {"gpus": i}
        assert w["message_linear"] == w["spawn_linear"] == i
        assert w["current_size"] == {"gpus": 4}


def test_slice_with_an_int_drops_the_dimension(where: ActorMesh[Where]) -> None:
    one = where.slice(gpus=1)
    assert len(one) == 1
    assert one.sizes == {}
    w = one.where.call_one().get(timeout=T)
    assert w["spawn_rank"] == {"gpus": 1}
    assert w["message_rank"] == {}
    assert w["current_size"] == {}
    vm = one.where.call().get(timeout=T)
    assert vm.sizes == {}
    assert vm.item()["spawn_rank"]["gpus"] == 1


@pytest.mark.parametrize(
    ("selection", "expected_spawn"),
    [(slice(0, 2), [0, 1]), (slice(1, 3), [1, 2]), (slice(1, 4, 2), [1, 3]), (range(2, 4), [2, 3])],
)
def test_slice_with_a_range_keeps_the_dimension_and_ranks_relative(
    where: ActorMesh[Where], selection: Any, expected_spawn: list[int]
) -> None:
    part = where.slice(gpus=selection)
    assert part.sizes == {"gpus": len(expected_spawn)}
    replies = list(part.where.call().get(timeout=T).items())
    assert [w["spawn_rank"]["gpus"] for _, w in replies] == expected_spawn
    for i, (point, w) in enumerate(replies):
        assert w["message_rank"] == dict(point) == {"gpus": i}
        assert w["message_linear"] == i
        assert w["current_size"] == {"gpus": len(expected_spawn)}


def test_slice_of_a_slice(where: ActorMesh[Where]) -> None:
    inner = where.slice(gpus=slice(1, 4)).slice(gpus=slice(1, 3))
    assert _spawn_ranks(inner) == [2, 3]
    assert inner.slice(gpus=0).where.call_one().get(timeout=T)["spawn_rank"]["gpus"] == 2


def test_current_rank_is_the_message_rank(where: ActorMesh[Where]) -> None:
    for w in where.slice(gpus=slice(2, 4)).where.call().get(timeout=T).values():
        assert w["current_rank_is_message_rank"]
        assert w["current_rank"] == w["message_rank"]


def test_instance_str_names_creator_class_name_and_spawn_rank(where: ActorMesh[Where]) -> None:
    module = Where.__module__
    for i, w in enumerate(where.where.call().get(timeout=T).values()):
        assert w["instance"] == f"<root>.<{module}.Where where{{'gpus': {i}/4}}>"
    # Sending to a slice does not change who the actor is.
    w = where.slice(gpus=3).where.call_one().get(timeout=T)
    assert w["instance"] == f"<root>.<{module}.Where where{{'gpus': 3/4}}>"


def test_controller_context_is_root() -> None:
    ctx = context()
    assert str(ctx.actor_instance) == "<root>"
    assert dict(ctx.message_rank) == {}


def test_flatten(where: ActorMesh[Where]) -> None:
    flat = where.flatten("rank")
    assert flat.sizes == {"rank": 4}
    replies = list(flat.where.call().get(timeout=T).items())
    assert [w["spawn_rank"]["gpus"] for _, w in replies] == [0, 1, 2, 3]
    assert [w["message_rank"] for _, w in replies] == [{"rank": i} for i in range(4)]
    solo = flat.slice(rank=2).where.call_one().get(timeout=T)
    assert solo["spawn_rank"]["gpus"] == 2
    assert solo["message_rank"] == {}


def test_rename(where: ActorMesh[Where]) -> None:
    renamed = where.rename(gpus="ranks")
    assert renamed.sizes == {"ranks": 4}
    vm = renamed.where.call().get(timeout=T)
    assert vm.item(ranks=3)["message_rank"] == {"ranks": 3}
    assert renamed.slice(ranks=1).where.call_one().get(timeout=T)["spawn_rank"]["gpus"] == 1


def test_split(where: ActorMesh[Where]) -> None:
    grid = where.split(gpus=("dp", "tp"), tp=2)
    assert grid.sizes == {"dp": 2, "tp": 2}
    for i, (point, w) in enumerate(grid.where.call().get(timeout=T)):
        assert w["spawn_rank"]["gpus"] == i
        assert w["message_rank"] == dict(point) == {"dp": i // 2, "tp": i % 2}
    assert _spawn_ranks(grid.slice(dp=1)) == [2, 3]
    assert _spawn_ranks(grid.slice(tp=1)) == [1, 3]
    assert grid.slice(tp=1).where.call().get(timeout=T).sizes == {"dp": 2}
    with pytest.raises(ValueError):
        where.split(gpus=("dp", "tp"), tp=3)  # 4 is not divisible by 3


def test_slice_errors(where: ActorMesh[Where]) -> None:
    with pytest.raises(TypeError):
        where.slice(racks=0)
    with pytest.raises(IndexError):
        where.slice(gpus=4)


def test_sliced_proc_mesh_spawns_on_the_selected_procs(
    procs4: ProcMesh, where: ActorMesh[Where]
) -> None:
    pids = [w["pid"] for w in where.where.call().get(timeout=T).values()]
    assert len(set(pids)) == 4
    part = procs4.slice(gpus=slice(2, 4))
    assert part.sizes == {"gpus": 2}
    mesh = part.spawn("where_part", Where)
    try:
        replies = list(mesh.where.call().get(timeout=T).values())
        assert [w["pid"] for w in replies] == pids[2:]
        # The spawn position is within the proc mesh slice it was spawned on.
        assert [w["spawn_rank"] for w in replies] == [{"gpus": i} for i in (0, 1)]
    finally:
        mesh.stop().get(timeout=T)
