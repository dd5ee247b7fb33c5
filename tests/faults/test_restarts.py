"""Restart policies: a mesh spawned with ``restart=RestartPolicy(...)`` comes back from crashes.

one_for_one restarts the failed rank in a new proc with a fresh ``__init__`` (same arguments);
one_for_all restarts every rank; more restarts than ``max_restarts`` within ``within_s`` escalate
as an ordinary failure. Calls in flight at the crash fail; calls after the restart succeed. The
last test runs 200 spawn -> crash -> recover cycles and checks that no process or file
descriptor is left behind.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _fault_helpers import QUIET, proc_alive, quiet, wait_gone, wait_until

from regency.actor import (
    Actor,
    MeshFailure,
    MeshRestarted,
    ProcMesh,
    RestartPolicy,
    SupervisionError,
    endpoint,
    this_host,
)

pytestmark = pytest.mark.timeout(120)

SPAWN = 60.0

INITS = 0  # constructors run in this process (a restarted rank lives in a fresh one)


def policy(strategy: str = "one_for_one", max_restarts: int = 3) -> RestartPolicy:
    return RestartPolicy(strategy=strategy, max_restarts=max_restarts, within_s=60, backoff_s=0)


class Worker(Actor):
    def __init__(self, arg: str) -> None:
        global INITS
        INITS += 1
        self.arg = arg

    @endpoint
    def info(self) -> dict[str, Any]:
        return {"arg": self.arg, "inits": INITS, "pid": os.getpid()}

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hang(self, seconds: float) -> None:
        threading.Event().wait(seconds)

    @endpoint
    def fail(self, text: str) -> None:
        raise RuntimeError(text)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


def infos(mesh: Any, n: int) -> list[dict[str, Any]]:
    values = mesh.info.call().get(timeout=SPAWN)
    return [values.item(gpus=i) for i in range(n)]


def _spawn(
    cleanup: tuple[list[ProcMesh], list[int]], gpus: int, restart: RestartPolicy, arg: str = "hi"
) -> tuple[ProcMesh, Any, list[dict[str, Any]]]:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": gpus})
    meshes.append(procs)
    mesh = procs.spawn("workers", Worker, arg, restart=restart)
    before = infos(mesh, gpus)
    pids.extend(i["pid"] for i in before)
    return procs, mesh, before


# -- strategies ------------------------------------------------------------------------------


def test_one_for_one_restarts_only_the_killed_rank(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    _, pids = cleanup
    _, mesh, before = _spawn(cleanup, 3, policy("one_for_one"), arg="same args")
    assert [i["arg"] for i in before] == ["same args"] * 3

    pending = mesh.slice(gpus=1).hang.call_one(30)
    with pytest.raises(TimeoutError):
        pending.get(timeout=0.2)  # it is really in flight
    os.kill(before[1]["pid"], signal.SIGKILL)
    with pytest.raises(SupervisionError):
        pending.get(timeout=10)

    assert mesh.restarted(1).get(timeout=30) >= 1
    assert mesh.restarts == 1
    after = infos(mesh, 3)
    pids.extend(i["pid"] for i in after)
    assert after[1]["pid"] != before[1]["pid"], "rank 1 was not moved to a new proc"
    assert [after[r]["pid"] for r in (0, 2)] == [before[r]["pid"] for r in (0, 2)]
    assert [i["arg"] for i in after] == ["same args"] * 3
    assert after[1]["inits"] == 1, "the restarted rank did not run a fresh __init__ once"
    assert [after[r]["inits"] for r in (0, 2)] == [1, 1]
    assert sorted(mesh.echo.call(7).get(timeout=10).values()) == [7, 7, 7]
    assert not wait_gone([before[1]["pid"]], 5)
    assert quiet(lambda: list(hook)) == [], "a restart is not an unhandled failure"


def test_one_for_all_restarts_every_rank(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    _, pids = cleanup
    procs, mesh, before = _spawn(cleanup, 3, policy("one_for_all"), arg="all")
    os.kill(before[0]["pid"], signal.SIGKILL)

    mesh.restarted(1).get(timeout=30)
    after = infos(mesh, 3)
    pids.extend(i["pid"] for i in after)
    old = {i["pid"] for i in before}
    assert not old & {i["pid"] for i in after}, f"not every rank restarted: {before} -> {after}"
    assert [i["arg"] for i in after] == ["all"] * 3
    assert [i["inits"] for i in after] == [1, 1, 1]
    assert sorted(mesh.echo.call(1).get(timeout=10).values()) == [1, 1, 1]
    assert quiet(lambda: list(hook)) == []
    procs.stop().get(timeout=30)
    left = wait_gone([*old, *(i["pid"] for i in after)], 10)
    assert not left, f"procs {left} outlived the proc mesh"


def test_actor_failure_restarts_under_one_for_one(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    _, pids = cleanup
    _, mesh, before = _spawn(cleanup, 2, policy("one_for_one"), arg="again")
    mesh.slice(gpus=0).fail.broadcast("rank zero broke")

    mesh.restarted(1).get(timeout=30)
    after = infos(mesh, 2)
    pids.extend(i["pid"] for i in after)
    assert after[0]["arg"] == "again"
    assert after[0]["inits"] == 1, "the restarted rank did not run a fresh __init__ in a new proc"
    assert after[0]["pid"] != before[0]["pid"]
    assert after[1]["pid"] == before[1]["pid"]
    assert sorted(mesh.echo.call(3).get(timeout=10).values()) == [3, 3]
    assert quiet(lambda: list(hook)) == []


def test_restart_intensity_exceeded_escalates(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    _, pids = cleanup
    _, mesh, before = _spawn(cleanup, 2, policy("one_for_one", max_restarts=2), arg="x")
    victim = before[0]["pid"]
    for n in (1, 2):
        os.kill(victim, signal.SIGKILL)
        mesh.restarted(n).get(timeout=30)
        victim = mesh.slice(gpus=0).pid.call_one().get(timeout=SPAWN)
        pids.append(victim)
        assert quiet(lambda: list(hook)) == []
    os.kill(victim, signal.SIGKILL)

    assert wait_until(lambda: bool(hook), 15), "exceeding the restart intensity was not escalated"
    wait_until(lambda: len(hook) > 1, QUIET, interval=0.05)
    (failure,) = hook
    assert failure.mesh_name == "workers"
    assert failure.crashed_ranks == [0]
    assert not failure.restarting
    assert "restart intensity exceeded" in str(failure), str(failure)
    with pytest.raises(SupervisionError):
        mesh.slice(gpus=0).echo.call_one(1).get(timeout=10)
    with pytest.raises(SupervisionError):
        mesh.echo.call(1).get(timeout=10)
    assert mesh.restarts == 2
    # Health is per rank: the other rank was never touched.
    assert mesh.slice(gpus=1).echo.call_one(2).get(timeout=10) == 2


class Owner(Actor):
    """Owns a restartable Worker mesh and records what its ``__supervise__`` is told."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="ownedprocs")
        self.workers = self.procs.spawn("workers", Worker, "owned", restart=policy())

    def __supervise__(self, notice: Any) -> bool:
        if isinstance(notice, MeshFailure):
            self.notices.append(
                {
                    "kind": "failure",
                    "mesh_name": notice.mesh_name,
                    "crashed_ranks": list(notice.crashed_ranks),
                    "restarting": notice.restarting,
                }
            )
        elif isinstance(notice, MeshRestarted):
            self.notices.append(
                {
                    "kind": "restarted",
                    "mesh_name": notice.mesh_name,
                    "ranks": list(notice.ranks),
                    "restarts": notice.restarts,
                    "mesh_is_ours": notice.mesh is self.workers,
                }
            )
        return False  # ignored for restart notices; an escalation would fail this actor

    @endpoint
    def worker_pids(self) -> list[int]:
        values = self.workers.pid.call().get(timeout=SPAWN)
        return [values.item(gpus=i) for i in range(2)]

    @endpoint
    def wait_restarted(self, count: int) -> int:
        return self.workers.restarted(count).get(timeout=30)

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)


def test_owner_observes_restarts(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    owner = procs.spawn("owner", Owner)
    before = owner.worker_pids.call_one().get(timeout=SPAWN)
    pids.extend(before)
    os.kill(before[1], signal.SIGKILL)
    owner.wait_restarted.call_one(1).get(timeout=40)

    seen: list[dict[str, Any]] = []

    def both() -> bool:
        seen[:] = owner.seen.call_one().get(timeout=10)
        return len(seen) >= 2

    assert wait_until(both, 10), seen
    assert seen[0] == {
        "kind": "failure",
        "mesh_name": "workers",
        "crashed_ranks": [1],
        "restarting": True,
    }
    assert seen[1] == {
        "kind": "restarted",
        "mesh_name": "workers",
        "ranks": [1],
        "restarts": 1,
        "mesh_is_ours": True,
    }
    after = owner.worker_pids.call_one().get(timeout=10)
    pids.extend(after)
    assert after[0] == before[0]
    assert after[1] != before[1]
    # The owner returned False to both notices and still lives: they were not escalations.
    assert len(owner.seen.call_one().get(timeout=10)) == 2
    assert quiet(lambda: list(hook)) == []


def test_stop_after_restarts_stops_the_replacement_procs(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    _, pids = cleanup
    procs, mesh, before = _spawn(cleanup, 2, policy("one_for_one"), arg="s")
    replacements = []
    for n in (1, 2):
        os.kill(mesh.slice(gpus=0).pid.call_one().get(timeout=SPAWN), signal.SIGKILL)
        mesh.restarted(n).get(timeout=30)
        replacements.append(mesh.slice(gpus=0).pid.call_one().get(timeout=SPAWN))
    pids.extend(replacements)
    assert not wait_gone(replacements[:1], 5), "the first replacement, killed, is gone"

    mesh.stop().get(timeout=30)
    assert not wait_gone(replacements, 10), "the mesh's replacement procs outlived its stop"
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.echo.call(1).get(timeout=10)
    # The original procs belong to the proc mesh, which is still up.
    assert proc_alive(before[1]["pid"])
    procs.stop().get(timeout=30)
    assert not wait_gone([i["pid"] for i in before], 10)
    assert quiet(lambda: list(hook)) == []


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "rest_for_one"},
        {"strategy": ""},
        {"max_restarts": -1},
        {"max_restarts": 1.5},
        {"within_s": -1},
        {"within_s": math.nan},
        {"backoff_s": -0.5},
        {"max_backoff_s": -1},
    ],
    ids=str,
)
def test_restart_policy_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)


def test_restart_policy_defaults_are_valid() -> None:
    default = RestartPolicy()
    assert default.strategy == "one_for_one"
    assert RestartPolicy(strategy="one_for_all", max_restarts=0, within_s=0).max_restarts == 0


# -- no leaks after many crashes -------------------------------------------------------------

ITERATIONS = 200


def _descendants(root: int) -> set[int]:
    """Live (non-zombie) processes whose parent chain leads to ``root``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            continue
        parents[int(entry.name)] = int(fields[1])
    found = set()
    for pid in parents:
        seen = pid
        for _ in range(64):
            seen = parents.get(seen, 0)
            if seen == root:
                found.add(pid)
                break
            if seen <= 1:
                break
    return found


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fd_kinds() -> dict[str, int]:
    """Open descriptors of this process by kind (``socket``, ``pipe``, a path...)."""
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            kind = os.readlink(f"/proc/self/fd/{fd}").split(":")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def _cast_until_refused(mesh: Any, value: Any) -> int:
    """Broadcast to ``mesh`` until a cast is refused (its proc is known dead); how many went."""
    sent = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            mesh.echo.broadcast(value)
        except SupervisionError:
            return sent
        sent += 1
    raise AssertionError(f"casts to a SIGKILLed proc were still accepted after 10 s ({sent})")


@pytest.mark.timeout(240)
def test_many_crash_and_recover_cycles_leak_nothing(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    # Three kinds of cycle, mixed so that 200 of them fit in well under a minute on two cores
    # (a proc start and stop costs some 0.3-0.4 s there, an actor mesh a few ms):
    #   i % 5 == 0  restart policy: the actor fails, comes back in a new proc, the mesh stops;
    #   i % 5 == 2  no policy: a proc mesh of its own is SIGKILLed while the test keeps
    #               broadcasting to it (as a training loop would), casts and calls are refused,
    #               the proc mesh is stopped (the recovery is to spawn again next time);
    #   otherwise   no policy, on the shared proc: a broadcast kills the actor, calls fail,
    #               the mesh is stopped and the next cycle spawns a new one.
    meshes, _ = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="leakprocs")
    meshes.append(procs)
    base_pid = procs.spawn("probe", Worker, "p").pid.call_one().get(timeout=SPAWN)

    def cycle(i: int) -> None:
        if i % 5 == 0:
            mesh = procs.spawn(f"r{i}", Worker, str(i), restart=policy(max_restarts=1))
            assert mesh.echo.call_one(i).get(timeout=SPAWN) == i
            mesh.fail.broadcast("crash")
            mesh.restarted(1).get(timeout=30)
            fresh = mesh.info.call_one().get(timeout=SPAWN)
            assert fresh["arg"] == str(i)
            assert fresh["pid"] != base_pid
            mesh.stop().get(timeout=30)
        elif i % 5 == 2:
            own = this_host().spawn_procs(per_host={"gpus": 1}, name=f"k{i}")
            mesh = own.spawn("victim", Worker, str(i))
            victim = mesh.pid.call_one().get(timeout=SPAWN)
            os.kill(victim, signal.SIGKILL)
            _cast_until_refused(mesh, i)
            with pytest.raises(SupervisionError):
                mesh.echo.call_one(i).get(timeout=10)
            own.stop().get(timeout=30)
        else:
            mesh = procs.spawn(f"a{i}", Worker, str(i))
            assert mesh.echo.call_one(i).get(timeout=SPAWN) == i
            mesh.fail.broadcast("crash")
            with pytest.raises(SupervisionError):
                mesh.echo.call_one(i).get(timeout=10)
            mesh.stop().get(timeout=30)

    def unhandled(cycles: range) -> int:
        # Actor failures reach the root every time. A SIGKILLed proc's failure does only when
        # its exit is known before the test stops the proc mesh (a stopped mesh reports
        # nothing more), and here the stop may win the race: those are not counted.
        return sum(1 for i in cycles if i % 5 not in (0, 2))

    def killed(cycles: range) -> int:
        return sum(1 for i in cycles if i % 5 == 2)

    # Warm up: the zygote and every lazily created resource exist before counting.
    warm = range(0, 5)
    for i in warm:
        cycle(i)
    assert wait_until(lambda: len(hook) >= unhandled(warm), 10)
    assert len(hook) <= unhandled(warm) + killed(warm)
    me = os.getpid()
    procs_before = _descendants(me)
    fds_before = _fds()
    threads_before = threading.active_count()

    loop = range(5, ITERATIONS + 5)
    started = time.monotonic()
    for i in loop:
        cycle(i)
    took = time.monotonic() - started
    print(f"{ITERATIONS} cycles in {took:.1f} s")

    least = unhandled(warm) + unhandled(loop)
    most = least + killed(warm) + killed(loop)
    assert wait_until(lambda: len(hook) >= least, 10), (
        f"{len(hook)} failures reached the root, expected at least {least}"
    )
    assert len(hook) <= most, f"{len(hook)} failures reached the root, expected at most {most}"
    assert not any(f.restarting for f in hook)
    extra: set[int] = set()

    def no_new_procs() -> bool:
        extra.clear()
        extra.update(_descendants(me) - procs_before)
        return not extra

    assert wait_until(no_new_procs, 15), f"leaked processes after {ITERATIONS} cycles: {extra}"
    assert base_pid in procs_before
    assert proc_alive(base_pid)
    threads: list[int] = []
    assert wait_until(
        lambda: threads.append(threading.active_count()) or threads[-1] <= threads_before + 5, 10
    ), f"threads: {threads_before} before, {threads[-1]} after {ITERATIONS} cycles"
    fds: list[int] = []
    assert wait_until(lambda: fds.append(_fds()) or fds[-1] <= fds_before + 5, 10), (
        f"file descriptors: {fds_before} before, {fds[-1]} after {ITERATIONS} cycles "
        f"({_fd_kinds()})"
    )


def test_casting_to_a_proc_as_it_is_killed_leaks_no_descriptor(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    # A message sent in the moment between a proc's death and the news of it fails with EPIPE;
    # that connection must still be closed like any other to a dead proc.
    meshes, pids = cleanup

    def cycle(i: int) -> None:
        own = this_host().spawn_procs(per_host={"gpus": 1}, name=f"c{i}")
        meshes.append(own)
        mesh = own.spawn("victim", Worker, str(i))
        victim = mesh.pid.call_one().get(timeout=SPAWN)
        pids.append(victim)
        os.kill(victim, signal.SIGKILL)
        _cast_until_refused(mesh, i)
        own.stop().get(timeout=30)

    cycle(0)
    before = _fds()
    for i in range(1, 7):
        cycle(i)
    fds: list[int] = []
    assert wait_until(lambda: fds.append(_fds()) or fds[-1] <= before + 2, 10), (
        f"file descriptors: {before} before, {fds[-1]} after 6 SIGKILLed procs ({_fd_kinds()})"
    )
