"""Actor runtime faults an attacker (or a bug) can provoke.

A ``BaseException`` raised inside an endpoint fails the actor through supervision (Monarch's
rule). One raised while unpickling a call's arguments or pickling its reply (a ``__reduce__``
raising ``SystemExit``, an unpickling raising ``KeyboardInterrupt``) is the bytes' doing, not the
endpoint's: it fails that one call with an ``ActorError`` naming it and the actor serves on, in
sync and async actors alike; with no reply path (a broadcast) the actor fails visibly, as for any
exception there. A reply whose unpickling raises one fails that call at the caller with
``pickle.UnpicklingError``. Calls on an empty slice raise ``IndexError``.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _fault_helpers import wait_until

import regency.actor
from regency.actor import (
    Actor,
    ActorError,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    endpoint,
    this_host,
)

pytestmark = pytest.mark.timeout(60)

T = 20.0
PROMPT = 5.0  # far below the 10 s a hung actor thread made stop() take


def _raise_now(kind: type[BaseException], why: str) -> None:
    raise kind(f"{kind.__name__.lower()} while {why}")


class RaiseOnLoad:
    """Raises ``kind`` when unpickled (in the proc, decoding the call's arguments; in the
    caller, decoding a reply)."""

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (_raise_now, (self.kind, "unpickled"))


class ExitOnDump:
    """Raises ``SystemExit`` when pickled (in the proc, encoding the endpoint's return value)."""

    def __reduce__(self) -> tuple[Any, ...]:
        raise SystemExit("exit while pickled")


class ExitOnReduceError(Exception):
    """An exception that cannot be pickled: its ``__reduce__`` raises ``SystemExit``."""

    def __reduce__(self) -> tuple[Any, ...]:
        raise SystemExit("exit while pickling the error")


class Echo(Actor):
    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def exit_on_return(self) -> ExitOnDump:
        return ExitOnDump()

    @endpoint
    def interrupt_at_caller(self) -> RaiseOnLoad:
        return RaiseOnLoad(KeyboardInterrupt)

    @endpoint
    def raise_unpicklable(self) -> None:
        raise ExitOnReduceError("the endpoint's own error")

    @endpoint
    def raise_exit(self) -> None:
        raise SystemExit("exit while pickled")


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, value: Any) -> Any:
        return value

    @endpoint
    async def exit_on_return(self) -> ExitOnDump:
        return ExitOnDump()

    @endpoint
    async def interrupt_at_caller(self) -> RaiseOnLoad:
        return RaiseOnLoad(KeyboardInterrupt)

    @endpoint
    async def raise_unpicklable(self) -> None:
        raise ExitOnReduceError("the endpoint's own error")


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    got: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", got.append)
    return got


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=30)


def _failed_call(fn: Any) -> SupervisionError:
    with pytest.raises(SupervisionError) as info:
        fn().get(timeout=T)
    return info.value


def test_system_exit_raised_in_endpoint_fails_the_actor(
    procs: ProcMesh, faults: list[MeshFailure]
) -> None:
    """The reference: an endpoint that raises ``SystemExit`` fails its actor (Monarch's rule)."""
    name, text = "raised", "SystemExit: exit while pickled"
    mesh = procs.spawn(name, Echo)
    err = _failed_call(mesh.slice(gpus=1).raise_exit.call_one)
    assert f"Endpoint call {name}." in str(err), str(err)
    assert "have failed" in str(err), str(err)
    assert text in str(err), str(err)
    assert wait_until(lambda: any(f.mesh_name == name for f in faults), T), faults
    (failure,) = [f for f in faults if f.mesh_name == name]
    assert failure.crashed_ranks == [1]
    assert text in str(failure)
    # Later calls to the failed rank fail at once; the healthy rank still answers.
    started = time.monotonic()
    later = _failed_call(lambda: mesh.slice(gpus=1).echo.call_one("again"))
    assert time.monotonic() - started < PROMPT
    assert f"failure on mesh {name} at rank 1" in str(later), str(later)
    assert mesh.slice(gpus=0).echo.call_one("ok").get(timeout=T) == "ok"
    started = time.monotonic()
    mesh.stop().get(timeout=T)
    assert time.monotonic() - started < PROMPT, "stop() waited on a dead actor thread"


_BAD_CALLS: dict[str, tuple[Any, str]] = {
    "exit_unpickling_argument": (
        lambda m: m.echo.call_one(RaiseOnLoad(SystemExit)),
        "SystemExit: systemexit while unpickled",
    ),
    "interrupt_unpickling_argument": (
        lambda m: m.echo.call_one(RaiseOnLoad(KeyboardInterrupt)),
        "KeyboardInterrupt: keyboardinterrupt while unpickled",
    ),
    "exit_pickling_return_value": (
        lambda m: m.exit_on_return.call_one(),
        "SystemExit: exit while pickled",
    ),
    "exit_pickling_endpoint_error": (
        lambda m: m.raise_unpicklable.call_one(),
        "ExitOnReduceError: the endpoint's own error",
    ),
}


@pytest.mark.parametrize("cls", [Echo, AsyncEcho], ids=["sync", "async"])
@pytest.mark.parametrize("case", list(_BAD_CALLS))
def test_base_exception_encoding_or_decoding_fails_only_that_call(
    procs: ProcMesh, faults: list[MeshFailure], cls: type[Actor], case: str
) -> None:
    call, text = _BAD_CALLS[case]
    mesh = procs.spawn("bad", cls)
    started = time.monotonic()
    with pytest.raises(ActorError) as info:
        call(mesh.slice(gpus=1)).get(timeout=T)
    assert time.monotonic() - started < PROMPT, "the call waited for a dead actor thread"
    assert "Actor call bad" in str(info.value), str(info.value)
    assert text in str(info.value), str(info.value)
    # The actor serves on, call after call, and nothing failed.
    for n in range(3):
        assert mesh.slice(gpus=1).echo.call_one(n).get(timeout=PROMPT) == n
    assert faults == []
    started = time.monotonic()
    mesh.stop().get(timeout=T)
    assert time.monotonic() - started < PROMPT, "stop() waited on a dead actor thread"


@pytest.mark.parametrize("cls", [Echo, AsyncEcho], ids=["sync", "async"])
def test_interrupt_unpickling_a_broadcast_fails_the_actor_visibly(
    procs: ProcMesh, faults: list[MeshFailure], cls: type[Actor]
) -> None:
    """No reply path: the actor fails through supervision (as for any exception there), and
    later calls fail at once instead of timing out on a dead thread."""
    mesh = procs.spawn("cast", cls)
    mesh.slice(gpus=1).echo.broadcast(RaiseOnLoad(KeyboardInterrupt))
    assert wait_until(lambda: any(f.mesh_name == "cast" for f in faults), T), faults
    (failure,) = [f for f in faults if f.mesh_name == "cast"]
    assert failure.crashed_ranks == [1]
    assert "KeyboardInterrupt: keyboardinterrupt while unpickled" in str(failure)
    started = time.monotonic()
    _failed_call(lambda: mesh.slice(gpus=1).echo.call_one("again"))
    assert time.monotonic() - started < PROMPT
    assert mesh.slice(gpus=0).echo.call_one("ok").get(timeout=T) == "ok"


@pytest.mark.parametrize("cls", [Echo, AsyncEcho], ids=["sync", "async"])
def test_reply_whose_unpickling_interrupts_fails_that_call_at_the_caller(
    procs: ProcMesh, faults: list[MeshFailure], cls: type[Actor]
) -> None:
    mesh = procs.spawn("reply", cls)
    match = "reply could not be unpickled: unpickling it raised KeyboardInterrupt"
    with pytest.raises(pickle.UnpicklingError, match=match):
        mesh.slice(gpus=1).interrupt_at_caller.call_one().get(timeout=T)
    values = mesh.interrupt_at_caller.call().get(timeout=T)
    with pytest.raises(pickle.UnpicklingError, match=match):
        values.item(gpus=0)
    assert list(mesh.echo.call("ok").get(timeout=T).values()) == ["ok", "ok"]
    assert faults == []


@pytest.mark.parametrize(
    ("dims", "text"),
    [
        ({"gpus": slice(1, 1)}, "empty range 1:1:1"),
        ({"gpus": slice(5, 9)}, "out of range 2:2:1 for dimension gpus of size 2"),
        ({"gpus": range(1, 0)}, "empty range 1:0:1"),
    ],
)
def test_empty_slice_raises_index_error_like_an_index_past_the_end(
    procs: ProcMesh, dims: dict[str, Any], text: str
) -> None:
    mesh = procs.spawn("empty", Echo)
    with pytest.raises(IndexError, match="out of range"):
        mesh.slice(gpus=5)
    # Monarch 0.7 raises ValueError with these words; regency's error is both.
    with pytest.raises(IndexError, match=f"^{text}$"):
        mesh.slice(**dims)
    with pytest.raises(ValueError, match=f"^{text}$"):
        procs.slice(**dims)
    assert list(mesh.slice(gpus=slice(0, 2)).echo.call("ok").get(timeout=T).values()) == [
        "ok",
        "ok",
    ]


def test_bookkeeping_of_ended_procs_stays_bounded(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawn/stop cycles must not grow what the controller remembers about ended procs."""
    from regency._runtime.host import controller
    from regency._runtime.kernel import state

    procs.spawn("warm", Echo).echo.call("up").get(timeout=T)
    rt = state.runtime()
    agent = controller._host_agent
    assert agent is not None
    records = {
        "dead": rt.losses.dead,
        "transport lost": rt.transport._lost,
        "switchboard gone": agent.switchboard._gone,
    }
    limit = 6
    for record in records.values():
        monkeypatch.setattr(record, "limit", limit)  # the default is in the thousands
    last = None
    for _ in range(limit):
        cycle = this_host().spawn_procs(per_host={"gpus": 2})
        last = cycle.spawn("cycle", Echo)
        last.echo.call("x").get(timeout=T)
        cycle.stop().get(timeout=T)
    sizes = {name: len(record) for name, record in records.items()}
    assert all(size <= limit for size in sizes.values()), sizes
    # The most recent ends are still remembered: a call to them fails at once.
    assert last is not None
    started = time.monotonic()
    with pytest.raises(SupervisionError, match="stopped"):
        last.echo.call("x").get(timeout=T)
    assert time.monotonic() - started < PROMPT


def test_failed_attach_says_how_long_it_really_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that accepts connections but never speaks (e.g. SIGSTOPped)."""
    import re
    import socket

    from regency._transport import transport as transport_module
    from regency.job import AttachError, attach_to_workers

    # One dial attempt lasts at most the handshake timeout (10 s; 1 s here to keep this short).
    monkeypatch.setattr(transport_module, "_HANDSHAKE_TIMEOUT", 1.0)
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        port = mute.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(AttachError) as info:
            attach_to_workers([f"tcp://127.0.0.1:{port}"], secret=b"s" * 32, timeout=3.0)
        took = time.monotonic() - started
    found = re.search(r"no answer within ([0-9.]+) s", str(info.value))
    assert found, str(info.value)
    assert took >= 2.9, f"gave up after {took:.1f} s of a 3 s timeout: {info.value}"
    assert abs(float(found.group(1)) - took) < 0.6, f"said {found.group(1)} s, took {took:.1f} s"


def test_sigstopped_local_proc_is_documented_behaviour(procs: ProcMesh) -> None:
    """A SIGSTOPped proc on this machine is not detected (docs/security.md): a call to it
    waits for its caller's timeout, and the proc mesh's ``stop()`` kills it after
    ``stop_timeout``."""
    import os
    import signal

    from regency import config

    mesh = procs.spawn("stopped", Pids)
    pid = mesh.slice(gpus=1).pid.call_one().get(timeout=T)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: _state(pid) == "T", T), "the proc did not stop"
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            mesh.slice(gpus=1).pid.call_one().get(timeout=1.0)
        assert time.monotonic() - started < PROMPT
        with config.configured(stop_timeout=1.0):
            started = time.monotonic()
            procs.stop().get(timeout=T)
            assert time.monotonic() - started < PROMPT, "stop() did not end the stopped proc"
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), T)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _state(pid: int) -> str:
    """The one-letter state of process ``pid`` (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


class Pids(Actor):
    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()


@pytest.mark.parametrize("adverb", ["call", "choose"])
def test_call_and_choose_on_an_empty_mesh_raise(procs: ProcMesh, adverb: str) -> None:
    """However an empty view came about, sending to it raises instead of hanging."""
    mesh = procs.spawn("emptycall", Echo)
    empty = mesh._new_with_shape(mesh._shape.slice(gpus=slice(1, 1)))
    with pytest.raises(IndexError, match=f"echo.{adverb}\\(\\): the mesh .* has no actor"):
        getattr(empty.echo, adverb)("x").get(timeout=T)
