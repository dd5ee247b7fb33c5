"""The outcome matrix of monarch-api.md §2.8, one test per row, plus §2.9 propagation.

Each test asserts what the user sees: the error type, the message form (``Endpoint call
{mesh}.{method}() failed, ...``, ``failure on mesh ... at rank N with event ...``, ``... and all
its descendants have failed``, ``stopped``) and which ranks failed (``MeshFailure.crashed_ranks``
as given to the root's ``unhandled_fault_hook`` or to an owner actor's ``__supervise__``).

"No ``MeshFailure``" is checked without sleeping: after the step that must not fail the actor, a
*sentinel* failure is caused on the same rank. An actor latches its first failure only, so if the
hook then holds exactly one failure for that mesh and it is the sentinel, the earlier step did not
fail anything.

Tests that need the default hook or a process-wide setting run a controller in a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _fault_helpers import Controller, kill_all, wait_gone, wait_until, write_script

import regency.actor
from regency.actor import (
    Actor,
    ActorError,
    ActorMesh,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    context,
    endpoint,
    send,
    this_host,
)

pytestmark = pytest.mark.timeout(60)

T = 20.0  # generous upper bound for any single wait; tests normally finish far sooner
FAST = 1.0  # a call to a rank known to be unhealthy fails within this many seconds


# -- actors (module level: procs import them by reference) -----------------------------------


class Fatal(BaseException):
    """Not an ``Exception``: kills the actor even when the call has a reply port."""


def _my_rank() -> int:
    return int(context().actor_instance.rank["gpus"])


class Worker(Actor):
    def __init__(self, fail_init_on: tuple[int, ...] = ()) -> None:
        self.rank = _my_rank()
        if self.rank in fail_init_on:
            raise ValueError(f"init refused on rank {self.rank}")
        self.calls = 0

    @endpoint
    def echo(self, value: Any) -> tuple[int, Any]:
        self.calls += 1
        return self.rank, value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def fail(self, rank: int, msg: str) -> int:
        """Raise on ``rank`` only (an ``Exception``)."""
        if self.rank == rank:
            raise ValueError(f"{msg} on rank {rank}")
        return self.rank

    @endpoint(explicit_response_port=True)
    def reply_or_raise(self, port: Any, rank: int) -> None:
        if self.rank == rank:
            raise KeyError(f"no reply from rank {rank}")
        port.send(self.rank)

    @endpoint
    def fatal(self, msg: str) -> None:
        raise Fatal(msg)

    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)  # a real SIGSEGV on this thread, before any reply can be sent

    @endpoint
    def hang(self) -> None:
        threading.Event().wait(30)


class AsyncWorker(Actor):
    def __init__(self) -> None:
        self.rank = _my_rank()

    @concurrent_endpoint
    async def fail(self, rank: int, msg: str) -> int:
        await asyncio.sleep(0)
        if self.rank == rank:
            raise LookupError(f"{msg} on rank {rank}")
        return self.rank

    @concurrent_endpoint(explicit_response_port=True)
    async def reply_or_raise(self, port: Any, rank: int) -> None:
        await asyncio.sleep(0)
        if self.rank == rank:
            raise KeyError(f"no reply from rank {rank}")
        port.send(self.rank)

    @endpoint
    async def echo(self, value: Any) -> tuple[int, Any]:
        return self.rank, value


class Owner(Actor):
    """Owns a 2-proc child mesh; records the ``MeshFailure``s its ``__supervise__`` receives."""

    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.seen: list[dict[str, Any]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.child = self.procs.spawn("child", Worker)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(
            {
                "mesh_name": failure.mesh_name,
                "crashed_ranks": list(failure.crashed_ranks),
                "text": str(failure),
                "report": failure.report(),
                "is_child": failure.mesh is self.child,
            }
        )
        return self.handle

    @endpoint
    def child_pids(self) -> list[int]:
        return sorted(self.child.pid.call().get(timeout=T).values())

    @endpoint
    def break_child(self, rank: int) -> None:
        self.child.fail.broadcast(rank, "child boom")

    @endpoint
    def call_child(self, rank: int) -> Any:
        return self.child.slice(gpus=rank).echo.call_one("hi").get(timeout=T)

    @endpoint
    def seen_failures(self) -> list[dict[str, Any]]:
        return self.seen

    @endpoint
    def ping(self) -> str:
        return "pong"


# -- helpers ---------------------------------------------------------------------------------


def actor_path(cls: type, mesh: str, rank: int, size: int = 4) -> str:
    """The qualified name of a root-owned actor, as failures print it."""
    point = f"{{'gpus': {rank}/{size}}}"
    return f"<root>.<{cls.__module__}.{cls.__qualname__} {mesh}{point}>"


def failures_of(faults: list[MeshFailure], mesh: str) -> list[MeshFailure]:
    return [f for f in list(faults) if f.mesh_name == mesh]


def wait_failures(faults: list[MeshFailure], mesh: str, count: int) -> list[MeshFailure]:
    """Wait until the hook has seen ``count`` failures of ``mesh``; return them."""
    assert wait_until(lambda: len(failures_of(faults, mesh)) >= count, T, 0.005), (
        f"expected {count} MeshFailure(s) of {mesh!r} at the hook, got {faults}"
    )
    return failures_of(faults, mesh)


def supervision_error(fut_fn: Callable[[], Any]) -> tuple[SupervisionError, float]:
    """Run ``fut_fn`` (which makes and waits on a call); return its SupervisionError and time."""
    start = time.monotonic()
    with pytest.raises(SupervisionError) as info:
        fut_fn()
    return info.value, time.monotonic() - start


def assert_sentinel_only(
    faults: list[MeshFailure], mesh: ActorMesh[Any], name: str, rank: int, cls: type = Worker
) -> MeshFailure:
    """Fail ``rank`` on purpose (broadcast); the hook must then hold exactly that one failure."""
    mesh.fail.broadcast(rank, "sentinel")
    wait_failures(faults, name, 1)
    got = failures_of(faults, name)
    assert len(got) == 1, f"unexpected failures of {name}: {got}"
    assert got[0].crashed_ranks == [rank]
    assert "sentinel" in got[0].event.reason, (
        f"the first failure latched for {name} rank {rank} is not the sentinel, so an earlier "
        f"step failed the actor: {got[0]}"
    )
    return got[0]


def assert_failed_rank_refused(
    mesh: ActorMesh[Any], name: str, rank: int, path: str | None, reason: str
) -> str:
    """A call to a failed rank fails fast with the 'failure on mesh' SupervisionError."""
    err, took = supervision_error(
        lambda: mesh.slice(gpus=rank).echo.call_one("after").get(timeout=T)
    )
    text = str(err)
    assert text.startswith(f"Endpoint call {name}.echo() failed, "), text
    assert f"failure on mesh {name} at rank " in text, text
    if path is not None:
        assert f"failure on mesh {name} at rank {rank} with event" in text, text
        assert path in text, text
    assert reason in text, text
    assert took < FAST, f"a call to failed rank {rank} took {took:.2f} s to fail"
    return text


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """Failures that reach the root during this test (the hook returns: nothing is fatal)."""
    got: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", got.append)
    return got


@pytest.fixture
def make_procs() -> Iterator[Callable[..., tuple[ProcMesh, list[int]]]]:
    """Procs private to one test, with their pids (rank order); all stopped and gone after."""
    made: list[tuple[ProcMesh, list[int]]] = []

    def factory(gpus: int = 4) -> tuple[ProcMesh, list[int]]:
        procs = this_host().spawn_procs(per_host={"gpus": gpus})
        probe = procs.spawn(f"probe{len(made)}", Worker)
        found = probe.pid.call().get(timeout=T)
        pids = [found.item(gpus=i) for i in range(gpus)]
        made.append((procs, pids))
        return procs, pids

    yield factory
    pids = [p for _, ps in made for p in ps]
    for procs, _ in made:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=T)
    left = wait_gone(pids, 10)
    kill_all(left)
    assert not left, f"procs {left} outlived procs.stop()"


# -- row 1: Exception with a reply port ------------------------------------------------------


def test_exception_in_called_endpoint_is_an_actor_error_and_the_actor_survives(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row1", Worker)

    with pytest.raises(ActorError) as info:
        m.fail.call(1, "called").get(timeout=T)
    assert "Actor call row1.fail failed." in info.value.message
    assert "ValueError: called on rank 1" in str(info.value)
    assert isinstance(info.value.exception, ValueError)

    with pytest.raises(ActorError) as info:
        m.slice(gpus=1).fail.call_one(1, "called once").get(timeout=T)
    assert "ValueError: called once on rank 1" in str(info.value)

    # The actor survives: the next calls work, on the same rank and on the whole mesh.
    assert m.slice(gpus=1).echo.call_one("next").get(timeout=T) == (1, "next")
    assert sorted(m.echo.call("all").get(timeout=T).values()) == [(r, "all") for r in range(4)]
    assert_sentinel_only(faults, m, "row1", 1)


# -- rows 2 and 3: Exception with no reply path ----------------------------------------------


def _broadcast(m: ActorMesh[Worker]) -> None:
    assert m.fail.broadcast(1, "fire and forget") is None


def _send_without_port(m: ActorMesh[Worker]) -> None:
    assert send(m.fail, (1, "fire and forget"), {}, port=None) is None


@pytest.mark.parametrize(
    ("name", "fire"),
    [("row2", _broadcast), ("row3", _send_without_port)],
    ids=["broadcast", "send"],
)
def test_exception_with_no_reply_path_kills_the_actor(
    faults: list[MeshFailure],
    make_procs: Callable[..., tuple[ProcMesh, list[int]]],
    name: str,
    fire: Callable[[ActorMesh[Worker]], None],
) -> None:
    procs, _ = make_procs()
    m = procs.spawn(name, Worker)
    other = procs.spawn(f"{name}_other", Worker)
    assert m.initialized.get(timeout=T) is None
    assert other.initialized.get(timeout=T) is None

    fire(m)  # the caller sees nothing

    (failure,) = wait_failures(faults, name, 1)
    path = actor_path(Worker, name, 1)
    reason = "endpoint fail raised ValueError: fire and forget on rank 1"
    assert failure.crashed_ranks == [1]
    assert failure.mesh_name == name
    assert failure.mesh is m
    assert reason in failure.event.reason
    text = str(failure)
    for piece in ("MeshFailure", path, reason, "crashed_ranks=[1]"):
        assert piece in text, f"{piece!r} missing from {text!r}"
    assert path in failure.report()
    assert reason in failure.report()

    # Later calls to that rank fail fast; ranks and meshes without it keep working.
    assert_failed_rank_refused(m, name, 1, path, reason)
    assert sorted(m.slice(gpus=slice(2, 4)).echo.call("ok").get(timeout=T).values()) == [
        (2, "ok"),
        (3, "ok"),
    ]
    assert m.slice(gpus=0).echo.call_one("ok").get(timeout=T) == (0, "ok")
    assert sorted(other.echo.call("ok").get(timeout=T).values()) == [(r, "ok") for r in range(4)]

    # New procs on the same host work.
    fresh, _ = make_procs(2)
    fm = fresh.spawn(f"{name}_fresh", Worker)
    assert sorted(fm.echo.call("ok").get(timeout=T).values()) == [(0, "ok"), (1, "ok")]

    assert len(failures_of(faults, name)) == 1
    assert not failures_of(faults, f"{name}_other")
    assert not failures_of(faults, f"{name}_fresh")


# -- row 4: explicit-port endpoint raises instead of replying --------------------------------


@pytest.mark.parametrize("cls", [Worker, AsyncWorker], ids=["endpoint", "concurrent_endpoint"])
def test_explicit_port_endpoint_raising_fails_the_call_and_the_actor(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]], cls: type
) -> None:
    procs, _ = make_procs()
    name = f"row4_{cls.__name__.lower()}"
    m = procs.spawn(name, cls)
    path = actor_path(cls, name, 2)

    # A healthy rank replies through its port.
    assert m.slice(gpus=0).reply_or_raise.call_one(2).get(timeout=T) == 0

    err, _ = supervision_error(lambda: m.slice(gpus=2).reply_or_raise.call_one(2).get(timeout=T))
    text = str(err)
    assert text.startswith(f"Endpoint call {name}.reply_or_raise() failed, "), text
    assert f"The actor {path} and all its descendants have failed" in text, text
    assert "KeyError" in text, text
    assert "no reply from rank 2" in text, text

    (failure,) = wait_failures(faults, name, 1)
    assert failure.crashed_ranks == [2]
    assert path in str(failure)
    assert "no reply from rank 2" in str(failure)
    assert_failed_rank_refused(m, name, 2, path, "no reply from rank 2")
    assert m.slice(gpus=3).echo.call_one("ok").get(timeout=T) == (3, "ok")
    assert len(failures_of(faults, name)) == 1


# -- row 5: non-explicit concurrent_endpoint raises ------------------------------------------


def test_concurrent_endpoint_exception_is_an_actor_error_and_the_actor_survives(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row5", AsyncWorker)

    with pytest.raises(ActorError) as info:
        m.slice(gpus=3).fail.call_one(3, "concurrent").get(timeout=T)
    assert "Actor call row5.fail failed." in info.value.message
    assert "LookupError: concurrent on rank 3" in str(info.value)

    with pytest.raises(ActorError):
        m.fail.call(3, "concurrent again").get(timeout=T)

    assert m.slice(gpus=3).echo.call_one("next").get(timeout=T) == (3, "next")
    assert_sentinel_only(faults, m, "row5", 3)


# -- row 6: BaseException ---------------------------------------------------------------------


def test_base_exception_fails_the_pending_call_and_the_actor(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row6", Worker)
    path = actor_path(Worker, "row6", 1)

    err, _ = supervision_error(lambda: m.slice(gpus=1).fatal.call_one("fatal!").get(timeout=T))
    text = str(err)
    assert text.startswith("Endpoint call row6.fatal() failed, "), text
    assert f"The actor {path} and all its descendants have failed" in text, text
    assert "Fatal: fatal!" in text, text
    assert err.endpoint == "row6.fatal"

    (failure,) = wait_failures(faults, "row6", 1)
    assert failure.crashed_ranks == [1]
    assert "Fatal: fatal!" in str(failure)
    assert_failed_rank_refused(m, "row6", 1, path, "Fatal: fatal!")
    assert m.slice(gpus=0).echo.call_one("ok").get(timeout=T) == (0, "ok")


# -- row 7: __init__ raises -------------------------------------------------------------------


def test_init_raising_on_some_ranks_fails_those_ranks_only(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row7", Worker, fail_init_on=(1, 3))  # does not raise

    with pytest.raises(Exception) as info:
        m.initialized.get(timeout=T)
    assert "init refused on rank" in str(info.value)

    got = wait_failures(faults, "row7", 2)
    assert sorted(f.crashed_ranks for f in got) == [[1], [3]]
    for f in got:
        (rank,) = f.crashed_ranks
        assert f.event.actor == actor_path(Worker, "row7", rank)
        assert f"__init__ raised ValueError: init refused on rank {rank}" in str(f)

    for rank in (1, 3):
        assert_failed_rank_refused(
            m, "row7", rank, actor_path(Worker, "row7", rank), f"init refused on rank {rank}"
        )
    err, _ = supervision_error(lambda: m.echo.call("all").get(timeout=T))
    assert "failure on mesh row7 at rank" in str(err)
    assert sorted(m.slice(gpus=slice(0, 4, 2)).echo.call("ok").get(timeout=T).values()) == [
        (0, "ok"),
        (2, "ok"),
    ]
    assert len(failures_of(faults, "row7")) == 2  # one per failing rank, no more


# -- row 8: the process dies -------------------------------------------------------------------

DEATHS = {
    "exit": "exited with code 3",
    "sigkill": "killed by signal SIGKILL",
    "sigsegv": "SIGSEGV",
}


MONARCH = {
    "exit": "exited with non-zero code 3",
    "sigkill": "failed: Killed(sig=9)",
    "sigsegv": "failed: Killed(sig=11)",
}


def _die(m: ActorMesh[Worker], pid: int, how: str) -> Any:
    """Start a call on rank 2 that is pending when the proc dies; return its future."""
    target = m.slice(gpus=2)
    if how == "exit":
        return target.exit_now.call_one(3)
    if how == "sigsegv":
        return target.segfault.call_one()
    fut = target.hang.call_one()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.1)  # really pending
    os.kill(pid, signal.SIGKILL)
    return fut


@pytest.mark.parametrize("how", list(DEATHS))
def test_proc_death_fails_pending_and_later_calls(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]], how: str
) -> None:
    procs, pids = make_procs()
    name = f"row8_{how}"
    m = procs.spawn(name, Worker)
    method = {"exit": "exit_now", "sigsegv": "segfault", "sigkill": "hang"}[how]
    fut = _die(m, pids[2], how)

    err, took = supervision_error(lambda: fut.get(timeout=T))
    text = str(err)
    assert text.startswith(f"Endpoint call {name}.{method}() failed, "), text
    assert f"failure on mesh {name} at rank" in text, text
    monarch = f"the process this actor was running on {MONARCH[how]}"
    assert f"and all its descendants have failed:\n  {monarch}" in text, text
    assert DEATHS[how] in text, f"the error does not say how the proc died: {text}"
    assert took < 5.0, f"the pending call took {took:.2f} s to fail"

    (failure,) = wait_failures(faults, name, 1)
    assert failure.crashed_ranks == [2]
    assert failure.event.actor == actor_path(Worker, name, 2)
    # Monarch's words first ("exited with non-zero code 3", "failed: Killed(sig=9)").
    assert failure.event.reason.startswith(f"the process this actor was running on {MONARCH[how]}")
    assert DEATHS[how] in str(failure)

    # Later calls: to that rank, and to the whole mesh, fail fast (the rank a call through a
    # slice names is checked by test_dead_proc_errors_name_the_mesh_rank).
    assert_failed_rank_refused(m, name, 2, None, DEATHS[how])
    err, took = supervision_error(lambda: m.echo.call("all").get(timeout=T))
    assert f"failure on mesh {name} at rank 2 with event" in str(err), str(err)
    assert took < FAST
    assert m.slice(gpus=3).echo.call_one("ok").get(timeout=T) == (3, "ok")

    start = time.monotonic()
    procs.stop().get(timeout=T)  # still succeeds
    assert time.monotonic() - start < 10.0
    assert not wait_gone(pids, 10)
    assert len(failures_of(faults, name)) == 1


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_dead_proc_errors_name_the_mesh_rank(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]], how: str
) -> None:
    # Calls go through the slice gpus=2; rank 2 of the mesh died, and the errors of the pending
    # call and of a later call must say so, as the MeshFailure (crashed_ranks=[2]) does.
    procs, pids = make_procs()
    name = f"row8rank_{how}"
    m = procs.spawn(name, Worker)
    fut = _die(m, pids[2], how)
    err, _ = supervision_error(lambda: fut.get(timeout=T))
    (failure,) = wait_failures(faults, name, 1)
    assert failure.crashed_ranks == [2]
    later = assert_failed_rank_refused(m, name, 2, None, DEATHS[how])
    wrong = [
        f"{what}: {text}"
        for what, text in (("pending call", str(err)), ("later call", later))
        if f"failure on mesh {name} at rank 2 with event" not in text
    ]
    assert not wrong, "errors that do not name rank 2 of the mesh:\n" + "\n".join(wrong)


# -- row 9: call to a stopped actor mesh ---------------------------------------------------------


def test_call_to_a_stopped_actor_mesh_says_stopped_and_is_no_failure(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row9", Worker)
    assert m.echo.call(1).get(timeout=T)
    assert m.stop().get(timeout=T) is None

    for make in (
        lambda: m.echo.call("x").get(timeout=T),
        lambda: m.slice(gpus=2).echo.call_one("x").get(timeout=T),
    ):
        err, took = supervision_error(make)
        text = str(err)
        assert text.startswith("Endpoint call row9.echo() failed, "), text
        assert "stopped" in text, text
        assert "failure on mesh" not in text, text
        assert took < FAST
    # A broadcast to the stopped mesh is refused at the call site (the root client has no
    # undeliverable-message handler); it is no failure either.
    with pytest.raises(SupervisionError, match="stopped"):
        m.echo.broadcast("x")

    # The procs are fine: a new mesh there works; its sentinel failure is the only failure.
    other = procs.spawn("row9_after", Worker)
    assert sorted(other.echo.call(1).get(timeout=T).values()) == [(r, 1) for r in range(4)]
    assert_sentinel_only(faults, other, "row9_after", 2)
    assert not failures_of(faults, "row9"), f"a stop was reported as a failure: {faults}"


# -- row 10: call after the proc mesh was stopped -----------------------------------------------


def test_call_after_the_proc_mesh_stopped_says_stopped_and_is_no_failure(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, pids = make_procs()
    m = procs.spawn("row10", Worker)
    assert m.echo.call(1).get(timeout=T)
    procs.stop().get(timeout=T)
    assert not wait_gone(pids, 10)

    for make in (
        lambda: m.echo.call("x").get(timeout=T),
        lambda: m.slice(gpus=3).echo.call_one("x").get(timeout=T),
    ):
        err, took = supervision_error(make)
        text = str(err)
        assert text.startswith("Endpoint call row10.echo() failed, "), text
        assert "stopped" in text, text
        assert "failure on mesh" not in text, text
        assert took < FAST

    # Barrier: a proc that dies later goes through the same exit reports; once its failure is
    # in, the stop's reports are too, and none of them was a failure.
    fresh, _ = make_procs(1)
    sentinel = fresh.spawn("row10_sentinel", Worker)
    with pytest.raises(SupervisionError):
        sentinel.exit_now.call_one(5).get(timeout=T)
    wait_failures(faults, "row10_sentinel", 1)
    assert not failures_of(faults, "row10"), f"a stop was reported as a failure: {faults}"
    assert not failures_of(faults, "probe0"), f"a stop was reported as a failure: {faults}"


# -- row 13: health is per rank -------------------------------------------------------------------


def test_health_is_per_rank(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs()
    m = procs.spawn("row13", Worker)
    m.fail.broadcast(1, "rank one down")
    (failure,) = wait_failures(faults, "row13", 1)
    assert failure.crashed_ranks == [1]

    assert sorted(m.slice(gpus=slice(2, 4)).echo.call("ok").get(timeout=T).values()) == [
        (2, "ok"),
        (3, "ok"),
    ]
    assert m.slice(gpus=2).echo.call_one("ok").get(timeout=T) == (2, "ok")
    assert m.slice(gpus=slice(1, 4)).slice(gpus=slice(1, 3)).echo.call(0).get(timeout=T)

    refused = {
        "whole mesh": lambda: m.echo.call("x").get(timeout=T),
        "slice 0:2": lambda: m.slice(gpus=slice(0, 2)).echo.call("x").get(timeout=T),
        "child slice": lambda: (
            m.slice(gpus=slice(1, 3)).slice(gpus=0).echo.call_one(0).get(timeout=T)
        ),
        "stream": lambda: [f.get(timeout=T) for f in m.echo.stream("x")],
    }
    for what, make in refused.items():
        err, took = supervision_error(make)
        text = str(err)
        assert "failure on mesh row13 at rank 1 with event" in text, f"{what}: {text}"
        assert "rank one down" in text, f"{what}: {text}"
        assert took < FAST, f"{what} took {took:.2f} s to fail"
    assert len(failures_of(faults, "row13")) == 1


# -- MeshFailure itself -----------------------------------------------------------------------


def test_mesh_failure_is_not_picklable(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs(2)
    m = procs.spawn("unpicklable", Worker)
    m.fail.broadcast(0, "pickle me")
    (failure,) = wait_failures(faults, "unpicklable", 1)
    with pytest.raises(TypeError):
        pickle.dumps(failure)
    text = str(failure)
    assert text.startswith("MeshFailure(")
    assert actor_path(Worker, "unpicklable", 0, 2) in text
    assert "pickle me on rank 0" in text
    assert "crashed_ranks=[0]" in text


# -- §2.9: an owner actor's __supervise__ ---------------------------------------------------------


def test_owner_supervise_receives_the_failed_ranks_and_handles_them(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs(1)
    owner = procs.spawn("owner_ok", Owner, True)
    child_pids = owner.child_pids.call_one().get(timeout=T)
    try:
        owner.break_child.call_one(1).get(timeout=T)
        assert wait_until(lambda: owner.seen_failures.call_one().get(timeout=T), T, 0.02)
        (seen,) = owner.seen_failures.call_one().get(timeout=T)
        assert seen["mesh_name"] == "child"
        assert seen["is_child"]
        assert seen["crashed_ranks"] == [1]
        child = (
            f"<root>.<{Owner.__module__}.Owner owner_ok{{'gpus': 0/1}}>"
            f".<{Worker.__module__}.Worker child{{'gpus': 1/2}}>"
        )
        assert child in seen["text"]
        assert "child boom on rank 1" in seen["text"]

        # Handled: the owner lives on, the child's other rank works, the root hears nothing.
        assert owner.ping.call_one().get(timeout=T) == "pong"
        assert owner.call_child.call_one(0).get(timeout=T) == (0, "hi")
        with pytest.raises(ActorError) as info:
            owner.call_child.call_one(1).get(timeout=T)
        assert "failure on mesh child at rank 1 with event" in str(info.value)
        assert_sentinel_only(
            faults, procs.spawn("owner_ok_sentinel", Worker), "owner_ok_sentinel", 0
        )
        assert not failures_of(faults, "owner_ok")
        assert not failures_of(faults, "child")
    finally:
        procs.stop().get(timeout=T)
        left = wait_gone(child_pids, 10)
        kill_all(left)
        assert not left, "the owner's child procs outlived it"


def test_owner_supervise_declining_escalates_to_the_root(
    faults: list[MeshFailure], make_procs: Callable[..., tuple[ProcMesh, list[int]]]
) -> None:
    procs, _ = make_procs(1)
    owner = procs.spawn("owner_no", Owner, False)
    child_pids = owner.child_pids.call_one().get(timeout=T)
    try:
        owner.break_child.call_one(0).get(timeout=T)
        (failure,) = wait_failures(faults, "owner_no", 1)
        assert failure.crashed_ranks == [0]
        owner_path = f"<root>.<{Owner.__module__}.Owner owner_no{{'gpus': 0/1}}>"
        assert failure.event.actor == owner_path
        assert f"The actor {owner_path} and all its descendants have failed" in str(failure)
        assert "child boom on rank 0" in failure.root_cause
        assert f"{owner_path}.<{Worker.__module__}.Worker child" in failure.root_cause
        assert "child{'gpus': 0/2}" in failure.root_cause
        assert "child boom on rank 0" in failure.report()

        err, _ = supervision_error(lambda: owner.ping.call_one().get(timeout=T))
        assert "failure on mesh owner_no at rank 0 with event" in str(err)
        assert "and all its descendants have failed" in str(err)
        # The failed owner's meshes are stopped: its child procs go away.
        left = wait_gone(child_pids, 10)
        assert not left, f"child procs {left} of a failed owner still run"
        assert not failures_of(faults, "child")
    finally:
        procs.stop().get(timeout=T)
        kill_all(child_pids)


# -- subprocess controllers: rows 11 and 12 --------------------------------------------------------

OVERSIZE = """
from regency import config

LIMIT = 1 << 20
config.configure(max_frame_bytes=LIMIT)

import threading
import regency.actor
from regency.actor import Actor, ActorError, context, endpoint, shutdown_context, this_host

failures = []
arrived = threading.Event()


def hook(failure):
    failures.append({"mesh": failure.mesh_name, "ranks": failure.crashed_ranks,
                     "text": str(failure)})
    arrived.set()


regency.actor.unhandled_fault_hook = hook


class Echo(Actor):
    @endpoint
    def echo(self, value):
        return len(value) if isinstance(value, bytes) else value

    @endpoint
    def big(self, n):
        return b"x" * n

    @endpoint
    def fail(self, rank):
        if context().actor_instance.rank["gpus"] == rank:
            raise ValueError("sentinel")

    @endpoint
    def pid(self):
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 2})
m = procs.spawn("over", Echo)
emit("PIDS", sorted(m.pid.call().get(timeout=30).values()))
result = {}


def attempt(key, fn):
    try:
        fn()
        result[key] = "no error"
    except Exception as exc:
        result[key] = [c.__name__ for c in type(exc).__mro__]


attempt("call_one", lambda: m.slice(gpus=0).echo.call_one(b"x" * (2 * LIMIT)))
attempt("call", lambda: m.echo.call(b"x" * (2 * LIMIT)))
attempt("broadcast", lambda: m.echo.broadcast(b"x" * (2 * LIMIT)))
attempt("reply", lambda: m.slice(gpus=1).big.call_one(2 * LIMIT).get(timeout=10))
result["after"] = sorted(m.echo.call("fine").get(timeout=10).values())
# Sentinel: rank 0 fails on purpose; it must be the only failure the hook ever sees.
m.fail.broadcast(0)
result["sentinel_arrived"] = arrived.wait(20)
result["failures"] = failures
emit("RESULT", result)
shutdown_context()
"""


def test_oversize_message_is_refused_at_the_call_site_without_a_failure(tmp_path: Path) -> None:
    controller = Controller(write_script(tmp_path, OVERSIZE))
    pids: list[int] = []
    try:
        pids.extend(controller.expect("PIDS", 30))
        result = controller.expect("RESULT", 40)
        assert controller.wait(20) == 0, controller.describe()
    finally:
        controller.close()
        kill_all(pids)
    for key in ("call_one", "call", "broadcast"):
        assert isinstance(result[key], list), (key, result)
        assert "ValueError" in result[key], (key, result)
    assert "ActorError" in result["reply"], result
    assert result["after"] == ["fine", "fine"]
    assert result["sentinel_arrived"], controller.describe()
    failures = result["failures"]
    assert len(failures) == 1, f"an oversize message produced a MeshFailure: {failures}"
    assert failures[0]["ranks"] == [0]
    assert "sentinel" in failures[0]["text"]
    assert not wait_gone(pids, 10)


HOOKS = """
import atexit, threading
import regency.actor
from regency.actor import Actor, context, endpoint, this_host

mode = sys.argv[1]
atexit.register(lambda: print("ATEXIT-RAN", flush=True))
hook_called = threading.Event()


def returning_hook(failure):
    print("HOOK-CALLED " + json.dumps(failure.crashed_ranks), flush=True)
    hook_called.set()


def raising_hook(failure):
    print("HOOK-CALLED " + json.dumps(failure.crashed_ranks), flush=True)
    raise RuntimeError("hook refuses " + failure.mesh_name)


if mode == "returns":
    regency.actor.unhandled_fault_hook = returning_hook
elif mode == "raises":
    regency.actor.unhandled_fault_hook = raising_hook


class Worker(Actor):
    @endpoint
    def fail(self, rank):
        if context().actor_instance.rank["gpus"] == rank:
            raise ValueError("unhandled boom")

    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def pid(self):
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 2})
m = procs.spawn("doomed", Worker)
emit("PIDS", sorted(m.pid.call().get(timeout=30).values()))
m.fail.broadcast(1)
if mode == "returns":
    emit("HOOK-RETURNED", hook_called.wait(20))
    emit("CONTINUED", m.slice(gpus=0).echo.call_one("still up").get(timeout=20))
else:
    threading.Event().wait(40)  # the fatal failure interrupts this
    emit("NOT-INTERRUPTED", True)
"""


@pytest.mark.parametrize(("mode", "code"), [("default", 1), ("returns", 0), ("raises", 1)])
def test_root_fault_hook_outcomes(tmp_path: Path, mode: str, code: int) -> None:
    controller = Controller(write_script(tmp_path, HOOKS), mode)
    pids: list[int] = []
    try:
        pids.extend(controller.expect("PIDS", 30))
        rc = controller.wait(30)
    finally:
        controller.close()
        kill_all(pids)
    out, err = "".join(controller.stdout), "".join(controller.stderr)
    described = controller.describe()
    assert rc == code, described
    assert "ATEXIT-RAN" in out, f"atexit handlers did not run\n{described}"
    assert "NOT-INTERRUPTED" not in out, described
    assert not wait_gone(pids, 10), f"procs outlived the controller\n{described}"
    if mode != "default":
        assert out.count("HOOK-CALLED") == 1, f"the hook was not called exactly once\n{described}"
        assert "HOOK-CALLED [1]" in out, described
    if mode == "returns":
        assert 'CONTINUED "still up"' in out, described
        assert "unhandled supervision failure" not in err, described
        return
    assert "unhandled supervision failure" in err, described
    assert "mesh 'doomed' failed at ranks [1]" in err, described
    assert "unhandled boom" in err, described
    assert "doomed{'gpus': 1/2}" in err, described
    if mode == "raises":
        assert "RuntimeError: hook refuses doomed" in err, described
    else:
        assert "SystemExit" in err, described


def test_a_fatal_failure_ends_a_controller_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A shell's background job (or nohup) starts with SIGINT ignored; the fatal exit path
    used to need SIGINT, so the controller stayed blocked in its wait instead of exiting."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the controller
    try:
        controller = Controller(write_script(tmp_path, HOOKS), "default")
    finally:
        signal.signal(signal.SIGINT, previous)
    pids: list[int] = []
    try:
        pids.extend(controller.expect("PIDS", 30))
        assert controller.wait(30) == 1
        assert "NOT-INTERRUPTED" not in "".join(controller.stdout)
    finally:
        controller.close()
        kill_all(pids)
