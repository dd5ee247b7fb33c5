"""Endpoint adverbs against real procs: call/ValueMesh, call_one, choose, stream, broadcast,
Accumulator and the free function ``send`` with ports (monarch-api.md §1.1 "Messaging")."""

from __future__ import annotations

import operator
import pickle
from collections.abc import Iterator

import pytest

from regency.actor import (
    Accumulator,
    Actor,
    ActorMesh,
    Channel,
    Point,
    ProcMesh,
    ValueMesh,
    context,
    endpoint,
    send,
)
from regency.shape import Extent, Shape

pytestmark = pytest.mark.timeout(60)

T = 30.0  # seconds any single reply may take


class Ranked(Actor):
    """Knows its spawn rank along ``gpus`` and keeps a counter."""

    def __init__(self) -> None:
        self.rank = context().actor_instance.rank["gpus"]
        self.count = 0

    @endpoint
    def rank_of(self) -> int:
        return self.rank

    @endpoint
    def scaled(self, factor: int, offset: int = 0) -> int:
        return self.rank * factor + offset

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.count += by
        return self.count

    @endpoint
    def value(self) -> int:
        return self.count

    @endpoint
    def total(self, values: ValueMesh[int]) -> tuple[int, dict[str, int]]:
        return sum(values.values()), dict(values.sizes)


@pytest.fixture
def ranked(procs4: ProcMesh) -> Iterator[ActorMesh[Ranked]]:
    mesh = procs4.spawn("ranked", Ranked)
    yield mesh
    mesh.stop().get(timeout=T)


# -- ValueMesh from call ---------------------------------------------------------------------


def test_call_returns_value_mesh_shaped_like_the_mesh(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.rank_of.call().get(timeout=T)
    assert isinstance(vm, ValueMesh)
    assert vm.sizes == {"gpus": 4}
    assert list(vm.extent.labels) == ["gpus"]
    assert len(vm) == 4
    assert vm.size() == 4
    assert vm.size("gpus") == 4


def test_value_mesh_items_are_point_value_pairs_in_rank_order(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.scaled.call(10, offset=1).get(timeout=T)
    items = list(vm.items())
    assert [value for _, value in items] == [1, 11, 21, 31]
    for i, (point, _) in enumerate(items):
        assert isinstance(point, Point)
        assert point.rank == i
        assert dict(point) == {"gpus": i}
        assert str(point) == f"{{'gpus': {i}/4}}"


def test_value_mesh_values_in_rank_order(ranked: ActorMesh[Ranked]) -> None:
    assert list(ranked.rank_of.call().get(timeout=T).values()) == [0, 1, 2, 3]


def test_value_mesh_iteration_yields_point_value_pairs(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.rank_of.call().get(timeout=T)
    seen = [(point["gpus"], value) for point, value in vm]
    assert seen == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_value_mesh_item_by_coordinates(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.scaled.call(7).get(timeout=T)
    assert vm.item(gpus=3) == 21
    assert vm.get(2) == 14
    with pytest.raises(KeyError):
        vm.item()  # every dimension must be given
    with pytest.raises(KeyError):
        vm.item(gpus=1, racks=0)  # unknown dimension


def test_value_mesh_item_on_a_singleton_needs_no_coordinates(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.slice(gpus=2).rank_of.call().get(timeout=T)
    assert len(vm) == 1
    assert vm.sizes == {}
    assert vm.item() == 2


def test_value_mesh_slicing(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.rank_of.call().get(timeout=T)
    middle = vm.slice(gpus=slice(1, 3))
    assert middle.sizes == {"gpus": 2}
    assert list(middle.values()) == [1, 2]
    assert middle.item(gpus=0) == 1
    one = vm.slice(gpus=3)
    assert one.sizes == {}
    assert one.item() == 3
    assert list(vm.flatten("rank").slice(rank=slice(0, 4, 2)).values()) == [0, 2]
    assert vm.rename(gpus="ranks").item(ranks=1) == 1


def test_value_mesh_pickles(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.scaled.call(3).get(timeout=T)
    copy = pickle.loads(pickle.dumps(vm))
    assert copy.sizes == vm.sizes
    assert list(copy.values()) == [0, 3, 6, 9]
    assert [dict(p) for p, _ in copy] == [dict(p) for p, _ in vm]
    sliced = pickle.loads(pickle.dumps(vm.slice(gpus=slice(2, 4))))
    assert sliced.sizes == {"gpus": 2}
    assert list(sliced.values()) == [6, 9]


def test_value_mesh_travels_to_an_actor(ranked: ActorMesh[Ranked]) -> None:
    vm = ranked.scaled.call(2).get(timeout=T)
    total, sizes = ranked.slice(gpus=0).total.call_one(vm).get(timeout=T)
    assert total == 0 + 2 + 4 + 6
    assert sizes == {"gpus": 4}


def test_value_mesh_constructor() -> None:
    shape = Shape.from_extent(Extent(["x", "y"], [2, 3]))
    vm = ValueMesh(shape, list("abcdef"))
    assert vm.sizes == {"x": 2, "y": 3}
    assert vm.item(x=1, y=0) == "d"
    assert list(vm.slice(y=2).values()) == ["c", "f"]
    with pytest.raises(ValueError):
        ValueMesh(shape, [1, 2, 3])


def test_value_mesh_from_indexed() -> None:
    shape = Shape.from_extent(Extent(["x"], [3]))
    vm = ValueMesh.from_indexed(shape, [(2, "c"), (0, "a"), (1, "b")])
    assert list(vm.values()) == ["a", "b", "c"]
    last_wins = ValueMesh.from_indexed(shape, [(0, "a"), (1, "b"), (2, "c"), (1, "B")])
    assert list(last_wins.values()) == ["a", "B", "c"]
    with pytest.raises(ValueError):
        ValueMesh.from_indexed(shape, [(0, "a"), (2, "c")])  # rank 1 missing


# -- call_one, choose, stream, broadcast -----------------------------------------------------


def test_call_one_on_a_one_actor_slice(ranked: ActorMesh[Ranked]) -> None:
    assert ranked.slice(gpus=2).rank_of.call_one().get(timeout=T) == 2
    assert ranked.slice(gpus=slice(3, 4)).scaled.call_one(5, offset=1).get(timeout=T) == 16


def test_call_one_on_many_actors_raises_immediately_and_sends_nothing(
    ranked: ActorMesh[Ranked],
) -> None:
    with pytest.raises(ValueError, match=r"^call_one requires exactly 1 actor, but mesh has 4$"):
        ranked.incr.call_one()
    with pytest.raises(ValueError, match=r"^call_one requires exactly 1 actor, but mesh has 2$"):
        ranked.slice(gpus=slice(0, 2)).incr.call_one()
    assert list(ranked.value.call().get(timeout=T).values()) == [0, 0, 0, 0]


def test_choose_sends_to_exactly_one_random_actor(ranked: ActorMesh[Ranked]) -> None:
    picked = [ranked.rank_of.choose().get(timeout=T) for _ in range(40)]
    assert set(picked) <= {0, 1, 2, 3}
    assert len(set(picked)) > 1  # 40 uniform picks all equal: probability 4**-39
    for _ in range(10):
        assert ranked.incr.choose().get(timeout=T) >= 1
    assert sum(ranked.value.call().get(timeout=T).values()) == 10


def test_stream_yields_exactly_one_future_per_rank(ranked: ActorMesh[Ranked]) -> None:
    stream = ranked.scaled.stream(100)
    futures = []
    for fut in stream:
        futures.append(fut)
    assert len(futures) == 4
    with pytest.raises(StopIteration):
        next(stream)
    assert sorted(f.get(timeout=T) for f in futures) == [0, 100, 200, 300]
    assert len(list(ranked.slice(gpus=slice(1, 3)).rank_of.stream())) == 2


def test_broadcast_then_call_sees_the_increment(ranked: ActorMesh[Ranked]) -> None:
    assert ranked.incr.broadcast(5) is None
    assert list(ranked.value.call().get(timeout=T).values()) == [5, 5, 5, 5]
    for i in range(1, 21):
        ranked.incr.broadcast()
        assert list(ranked.value.call().get(timeout=T).values()) == [5 + i] * 4


def test_thousands_of_calls_in_flight_complete_in_order(ranked: ActorMesh[Ranked]) -> None:
    one = ranked.slice(gpus=3)
    futures = [one.incr.call_one() for _ in range(2000)]
    assert [f.get(timeout=T) for f in futures] == list(range(1, 2001))
    casts = [ranked.incr.call() for _ in range(200)]
    got = [list(f.get(timeout=T).values()) for f in casts]
    assert got == [[i, i, i, 2000 + i] for i in range(1, 201)]


def test_accumulator_folds_every_reply(ranked: ActorMesh[Ranked]) -> None:
    total = Accumulator(ranked.scaled, 0, operator.add).accumulate(10, offset=1).get(timeout=T)
    assert total == 1 + 11 + 21 + 31
    collected = Accumulator(ranked.rank_of, (), lambda acc, r: (*acc, r)).accumulate()
    assert sorted(collected.get(timeout=T)) == [0, 1, 2, 3]
    sliced = Accumulator(ranked.slice(gpus=slice(2, 4)).rank_of, 0, operator.add)
    assert sliced.accumulate().get(timeout=T) == 5


# -- the free function send, with ports ------------------------------------------------------


def test_send_to_a_port_gives_one_reply_per_rank(ranked: ActorMesh[Ranked]) -> None:
    port, receiver = Channel[int].open()
    send(ranked.scaled, (3,), {"offset": 1}, port=port)
    replies = sorted(receiver.recv().get(timeout=T) for _ in range(4))
    assert replies == [1, 4, 7, 10]


def test_send_to_a_ranked_port_stamps_the_rank(ranked: ActorMesh[Ranked]) -> None:
    port, receiver = Channel[int].open_ranked()
    waiting = [receiver.recv() for _ in range(4)]  # receivers waiting before any reply exists
    send(ranked.rank_of, (), {}, port=port)
    pairs = sorted(fut.get(timeout=T) for fut in waiting)
    assert pairs == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_send_without_port_still_delivers_in_order(ranked: ActorMesh[Ranked]) -> None:
    send(ranked.incr, (2,), {})
    send(ranked.incr, (), {"by": 3})
    assert list(ranked.value.call().get(timeout=T).values()) == [5, 5, 5, 5]


def test_send_selection_choose_reaches_one_actor(ranked: ActorMesh[Ranked]) -> None:
    port, receiver = Channel[int].open()
    send(ranked.incr, (), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=T) == 1
    # Per-sender FIFO: the call below runs after the chosen increment on every actor.
    assert sorted(ranked.value.call().get(timeout=T).values()) == [0, 0, 0, 1]
