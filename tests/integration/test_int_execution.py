"""The execution model (monarch-api.md §2.3): one message at a time per actor, sync endpoints
without a loop, async endpoints on a real loop, call-site validation, concurrent endpoints."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from regency.actor import (
    Actor,
    ActorMesh,
    ProcMesh,
    concurrent_endpoint,
    context,
    endpoint,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0


class Guarded(Actor):
    """Counts how many handlers run at once; any value above 1 is an overlap."""

    def __init__(self) -> None:
        self.inside = 0
        self.max_inside = 0
        self.entered = 0
        self.threads: set[int] = set()

    @endpoint
    def enter(self, hold: float) -> int:
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        self.threads.add(threading.get_ident())
        # Stay inside long enough for an overlapping handler to show up if dispatch allowed it.
        time.sleep(hold)
        self.entered += 1
        self.inside -= 1
        return self.entered

    @endpoint
    def stats(self) -> tuple[int, int, int]:
        return self.max_inside, self.entered, len(self.threads)


class Hammer(Actor):
    """Calls a target from its own actor: another sender, running concurrently."""

    @endpoint
    def hammer(self, target: ActorMesh[Guarded], times: int) -> list[int]:
        return [target.enter.call_one(0.002).get(timeout=T) for _ in range(times)]


class ThreadLocal(Actor):
    def __init__(self) -> None:
        self.local = threading.local()
        self.local.value = f"set in __init__ of {context().actor_instance.rank.rank}"
        self.init_thread = threading.get_ident()

    @endpoint
    def read(self) -> tuple[str | None, bool]:
        return getattr(self.local, "value", None), threading.get_ident() == self.init_thread


class AsyncThreadLocal(Actor):
    def __init__(self) -> None:
        self.local = threading.local()
        self.local.value = "async init"
        self.init_thread = threading.get_ident()

    @endpoint
    async def read(self) -> tuple[str | None, bool]:
        await asyncio.sleep(0)
        return getattr(self.local, "value", None), threading.get_ident() == self.init_thread


class Leaf(Actor):
    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank


class SyncCaller(Actor):
    @endpoint
    def loop_state(self) -> str:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return "no running loop"
        return "running loop"

    @endpoint
    def relay(self, leaves: ActorMesh[Leaf]) -> tuple[list[int], list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            values = list(leaves.rank.call().get(timeout=T).values())
            one = leaves.slice(gpus=1).rank.call_one().get(timeout=T)
        return [*values, one], [str(w.message) for w in caught]


class AsyncCaller(Actor):
    @endpoint
    async def loop_state(self) -> bool:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)
        return loop.is_running()

    @endpoint
    async def relay(self, leaves: ActorMesh[Leaf]) -> tuple[list[int], int, int]:
        vm = await leaves.rank.call()
        one = await leaves.slice(gpus=2).rank.call_one()
        both = await asyncio.gather(
            leaves.slice(gpus=0).rank.call_one(), leaves.slice(gpus=3).rank.call_one()
        )
        return list(vm.values()), one, sum(both)


class Mixed(Actor):
    @endpoint
    def sync_one(self) -> int:
        return 1

    @endpoint
    async def async_one(self) -> int:
        return 2


class ClashesWithMesh(Actor):
    @endpoint
    def stop(self) -> None:
        return None


class NotAnActor:
    pass


class Counter(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def add(self, amount: int, *, note: str = "") -> int:
        self.count += amount
        return self.count

    @endpoint
    def value(self) -> int:
        return self.count

    def helper(self) -> int:
        return self.count


class Gate(Actor):
    """``hold`` waits for ``release``; only a concurrent ``hold`` lets ``release`` run meanwhile."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    @endpoint
    async def hold(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    @concurrent_endpoint
    async def hold_concurrently(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    @endpoint
    async def release(self) -> str:
        self.event.set()
        return "released"


@pytest.fixture(scope="module")
def leaves(procs4: ProcMesh) -> Iterator[ActorMesh[Leaf]]:
    mesh = procs4.spawn("leaves", Leaf)
    yield mesh
    mesh.stop().get(timeout=T)


def test_one_message_at_a_time_per_actor(procs4: ProcMesh) -> None:
    target = procs4.slice(gpus=0).spawn("guarded", Guarded)
    hammers = procs4.spawn("hammers", Hammer)
    try:
        # Four actors and two controller threads call the same actor at the same time.
        from_actors = hammers.hammer.call(target, 10)
        from_threads: list[list[int]] = []

        def call_from_thread() -> None:
            from_threads.append([target.enter.call_one(0.002).get(timeout=T) for _ in range(10)])

        threads = [threading.Thread(target=call_from_thread) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(T)
        results = [r for rs in from_actors.get(timeout=T).values() for r in rs]
        results += [r for rs in from_threads for r in rs]
        assert sorted(results) == list(range(1, 61))  # each handler saw a distinct count
        max_inside, entered, nthreads = target.stats.call_one().get(timeout=T)
        assert entered == 60
        assert max_inside == 1
        assert nthreads == 1
    finally:
        hammers.stop().get(timeout=T)
        target.stop().get(timeout=T)


@pytest.mark.parametrize("cls", [ThreadLocal, AsyncThreadLocal])
def test_thread_local_state_from_init_is_visible_in_handlers(
    procs4: ProcMesh, cls: type[Actor]
) -> None:
    mesh = procs4.spawn("tls", cls)
    try:
        for _ in range(3):
            for value, same_thread in mesh.read.call().get(timeout=T).values():
                assert value is not None
                assert same_thread
    finally:
        mesh.stop().get(timeout=T)


def test_sync_endpoint_sees_no_running_loop(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("sync_caller", SyncCaller)
    try:
        assert list(mesh.loop_state.call().get(timeout=T).values()) == ["no running loop"] * 4
    finally:
        mesh.stop().get(timeout=T)


def test_sync_endpoint_may_block_on_another_actors_future(
    procs4: ProcMesh, leaves: ActorMesh[Leaf]
) -> None:
    mesh = procs4.spawn("sync_relay", SyncCaller)
    try:
        for values, warned in mesh.relay.call(leaves).get(timeout=T).values():
            assert values == [0, 1, 2, 3, 1]
            assert warned == []  # Future.get() in a sync endpoint does not warn
    finally:
        mesh.stop().get(timeout=T)


def test_async_endpoint_runs_on_a_loop_and_awaits_other_actors(
    procs4: ProcMesh, leaves: ActorMesh[Leaf]
) -> None:
    mesh = procs4.spawn("async_relay", AsyncCaller)
    try:
        assert list(mesh.loop_state.call().get(timeout=T).values()) == [True] * 4
        for values, one, both in mesh.relay.call(leaves).get(timeout=T).values():
            assert values == [0, 1, 2, 3]
            assert one == 2
            assert both == 3
    finally:
        mesh.stop().get(timeout=T)


def test_mixing_sync_and_async_endpoints_fails_at_spawn(procs4: ProcMesh) -> None:
    with pytest.raises(ValueError, match="mixes both async and sync"):
        procs4.spawn("mixed", Mixed)


def test_spawn_validates_the_class(procs4: ProcMesh) -> None:
    with pytest.raises(ValueError, match="stop"):
        procs4.spawn("clash", ClashesWithMesh)
    with pytest.raises(ValueError):
        procs4.spawn("plain", NotAnActor)


def test_calling_a_method_that_is_not_an_endpoint(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("counter", Counter)
    try:
        with pytest.raises(RuntimeError, match="not annotated as an endpoint"):
            mesh.helper.call()
        with pytest.raises(AttributeError):
            mesh.no_such_method.call()
        assert list(mesh.value.call().get(timeout=T).values()) == [0, 0, 0, 0]
    finally:
        mesh.stop().get(timeout=T)


def test_wrong_arguments_raise_type_error_at_the_call_site(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("counter", Counter)
    try:
        with pytest.raises(TypeError):
            mesh.add.call()  # missing amount
        with pytest.raises(TypeError):
            mesh.add.broadcast(1, 2)  # too many positionals
        with pytest.raises(TypeError):
            mesh.add.call(1, colour="red")  # unknown keyword
        with pytest.raises(TypeError):
            mesh.slice(gpus=0).add.call_one(1, "positional note")  # note is keyword-only
        with pytest.raises(TypeError):
            mesh.value.choose(3)
        with pytest.raises(TypeError):
            list(mesh.add.stream())
        # Nothing was sent: every actor is alive and its counter untouched.
        assert list(mesh.value.call().get(timeout=T).values()) == [0, 0, 0, 0]
        assert list(mesh.add.call(2, note="ok").get(timeout=T).values()) == [2, 2, 2, 2]
    finally:
        mesh.stop().get(timeout=T)


def test_async_endpoints_are_not_concurrent_by_default(procs4: ProcMesh) -> None:
    gate = procs4.slice(gpus=1).spawn("gate", Gate)
    try:
        held = gate.hold.call_one(0.5)
        released = gate.release.call_one()
        # release is queued behind hold, so hold times out before release runs.
        assert held.get(timeout=T) is False
        assert released.get(timeout=T) == "released"
    finally:
        gate.stop().get(timeout=T)


def test_concurrent_endpoint_lets_the_next_message_run(procs4: ProcMesh) -> None:
    gate = procs4.slice(gpus=1).spawn("gate", Gate)
    try:
        held = gate.hold_concurrently.call_one(T)
        assert gate.release.call_one().get(timeout=T) == "released"
        assert held.get(timeout=T) is True
    finally:
        gate.stop().get(timeout=T)
