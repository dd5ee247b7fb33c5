"""Supervision trees: failures climb the owner tree to the right ``__supervise__``.

The trees here are real: the test process (``<root>``) spawns a ``Top`` actor on a proc of its
own; ``Top`` spawns procs and a ``Sup`` mesh; ``Sup`` spawns procs and a ``Worker`` mesh. Every
``__supervise__`` records what it got so the test can ask each level what it saw.

Also here: ownership (failures on a reference go to the owner, never the holder), the lifecycle
(``__cleanup__``, ``stop`` by owners and refusals for references, ``stop/kill/abort`` of an
actor by itself, ``HostMesh.stop``), failed singleton controllers, undeliverable messages and
a controller killed with SIGKILL that leaves no orphan behind, however deep its tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _fault_helpers import (
    QUIET,
    Controller,
    kill_all,
    proc_alive,
    quiet,
    tracked_procs,
    wait_gone,
    wait_until,
    write_script,
)

from regency import config
from regency.actor import (
    Actor,
    MeshFailure,
    MeshRestarted,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
    get_or_spawn_controller,
    this_host,
)

pytestmark = pytest.mark.timeout(120)

SPAWN = 60.0  # seconds to wait for procs and actors to come up (2 slow cores)


# -- recording what each level saw -----------------------------------------------------------


def describe(notice: Any) -> dict[str, Any]:
    """A picklable account of a supervision notice."""
    if isinstance(notice, MeshFailure):
        return {
            "kind": "failure",
            "mesh_name": notice.mesh_name,
            "str": str(notice),
            "root_cause": notice.root_cause,
            "report": notice.report(),
            "crashed_ranks": list(notice.crashed_ranks),
            "restarting": notice.restarting,
        }
    if isinstance(notice, MeshRestarted):
        return {"kind": "restarted", "mesh_name": notice.mesh_name, "ranks": list(notice.ranks)}
    return {"kind": type(notice).__name__, "str": str(notice)}


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What a call did: its value, or its error's type and text."""
    try:
        return {"value": fn()}
    except Exception as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "runtime": isinstance(exc, RuntimeError),
            "supervision": isinstance(exc, SupervisionError),
        }


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def name(self) -> str:
        return str(context().actor_instance)

    @endpoint
    def fail(self, text: str) -> None:
        raise RuntimeError(text)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


class Sup(Actor):
    """Owns a Worker mesh on procs of its own; ``mode`` says what its ``__supervise__`` does."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.notices: list[dict[str, Any]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="supprocs")
        self.workers = self.procs.spawn("workers", Worker)

    def __supervise__(self, failure: Any) -> bool:
        self.notices.append(describe(failure))
        if self.mode == "raise":
            raise RuntimeError("the supervisor's own handler exploded")
        return self.mode == "handle"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def worker_pids(self) -> list[int]:
        values = self.workers.pid.call().get(timeout=SPAWN)
        return [values.item(gpus=i) for i in range(2)]

    @endpoint
    def worker_names(self) -> list[str]:
        values = self.workers.name.call().get(timeout=SPAWN)
        return [values.item(gpus=i) for i in range(2)]

    @endpoint
    def fail_worker(self, rank: int, text: str) -> None:
        self.workers.slice(gpus=rank).fail.broadcast(text)

    @endpoint
    def call_worker(self, rank: int) -> Any:
        return outcome(lambda: self.workers.slice(gpus=rank).echo.call_one(rank).get(timeout=10))

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)


class Top(Actor):
    """Owns a Sup on a proc of its own; ``mode`` says what its ``__supervise__`` does."""

    def __init__(self, mode: str, sup_mode: str) -> None:
        self.mode = mode
        self.notices: list[dict[str, Any]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 1}, name="topprocs")
        self.sup = self.procs.spawn("sup", Sup, sup_mode)

    def __supervise__(self, failure: Any) -> bool:
        self.notices.append(describe(failure))
        return self.mode == "handle"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sup_ref(self) -> Any:
        return self.sup

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)


class Tree:
    """A running three-level tree and what the test learned about it."""

    def __init__(self, procs: ProcMesh, top: Any) -> None:
        self.procs = procs
        self.top = top
        self.sup = top.sup_ref.call_one().get(timeout=SPAWN)
        self.top_pid = top.pid.call_one().get(timeout=SPAWN)
        self.sup_pid = self.sup.pid.call_one().get(timeout=SPAWN)
        self.worker_pids = self.sup.worker_pids.call_one().get(timeout=SPAWN)
        self.worker_names = self.sup.worker_names.call_one().get(timeout=SPAWN)

    def pids(self) -> list[int]:
        return [self.top_pid, self.sup_pid, *self.worker_pids]


@pytest.fixture
def make_tree(cleanup: tuple[list[ProcMesh], list[int]]) -> Callable[[str, str], Tree]:
    meshes, pids = cleanup

    def make(top_mode: str, sup_mode: str) -> Tree:
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="rootprocs")
        meshes.append(procs)
        top = procs.spawn("top", Top, top_mode, sup_mode)
        tree = Tree(procs, top)
        pids.extend(tree.pids())
        return tree

    return make


def _qualified(cls: type, name: str, point: str) -> str:
    return re.escape(f"<{cls.__module__}.{cls.__qualname__} {name}{point}>")


def _check_worker_name(tree: Tree) -> None:
    """The qualified names read ``<root>.<..Top top..>.<..Sup sup..>.<..Worker workers..>``."""
    for rank, name in enumerate(tree.worker_names):
        pattern = (
            re.escape("<root>.")
            + _qualified(Top, "top", "{'gpus': 0/1}")
            + r"\."
            + _qualified(Sup, "sup", "{'gpus': 0/1}")
            + r"\."
            + _qualified(Worker, "workers", f"{{'gpus': {rank}/2}}")
        )
        assert re.fullmatch(pattern, name), name


def _wait_seen(get: Callable[[], list[dict[str, Any]]], n: int, timeout: float = 15) -> list[Any]:
    seen: list[Any] = []

    def enough() -> bool:
        seen[:] = get()
        return len(seen) >= n

    assert wait_until(enough, timeout), f"expected {n} notices, got {seen}"
    return seen


# -- three levels deep -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["broadcast", "sigkill"])
def test_worker_failure_handled_by_its_supervisor(
    make_tree: Callable[[str, str], Tree], hook: list[MeshFailure], how: str
) -> None:
    tree = make_tree("handle", "handle")
    _check_worker_name(tree)
    victim = tree.worker_pids[1]
    if how == "broadcast":
        tree.sup.fail_worker.call_one(1, "worker one exploded").get(timeout=10)
    else:
        os.kill(victim, signal.SIGKILL)

    (notice,) = _wait_seen(lambda: tree.sup.seen.call_one().get(timeout=10), 1)
    assert notice["kind"] == "failure"
    assert notice["mesh_name"] == "workers"
    assert notice["crashed_ranks"] == [1]
    assert notice["restarting"] is False
    assert "MeshFailure" in notice["str"]
    assert tree.worker_names[1] in notice["str"]
    assert "crashed_ranks=[1]" in notice["str"]
    if how == "broadcast":
        assert "worker one exploded" in notice["str"]
        assert proc_alive(victim), "an actor failure must not take its process down"
    else:
        assert "SIGKILL" in notice["str"], notice["str"]
        assert not wait_gone([victim], 5)

    # Handled: it stops at Sup. Neither Top nor the root hears of it, Sup carries on, and the
    # healthy rank keeps working while the failed one fails fast.
    assert quiet(lambda: tree.top.seen.call_one().get(timeout=10)) == []
    assert quiet(lambda: list(hook)) == []
    assert tree.sup.call_worker.call_one(0).get(timeout=10) == {"value": 0}
    dead = tree.sup.call_worker.call_one(1).get(timeout=10)
    assert dead.get("supervision"), dead
    assert len(tree.sup.seen.call_one().get(timeout=10)) == 1
    assert proc_alive(tree.worker_pids[0])


def test_unhandled_worker_failure_fails_the_supervisor(
    make_tree: Callable[[str, str], Tree], hook: list[MeshFailure]
) -> None:
    tree = make_tree("handle", "decline")
    tree.sup.fail_worker.call_one(1, "worker one exploded").get(timeout=10)

    (notice,) = _wait_seen(lambda: tree.top.seen.call_one().get(timeout=10), 1)
    assert notice["kind"] == "failure"
    assert notice["mesh_name"] == "sup"
    assert notice["crashed_ranks"] == [0]
    assert "and all its descendants have failed" in notice["str"]
    assert tree.worker_names[1] in notice["root_cause"]
    assert "worker one exploded" in notice["root_cause"]
    assert tree.worker_names[1] in notice["report"]

    # Sup failed: its own meshes stopped (its worker procs are gone), calls to it fail.
    assert not wait_gone(tree.worker_pids, 15), "Sup failed but its worker procs live on"
    later = outcome(lambda: tree.sup.seen.call_one().get(timeout=10))
    assert later.get("supervision"), later
    assert "and all its descendants have failed" in later["message"]
    # Top handled it; nothing reaches the root, and Top (and Sup's proc) carry on.
    assert quiet(lambda: list(hook)) == []
    assert len(tree.top.seen.call_one().get(timeout=10)) == 1
    assert proc_alive(tree.sup_pid)


def test_supervise_raising_sends_a_chained_failure_up(
    make_tree: Callable[[str, str], Tree], hook: list[MeshFailure]
) -> None:
    tree = make_tree("handle", "raise")
    tree.sup.fail_worker.call_one(0, "worker zero exploded").get(timeout=10)

    (notice,) = _wait_seen(lambda: tree.top.seen.call_one().get(timeout=10), 1)
    assert notice["mesh_name"] == "sup"
    assert "the supervisor's own handler exploded" in notice["str"]
    assert tree.worker_names[0] in notice["root_cause"]
    assert "worker zero exploded" in notice["root_cause"]
    later = outcome(lambda: tree.sup.seen.call_one().get(timeout=10))
    assert later.get("supervision"), later
    assert not wait_gone(tree.worker_pids, 15)
    assert quiet(lambda: list(hook)) == []


def test_unhandled_all_the_way_reaches_the_root_hook(
    make_tree: Callable[[str, str], Tree], hook: list[MeshFailure]
) -> None:
    tree = make_tree("decline", "decline")
    tree.sup.fail_worker.call_one(1, "worker one exploded").get(timeout=10)

    assert wait_until(lambda: bool(hook), 15), "the failure never reached the root"
    (failure,) = _quiet_more(hook)
    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == "top"
    assert failure.crashed_ranks == [0]
    assert "MeshFailure" in str(failure)
    assert tree.worker_names[1] in failure.root_cause
    assert "worker one exploded" in failure.root_cause
    report = failure.report()
    for level in ("Top top", "Sup sup", "Worker workers"):
        assert level in report, report
    # Top and Sup failed: every mesh below Top stopped, and calls to Top fail.
    assert not wait_gone([tree.sup_pid, *tree.worker_pids], 15)
    later = outcome(lambda: tree.top.seen.call_one().get(timeout=10))
    assert later.get("supervision"), later


def _quiet_more(hook: list[MeshFailure]) -> list[MeshFailure]:
    """``hook`` after a short wait for any extra (unwanted) failure."""
    wait_until(lambda: len(hook) > 1, QUIET, interval=0.05)
    return list(hook)


# -- ownership: references never own ---------------------------------------------------------


class MeshOwner(Actor):
    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="ownedprocs")
        self.victims = self.procs.spawn("victims", Worker)

    def __supervise__(self, failure: Any) -> bool:
        self.notices.append(describe(failure))
        return True

    @endpoint
    def victims_ref(self) -> Any:
        return self.victims

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)


class Holder(Actor):
    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []

    def __supervise__(self, failure: Any) -> bool:
        self.notices.append(describe(failure))
        return True

    @endpoint
    def break_it(self, mesh: Any, text: str) -> None:
        mesh.fail.broadcast(text)

    @endpoint
    def try_stop(self, mesh: Any) -> dict[str, Any]:
        return outcome(mesh.stop)

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


def test_failures_on_a_reference_go_to_the_owner_not_the_holder(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    procs = tracked_procs(cleanup)
    owner = procs.spawn("owner", MeshOwner)
    holder = procs.spawn("holder", Holder)
    ref = owner.victims_ref.call_one().get(timeout=SPAWN)
    assert sorted(ref.echo.call(0).get(timeout=SPAWN).values()) == [0, 0]
    holder.break_it.call_one(ref, "broken through a reference").get(timeout=10)

    seen = _wait_seen(lambda: owner.seen.call_one().get(timeout=10), 2)
    assert sorted(n["crashed_ranks"][0] for n in seen) == [0, 1]
    for notice in seen:
        assert notice["mesh_name"] == "victims"
        assert "broken through a reference" in notice["str"]
    assert quiet(lambda: holder.seen.call_one().get(timeout=10)) == []
    assert holder.echo.call_one("still here").get(timeout=10) == "still here"
    assert quiet(lambda: list(hook)) == []
    assert len(owner.seen.call_one().get(timeout=10)) == 2


# -- lifecycle: __cleanup__ ------------------------------------------------------------------


class Child(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: Exception | None) -> None:
        Path(self.path).write_text(repr(exc))


class Cleaner(Actor):
    """Owns a Child mesh; its ``__cleanup__`` records what it finds into ``out/cleanup.json``."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.child_pid = -1
        self.child_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="childprocs")
        self.child = self.child_procs.spawn("child", Child, str(self.out / "child-cleanup"))

    @endpoint
    def get_child_pid(self) -> int:
        self.child_pid = self.child.pid.call_one().get(timeout=SPAWN)
        return self.child_pid

    @endpoint
    def fail(self, text: str) -> None:
        raise RuntimeError(text)

    def __cleanup__(self, exc: Exception | None) -> None:
        record = {
            "exc": None if exc is None else repr(exc),
            "child_cleanup_ran": (self.out / "child-cleanup").exists(),
            "child_call": outcome(lambda: self.child.pid.call_one().get(timeout=5)),
            "child_proc_alive": proc_alive(self.child_pid),
        }
        (self.out / "cleanup.json").write_text(json.dumps(record))


def _read_json(path: Path, timeout: float = 15) -> dict[str, Any]:
    assert wait_until(path.exists, timeout), f"{path.name} was never written"
    # Written in one call; wait until it parses (the write may be in progress).
    found: dict[str, Any] = {}

    def parsed() -> bool:
        try:
            found.update(json.loads(path.read_text()))
        except ValueError:
            return False
        return True

    assert wait_until(parsed, 5)
    return found


def test_cleanup_on_graceful_stop_runs_after_owned_meshes_stopped(
    tmp_path: Path, cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    cleaner = procs.spawn("cleaner", Cleaner, str(tmp_path))
    child_pid = cleaner.get_child_pid.call_one().get(timeout=SPAWN)
    pids.append(child_pid)

    cleaner.stop().get(timeout=30)
    record = _read_json(tmp_path / "cleanup.json")
    assert record["exc"] is None
    assert record["child_cleanup_ran"], "the child's __cleanup__ had not run before its owner's"
    assert record["child_call"].get("supervision"), record["child_call"]
    assert "stopped" in record["child_call"]["message"]
    assert record["child_proc_alive"] is False, "the owned proc mesh was not stopped first"
    assert (tmp_path / "child-cleanup").read_text() == "None"
    assert not wait_gone([child_pid], 10)
    later = outcome(lambda: cleaner.get_child_pid.call_one().get(timeout=10))
    assert later.get("supervision"), later
    assert "stopped" in later["message"], later
    assert quiet(lambda: list(hook)) == [], "a graceful stop is not a failure"


def test_cleanup_on_failure_gets_the_exception(
    tmp_path: Path, cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    cleaner = procs.spawn("cleaner", Cleaner, str(tmp_path))
    child_pid = cleaner.get_child_pid.call_one().get(timeout=SPAWN)
    pids.append(child_pid)

    cleaner.fail.broadcast("the cleaner broke")
    record = _read_json(tmp_path / "cleanup.json")
    assert record["exc"] is not None, record
    assert "the cleaner broke" in record["exc"], record
    assert record["child_call"].get("supervision"), record["child_call"]
    # Monarch: "Owned meshes are already stopped and their cleanups ran" -- on failure too.
    assert record["child_cleanup_ran"], "the child's __cleanup__ had not run before its owner's"
    assert not wait_gone([child_pid], 10)
    assert wait_until(lambda: bool(hook), 10)
    assert hook[0].mesh_name == "cleaner"
    assert "the cleaner broke" in str(hook[0])


class SlowCleanup(Actor):
    @endpoint
    def stop_self(self) -> None:
        context().actor_instance.stop()

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    def __cleanup__(self, exc: Exception | None) -> None:
        time.sleep(1.5)  # the behaviour under test: longer than cleanup_timeout


class SlowCleanupAsync(Actor):
    @endpoint
    async def stop_self(self) -> None:
        context().actor_instance.stop()

    @endpoint
    async def echo(self, value: Any) -> Any:
        return value

    async def __cleanup__(self, exc: Exception | None) -> None:
        await asyncio.sleep(60)  # the behaviour under test: far longer than cleanup_timeout


@pytest.mark.parametrize("cls", [SlowCleanup, SlowCleanupAsync], ids=["sync", "async"])
def test_cleanup_over_timeout_is_a_failure_but_the_stop_completes(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure], cls: type
) -> None:
    meshes, _ = cleanup
    with config.configured(cleanup_timeout=0.5):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    slow = procs.spawn("slow", cls)
    assert slow.echo.call_one(1).get(timeout=SPAWN) == 1
    slow.stop_self.call_one().get(timeout=10)

    assert wait_until(lambda: bool(hook), 15), "the slow __cleanup__ was not reported"
    (failure,) = _quiet_more(hook)
    assert failure.mesh_name == "slow"
    assert "__cleanup__ took longer than 0.5 s" in str(failure), str(failure)
    later = outcome(lambda: slow.echo.call_one(2).get(timeout=10))
    assert later.get("supervision"), later


def test_async_cleanup_over_timeout_does_not_hold_up_an_owner_stop(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, _ = cleanup
    with config.configured(cleanup_timeout=0.5):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    slow = procs.spawn("slow", SlowCleanupAsync)
    assert slow.echo.call_one(1).get(timeout=SPAWN) == 1
    started = time.monotonic()
    slow.stop().get(timeout=20)
    took = time.monotonic() - started
    assert took < 5, f"stop took {took:.1f} s with a 0.5 s cleanup_timeout"
    later = outcome(lambda: slow.echo.call_one(2).get(timeout=10))
    assert later.get("supervision"), later


# -- lifecycle: stop by owners, refusal for references ---------------------------------------


def test_owner_stops_actor_mesh_and_proc_mesh(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    meshes.append(procs)
    first = procs.spawn("first", Worker)
    second = procs.spawn("second", Worker)
    proc_pids = sorted(first.pid.call().get(timeout=SPAWN).values())
    pids.extend(proc_pids)

    first.stop().get(timeout=30)
    later = outcome(lambda: first.echo.call(1).get(timeout=10))
    assert later.get("supervision"), later
    assert "stopped" in later["message"], later
    # Other meshes on the same procs are unaffected.
    assert sorted(second.echo.call(2).get(timeout=10).values()) == [2, 2]

    procs.stop().get(timeout=30)
    assert not wait_gone(proc_pids, 10)
    later = outcome(lambda: second.echo.call(3).get(timeout=10))
    assert later.get("supervision"), later
    assert quiet(lambda: list(hook)) == []


def test_slices_cannot_stop(cleanup: tuple[list[ProcMesh], list[int]]) -> None:
    procs = tracked_procs(cleanup, 2)
    workers = procs.spawn("workers", Worker)
    assert sorted(workers.echo.call(1).get(timeout=SPAWN).values()) == [1, 1]
    with pytest.raises(RuntimeError):
        workers.slice(gpus=0).stop()
    with pytest.raises(RuntimeError):
        procs.slice(gpus=1).stop()
    assert sorted(workers.echo.call(2).get(timeout=10).values()) == [2, 2]


def test_received_references_cannot_stop(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    procs = tracked_procs(cleanup)
    workers = procs.spawn("workers", Worker)
    holder = procs.spawn("holder", Holder)
    assert workers.echo.call_one(1).get(timeout=SPAWN) == 1
    for mesh in (workers, procs, this_host()):
        result = holder.try_stop.call_one(mesh).get(timeout=10)
        assert result.get("runtime"), f"{mesh!r} stopped by a holder of a reference: {result}"
    assert workers.echo.call_one(2).get(timeout=10) == 2
    assert holder.echo.call_one(3).get(timeout=10) == 3
    assert quiet(lambda: list(hook)) == []


class HostStopper(Actor):
    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="hostprocs")
        self.workers = self.procs.spawn("workers", Worker)

    @endpoint
    def worker_pids(self) -> list[int]:
        return sorted(self.workers.pid.call().get(timeout=SPAWN).values())

    @endpoint
    def stop_host(self, how: str) -> dict[str, Any]:
        host = this_host()
        return outcome(lambda: getattr(host, how)().get(timeout=30))

    @endpoint
    def call_workers(self) -> dict[str, Any]:
        return outcome(lambda: self.workers.echo.call(1).get(timeout=10))

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


def test_this_host_cannot_be_shut_down(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    """As in Monarch, ``this_host()`` is a reference: only an attached mesh shuts hosts down."""
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    stopper = procs.spawn("stopper", HostStopper)
    worker_pids = stopper.worker_pids.call_one().get(timeout=SPAWN)
    pids.extend(worker_pids)

    refused = stopper.stop_host.call_one("shutdown").get(timeout=40)
    assert refused["message"] == "cannot shut down `HostMesh` that is a reference instead of owned"
    assert refused["runtime"]
    assert stopper.worker_pids.call_one().get(timeout=10) == worker_pids
    assert quiet(lambda: list(hook)) == []


def test_host_mesh_stop_stops_the_procs_spawned_from_it(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    stopper = procs.spawn("stopper", HostStopper)
    worker_pids = stopper.worker_pids.call_one().get(timeout=SPAWN)
    pids.extend(worker_pids)

    assert stopper.stop_host.call_one("stop").get(timeout=40) == {"value": None}
    assert not wait_gone(worker_pids, 10)
    assert stopper.call_workers.call_one().get(timeout=10).get("supervision")
    # The host itself stays up for its owner: the actor that asked lives on.
    assert stopper.echo.call_one("up").get(timeout=10) == "up"
    assert quiet(lambda: list(hook)) == []


# -- lifecycle: an actor stops, kills or aborts itself --------------------------------------


class SelfEnder(Actor):
    def __init__(self, cleanup_s: float = 0.0) -> None:
        self.cleanup_s = cleanup_s

    def __cleanup__(self, exc: Exception | None) -> None:
        time.sleep(self.cleanup_s)  # a cleanup that takes a while (well under cleanup_timeout)

    @endpoint
    def end(self, how: str, reason: str | None) -> None:
        instance = context().actor_instance
        if reason is None:
            getattr(instance, how)()
        else:
            getattr(instance, how)(reason)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


def test_actor_stops_itself_gracefully(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    procs = tracked_procs(cleanup)
    # The actor takes a second to clean up: the next call arrives meanwhile, after the stop
    # was asked for, and must be refused as "stopped" (not dropped).
    ender = procs.spawn("ender", SelfEnder, 1.0)
    assert ender.echo.call_one(1).get(timeout=SPAWN) == 1
    ender.end.call_one("stop", None).get(timeout=10)
    later = outcome(lambda: ender.echo.call_one(2).get(timeout=10))
    assert later.get("supervision"), later
    assert "stopped" in later["message"], later
    assert quiet(lambda: list(hook)) == [], "a self-stop is not a failure"


@pytest.mark.parametrize(
    ("how", "reason", "expected"),
    [
        ("abort", "why: the data went bad", "why: the data went bad"),
        ("abort", None, "no reason provided"),
        ("kill", "killed on purpose", "killed on purpose"),
        ("kill", None, "no reason provided"),
    ],
    ids=["abort-reason", "abort-no-reason", "kill-reason", "kill-no-reason"],
)
def test_actor_aborts_or_kills_itself(
    cleanup: tuple[list[ProcMesh], list[int]],
    hook: list[MeshFailure],
    how: str,
    reason: str | None,
    expected: str,
) -> None:
    procs = tracked_procs(cleanup)
    ender = procs.spawn("ender", SelfEnder)
    assert ender.echo.call_one(1).get(timeout=SPAWN) == 1
    with contextlib.suppress(Exception):
        ender.end.call_one(how, reason).get(timeout=10)
    assert wait_until(lambda: bool(hook), 15), f"{how}() was not reported to the owner"
    (failure,) = _quiet_more(hook)
    assert failure.mesh_name == "ender"
    assert expected in str(failure), str(failure)
    later = outcome(lambda: ender.echo.call_one(2).get(timeout=10))
    assert later.get("supervision"), later


# -- singleton controllers -------------------------------------------------------------------


class Ctl(Actor):
    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def die(self) -> None:
        raise SystemExit("the controller gives up")


def test_get_or_spawn_controller_on_a_failed_controller_raises(hook: list[MeshFailure]) -> None:
    name = f"ctl-{uuid.uuid4().hex[:8]}"
    ctl = get_or_spawn_controller(name, Ctl).get(timeout=SPAWN)
    assert ctl.echo.call_one(1).get(timeout=10) == 1
    same = get_or_spawn_controller(name, Ctl).get(timeout=10)
    assert same.echo.call_one(2).get(timeout=10) == 2
    with pytest.raises(SupervisionError):
        ctl.die.call_one().get(timeout=10)

    errors: list[BaseException] = []

    def lookup_fails() -> bool:
        try:
            get_or_spawn_controller(name, Ctl).get(timeout=10)
        except Exception as exc:
            errors.append(exc)
            return True
        return False

    assert wait_until(lookup_fails, 10), "a failed controller was handed out again"
    assert isinstance(errors[-1], SupervisionError), repr(errors[-1])
    assert name in str(errors[-1])
    assert quiet(lambda: list(hook)) == [], "the registry handles its controllers' failures"


# -- undeliverable messages ------------------------------------------------------------------


class Sender(Actor):
    """Owns a one-proc target mesh; handles the target's crash, then broadcasts to it."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        self.envelopes: list[dict[str, str]] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 1}, name="targetprocs")
        self.targets = self.procs.spawn("targets", Worker)

    def __supervise__(self, failure: Any) -> bool:
        self.notices.append(describe(failure))
        return True

    @endpoint
    def target_pid(self) -> int:
        return self.targets.pid.call_one().get(timeout=SPAWN)

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.notices)

    @endpoint
    def cast_to_targets(self) -> None:
        self.targets.echo.broadcast("hello?")

    @endpoint
    def undeliverable_seen(self) -> list[dict[str, str]]:
        return list(self.envelopes)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


class HandlingSender(Sender):
    def _handle_undeliverable_message(self, message: Any) -> bool:
        self.envelopes.append(
            {"sender": message.sender(), "dest": message.dest(), "error": message.error_msg()}
        )
        return True


@pytest.mark.parametrize("cls", [HandlingSender, Sender], ids=["handled", "default"])
def test_undeliverable_message(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure], cls: type
) -> None:
    meshes, pids = cleanup
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    sender = procs.spawn("sender", cls)
    target = sender.target_pid.call_one().get(timeout=SPAWN)
    pids.append(target)
    os.kill(target, signal.SIGKILL)
    _wait_seen(lambda: sender.seen.call_one().get(timeout=10), 1)

    with contextlib.suppress(Exception):
        sender.cast_to_targets.call_one().get(timeout=10)
    if cls is HandlingSender:
        (envelope,) = sender.undeliverable_seen.call_one().get(timeout=10)
        assert "targets" in envelope["dest"]
        assert "sender" in envelope["sender"]
        assert sender.echo.call_one("alive").get(timeout=10) == "alive"
        assert quiet(lambda: list(hook)) == []
    else:
        assert wait_until(lambda: bool(hook), 15), "the undeliverable message was not escalated"
        (failure,) = _quiet_more(hook)
        assert failure.mesh_name == "sender"
        assert "could not be delivered" in str(failure), str(failure)
        later = outcome(lambda: sender.echo.call_one("alive?").get(timeout=10))
        assert later.get("supervision"), later


# -- a killed controller leaves nothing behind, however deep its tree ------------------------

NESTED = """
import os, threading
import regency.actor
from regency.actor import Actor, endpoint, this_host

regency.actor.unhandled_fault_hook = lambda failure: None


class Leaf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Middle(Actor):
    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2}, name="leafprocs")
        self.leaves = self.procs.spawn("leaves", Leaf)

    @endpoint
    def pids(self) -> list:
        return [os.getpid(), *sorted(self.leaves.pid.call().get(timeout=60).values())]


procs = this_host().spawn_procs(per_host={"gpus": 1}, name="middleprocs")
middle = procs.spawn("middle", Middle)
emit("PIDS", middle.pids.call_one().get(timeout=60))
threading.Event().wait()
"""


def test_sigkilled_controller_leaves_no_nested_proc(tmp_path: Path) -> None:
    controller = Controller(write_script(tmp_path, NESTED))
    pids: list[int] = []
    try:
        pids.extend(controller.expect("PIDS", 60))
        assert len(set(pids)) == 3
        assert all(proc_alive(p) for p in pids)
        os.kill(controller.popen.pid, signal.SIGKILL)
        assert controller.wait(10) == -signal.SIGKILL
        left = wait_gone(pids, 15)
        assert not left, f"procs {left} (nested under an actor) outlived a SIGKILLed controller"
    finally:
        controller.close()
        kill_all(pids)
