"""Which thread of a proc a message wakes (docs/actors.md, "Who reads the sockets").

A sync actor with nothing queued becomes its proc's inline reader before its reply leaves. The
caller, woken by the reply, often runs at once on the CPU the actor's thread was using and
sends the next message before that thread runs again; the message then waits for the actor's
thread instead of waking the proc's I/O thread, which would read it and hand it over.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from regency.actor import Actor, ProcMesh, endpoint

pytestmark = pytest.mark.timeout(120)

T = 30.0
CALLS = 20
HOLD_S = 0.02


def _switches(name: str) -> int:
    """Voluntary context switches so far of this process's thread called ``name``."""
    for thread in threading.enumerate():
        if thread.name == name:
            status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
            return int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    raise LookupError(name)


class Held(Actor):
    """Its thread can be held up right after each reply has left, as if the caller took its
    CPU; ``io_switches`` reads the proc's I/O thread's wake-ups."""

    @endpoint
    def hold_after_replies(self, seconds: float) -> None:
        from regency._runtime.kernel import state

        runtime = state.runtime()
        send_port = type(runtime).send_port
        me = threading.get_ident()

        def held(*args: Any, **kwargs: Any) -> None:
            send_port(runtime, *args, **kwargs)
            if threading.get_ident() == me:
                time.sleep(seconds)

        runtime.send_port = held  # type: ignore[method-assign]

    @endpoint
    def ping(self, i: int) -> int:
        return i

    @endpoint
    def io_switches(self) -> int:
        return _switches("regency-io")


def test_next_message_waits_for_the_actor_thread_held_up_after_its_reply(
    make_procs: Any,
) -> None:
    procs: ProcMesh = make_procs(1)
    held = procs.spawn("held", Held)
    held.hold_after_replies.call_one(HOLD_S).get(timeout=T)
    before = held.io_switches.call_one().get(timeout=T)
    # Each ping reaches the proc while the actor's thread is held up after its last reply.
    got = [held.ping.call_one(i).get(timeout=T) for i in range(CALLS)]
    woken = held.io_switches.call_one().get(timeout=T) - before
    assert got == list(range(CALLS))
    # Before the actor's thread claimed the sockets ahead of its reply, the I/O thread was
    # woken for every one of them (CALLS or more).
    assert woken <= CALLS // 4, woken


def _cpu_ns(pid: int) -> int:
    """CPU time so far of every thread of process ``pid``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # a thread that just ended
    return total


class Quick(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_an_idle_mesh_spends_no_cpu_after_quick_calls(make_procs: Any) -> None:
    # While messages come within the idle spin (a call_one loop, a stream of broadcasts), an
    # actor's thread and the caller poll without sleeping for a moment after each message;
    # once they stop coming, nothing may keep polling.
    procs: ProcMesh = make_procs(2)
    quick = procs.spawn("quick", Quick)
    pids = quick.pid.call().get(timeout=T).values()
    first = quick.slice(gpus=0)
    assert [first.ping.call_one(i).get(timeout=T) for i in range(2000)] == list(range(2000))
    for i in range(2000):
        quick.ping.broadcast(i)
    assert list(quick.ping.call(7).get(timeout=T).values()) == [7, 7]
    watched = [os.getpid(), *pids]
    before = sum(_cpu_ns(pid) for pid in watched)
    time.sleep(1.0)  # the idle second being measured
    spent_ms = (sum(_cpu_ns(pid) for pid in watched) - before) / 1e6
    # ~1 ms here; a spin that never ends would take ~1,000 ms of it per busy thread.
    assert spent_ms < 100, f"{spent_ms:.1f} ms of CPU in an idle second"
