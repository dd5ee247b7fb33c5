"""Remote exceptions and ``Future`` semantics (monarch-api.md §1.1 "Future", "Supervision types",
§2.8 first rows): ActorError with the remote traceback, timeouts, cached outcomes, await."""

from __future__ import annotations

import asyncio
import math
import operator
from collections.abc import Iterator

import pytest

from regency.actor import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Future,
    ProcMesh,
    concurrent_endpoint,
    context,
    endpoint,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0


def _innermost_helper(msg: str) -> None:
    raise KeyError(f"root cause of {msg}")


class Faulty(Actor):
    def __init__(self) -> None:
        self.rank = context().actor_instance.rank["gpus"]
        self.calls = 0

    @endpoint
    def fail(self, msg: str) -> None:
        self.calls += 1
        try:
            _innermost_helper(msg)
        except KeyError as exc:
            raise ValueError(f"endpoint failed: {msg}") from exc

    @endpoint
    def fail_on(self, rank: int) -> int:
        self.calls += 1
        if self.rank == rank:
            raise RuntimeError(f"rank {rank} refuses")
        return self.rank

    @endpoint
    def ok(self) -> tuple[str, int]:
        self.calls += 1
        return "ok", self.calls

    @endpoint
    def fresh_list(self) -> list[int]:
        return [self.rank, 1, 2]


class Gate(Actor):
    """``wait`` completes only once ``open`` is called: a slow endpoint with no sleeping."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        await self.opened.wait()
        return "opened"

    @endpoint
    async def open(self) -> None:
        self.opened.set()

    @concurrent_endpoint
    async def fail_concurrently(self, msg: str) -> None:
        await asyncio.sleep(0)
        raise LookupError(msg)

    @endpoint
    async def ping(self) -> str:
        return "pong"


@pytest.fixture(scope="module")
def faulty(procs4: ProcMesh) -> Iterator[ActorMesh[Faulty]]:
    mesh = procs4.spawn("faulty", Faulty)
    yield mesh
    mesh.stop().get(timeout=T)


@pytest.fixture
def gate(procs4: ProcMesh) -> Iterator[ActorMesh[Gate]]:
    mesh = procs4.slice(gpus=0).spawn("gate", Gate)
    yield mesh
    mesh.open.call_one().get(timeout=T)
    mesh.stop().get(timeout=T)


def test_actor_error_carries_remote_traceback_and_chain(faulty: ActorMesh[Faulty]) -> None:
    one = faulty.slice(gpus=2)
    with pytest.raises(ActorError) as info:
        one.fail.call_one("boom").get(timeout=T)
    err = info.value
    text = str(err)
    assert "Traceback" in text
    assert "ValueError: endpoint failed: boom" in text
    assert "KeyError: 'root cause of boom'" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert "_innermost_helper" in text  # a frame of the remote stack
    assert "in fail" in text
    assert "faulty.fail" in err.message
    assert "KeyError" in err.exception_formatted
    assert isinstance(err.exception, ValueError)
    # Python pickles no ``__cause__``; the chain survives as text (checked above).
    # The actor lives on and keeps its state.
    assert one.ok.call_one().get(timeout=T) == ("ok", 2)


def test_any_failing_rank_fails_the_whole_call(faulty: ActorMesh[Faulty]) -> None:
    with pytest.raises(ActorError, match="rank 3 refuses"):
        faulty.fail_on.call(3).get(timeout=T)
    assert list(faulty.fail_on.call(99).get(timeout=T).values()) == [0, 1, 2, 3]


def test_stream_fails_only_the_failing_reply(faulty: ActorMesh[Faulty]) -> None:
    values, errors = [], []
    for fut in faulty.fail_on.stream(1):
        try:
            values.append(fut.get(timeout=T))
        except ActorError as exc:
            errors.append(exc)
    assert sorted(values) == [0, 2, 3]
    assert len(errors) == 1
    assert "rank 1 refuses" in str(errors[0])


def test_accumulator_raises_when_a_reply_is_an_error(faulty: ActorMesh[Faulty]) -> None:
    acc = Accumulator(faulty.fail_on, 0, operator.add)
    with pytest.raises(ActorError, match="rank 2 refuses"):
        acc.accumulate(2).get(timeout=T)
    assert acc.accumulate(-1).get(timeout=T) == 6


def test_concurrent_endpoint_error_reaches_the_caller(gate: ActorMesh[Gate]) -> None:
    with pytest.raises(ActorError, match="LookupError: concurrent boom"):
        gate.fail_concurrently.call_one("concurrent boom").get(timeout=T)
    assert gate.ping.call_one().get(timeout=T) == "pong"


def test_exception_with_timeout_on_a_pending_future(gate: ActorMesh[Gate]) -> None:
    fut = gate.wait.call_one()
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0.05)
    gate.open.call_one().get(timeout=T)
    assert fut.exception(timeout=T) is None


def test_get_with_timeout_does_not_consume_the_future(gate: ActorMesh[Gate]) -> None:
    fut = gate.wait.call_one()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert not fut.done()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0)
    gate.open.call_one().get(timeout=T)
    assert fut.get(timeout=T) == "opened"
    assert fut.done()


def test_outcomes_are_cached(faulty: ActorMesh[Faulty]) -> None:
    fut = faulty.slice(gpus=1).fresh_list.call_one()
    first = fut.get(timeout=T)
    assert first == [1, 1, 2]
    assert fut.get(timeout=T) is first
    assert fut.result() is first
    assert fut.exception() is None

    failing = faulty.slice(gpus=1).fail.call_one("cached")
    with pytest.raises(ActorError) as one:
        failing.get(timeout=T)
    with pytest.raises(ActorError) as two:
        failing.get(timeout=T)
    assert one.value is two.value
    assert failing.exception() is one.value

    vm_fut = faulty.fresh_list.call()
    assert vm_fut.get(timeout=T) is vm_fut.get(timeout=T)


@pytest.mark.parametrize("bad", [-1.0, -0.001, math.nan, math.inf, -math.inf])
def test_invalid_timeout_is_a_value_error(faulty: ActorMesh[Faulty], bad: float) -> None:
    fut = faulty.slice(gpus=0).ok.call_one()
    with pytest.raises(ValueError):
        fut.get(timeout=bad)
    assert fut.get(timeout=T)[0] == "ok"  # still usable


def test_await_inside_asyncio_run(faulty: ActorMesh[Faulty]) -> None:
    async def main() -> tuple[list[int], list[int], list[int], str]:
        fut = faulty.slice(gpus=3).fresh_list.call_one()
        a = await fut
        b = await fut  # observation is not consuming
        vm = await faulty.fail_on.call(99)
        try:
            await faulty.slice(gpus=0).fail.call_one("awaited")
        except ActorError as exc:
            error = str(exc)
        else:
            error = ""
        return a, b, list(vm.values()), error

    a, b, values, error = asyncio.run(main())
    assert a == b == [3, 1, 2]
    assert values == [0, 1, 2, 3]
    assert "endpoint failed: awaited" in error


def test_future_awaited_on_two_loops(faulty: ActorMesh[Faulty]) -> None:
    fut = faulty.slice(gpus=2).fresh_list.call_one()

    async def observe() -> list[int]:
        return await fut

    assert asyncio.run(observe()) == [2, 1, 2]
    assert asyncio.run(observe()) == [2, 1, 2]
    assert fut.get(timeout=T) == [2, 1, 2]


def test_await_without_a_loop_is_an_error(faulty: ActorMesh[Faulty]) -> None:
    fut = faulty.slice(gpus=0).fresh_list.call_one()
    with pytest.raises(ValueError):
        fut.__await__()
    with pytest.raises(RuntimeError):
        fut.as_asyncio()
    assert fut.get(timeout=T) == [0, 1, 2]


def test_future_get_inside_a_running_loop_warns(gate: ActorMesh[Gate]) -> None:
    fut = gate.wait.call_one()  # stays pending until the gate opens

    async def main() -> None:
        with pytest.warns(UserWarning, match="active event loop"), pytest.raises(TimeoutError):
            fut.get(timeout=0.05)

    asyncio.run(main())
    gate.open.call_one().get(timeout=T)
    assert fut.get(timeout=T) == "opened"


def test_future_cannot_be_constructed() -> None:
    with pytest.raises(TypeError):
        Future()
    with pytest.raises(TypeError):
        Future(lambda: 1)
