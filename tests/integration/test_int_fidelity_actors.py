"""Actor semantics as Monarch 0.7 has them (issue 18): hook kinds checked at spawn, stops that
return while an actor is stuck, the error texts users match on, and an actor's identity.

Each expectation here was first observed on torchmonarch 0.7.0 with the same scenario.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import regency.actor
from regency.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    context,
    endpoint,
    this_host,
)
from regency.config import configured

pytestmark = pytest.mark.timeout(90)

T = 30.0


# -- item 2: which hooks may be sync ----------------------------------------------------------


class Crasher(Actor):
    @endpoint
    async def crash(self) -> None:
        os._exit(3)


class AsyncWithSyncSupervise(Actor):
    """Async endpoints, plain ``def __supervise__``: Monarch accepts it and calls it."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        return True

    @endpoint
    async def crash_a_child(self) -> None:
        child = this_host().spawn_procs(per_host={"gpus": 1}).spawn("crasher", Crasher)
        with_error = child.crash.call()
        try:
            await with_error
        except Exception:
            pass

    @endpoint
    async def seen(self) -> list[str]:
        return self.failures


def _hooked(endpoint_async: bool, hook: str, hook_async: bool) -> type[Actor]:
    if endpoint_async:

        async def ping(self: Any) -> str:
            return "pong"
    else:

        def ping(self: Any) -> str:
            return "pong"

    if hook_async:

        async def method(self: Any, arg: Any) -> Any:
            return True
    else:

        def method(self: Any, arg: Any) -> Any:
            return True

    name = f"Hooked_{'async' if endpoint_async else 'sync'}_{hook.strip('_')}"
    return type(name, (Actor,), {"ping": endpoint(ping), hook: method})


def test_sync_supervise_on_an_async_actor_is_accepted_and_called(
    make_procs: Callable[..., ProcMesh],
) -> None:
    owner = make_procs(1).spawn("owner", AsyncWithSyncSupervise)
    owner.crash_a_child.call_one().get(timeout=T)
    deadline = time.monotonic() + T
    while not (seen := owner.seen.call_one().get(timeout=T)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(seen) == 1
    assert "crashed_ranks=[0]" in seen[0]


@pytest.mark.parametrize(
    ("endpoint_async", "hook", "hook_async", "text"),
    [
        (False, "__supervise__", True, "has sync endpoints, but an async __supervise__"),
        (False, "__cleanup__", True, "has sync endpoints, but an async __cleanup__"),
        (True, "__cleanup__", False, "has async endpoints, but a synchronous __cleanup__"),
        (
            False,
            "_handle_undeliverable_message",
            True,
            "has sync endpoints, but an async _handle_undeliverable_message",
        ),
    ],
)
def test_hooks_that_do_not_match_are_refused_at_spawn(
    procs4: ProcMesh, endpoint_async: bool, hook: str, hook_async: bool, text: str
) -> None:
    cls = _hooked(endpoint_async, hook, hook_async)
    with pytest.raises(ValueError, match=text) as info:
        procs4.spawn("refused", cls)
    assert str(info.value).startswith(f"{cls}")


@pytest.mark.parametrize(
    ("endpoint_async", "hook", "hook_async"),
    [
        (True, "__supervise__", False),
        (True, "__supervise__", True),
        (True, "__cleanup__", True),
        (False, "__cleanup__", False),
        (False, "__supervise__", False),
    ],
)
def test_hooks_that_match_are_accepted(
    procs4: ProcMesh, endpoint_async: bool, hook: str, hook_async: bool
) -> None:
    mesh = procs4.spawn("accepted", _hooked(endpoint_async, hook, hook_async))
    assert list(mesh.ping.call().get(timeout=T).values()) == ["pong"] * 4
    mesh.stop().get(timeout=T)


def test_mixed_endpoints_keep_monarchs_text(procs4: ProcMesh) -> None:
    class Mixed(Actor):
        @endpoint
        def a(self) -> None: ...

        @endpoint
        async def b(self) -> None: ...

    with pytest.raises(ValueError, match=r"mixes both async and sync endpoints.*sync: \['a'\]"):
        procs4.spawn("mixed", Mixed)


class OnlyAsyncCleanup(Actor):
    """No endpoints, an async ``__cleanup__``: an async actor, whose cleanup is awaited."""

    async def __cleanup__(self, exc: Exception | None) -> None:
        await asyncio.sleep(0)
        os.environ["REGENCY_IT_CLEANED"] = "yes"


def test_an_actor_with_only_an_async_cleanup_gets_it_awaited() -> None:
    from regency.actor import this_proc

    mesh = this_proc().spawn("only_cleanup", OnlyAsyncCleanup)
    mesh.initialized.get(timeout=T)
    os.environ.pop("REGENCY_IT_CLEANED", None)
    mesh.stop().get(timeout=T)
    assert os.environ.pop("REGENCY_IT_CLEANED", None) == "yes"


def test_concurrent_endpoint_on_a_sync_method_keeps_monarchs_text() -> None:
    with pytest.raises(ValueError, match="concurrent_endpoint can only wrap async endpoints"):

        class Bad(Actor):
            @concurrent_endpoint
            def f(self) -> None: ...


# -- items 3 and 9: a stop does not wait for ever on a busy actor -----------------------------

GRACE = 1.0  # cleanup_timeout for these tests: how long a stop waits for a busy actor
PROMPT = 6.0  # well under the 10 s stop_timeout that used to end in a force-kill


class Helper(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class BlockedAfterSpawning(Actor):
    """Spawns a helper on its own procs, hands it out through a port, then blocks for ever."""

    def __init__(self, port: Port[Any]) -> None:
        helper = context().actor_instance.proc_mesh.spawn("helper", Helper)
        port.send(helper)
        threading.Event().wait()

    @endpoint
    def ping(self) -> str:
        return "never"


class AsyncBlockedInInit(Actor):
    def __init__(self) -> None:
        threading.Event().wait()

    @endpoint
    async def ping(self) -> str:
        return "never"


class BlockedInHandler(Actor):
    @endpoint
    def block(self) -> None:
        threading.Event().wait()

    @endpoint
    def ping(self) -> str:
        return "pong"


def _timed(fn: Callable[[], Any]) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def test_an_actor_blocked_in_init_leaves_its_helper_working_and_stops(
    make_procs: Callable[..., ProcMesh],
) -> None:
    with configured(cleanup_timeout=GRACE):
        procs = make_procs(2)
    bystander = procs.spawn("bystander", Helper)
    port, receiver = Channel[Any].open()
    blocked = procs.spawn("blocked", BlockedAfterSpawning, port)
    helpers = [receiver.recv().get(timeout=T) for _ in range(2)]
    pids = set(bystander.pid.call().get(timeout=T).values())
    for helper in helpers:
        assert set(helper.pid.call().get(timeout=T).values()) == pids
    assert GRACE * 0.9 <= _timed(lambda: blocked.stop().get(timeout=T)) < PROMPT
    with pytest.raises(
        SupervisionError, match=r"(?s)Endpoint call blocked\.ping\(\) failed.*stopped"
    ):
        blocked.ping.call().get(timeout=T)
    # The helpers were the blocked actor's: they stop with it. Other meshes carry on.
    with pytest.raises(SupervisionError, match="stopped"):
        helpers[0].pid.call().get(timeout=T)
    assert set(bystander.pid.call().get(timeout=T).values()) == pids
    assert _timed(lambda: procs.stop().get(timeout=T)) < PROMPT


@pytest.mark.parametrize("cls", [AsyncBlockedInInit, BlockedInHandler])
def test_stop_of_a_busy_actor_returns_after_the_cleanup_timeout(
    make_procs: Callable[..., ProcMesh], cls: type[Actor]
) -> None:
    with configured(cleanup_timeout=GRACE):
        procs = make_procs(1)
    busy = procs.spawn("busy", cls)
    if cls is BlockedInHandler:
        assert list(busy.ping.call().get(timeout=T).values()) == ["pong"]
        busy.block.broadcast()
    queued = busy.ping.call()  # waits behind the blocked constructor or handler
    assert GRACE * 0.9 <= _timed(lambda: busy.stop().get(timeout=T)) < PROMPT
    with pytest.raises(SupervisionError, match="stopped"):
        queued.get(timeout=T)
    with pytest.raises(SupervisionError, match="stopped"):
        busy.ping.call().get(timeout=T)
    assert _timed(lambda: procs.stop().get(timeout=T)) < PROMPT


def test_proc_stop_with_an_actor_blocked_in_init_is_bounded_by_the_cleanup_timeout(
    make_procs: Callable[..., ProcMesh],
) -> None:
    with configured(cleanup_timeout=GRACE):
        procs = make_procs(1)
    procs.spawn("blocked", AsyncBlockedInInit)
    procs.spawn("helper", Helper).pid.call().get(timeout=T)
    assert _timed(lambda: procs.stop().get(timeout=T)) < PROMPT


class OwnsMeshOnItsProc(Actor):
    """The documented pattern: a mesh spawned on the actor's own proc."""

    def __init__(self) -> None:
        self.child = context().actor_instance.proc.spawn("child", Helper)

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get(timeout=T)


def test_proc_stop_with_an_owner_of_a_mesh_on_its_own_proc_is_prompt(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)
    owners = procs.spawn("owners", OwnsMeshOnItsProc)
    assert len(set(owners.child_pid.call().get(timeout=T).values())) == 2
    # The proc agent used to wait on itself here for the whole 10 s stop_timeout.
    assert _timed(lambda: procs.stop().get(timeout=T)) < 3.0


# -- item 4: the error texts users match on ---------------------------------------------------


class CustomBase(BaseException):
    pass


class Worker(Actor):
    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def die_on(self, rank: int) -> None:
        if context().actor_instance.rank.rank == rank:
            os._exit(7)

    @endpoint
    def base(self) -> None:
        raise CustomBase("custom base")

    @endpoint
    def bad(self) -> None:
        raise ValueError("bad value")


def _path(name: str, rank: str) -> str:
    """A regex for the qualified name of a root-spawned Worker (whatever the mesh's dims)."""
    return rf"<root>\.<{Worker.__module__}\.Worker {name}\{{[^}}]*'gpus': {rank}\}}>"


def _failed(mesh: str, method: str, path: str, reason: str) -> str:
    return (
        rf"^Endpoint call {mesh}\.{method}\(\) failed, The actor {path} and all its "
        rf"descendants have failed:\n  {reason}"
    )


def test_a_crashed_process_reads_as_in_monarch_with_regencys_detail_after(
    make_procs: Callable[..., ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", failures.append)
    mesh = make_procs(4).spawn("crash", Worker)
    with pytest.raises(SupervisionError) as pending:
        mesh.die_on.call(3).get(timeout=T)
    monarch = "the process this actor was running on exited with non-zero code 7"
    text = str(pending.value)
    assert re.match(_failed("crash", "die_on", _path("crash", "3/4"), monarch), text), text
    assert "failure on mesh crash at rank 3" in text, text
    assert "exited with code 7" in text, text
    with pytest.raises(SupervisionError) as later:
        mesh.rank.call().get(timeout=T)
    assert re.match(_failed("crash", "rank", _path("crash", "3/4"), monarch), str(later.value))
    deadline = time.monotonic() + T
    while not failures and time.monotonic() < deadline:
        time.sleep(0.02)
    (failure,) = failures
    shown = str(failure)
    head = r"^MeshFailure\(mesh_name=crash, crashed_ranks=\[3\], event=Supervision event: "
    assert re.match(rf"{head}actor {_path('crash', '3/4')} failed:\n  {monarch}", shown), shown
    assert re.match(rf"The actor {_path('crash', '3/4')} and all its descendants", failure.report())


def test_a_base_exception_reads_as_in_monarch_now_and_later(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("based", Worker)
    one = mesh.slice(gpus=1)
    path = _path("based", "1/4")
    with pytest.raises(SupervisionError) as first:
        one.base.call_one().get(timeout=T)
    reason = "endpoint base raised CustomBase: custom base"
    assert re.match(_failed("based", "base", path, reason), str(first.value)), str(first.value)
    with pytest.raises(SupervisionError) as later:
        one.rank.call_one().get(timeout=T)
    assert re.match(_failed("based", "rank", path, reason), str(later.value)), str(later.value)
    mesh.stop().get(timeout=T)


class RaisesInInit(Actor):
    def __init__(self) -> None:
        raise ValueError("init boom")

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_an_init_that_raises_reads_as_in_monarch(
    make_procs: Callable[..., ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", failures.append)
    mesh = make_procs(2).spawn("badinit", RaisesInInit)
    path = rf"<root>\.<{RaisesInInit.__module__}\.RaisesInInit badinit\{{[^}}]*\}}>"
    for _ in range(2):  # the first call and a later one read alike
        with pytest.raises(SupervisionError) as info:
            mesh.ping.call().get(timeout=T)
        text = str(info.value)
        assert re.match(_failed("badinit", "ping", path, ""), text), text
        assert "ValueError: init boom" in text, text
    deadline = time.monotonic() + T
    while len(failures) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(f.crashed_ranks for f in failures) == [[0], [1]]


def _refuse_unpickling() -> None:
    raise RuntimeError("this argument cannot be unpickled on the proc")


class Unpicklable:
    """An argument whose unpickling raises (on the proc, as it is sent)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_unpickling, ())


def test_an_argument_that_cannot_be_unpickled_still_names_the_class(
    make_procs: Callable[..., ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", lambda failure: None)
    mesh = make_procs(1).spawn("unpicklable", RaisesInInit, Unpicklable())
    with pytest.raises(SupervisionError) as info:
        mesh.ping.call().get(timeout=T)
    text = str(info.value)
    assert f"<root>.<{RaisesInInit.__module__}.RaisesInInit unpicklable" in text, text
    assert "this argument cannot be unpickled on the proc" in text, text


def test_actor_error_text_is_monarchs(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("erring", Worker)
    with pytest.raises(ActorError) as info:
        mesh.bad.call().get(timeout=T)
    err = info.value
    assert err.message == "Actor call erring.bad failed."
    assert err.exception_formatted.startswith(
        "Traceback of where the remote call failed (most recent call last):\n"
    )
    assert "Traceback (most recent call last)" not in err.exception_formatted
    assert err.exception_formatted.endswith("ValueError: bad value\n")
    assert str(err) == f"{err.message}\n {err.exception_formatted}"
    mesh.stop().get(timeout=T)


def test_calls_to_a_stopped_mesh_read_as_in_monarch(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(2)
    stopped = procs.spawn("gone", Worker)
    stopped.rank.call().get(timeout=T)
    stopped.stop().get(timeout=T)
    status = rf"Supervision event: actor {_path('gone', '0/2')} has status:\n  stopped: "
    with pytest.raises(SupervisionError) as info:
        stopped.rank.call().get(timeout=T)
    assert re.match(rf"^Endpoint call gone\.rank\(\) failed, {status}", str(info.value))
    assert "actor mesh gone is stopped" in str(info.value)
    with_procs = procs.spawn("with_procs", Worker)
    with_procs.rank.call().get(timeout=T)
    procs.stop().get(timeout=T)
    status = rf"Supervision event: actor {_path('with_procs', '0/2')} has status:\n  stopped: "
    with pytest.raises(SupervisionError) as info:
        with_procs.rank.call().get(timeout=T)
    assert re.match(rf"^Endpoint call with_procs\.rank\(\) failed, {status}", str(info.value))
    with pytest.raises(RuntimeError, match=r"^`ProcMesh` has already been stopped$"):
        procs.spawn("late", Worker)


# -- item 6: who an actor is ------------------------------------------------------------------


def _identity() -> dict[str, Any]:
    ctx = context()
    me = ctx.actor_instance
    creator = me.creator
    return {
        "name": me.name,
        "class_name": me.class_name,
        "str": str(me),
        "rank": dict(me.rank),
        "message_rank": dict(ctx.message_rank),
        "current_actor_name": regency.actor.current_actor_name(),
        "proc_id": me.proc_id,
        "creator": None
        if creator is None
        else {
            "type": type(creator).__name__,
            "name": creator.name,
            "class_name": creator.class_name,
            "rank": dict(creator.rank),
            "str": str(creator),
            "repr": repr(creator),
            "proc_mesh": type(creator.proc_mesh).__name__,
            "proc": type(creator.proc).__name__,
            "creator": None if creator.creator is None else str(creator.creator),
        },
    }


class Inner(Actor):
    @endpoint
    def who(self) -> dict[str, Any]:
        return _identity()


class Outer(Actor):
    def __init__(self) -> None:
        self.inner = context().actor_instance.proc.spawn("inner", Inner)

    @endpoint
    def who(self) -> dict[str, Any]:
        return _identity()

    @endpoint
    def inner_who(self) -> dict[str, Any]:
        return self.inner.who.call_one().get(timeout=T)


def test_the_root_is_named_root_and_has_no_class_or_creator() -> None:
    me = context().actor_instance
    assert (me.name, me.class_name, me.creator, str(me)) == ("root", None, None, "<root>")
    assert regency.actor.current_actor_name() == str(me.actor_id)


def test_an_actors_creator_is_an_instance_with_a_name(make_procs: Callable[..., ProcMesh]) -> None:
    outers = make_procs(2).spawn("outer", Outer)
    module = Outer.__module__
    for point, outer in outers.who.call().get(timeout=T).items():
        assert outer["name"] == "outer"
        assert outer["class_name"] == f"{module}.Outer"
        assert outer["rank"] == outer["message_rank"] == dict(point)
        assert outer["str"] == f"<root>.<{module}.Outer outer{point}>"
        assert outer["current_actor_name"].startswith("outer")
        assert outer["creator"] == {
            "type": "CreatorInstance",
            "name": "root",
            "class_name": None,
            "rank": {},
            "str": "<root>",
            "repr": "<root>",
            "proc_mesh": "ProcMesh",
            "proc": "ProcMesh",
            "creator": None,
        }
    spawner = outers.slice(gpus=1).who.call_one().get(timeout=T)
    inner = outers.slice(gpus=1).inner_who.call_one().get(timeout=T)
    # A mesh on a single proc has no dimensions: its actors print no rank at all.
    assert inner["str"] == f"{spawner['str']}.<{module}.Inner inner>"
    assert (inner["name"], inner["class_name"], inner["rank"]) == ("inner", f"{module}.Inner", {})
    assert inner["proc_id"] == spawner["proc_id"]
    assert inner["current_actor_name"].startswith("inner")
    assert inner["creator"] == {
        "type": "CreatorInstance",
        "name": "outer",
        "class_name": f"{module}.Outer",
        "rank": spawner["rank"],
        "str": spawner["str"],
        "repr": spawner["str"],
        "proc_mesh": "ProcMesh",
        "proc": "ProcMesh",
        "creator": "<root>",
    }


class Ids(Actor):
    @endpoint
    def actor_id(self) -> dict[str, Any]:
        aid = context().actor_instance.actor_id
        return {
            "str": str(aid),
            "name": regency.actor.current_actor_name(),
            "attrs": (aid.actor_name, aid.label, aid.is_root, aid.proc_id, aid.addr),
            "uid": aid.uid,
            "proc_id": context().actor_instance.proc_id,
        }


def test_actor_id_has_monarchs_attributes(procs4: ProcMesh) -> None:
    root = context().actor_instance.actor_id
    assert (root.actor_name, root.label, root.is_root) == ("client", "client", True)
    assert root.proc_id == root.addr == context().actor_instance.proc_id
    ids = list(procs4.spawn("ids", Ids).actor_id.call().get(timeout=T).values())
    for found in ids:
        assert found["str"] == found["name"]
        assert found["attrs"] == ("ids", "ids", False, found["proc_id"], found["proc_id"])
        assert found["uid"].startswith("ids<")
        assert found["str"].startswith(found["uid"])
    assert len({found["str"] for found in ids}) == 4


def test_a_controllers_creator_is_the_root() -> None:
    # Monarch's chain runs through its internal controller_controller actor; regency has none.
    controller = regency.actor.get_or_spawn_controller("identity_ctl", Inner).get(timeout=T)
    who = controller.who.call_one().get(timeout=T)
    assert who["str"] == f"<root>.<{Inner.__module__}.Inner identity_ctl>"
    assert (who["name"], who["rank"]) == ("identity_ctl", {})
    assert who["creator"] is not None
    assert (who["creator"]["name"], who["creator"]["str"]) == ("root", "<root>")
