"""``__supervise__`` while the owner is busy, as in Monarch.

An async owner's ``__supervise__`` runs while its endpoint is suspended (the endpoint can wait
for it); a verdict that fails the owner (falsy, or raising) ends the call in flight on the owner
at once with ``SupervisionError``. A sync owner runs it once the endpoint in hand returns. Either
kind runs it before the messages queued behind. Real processes: the test process spawns an owner
on a proc of its own, the owner spawns a ``Kid`` mesh on procs the test passes in.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _fault_helpers import tracked_procs, wait_until

from regency import config
from regency.actor import (
    Actor,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    context,
    endpoint,
)

pytestmark = pytest.mark.timeout(120)

T = 60.0  # seconds for anything that should be quick, on 2 busy cores
WAIT = 30.0  # how long an owner's endpoint waits for its __supervise__


class Fatal(BaseException):
    """Raised by an endpoint: the kid fails and its caller gets a ``SupervisionError``."""


class Kid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def fatal(self) -> None:
        raise Fatal("kid fatal")

    @endpoint
    def fail(self) -> None:
        raise ValueError("kid value error")

    @endpoint
    def hang(self) -> None:
        threading.Event().wait()


def _wait_queued(count: int, done: Any = None) -> None:
    """Block this actor's thread (no await) until ``count`` items wait in its mailbox."""
    me: Any = context().actor_instance
    assert wait_until(lambda: me.queued() >= count or bool(done and done()), T, 0.002)


class AsyncOwner(Actor):
    """Owns a Kid mesh; ``verdict`` is what its ``__supervise__`` answers ("raise": raises)."""

    def __init__(self, procs: ProcMesh, verdict: Any, async_hook: bool = False) -> None:
        self.kid = procs.spawn("kid", Kid)
        self.verdict = verdict
        self.async_hook = async_hook
        self.log: list[str] = []
        self.seen = asyncio.Event()

    def _record(self, failure: MeshFailure) -> Any:
        self.log.append(f"supervise: {failure}")
        self.seen.set()
        if self.verdict == "raise":
            raise RuntimeError("boom from supervise")
        return self.verdict

    def __supervise__(self, failure: MeshFailure) -> Any:
        if not self.async_hook:
            return self._record(failure)

        async def later() -> Any:
            await asyncio.sleep(0)
            return self._record(failure)

        return later()

    @endpoint
    async def kid_pid(self) -> int:
        return await self.kid.pid.call_one()

    @endpoint
    async def call_then_wait(self, how: str) -> list[str]:
        """Break the kid (a call, a broadcast, or the test's SIGKILL), then wait for
        ``__supervise__``."""
        if how == "broadcast":
            self.kid.fail.broadcast()
        else:
            try:
                await (self.kid.fatal if how == "call" else self.kid.hang).call_one()
            except SupervisionError:
                self.log.append("caught")
        await asyncio.wait_for(self.seen.wait(), WAIT)
        self.log.append("return")
        return self.log

    @endpoint
    async def fail_kid_then_wait_forever(self) -> str:
        try:
            await self.kid.fatal.call_one()
        except SupervisionError:
            pass
        await asyncio.Event().wait()
        return "never"

    @concurrent_endpoint
    async def wait_forever(self) -> str:
        await asyncio.Event().wait()
        return "never"

    @endpoint
    async def fail_kid_blocking(self) -> list[str]:
        """Fail the kid, then hold the loop (no await) until the notice and the test's next
        message both wait."""
        try:
            await self.kid.fatal.call_one()
        except SupervisionError:
            self.log.append("caught")
        _wait_queued(2, self.seen.is_set)
        self.log.append("return")
        return self.log

    @endpoint
    async def other(self) -> list[str]:
        self.log.append("other")
        return self.log


class SlowSupervisor(Actor):
    """Its async ``__supervise__`` awaits a gate that an endpoint opens."""

    def __init__(self, procs: ProcMesh, record: str = "") -> None:
        self.kid = procs.spawn("kid", Kid)
        self.log: list[str] = []
        self.gate = asyncio.Event()
        self.record = record

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self.record:
            me: Any = context().actor_instance
            Path(self.record).write_text(f"{me.stats()['state']} {exc!r}")

    async def __supervise__(self, failure: MeshFailure) -> bool:
        self.log.append("supervise-start")
        await self.gate.wait()
        self.log.append("supervise-end")
        return True

    @endpoint
    async def break_kid(self) -> None:
        self.kid.fail.broadcast()

    @endpoint
    async def started(self) -> bool:
        return "supervise-start" in self.log

    @endpoint
    async def open_gate(self) -> list[str]:
        self.gate.set()
        return list(self.log)

    @endpoint
    async def history(self) -> list[str]:
        return list(self.log)


class SyncOwner(Actor):
    def __init__(self, procs: ProcMesh, verdict: Any) -> None:
        self.kid = procs.spawn("kid", Kid)
        self.verdict = verdict
        self.log: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> Any:
        self.log.append("supervise")
        return self.verdict

    @endpoint
    def fail_kid(self) -> list[str]:
        """Fail the kid, then return only once the notice and the test's next message wait."""
        try:
            self.kid.fatal.call_one().get(timeout=T)
        except SupervisionError:
            self.log.append("caught")
        _wait_queued(2)
        self.log.append("return")
        return list(self.log)

    @endpoint
    def other(self) -> list[str]:
        self.log.append("other")
        return self.log


def _owner(cleanup: Any, cls: type, *args: Any) -> Any:
    home = tracked_procs(cleanup)
    kid_procs = tracked_procs(cleanup)
    return home.spawn("owner", cls, kid_procs, *args)


def _supervise_lines(log: list[str]) -> list[str]:
    return [line for line in log if line.startswith("supervise")]


@pytest.mark.parametrize("how", ["call", "broadcast"])
def test_async_owner_runs_supervise_while_its_endpoint_awaits(cleanup: Any, how: str) -> None:
    owner = _owner(cleanup, AsyncOwner, True)
    log = owner.call_then_wait.call_one(how).get(timeout=T)
    (notice,) = _supervise_lines(log)
    assert "MeshFailure(mesh_name=kid, crashed_ranks=[0]" in notice
    assert ("kid fatal" if how == "call" else "kid value error") in notice
    assert log[-1] == "return"
    # Handled: the owner carries on.
    assert owner.other.call_one().get(timeout=T)[-1] == "other"


def test_async_owner_sees_a_killed_kid_while_suspended(cleanup: Any) -> None:
    owner = _owner(cleanup, AsyncOwner, True)
    pid = owner.kid_pid.call_one().get(timeout=T)
    cleanup[1].append(pid)
    waiting = owner.call_then_wait.call_one("kill")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    log = waiting.get(timeout=T)
    took = time.monotonic() - killed
    assert log[0] == "caught" or log[0].startswith("supervise")
    (notice,) = _supervise_lines(log)
    assert "MeshFailure(mesh_name=kid, crashed_ranks=[0]" in notice
    assert "the process this actor was running on" in notice
    assert took < 10, f"the owner saw its killed kid after {took:.1f} s"


@pytest.mark.parametrize("verdict", [False, None])
def test_falsy_supervise_fails_the_call_in_flight_at_once(
    cleanup: Any, hook: list[MeshFailure], verdict: Any
) -> None:
    owner = _owner(cleanup, AsyncOwner, verdict)
    with pytest.raises(SupervisionError) as info:
        owner.fail_kid_then_wait_forever.call_one().get(timeout=T)
    text = str(info.value)
    assert text.startswith("Endpoint call owner.fail_kid_then_wait_forever() failed, The actor ")
    assert "AsyncOwner owner{'gpus': 0/1}> and all its descendants have failed" in text
    # Monarch's words for the kid, whose failure the owner did not handle.
    assert "Kid kid{'gpus': 0/1}> and all its descendants have failed" in text
    assert "kid fatal" in text
    # The owner failed: later calls fail, its owner (the root) hears of it.
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        owner.other.call_one().get(timeout=T)
    assert wait_until(lambda: any(f.mesh_name == "owner" for f in hook), T)


@pytest.mark.parametrize("async_hook", [False, True], ids=["sync_hook", "async_hook"])
def test_raising_supervise_fails_the_call_in_flight_with_its_text(
    cleanup: Any, hook: list[MeshFailure], async_hook: bool
) -> None:
    owner = _owner(cleanup, AsyncOwner, "raise", async_hook)
    with pytest.raises(SupervisionError) as info:
        owner.fail_kid_then_wait_forever.call_one().get(timeout=T)
    text = str(info.value)
    assert "AsyncOwner owner{'gpus': 0/1}> and all its descendants have failed" in text
    assert "RuntimeError: boom from supervise" in text
    assert "This error occurred while handling another failure" in text
    assert "kid fatal" in text


def test_concurrent_calls_in_flight_fail_with_the_owner(
    cleanup: Any, hook: list[MeshFailure]
) -> None:
    owner = _owner(cleanup, AsyncOwner, False)
    waiting = owner.wait_forever.call_one()
    with pytest.raises(SupervisionError):
        owner.fail_kid_then_wait_forever.call_one().get(timeout=T)
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        waiting.get(timeout=T)


def test_async_owner_runs_supervise_before_queued_messages(cleanup: Any) -> None:
    owner = _owner(cleanup, AsyncOwner, True)
    first = owner.fail_kid_blocking.call_one()
    queued = owner.other.call_one()
    first.get(timeout=T)
    steps = [line.split(":")[0] for line in queued.get(timeout=T)]
    # The notice ran while the endpoint awaited its kid, or right after it, never after `other`.
    assert steps in (
        ["caught", "return", "supervise", "other"],
        ["supervise", "caught", "return", "other"],
    ), steps


@pytest.mark.parametrize("verdict", [True, False])
def test_sync_owner_runs_supervise_after_its_endpoint_before_queued_messages(
    cleanup: Any, hook: list[MeshFailure], verdict: bool
) -> None:
    owner = _owner(cleanup, SyncOwner, verdict)
    first = owner.fail_kid.call_one()
    queued = owner.other.call_one()
    # The endpoint in hand finishes with its own value, whatever the verdict (as in Monarch).
    assert first.get(timeout=T) == ["caught", "return"]
    if verdict:
        assert queued.get(timeout=T) == ["caught", "return", "supervise", "other"]
        return
    with pytest.raises(SupervisionError) as info:
        queued.get(timeout=T)
    assert "SyncOwner owner{'gpus': 0/1}> and all its descendants have failed" in str(info.value)
    assert "Kid kid{'gpus': 0/1}> and all its descendants have failed" in str(info.value)


def _slow_supervisor_started(cleanup: Any, record: str = "") -> Any:
    owner = _owner(cleanup, SlowSupervisor, record)
    owner.break_kid.call_one().get(timeout=T)
    assert wait_until(lambda: owner.started.call_one().get(timeout=T), T, 0.02)
    return owner


def test_messages_go_on_while_an_async_supervise_awaits(cleanup: Any) -> None:
    owner = _slow_supervisor_started(cleanup)
    # The endpoint runs while __supervise__ awaits its gate (as in Monarch), and opens it.
    assert owner.open_gate.call_one().get(timeout=T) == ["supervise-start"]
    assert wait_until(
        lambda: owner.history.call_one().get(timeout=T)[-1] == "supervise-end", T, 0.02
    )


def test_stop_cancels_an_awaiting_supervise_without_a_verdict(
    cleanup: Any, hook: list[MeshFailure], tmp_path: Path
) -> None:
    record = tmp_path / "cleanup.txt"
    owner = _slow_supervisor_started(cleanup, str(record))
    started = time.monotonic()
    owner.stop().get(timeout=T)
    took = time.monotonic() - started
    # Not held up until the stop gives up on the actor (cleanup_timeout), and not a failure.
    assert took < config.get_seconds("cleanup_timeout"), f"the stop took {took:.1f} s"
    assert not [f for f in hook if f.mesh_name == "owner"]
    # The cancelled __supervise__ did not fail the actor: its cleanup ran for a stop.
    assert record.read_text() == "running None"
    with pytest.raises(SupervisionError, match="stopped"):
        owner.history.call_one().get(timeout=T)
