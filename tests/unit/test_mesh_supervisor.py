"""The mesh supervisor's decisions, with its procs on the in-memory loopback (issue 16 part 8).

The owner's router and the mesh's procs are routers of one :class:`Loopback`; killing a proc
there is what the supervisor hears as a lost peer, through the router's watchers.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest

from regency._runtime.actors.control.control import ProcInfo
from regency._runtime.actors.supervision.mesh_supervisor import MeshSupervisor
from regency._runtime.actors.supervision.supervision import (
    STOP_REASON_PREFIX,
    FailureEvent,
    MeshFailure,
    MeshRestarted,
    RestartPolicy,
)
from regency._runtime.kernel import state
from regency._runtime.kernel.loopback import Loopback
from regency.shape import Extent

pytestmark = pytest.mark.timeout(30)

RANKS = 3


class Owner:
    """The mesh's owner: keeps the notices it is given."""

    def __init__(self) -> None:
        self.notices: list[MeshFailure | MeshRestarted] = []
        self.disowned: list[Any] = []

    def __str__(self) -> str:
        return "root"

    def supervise(self, notice: MeshFailure | MeshRestarted) -> None:
        self.notices.append(notice)

    def disown(self, mesh: Any) -> None:
        self.disowned.append(mesh)


class Respawns:
    """The supervisor's respawn callback: records which ranks it was asked to restart."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []
        self.called = threading.Event()

    def __call__(self, supervisor: MeshSupervisor, ranks: list[int]) -> None:
        self.asked.append(ranks)
        self.called.set()

    def wait(self) -> list[int]:
        assert self.called.wait(10), "no restart was started"
        self.called.clear()
        return self.asked[-1]


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch) -> Loopback:
    loopback = Loopback()
    monkeypatch.setattr(state, "_runtime", loopback.router("unix:@root"))
    for rank in range(RANKS):
        loopback.router(f"unix:@p{rank}")
    return loopback


def _supervisor(policy: RestartPolicy | None) -> tuple[MeshSupervisor, Owner, Respawns]:
    owner, respawn = Owner(), Respawns()
    procs = [ProcInfo(f"unix:@p{r}", "unix:@host", r, r) for r in range(RANKS)]
    sup = MeshSupervisor(
        owner,  # type: ignore[arg-type]
        9,
        "workers",
        "Worker",
        Extent(["gpu"], [RANKS]),
        range(RANKS),
        procs,
        policy,
        respawn,
    )
    sup.mesh = "the mesh"
    sup.start_watching()
    return sup, owner, respawn


def test_without_a_policy_a_lost_proc_is_one_failure_per_rank(net: Loopback) -> None:
    sup, owner, respawn = _supervisor(None)
    net.kill("unix:@p1", "exited with code 3")
    [notice] = owner.notices
    assert isinstance(notice, MeshFailure)
    assert (notice.crashed_ranks, notice.restarting) == ([1], False)
    assert "exited with code 3" in notice.report()
    assert list(sup.bad) == [1]
    # The rank's own report arriving afterwards is the same failure: latched, not told again.
    event = FailureEvent(9, 1, sup.actor_name(1), "boom", proc="unix:@p1")
    sup.deliver(1, 0, [pickle.dumps(event)])
    assert len(owner.notices) == 1
    assert respawn.asked == []


def test_a_stopped_proc_is_no_failure(net: Loopback) -> None:
    sup, owner, _ = _supervisor(RestartPolicy())
    net.kill("unix:@p0", f"{STOP_REASON_PREFIX}asked)")
    assert owner.notices == []
    assert "stopped" in sup.bad[0]


def test_one_for_one_restarts_the_failed_rank_until_the_budget_is_spent(net: Loopback) -> None:
    sup, owner, respawn = _supervisor(RestartPolicy(max_restarts=1, within_s=60.0))
    net.kill("unix:@p2", "killed by SIGKILL")
    assert respawn.wait() == [2]
    [notice] = owner.notices
    assert isinstance(notice, MeshFailure)
    assert notice.restarting
    assert "have failed" in sup.bad[2]  # calls to it fail fast until it is back
    assert sorted(sup.bad) == [2]
    # The restart moves rank 2 to a new proc; its constructor ran.
    net.router("unix:@p2b")
    sup.replaced(2, ProcInfo("unix:@p2b", "unix:@host", 2, 2))
    sup.restarted([2])
    assert sup.bad == {}
    assert isinstance(owner.notices[-1], MeshRestarted)
    done = sup.when_restarted(1)
    assert done.done
    assert done.outcome() == 1
    assert not sup.when_restarted(2).done
    # Late news of the old proc is about the previous incarnation: ignored.
    sup.on_event(FailureEvent(9, 2, sup.actor_name(2), "late"), proc="unix:@p2")
    assert sup.bad == {}
    # A second failure within the window exceeds the budget and escalates.
    net.kill("unix:@p2b", "killed by SIGKILL")
    last = owner.notices[-1]
    assert isinstance(last, MeshFailure)
    assert not last.restarting
    assert "restart intensity exceeded: 1 restarts within 60 s" in last.event.reason
    assert respawn.asked == [[2]]


def test_one_for_all_restarts_every_rank(net: Loopback) -> None:
    sup, owner, respawn = _supervisor(RestartPolicy(strategy="one_for_all"))
    net.kill("unix:@p0", "exited with code 1")
    assert respawn.wait() == [0, 1, 2]
    assert sorted(sup.bad) == [0, 1, 2]
    assert "restarting rank 1" in sup.bad[1]
    assert [n.restarting for n in owner.notices if isinstance(n, MeshFailure)] == [True]


def test_a_stopped_mesh_tells_nobody(net: Loopback) -> None:
    sup, owner, respawn = _supervisor(RestartPolicy())
    sup.stop("the owner stopped it")
    assert owner.disowned == ["the mesh"]
    net.kill("unix:@p1", "exited with code 1")
    assert owner.notices == []
    assert respawn.asked == []
    assert all("stopped" in why for why in sup.bad.values())
