"""A call to a proc whose connection dropped a moment before the call: it fails with the
account of the loss that the controller is about to record, not with the bare connection error.

A lost connection to a proc the controller started is not yet the proc's end: the controller
waits up to ``EXIT_REPORT_GRACE`` for its host's report of how it ended (or for its host's own
loss), then records why. A call sent inside that window used to fail at once with "cannot reach
…", a different (and less useful) error than the same call a moment later. The window is made
certain here: the proc cuts its own connections and stays alive, so no exit report comes and
the controller records the end when the grace runs out.
"""

from __future__ import annotations

import os

import pytest
from _fault_helpers import tracked_procs, wait_until

from regency._runtime.kernel import losses, state
from regency.actor import Actor, ProcMesh, SupervisionError, endpoint

pytestmark = pytest.mark.timeout(60)

T = 20.0


class Cutter(Actor):
    """An actor that can cut every connection of its proc without the proc ending."""

    @endpoint
    def where(self) -> tuple[str, int]:
        return state.runtime().address, os.getpid()

    @endpoint
    def cut(self) -> None:
        transport = state.runtime()._link
        for conn in list(transport._conns):
            conn.close("cut by the test")


def _lost_here(addr: str) -> bool:
    """Whether this process's transport has seen its connection to ``addr`` go."""
    return addr in state.runtime()._link._lost


def test_a_call_inside_the_grace_fails_with_the_recorded_loss(
    cleanup: tuple[list[ProcMesh], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grace long enough that a stalled test thread cannot outlast it on a loaded machine.
    monkeypatch.setattr(losses, "EXIT_REPORT_GRACE", 5.0)
    procs = tracked_procs(cleanup)
    actor = procs.spawn("cutter", Cutter)
    addr, pid = actor.where.call_one().get(timeout=T)
    cleanup[1].append(pid)
    actor.cut.broadcast()
    assert wait_until(lambda: _lost_here(addr), T), "the controller never saw the connection go"
    assert addr not in state.runtime().losses.dead  # inside the grace: the end is not recorded

    with pytest.raises(SupervisionError) as info:
        actor.where.call_one().get(timeout=T)
    message = str(info.value)
    assert "cannot reach" not in message, message
    assert "the process this actor was running on" in message, message
    assert addr in state.runtime().losses.dead
