"""A proc mesh handed to a second controller process (``multiprocessing`` with ``spawn``).

As in Monarch, the child (a controller of its own) spawns actors on the parent's procs and on
procs of its own; when it is killed, its own procs end and the parent's keep serving. A child
that started regency before it received the mesh says why it cannot use it.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import select
import signal
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler

import pytest

from regency._lowlevel import runtime
from regency.actor import Actor, ProcMesh, endpoint, this_host

pytestmark = pytest.mark.timeout(120)


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def pids_of(mesh: ProcMesh, name: str) -> list[int]:
    return [pid for _, pid in mesh.spawn(name, Pid).pid.call().get(timeout=60)]


def second_controller(out: multiprocessing.Queue[object], theirs: ProcMesh) -> None:
    out.put(pids_of(this_host().spawn_procs(per_host={"gpus": 1}), "own"))
    out.put(pids_of(theirs, "on_theirs"))
    signal.pause()  # until the parent kills this controller


def late_joiner(inbox: multiprocessing.Queue[object], out: multiprocessing.Queue[object]) -> None:
    this_host().spawn_procs(per_host={"gpus": 1})  # starts this process's own runtime
    try:
        inbox.get(timeout=60)
    except RuntimeError as exc:
        out.put(str(exc))
    else:
        out.put("received the mesh")


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    yield procs
    procs.stop().get(timeout=30)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_spawned_process_uses_a_proc_mesh_passed_to_it(procs: ProcMesh) -> None:
    ours = pids_of(procs, "ours")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=second_controller, args=(out, procs))
    child.start()
    try:
        own, on_ours = out.get(timeout=90), out.get(timeout=60)
    finally:
        child.kill()
        child.join(30)
    assert on_ours == ours, "the child's actor runs in the parent's proc"
    assert own != ours
    pidfd = os.pidfd_open(own[0])  # the child's own proc ends with it
    try:
        assert select.select([pidfd], [], [], 30)[0], "the child's proc outlived it"
    finally:
        os.close(pidfd)
    assert alive(ours[0])
    assert pids_of(procs, "still") == ours, "the parent's procs keep serving it"


def test_a_process_with_its_own_runtime_says_it_cannot_join(procs: ProcMesh) -> None:
    ctx = multiprocessing.get_context("spawn")
    inbox, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=late_joiner, args=(inbox, out))
    child.start()
    try:
        inbox.put(procs)
        error = out.get(timeout=90)
    except queue.Empty:
        pytest.fail(f"the child said nothing (exit code {child.exitcode})")
    finally:
        child.kill()
        child.join(30)
    assert isinstance(error, str)
    assert error.startswith(
        f"cannot use a mesh of the regency controller in process {os.getpid()} here: "
        "this process already holds another controller's secret"
    )


def test_only_multiprocessing_pickles_carry_the_secret(procs: ProcMesh) -> None:
    secret = runtime().secret
    assert secret not in pickle.dumps(procs)
    assert secret not in pickle.dumps(this_host())
    assert secret in bytes(ForkingPickler.dumps(procs))
