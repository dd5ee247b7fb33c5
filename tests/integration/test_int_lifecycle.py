"""Proc mesh lifecycle (monarch-api.md §1.1 "Process/host meshes", §2.10): initialized, bootstrap
functions, stop ends the processes, and what happens to a stopped mesh."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from regency.actor import (
    Actor,
    ActorError,
    ProcMesh,
    SupervisionError,
    endpoint,
    this_host,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0
BOOT_T = 15.0  # a proc with a bootstrap is up in about a second
BOOT_VAR = "REGENCY_IT_BOOTSTRAP"


def set_env_bootstrap() -> None:
    os.environ[BOOT_VAR] = f"booted in {os.getpid()}"


async def async_set_env_bootstrap() -> None:
    await asyncio.sleep(0)
    os.environ[BOOT_VAR] = f"async-booted in {os.getpid()}"


def failing_bootstrap() -> None:
    raise RuntimeError("bootstrap exploded on purpose")


class Probe(Actor):
    def __init__(self) -> None:
        self.env_at_init = os.environ.get(BOOT_VAR)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def env(self) -> tuple[int, str | None, str | None]:
        return os.getpid(), self.env_at_init, os.environ.get(BOOT_VAR)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_initialized_returns_true(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(2)
    fut = procs.initialized
    assert fut.get(timeout=T) is True
    assert procs.initialized.get(timeout=T) is True
    assert procs.sizes == {"gpus": 2}


def test_messages_to_a_mesh_still_starting_are_delivered(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)  # not waited on
    probes = procs.spawn("probe", Probe)  # nor is this
    pids = list(probes.pid.call().get(timeout=T).values())
    assert len(set(pids)) == 2
    assert probes.initialized.get(timeout=T) is None


def test_per_host_may_name_hosts_on_this_host() -> None:
    # this_host() has no dimensions (as in Monarch), so "hosts" overlaps nothing.
    procs = this_host().spawn_procs(per_host={"hosts": 2})
    try:
        assert procs.sizes == {"hosts": 2}
    finally:
        procs.stop().get(timeout=T)


def test_stop_ends_the_processes(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(3)
    probes = procs.spawn("probe", Probe)
    pids = list(probes.pid.call().get(timeout=T).values())
    assert len(set(pids)) == 3
    assert os.getpid() not in pids
    assert all(_alive(pid) for pid in pids)
    assert procs.stop().get(timeout=T) is None
    assert [pid for pid in pids if _alive(pid)] == []
    # Stopping again is harmless.
    procs.stop().get(timeout=T)


def test_calls_to_a_stopped_mesh_fail(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(2)
    probes = procs.spawn("probe", Probe)
    probes.pid.call().get(timeout=T)
    procs.stop().get(timeout=T)
    with pytest.raises(SupervisionError):
        probes.pid.call().get(timeout=T)
    with pytest.raises(SupervisionError):
        probes.slice(gpus=0).pid.call_one().get(timeout=T)


def test_stopping_an_actor_mesh_leaves_other_meshes_working(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)
    doomed = procs.spawn("doomed", Probe)
    survivor = procs.spawn("survivor", Probe)
    pids = list(doomed.pid.call().get(timeout=T).values())
    assert doomed.stop().get(timeout=T) is None
    with pytest.raises(SupervisionError):
        doomed.pid.call().get(timeout=10)  # must fail at once, not hang
    assert list(survivor.pid.call().get(timeout=T).values()) == pids
    with pytest.raises(RuntimeError):
        doomed.slice(gpus=0).stop()  # a slice is a reference, not the owner


def test_spawn_on_a_stopped_mesh_fails(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(1)
    procs.stop().get(timeout=T)
    # As in Monarch 0.7: the spawn itself raises.
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        procs.spawn("late", Probe)


def test_only_the_owner_stops_a_proc_mesh(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(2)
    with pytest.raises(ValueError, match="not owned"):
        procs.slice(gpus=0).stop()
    assert procs.initialized.get(timeout=T) is True


def test_context_manager_stops_the_procs(make_procs: Callable[..., ProcMesh]) -> None:
    with make_procs(2) as procs:
        pids = list(procs.spawn("probe", Probe).pid.call().get(timeout=T).values())
        assert all(_alive(pid) for pid in pids)
    assert [pid for pid in pids if _alive(pid)] == []


@pytest.mark.parametrize(
    ("bootstrap", "prefix"),
    [(set_env_bootstrap, "booted in"), (async_set_env_bootstrap, "async-booted in")],
    ids=["sync", "async"],
)
def test_bootstrap_runs_in_each_proc_before_actors(
    make_procs: Callable[..., ProcMesh], bootstrap: Callable[[], object], prefix: str
) -> None:
    assert BOOT_VAR not in os.environ
    procs = make_procs(3, bootstrap=bootstrap)
    assert procs.initialized.get(timeout=BOOT_T) is True
    for pid, at_init, now in procs.spawn("probe", Probe).env.call().get(timeout=T).values():
        assert at_init == now == f"{prefix} {pid}"
    assert BOOT_VAR not in os.environ  # it ran in the procs, not here


def test_failing_bootstrap_fails_initialized(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(2, bootstrap=failing_bootstrap)
    with pytest.raises(ActorError, match="bootstrap exploded on purpose"):
        procs.initialized.get(timeout=BOOT_T)
