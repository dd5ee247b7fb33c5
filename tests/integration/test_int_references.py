"""Passing mesh and port references in messages; controller singletons; actors in the
controller's own process (monarch-api.md §1.1 "Ports and channels", "Process/host meshes", §2.7)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from regency.actor import (
    Actor,
    ActorMesh,
    Channel,
    Port,
    ProcMesh,
    context,
    current_rank,
    endpoint,
    get_or_spawn_controller,
    this_proc,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0


class Player(Actor):
    """Holds the same-rank actor of another mesh and hits it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rank = context().actor_instance.rank["gpus"]
        self.partner: ActorMesh[Player] | None = None
        self.hits_taken: list[str] = []

    @endpoint
    def meet(self, others: ActorMesh[Player]) -> int:
        self.partner = others.slice(**current_rank())
        return len(self.partner)

    @endpoint
    def serve(self, times: int) -> list[str]:
        assert self.partner is not None
        return [
            self.partner.hit.call_one(self.name, self.rank, i).get(timeout=T) for i in range(times)
        ]

    @endpoint
    def hit(self, by: str, by_rank: int, i: int) -> str:
        note = f"{self.name}{self.rank} hit by {by}{by_rank} #{i}"
        self.hits_taken.append(note)
        return note

    @endpoint
    def taken(self) -> list[str]:
        return self.hits_taken


class Replier(Actor):
    def __init__(self) -> None:
        self.rank = context().actor_instance.rank["gpus"]

    @endpoint
    def reply_many(self, port: Port[tuple[int, int]], count: int) -> str:
        for i in range(count):
            port.send((self.rank, i))
        return "sent"

    @endpoint
    def reply_error(self, port: Port[Any]) -> None:
        port.exception(ValueError(f"error from rank {self.rank}"))

    @endpoint(explicit_response_port=True)
    def explicit(self, port: Port[str], word: str) -> None:
        port.send(f"{word} from {self.rank}")


class Child(Actor):
    @endpoint
    def where(self) -> tuple[int, int]:
        return os.getpid(), context().actor_instance.rank["gpus"]


class Spawner(Actor):
    @endpoint
    def spawn_children(self, procs: ProcMesh) -> list[tuple[int, int]]:
        children = procs.spawn("grandchildren", Child)
        return list(children.where.call().get(timeout=T).values())

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Registry(Actor):
    """A controller singleton; counts how many instances were ever made in this process."""

    constructed: ClassVar[int] = 0

    def __init__(self, label: str) -> None:
        type(self).constructed += 1
        self.label = label
        self.count = 0

    @endpoint
    def bump(self) -> int:
        self.count += 1
        return self.count

    @endpoint
    def info(self) -> tuple[str, int, int, int, str]:
        return (
            self.label,
            self.count,
            type(self).constructed,
            os.getpid(),
            str(context().actor_instance),
        )


class RegistryUser(Actor):
    @endpoint
    def bump_registry(self, name: str) -> tuple[int, int]:
        registry = get_or_spawn_controller(name, Registry, "from actor").get(timeout=T)
        return registry.bump.call_one().get(timeout=T), os.getpid()

    @endpoint
    def registry_info(self, name: str) -> tuple[str, int, int, int, str]:
        registry = get_or_spawn_controller(name, Registry, "from actor").get(timeout=T)
        return registry.info.call_one().get(timeout=T)


class Local(Actor):
    @endpoint
    def where(self) -> tuple[int, str]:
        return os.getpid(), str(context().actor_instance)


@pytest.fixture(scope="module")
def replier(procs4: ProcMesh) -> Iterator[ActorMesh[Replier]]:
    mesh = procs4.spawn("replier", Replier)
    yield mesh
    mesh.stop().get(timeout=T)


def test_actor_meshes_passed_as_arguments_ping_pong(procs4: ProcMesh) -> None:
    pings = procs4.spawn("ping", Player, "ping")
    pongs = procs4.spawn("pong", Player, "pong")
    try:
        assert list(pings.meet.call(pongs).get(timeout=T).values()) == [1] * 4
        assert list(pongs.meet.call(pings).get(timeout=T).values()) == [1] * 4
        for r, notes in enumerate(pings.serve.call(3).get(timeout=T).values()):
            assert notes == [f"pong{r} hit by ping{r} #{i}" for i in range(3)]
        for r, notes in enumerate(pongs.serve.call(2).get(timeout=T).values()):
            assert notes == [f"ping{r} hit by pong{r} #{i}" for i in range(2)]
        taken = list(pongs.taken.call().get(timeout=T).values())
        assert taken == [[f"pong{r} hit by ping{r} #{i}" for i in range(3)] for r in range(4)]
    finally:
        pings.stop().get(timeout=T)
        pongs.stop().get(timeout=T)


def test_port_passed_in_a_message_is_used_to_reply(replier: ActorMesh[Replier]) -> None:
    port, receiver = Channel[tuple[int, int]].open()
    assert list(replier.reply_many.call(port, 25).get(timeout=T).values()) == ["sent"] * 4
    received = [receiver.recv().get(timeout=T) for _ in range(100)]
    for rank in range(4):
        # Port messages from one sender arrive in send order.
        assert [i for r, i in received if r == rank] == list(range(25))


def test_port_exception_makes_recv_raise(replier: ActorMesh[Replier]) -> None:
    port, receiver = Channel[Any].open()
    replier.slice(gpus=3).reply_error.call_one(port).get(timeout=T)
    with pytest.raises(ValueError, match="error from rank 3"):
        receiver.recv().get(timeout=T)


def test_explicit_response_port_endpoint(replier: ActorMesh[Replier]) -> None:
    assert replier.slice(gpus=1).explicit.call_one("hello").get(timeout=T) == "hello from 1"
    values = list(replier.explicit.call("hi").get(timeout=T).values())
    assert values == [f"hi from {r}" for r in range(4)]


def test_proc_mesh_passed_in_a_message_can_spawn(procs4: ProcMesh) -> None:
    spawner = procs4.slice(gpus=0).spawn("spawner", Spawner)
    probe = procs4.spawn("probe", Spawner)
    try:
        target = procs4.slice(gpus=slice(1, 4))
        reference_pids = list(probe.pid.call().get(timeout=T).values())
        children = spawner.spawn_children.call_one(target).get(timeout=T)
        assert [pid for pid, _ in children] == reference_pids[1:]
        assert [rank for _, rank in children] == [0, 1, 2]
    finally:
        spawner.stop().get(timeout=T)
        probe.stop().get(timeout=T)


def test_get_or_spawn_controller_is_one_singleton_everywhere(procs4: ProcMesh) -> None:
    name = "registry-singleton"
    before = Registry.constructed
    first = get_or_spawn_controller(name, Registry, "from controller").get(timeout=T)
    again = get_or_spawn_controller(name, Registry, "ignored").get(timeout=T)
    assert first.bump.call_one().get(timeout=T) == 1
    assert again.bump.call_one().get(timeout=T) == 2
    users = procs4.spawn("registry_users", RegistryUser)
    try:
        bumps = list(users.bump_registry.call(name).get(timeout=T).values())
        assert sorted(count for count, _ in bumps) == [3, 4, 5, 6]
        assert len({pid for _, pid in bumps}) == 4
        label, count, constructed, pid, _ = (
            users.slice(gpus=2).registry_info.call_one(name).get(timeout=T)
        )
        assert (label, count) == ("from controller", 6)
        assert pid == os.getpid()  # lives in the controller's process
        assert constructed - before == 1
        assert Registry.constructed - before == 1
    finally:
        users.stop().get(timeout=T)


def test_get_or_spawn_controller_deduplicates_concurrent_first_calls(procs4: ProcMesh) -> None:
    name = "registry-raced"
    before = Registry.constructed
    users = procs4.spawn("registry_racers", RegistryUser)
    try:
        bumps = list(users.bump_registry.call(name).get(timeout=T).values())
        assert sorted(count for count, _ in bumps) == [1, 2, 3, 4]
        mine = get_or_spawn_controller(name, Registry, "late").get(timeout=T)
        label, count, _, pid, _ = mine.info.call_one().get(timeout=T)
        assert (label, count, pid) == ("from actor", 4, os.getpid())
        assert Registry.constructed - before == 1
    finally:
        users.stop().get(timeout=T)


def test_this_proc_spawn_runs_in_the_controller_process() -> None:
    local = this_proc().spawn("local", Local)
    try:
        pid, name = local.where.call_one().get(timeout=T)
        assert pid == os.getpid()
        assert name.startswith("<root>.<")
        assert "Local local" in name
    finally:
        local.stop().get(timeout=T)
