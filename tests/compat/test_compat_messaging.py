"""Endpoints and their adverbs (monarch-api.md §1.1 "Defining actors", "Messaging", §2.3-2.4)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from compat_impl import actor
from compat_util import CALL_TIMEOUT

Actor = actor.Actor
endpoint = actor.endpoint


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.log: list[int] = []

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def record(self, i: int) -> None:
        self.log.append(i)

    @endpoint
    def seen(self) -> list[int]:
        return list(self.log)

    @endpoint
    def rank(self) -> dict[str, int]:
        return dict(actor.current_rank())

    @endpoint
    def rank_and_size(self) -> tuple[int, dict[str, int]]:
        return actor.current_rank().rank, dict(actor.current_size())

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def fail(self, text: str) -> None:
        raise ValueError(text)

    @endpoint
    def echo(self, *args: object, **kwargs: object) -> tuple[object, object]:
        return args, kwargs

    @endpoint
    def two_args(self, a: int, b: int) -> int:
        return a * 10 + b


class AsyncActor(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    async def has_loop(self) -> bool:
        return asyncio.get_running_loop() is not None

    @endpoint
    async def sleep_then(self, delay: float, value: int) -> int:
        await asyncio.sleep(delay)
        return value

    @endpoint
    async def rank0_late(self) -> int:
        rank = actor.current_rank().rank
        if rank == 0:
            await asyncio.sleep(0.5)
        return rank

    @endpoint
    async def bump(self) -> int:
        self.n += 1
        return self.n


class SyncLoopProbe(Actor):
    def __init__(self) -> None:
        self.local = threading.local()
        self.local.tag = "set-in-init"
        self.init_thread = threading.get_ident()

    @endpoint
    def running_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @endpoint
    def thread_local(self) -> str:
        return getattr(self.local, "tag", "missing")


class NotEndpoint(Actor):
    @endpoint
    def ok(self) -> int:
        return 1

    def plain(self) -> int:
        return 2


@pytest.fixture(scope="module")
def counters(procs2):
    mesh = procs2.spawn("counters", Counter, 100)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    return mesh


def test_call_returns_valuemesh_shaped_like_mesh(counters):
    vm = counters.get.call().get(timeout=CALL_TIMEOUT)
    assert vm.sizes == {"gpus": 2}
    assert len(vm) == 2


def test_call_values_in_rank_order(counters):
    vm = counters.rank.call().get(timeout=CALL_TIMEOUT)
    assert list(vm.values()) == [{"gpus": 0}, {"gpus": 1}]
    assert vm.item(gpus=1) == {"gpus": 1}


def test_spawn_args_reach_init(procs2):
    mesh = procs2.spawn("args", Counter, 41)
    assert list(mesh.incr.call().get(timeout=CALL_TIMEOUT).values()) == [42, 42]


def test_spawn_kwargs_reach_init(procs2):
    mesh = procs2.spawn("kwargs", Counter, start=7)
    assert mesh.slice(gpus=0).get.call_one().get(timeout=CALL_TIMEOUT) == 7


def test_endpoint_kwargs_and_varargs(counters):
    one = counters.slice(gpus=0)
    assert one.echo.call_one(1, 2, k="v").get(timeout=CALL_TIMEOUT) == ((1, 2), {"k": "v"})


def test_each_rank_has_its_own_state(procs2):
    mesh = procs2.spawn("state", Counter)
    mesh.slice(gpus=1).incr.call_one(5).get(timeout=CALL_TIMEOUT)
    assert list(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [0, 5]


def test_ranks_are_separate_processes(counters):
    pids = list(counters.pid.call().get(timeout=CALL_TIMEOUT).values())
    assert len(set(pids)) == 2
    assert os.getpid() not in pids


def test_call_one_on_singleton_returns_bare_value(counters):
    assert counters.slice(gpus=1).rank.call_one().get(timeout=CALL_TIMEOUT) == {}


def test_call_one_on_many_raises_value_error_at_once(counters):
    with pytest.raises(ValueError, match="call_one requires exactly 1 actor, but mesh has 2"):
        counters.get.call_one()


def test_choose_returns_one_value(procs2):
    mesh = procs2.spawn("choose", Counter)
    assert mesh.incr.choose(3).get(timeout=CALL_TIMEOUT) == 3
    assert sorted(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [0, 3]


def test_choose_picks_any_rank(counters):
    seen = set()
    for _ in range(40):
        seen.add(counters.pid.choose().get(timeout=CALL_TIMEOUT))
        if len(seen) == 2:
            break
    assert len(seen) == 2


def test_stream_yields_one_future_per_rank(counters):
    futures = list(counters.rank_and_size.stream())
    assert len(futures) == 2
    values = sorted(f.get(timeout=CALL_TIMEOUT)[0] for f in futures)
    assert values == [0, 1]


def test_stream_futures_in_arrival_order(procs2):
    mesh = procs2.spawn("arrival", AsyncActor)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    # rank 0 answers late, rank 1 at once: the first future driven takes the first reply
    futures = list(mesh.rank0_late.stream())
    assert len(futures) == 2
    assert [f.get(timeout=CALL_TIMEOUT) for f in futures] == [1, 0]


def test_stream_exception_is_actor_error(counters):
    futures = list(counters.fail.stream("streamed"))
    for f in futures:
        with pytest.raises(actor.ActorError, match="streamed"):
            f.get(timeout=CALL_TIMEOUT)


def test_broadcast_returns_none_and_delivers(procs2):
    mesh = procs2.spawn("bcast", Counter)
    assert mesh.incr.broadcast(4) is None
    # FIFO per sender: the call after the broadcast sees its effect
    assert list(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [4, 4]


def test_send_to_port_gets_one_message_per_rank(counters):
    port, receiver = actor.Channel.open()
    actor.send(counters.rank, (), {}, port=port)
    got = [receiver.recv().get(timeout=CALL_TIMEOUT) for _ in range(2)]
    assert sorted(g["gpus"] for g in got) == [0, 1]


def test_send_without_port_is_fire_and_forget(procs2):
    mesh = procs2.spawn("sendnone", Counter)
    assert actor.send(mesh.incr, (2,), {}) is None
    assert list(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [2, 2]


def test_send_choose_reaches_one_rank(procs2):
    mesh = procs2.spawn("sendchoose", Counter)
    port, receiver = actor.Channel.open()
    actor.send(mesh.incr, (1,), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=CALL_TIMEOUT) == 1
    assert sorted(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [0, 1]


def test_accumulator_folds_replies(procs2):
    mesh = procs2.spawn("acc", Counter, 10)
    acc = actor.Accumulator(mesh.incr, 0, lambda a, b: a + b)
    assert acc.accumulate(5).get(timeout=CALL_TIMEOUT) == 30


def test_accumulator_identity_and_combine_order(counters):
    acc = actor.Accumulator(counters.rank, [], lambda a, r: [*a, r["gpus"]])
    assert sorted(acc.accumulate().get(timeout=CALL_TIMEOUT)) == [0, 1]


def test_fifo_per_sender_for_calls_and_broadcasts(procs2):
    mesh = procs2.spawn("fifo", Counter)
    for i in range(50):
        if i % 2:
            mesh.record.broadcast(i)
        else:
            mesh.record.call(i)
    got = mesh.seen.call().get(timeout=CALL_TIMEOUT)
    assert list(got.values()) == [list(range(50))] * 2


def test_fifo_to_a_slice_and_whole_mesh(procs2):
    mesh = procs2.spawn("fifo2", Counter)
    mesh.slice(gpus=1).record.broadcast(1)
    mesh.record.broadcast(2)
    mesh.slice(gpus=1).record.broadcast(3)
    assert mesh.seen.call().get(timeout=CALL_TIMEOUT).item(gpus=1) == [1, 2, 3]


def test_handlers_run_one_at_a_time(procs2):
    mesh = procs2.spawn("seq", AsyncActor).slice(gpus=0)
    futures = [mesh.bump.call_one() for _ in range(20)]
    assert [f.get(timeout=CALL_TIMEOUT) for f in futures] == list(range(1, 21))


def test_async_endpoint_runs_on_a_loop(procs2):
    mesh = procs2.spawn("aloop", AsyncActor)
    assert list(mesh.has_loop.call().get(timeout=CALL_TIMEOUT).values()) == [True, True]


def test_sync_endpoint_sees_no_running_loop(procs2):
    mesh = procs2.spawn("sloop", SyncLoopProbe)
    assert list(mesh.running_loop.call().get(timeout=CALL_TIMEOUT).values()) == [False, False]


def test_thread_local_from_init_visible_in_handlers(procs2):
    mesh = procs2.spawn("tls", SyncLoopProbe)
    assert mesh.thread_local.call().get(timeout=CALL_TIMEOUT).item(gpus=0) == "set-in-init"


def test_bad_arguments_raise_type_error_at_call_site(counters):
    with pytest.raises(TypeError):
        counters.two_args.call(1)
    with pytest.raises(TypeError):
        counters.two_args.call(1, 2, 3)
    with pytest.raises(TypeError):
        counters.two_args.call(1, c=2)
    assert counters.slice(gpus=0).two_args.call_one(1, b=2).get(timeout=CALL_TIMEOUT) == 12


def test_endpoint_exception_is_actor_error_and_actor_survives(procs2):
    mesh = procs2.spawn("survive", Counter, 1)
    with pytest.raises(actor.ActorError):
        mesh.fail.call("boom").get(timeout=CALL_TIMEOUT)
    assert list(mesh.get.call().get(timeout=CALL_TIMEOUT).values()) == [1, 1]


def test_actor_error_attributes(counters):
    with pytest.raises(actor.ActorError) as info:
        counters.slice(gpus=0).fail.call_one("the text").get(timeout=CALL_TIMEOUT)
    err = info.value
    assert isinstance(err, Exception)
    assert isinstance(err.exception, ValueError)
    assert str(err.exception) == "the text"
    assert "Traceback of where the remote call failed" in str(err)
    assert "ValueError: the text" in str(err)


def test_actor_error_message_names_mesh_and_method(counters):
    with pytest.raises(actor.ActorError) as info:
        counters.slice(gpus=0).fail.call_one("x").get(timeout=CALL_TIMEOUT)
    assert str(info.value).startswith("Actor call counters.fail failed.")


def test_calling_a_plain_method_raises_runtime_error(procs2):
    mesh = procs2.spawn("plain", NotEndpoint)
    with pytest.raises(RuntimeError, match="not annotated as an endpoint"):
        mesh.plain()


def test_as_endpoint_calls_a_plain_method(procs2):
    mesh = procs2.spawn("asep", NotEndpoint)
    ep = actor.as_endpoint(mesh.plain)
    assert list(ep.call().get(timeout=CALL_TIMEOUT).values()) == [2, 2]


def test_unknown_attribute_on_actor_mesh_is_attribute_error(counters):
    with pytest.raises(AttributeError):
        counters.no_such_endpoint


# --- large buffers (issue 17) ---------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 100, 2 << 20])
@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_bytes_and_bytearray_arguments_keep_their_type(counters, kind, size):
    data = kind(os.urandom(size))
    (args, _) = counters.slice(gpus=0).echo.call_one(data).get(timeout=CALL_TIMEOUT)
    assert type(args[0]) is kind
    assert args[0] == data


@pytest.mark.deviation("regency delivers a memoryview as a memoryview, not bytes", skip="regency")
def test_memoryview_argument_arrives_as_bytes(counters):
    (args, _) = counters.slice(gpus=0).echo.call_one(memoryview(b"abc")).get(timeout=CALL_TIMEOUT)
    assert type(args[0]) is bytes
    assert args[0] == b"abc"
