"""Which thread of a proc a message wakes (docs/actors.md, "Who reads the sockets").

A sync actor with nothing queued becomes its proc's inline reader before its reply leaves. The
caller, woken by the reply, often runs at once on the CPU the actor's thread was using and
sends the next message before that thread runs again; the message then waits for the actor's
thread instead of waking the proc's I/O thread, which would read it and hand it over.
"""

from __future__ import annotations

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
