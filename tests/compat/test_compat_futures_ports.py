"""Future, Channel/Port/PortReceiver, explicit-port and concurrent endpoints (reference §1.1)."""

from __future__ import annotations

import asyncio
import math
import warnings

import pytest
from compat_impl import actor
from compat_util import CALL_TIMEOUT

Actor = actor.Actor
endpoint = actor.endpoint


class Svc(Actor):
    @endpoint
    async def slow(self, delay: float, value: object) -> object:
        await asyncio.sleep(delay)
        return value

    @endpoint
    async def fail(self) -> None:
        raise KeyError("k")

    @endpoint(explicit_response_port=True)
    async def explicit(self, port, n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    async def to_port(self, port, value: object) -> None:
        port.send(value)

    @endpoint
    async def to_port_exc(self, port) -> None:
        port.exception(ValueError("via port"))

    @endpoint
    async def to_port_many(self, port, n: int) -> None:
        for i in range(n):
            port.send(i)

    @actor.concurrent_endpoint
    async def conc(self, delay: float, value: object) -> object:
        await asyncio.sleep(delay)
        return value

    @endpoint
    async def local_channel(self) -> list[int]:
        port, receiver = actor.Channel.open()
        port.send(1)
        port.send(2)
        return [await receiver.recv(), await receiver.recv()]


class SyncExplicit(Actor):
    @endpoint(explicit_response_port=True)
    def explicit_sync(self, port, value: int) -> str:
        port.send(value * 2)
        return "ignored"


@pytest.fixture(scope="module")
def svc(procs2):
    mesh = procs2.spawn("svc", Svc).slice(gpus=0)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    return mesh


# --- Future -------------------------------------------------------------------------------


def test_get_timeout_raises_timeout_error_and_does_not_consume(svc):
    fut = svc.slow.call_one(0.5, 7)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    assert fut.get(timeout=CALL_TIMEOUT) == 7


def test_results_are_cached(svc):
    fut = svc.slow.call_one(0, "x")
    assert fut.get(timeout=CALL_TIMEOUT) == "x"
    assert fut.get() == "x"
    assert fut.result() == "x"


def test_exception_of_successful_future_is_none(svc):
    fut = svc.slow.call_one(0, 1)
    assert fut.exception(timeout=CALL_TIMEOUT) is None


def test_exceptions_are_cached(svc):
    fut = svc.fail.call_one()
    with pytest.raises(actor.ActorError) as first:
        fut.get(timeout=CALL_TIMEOUT)
    with pytest.raises(actor.ActorError) as second:
        fut.get()
    assert str(first.value) == str(second.value)
    assert isinstance(fut.exception(), actor.ActorError)
    assert isinstance(fut.exception().exception, KeyError)


@pytest.mark.parametrize("bad", [-1.0, math.inf])
def test_invalid_timeout_is_value_error(svc, bad):
    fut = svc.slow.call_one(0, 1)
    with pytest.raises(ValueError, match="invalid timeout"):
        fut.get(timeout=bad)
    assert fut.get(timeout=CALL_TIMEOUT) == 1


def test_as_asyncio_without_loop_is_runtime_error(svc):
    fut = svc.slow.call_one(0, 1)
    with pytest.raises(RuntimeError, match="requires a running asyncio event loop"):
        fut.as_asyncio()
    assert fut.get(timeout=CALL_TIMEOUT) == 1


def test_await_is_non_consuming(svc):
    async def main():
        fut = svc.slow.call_one(0, 3)
        return await fut, await fut, await fut.as_asyncio()

    assert asyncio.run(main()) == (3, 3, 3)


def test_get_on_a_running_loop_warns_but_works(svc):
    async def main():
        fut = svc.slow.call_one(0, 4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = fut.get()
        return value, [str(w.message) for w in caught]

    value, messages = asyncio.run(main())
    assert value == 4
    assert any("from within an active event loop" in m for m in messages)


def test_wait_for_times_out(svc):
    async def main():
        return await asyncio.wait_for(svc.slow.call_one(1.0, 3), 0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(main())


def test_gather_many_calls(svc):
    async def main():
        return await asyncio.gather(*(svc.slow.call_one(0, i) for i in range(10)))

    assert asyncio.run(main()) == list(range(10))


def test_await_call_gives_value_mesh(procs2):
    mesh = procs2.spawn("awaitvm", Svc)

    async def main():
        return await mesh.slow.call(0, "v")

    vm = asyncio.run(main())
    assert list(vm.values()) == ["v", "v"]


# --- ports and channels ---------------------------------------------------------------------


def test_local_port_in_order():
    port, receiver = actor.Channel.open()
    port.send(1)
    port.send(2)
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == 1
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == 2


def test_port_passed_to_actor(svc):
    port, receiver = actor.Channel.open()
    svc.to_port.call_one(port, "hi").get(timeout=CALL_TIMEOUT)
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == "hi"


def test_port_exception_raises_on_recv(svc):
    port, receiver = actor.Channel.open()
    svc.to_port_exc.call_one(port).get(timeout=CALL_TIMEOUT)
    with pytest.raises(ValueError, match="via port"):
        receiver.recv().get(timeout=CALL_TIMEOUT)


def test_port_keeps_sender_order(svc):
    port, receiver = actor.Channel.open()
    svc.to_port_many.call_one(port, 20).get(timeout=CALL_TIMEOUT)
    assert [receiver.recv().get(timeout=CALL_TIMEOUT) for _ in range(20)] == list(range(20))


def test_once_port_refuses_a_second_send():
    port, receiver = actor.Channel.open(once=True)
    port.send(5)
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == 5
    with pytest.raises(RuntimeError, match="already used"):
        port.send(6)


def test_ranked_channel_yields_rank_and_value(svc):
    port, receiver = actor.Channel.open_ranked()
    actor.send(svc.slow, (0, "r"), {}, port=port)
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == (0, "r")


def test_ranked_receiver_from_plain(procs2):
    mesh = procs2.spawn("rankedrx", Svc)
    port, receiver = actor.Channel.open()
    ranked = receiver.ranked()
    actor.send(mesh.slow, (0, "v"), {}, port=port)
    got = sorted(ranked.recv().get(timeout=CALL_TIMEOUT) for _ in range(2))
    assert got == [(0, "v"), (1, "v")]


def test_return_undeliverable_default_true():
    port, _ = actor.Channel.open()
    assert port.return_undeliverable is True


def test_channel_inside_an_actor(svc):
    assert svc.local_channel.call_one().get(timeout=CALL_TIMEOUT) == [1, 2]


# --- explicit-port and concurrent endpoints ------------------------------------------------


def test_explicit_port_reply_through_call_one(svc):
    assert svc.explicit.call_one(1).get(timeout=CALL_TIMEOUT) == 0


def test_explicit_port_many_replies_with_send(svc):
    port, receiver = actor.Channel.open()
    actor.send(svc.explicit, (3,), {}, port=port)
    assert [receiver.recv().get(timeout=CALL_TIMEOUT) for _ in range(3)] == [0, 1, 2]


def test_explicit_port_sync_return_value_ignored(procs2):
    sync = procs2.spawn("xsync", SyncExplicit).slice(gpus=1)
    assert sync.explicit_sync.call_one(21).get(timeout=CALL_TIMEOUT) == 42


def test_explicit_port_call_gives_value_mesh(procs2):
    mesh = procs2.spawn("xcall", Svc)
    assert list(mesh.explicit.call(1).get(timeout=CALL_TIMEOUT).values()) == [0, 0]


def test_concurrent_endpoint_returns_value(svc):
    assert svc.conc.call_one(0.0, 9).get(timeout=CALL_TIMEOUT) == 9


def test_concurrent_endpoint_lets_later_messages_through(svc):
    slow = svc.conc.call_one(1.0, "slow")
    fast = svc.conc.call_one(0.0, "fast")
    assert fast.get(timeout=0.9) == "fast"
    assert slow.get(timeout=CALL_TIMEOUT) == "slow"


def test_plain_endpoint_waits_behind_concurrent(svc):
    slow = svc.conc.call_one(0.3, "c")
    assert svc.slow.call_one(0, "p").get(timeout=CALL_TIMEOUT) == "p"
    assert slow.get(timeout=CALL_TIMEOUT) == "c"
