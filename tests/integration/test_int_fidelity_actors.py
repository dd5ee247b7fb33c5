"""Actor semantics as Monarch 0.7 has them (issue 18): hook kinds checked at spawn, stops that
return while an actor is stuck, the error texts users match on, and an actor's identity.

Each expectation here was first observed on torchmonarch 0.7.0 with the same scenario.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from regency.actor import (
    Actor,
    MeshFailure,
    ProcMesh,
    concurrent_endpoint,
    endpoint,
    this_host,
)

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
