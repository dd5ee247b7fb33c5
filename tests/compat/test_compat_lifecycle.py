"""Stop, cleanup, shutdown, proc/host meshes and controllers (monarch-api.md §1.1, §2.10)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
from compat_impl import IMPL, SupervisionError, actor
from compat_util import CALL_TIMEOUT, Failures, wait_for

Actor = actor.Actor
endpoint = actor.endpoint


class Cleaner(Actor):
    def __init__(self, port=None, tag: str = "") -> None:
        self.port = port
        self.tag = tag
        self.child = None

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def stop_self(self) -> None:
        actor.context().actor_instance.stop()

    @endpoint
    def abort_self(self) -> None:
        actor.context().actor_instance.abort()

    @endpoint
    def fail_hard(self) -> None:
        raise ValueError("cleanup sees this")

    @endpoint
    def own_child(self, port) -> None:
        self.child = actor.context().actor_instance.proc.spawn("kid", Cleaner, port, "child")
        self.child.initialized.get()

    def __cleanup__(self, exc: Exception | None) -> None:
        # ``port`` is a file path: a message sent from __cleanup__ races the actor's teardown
        # in Monarch, a file does not
        if self.port is not None:
            with open(self.port, "a") as f:
                f.write(f"{self.tag}:{exc}\n")


class Ctl(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class UsesCtl(Actor):
    @endpoint
    def go(self, name: str) -> int:
        ctl = actor.get_or_spawn_controller(name, Ctl).get()
        return ctl.pid.call_one().get()


# --- ActorMesh.stop -----------------------------------------------------------------------


def test_actor_mesh_stop_runs_cleanup_on_every_rank(procs2, tmp_path):
    path = str(tmp_path / "cleanups")
    mesh = procs2.spawn("stopped", Cleaner, path, "c")
    mesh.pid.call().get(timeout=CALL_TIMEOUT)  # every rank constructed and running
    mesh.stop().get(timeout=CALL_TIMEOUT)
    assert _cleanups(path, 2) == ["c:None", "c:None"]


def test_call_to_stopped_actor_mesh_is_supervision_error(procs2):
    mesh = procs2.spawn("stopped2", Cleaner)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    mesh.stop().get(timeout=CALL_TIMEOUT)
    with pytest.raises(SupervisionError, match="stopped") as info:
        mesh.pid.call().get(timeout=CALL_TIMEOUT)
    assert str(info.value).startswith("Endpoint call stopped2.pid() failed, Supervision event:")


def test_actor_mesh_stop_twice_is_harmless(procs2):
    mesh = procs2.spawn("twice", Cleaner)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    mesh.stop().get(timeout=CALL_TIMEOUT)
    mesh.stop().get(timeout=CALL_TIMEOUT)


def test_stopping_one_mesh_leaves_others_on_same_procs(procs2):
    a = procs2.spawn("gone", Cleaner)
    b = procs2.spawn("kept", Cleaner)
    b.initialized.get(timeout=CALL_TIMEOUT)
    a.stop().get(timeout=CALL_TIMEOUT)
    assert len(b.pid.call().get(timeout=CALL_TIMEOUT)) == 2


def test_stop_is_not_a_failure(procs2):
    failures = Failures()
    mesh = procs2.spawn("clean", Cleaner)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    mesh.stop().get(timeout=CALL_TIMEOUT)
    assert [f for f in failures.new() if str(f.mesh_name).startswith("clean")] == []


def test_self_stop_runs_cleanup_and_is_not_a_failure(procs2, tmp_path):
    failures = Failures()
    path = str(tmp_path / "cleanups")
    mesh = procs2.spawn("selfstop", Cleaner, path, "s")
    mesh.slice(gpus=0).stop_self.broadcast()
    assert _cleanups(path, 1) == ["s:None"]
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.slice(gpus=0).pid.call_one().get(timeout=CALL_TIMEOUT)
    assert mesh.slice(gpus=1).pid.call_one().get(timeout=CALL_TIMEOUT) > 0
    # (Monarch also reports the undeliverable call to the stopped actor, with no mesh name)
    assert [f for f in failures.new() if str(f.mesh_name).startswith("selfstop")] == []


def test_abort_is_a_failure_with_no_reason_provided(make_procs, failures):
    mesh = make_procs(1).spawn("aborted", Cleaner)
    mesh.abort_self.call_one().get(timeout=CALL_TIMEOUT)
    got = failures.wait(1)
    text = " ".join(str(f) for f in got)
    assert "aborted" in text
    assert "no reason provided" in text
    assert "crashed_ranks=[0]" in text


def test_owned_child_cleans_up_before_parent(make_procs, tmp_path):
    path = str(tmp_path / "cleanups")
    parent = make_procs(1).spawn("parent", Cleaner, path, "parent")
    parent.own_child.call_one(path).get(timeout=CALL_TIMEOUT)
    parent.stop().get(timeout=CALL_TIMEOUT)
    assert _cleanups(path, 2) == ["child:None", "parent:None"]


# --- ProcMesh ---------------------------------------------------------------------------


def test_spawn_procs_sizes_are_per_host_dims():
    procs = actor.this_host().spawn_procs(per_host={"gpus": 3})
    try:
        assert procs.sizes == {"gpus": 3}
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_spawn_procs_with_hosts_dim_in_per_host():
    procs = actor.this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2})
    try:
        assert procs.sizes == {"hosts": 1, "gpus": 2}
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_spawn_procs_default_is_one_proc():
    procs = actor.this_host().spawn_procs()
    try:
        assert procs.sizes == {}
        mesh = procs.spawn("single", Cleaner)
        assert mesh.pid.call_one().get(timeout=CALL_TIMEOUT) != os.getpid()
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_spawn_procs_two_dims():
    procs = actor.this_host().spawn_procs(name="nm", per_host={"a": 2, "b": 2})
    try:
        assert procs.sizes == {"a": 2, "b": 2}
        mesh = procs.spawn("grid", Cleaner)
        assert len(set(mesh.pid.call().get(timeout=CALL_TIMEOUT).values())) == 4
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_proc_mesh_slice_cannot_be_stopped(procs2):
    with pytest.raises(ValueError, match="ProcMesh is not owned; must be stopped by an owner"):
        procs2.slice(gpus=0).stop().get(timeout=CALL_TIMEOUT)


def test_proc_mesh_slice_sizes(procs2):
    assert procs2.slice(gpus=0).sizes == {}
    assert procs2.slice(gpus=slice(0, 1)).sizes == {"gpus": 1}


def test_host_mesh_of_non_singleton_proc_mesh_not_implemented(procs2):
    with pytest.raises(NotImplementedError, match="not yet supported for non-singleton"):
        procs2.host_mesh


def test_host_mesh_of_singleton_proc_mesh(procs2):
    assert procs2.slice(gpus=0).host_mesh.sizes == {}


def test_spawn_on_stopped_proc_mesh_fails(make_procs):
    procs = make_procs(1)
    procs.stop().get(timeout=CALL_TIMEOUT)
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        procs.spawn("late", Cleaner).initialized.get(timeout=CALL_TIMEOUT)


def test_proc_mesh_stop_twice_is_harmless(make_procs):
    procs = make_procs(1)
    assert procs.stop().get(timeout=CALL_TIMEOUT) is None
    assert procs.stop().get(timeout=CALL_TIMEOUT) is None


@pytest.mark.deviation(
    "Monarch usually raises SupervisionError here, but in a CI run under load the call was never"
    " answered (it hung past its timeout); regency always raises",
    skip="monarch",
)
def test_call_after_proc_mesh_stop_is_supervision_error(make_procs):
    procs = make_procs(1)
    mesh = procs.spawn("orphan", Cleaner)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    procs.stop().get(timeout=CALL_TIMEOUT)
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.pid.call_one().get(timeout=CALL_TIMEOUT)


def test_proc_mesh_stop_runs_actor_cleanup(make_procs, tmp_path):
    path = str(tmp_path / "cleanups")
    procs = make_procs(2)
    mesh = procs.spawn("procstop", Cleaner, path, "p")
    mesh.pid.call().get(timeout=CALL_TIMEOUT)
    procs.stop().get(timeout=CALL_TIMEOUT)
    assert _cleanups(path, 2) == ["p:None", "p:None"]


def test_async_with_proc_mesh_stops_it():
    async def main():
        async with actor.this_host().spawn_procs(per_host={"gpus": 1}) as procs:
            mesh = procs.spawn("scoped", Cleaner)
            pid = await mesh.pid.call_one()
        return mesh, pid

    mesh, pid = asyncio.run(main())
    assert pid > 0
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.pid.call_one().get(timeout=CALL_TIMEOUT)


def test_proc_mesh_initialized_is_true(make_procs):
    assert make_procs(1).initialized.get(timeout=CALL_TIMEOUT) is True


# --- this_proc / this_host / controllers --------------------------------------------------


def test_this_proc_spawns_in_the_client_process():
    mesh = actor.this_proc().spawn("local", Cleaner)
    assert mesh.pid.call_one().get(timeout=CALL_TIMEOUT) == os.getpid()


def test_this_proc_and_this_host_have_no_dims():
    assert actor.this_proc().sizes == {}
    assert actor.this_host().sizes == {}


def test_this_host_cannot_be_shut_down():
    with pytest.raises(RuntimeError, match="cannot shut down `HostMesh` that is a reference"):
        actor.this_host().shutdown().get(timeout=CALL_TIMEOUT)


@pytest.mark.deviation(
    "regency allows this_host().stop() (it stops the client's procs)", skip="regency"
)
def test_this_host_cannot_be_stopped():
    with pytest.raises(RuntimeError, match="cannot stop `HostMesh` that is a reference"):
        actor.this_host().stop().get(timeout=CALL_TIMEOUT)


def test_controller_lives_in_the_client_process():
    ctl = actor.get_or_spawn_controller("compat_ctl_pid", Ctl).get(timeout=CALL_TIMEOUT)
    assert ctl.pid.call_one().get(timeout=CALL_TIMEOUT) == os.getpid()


def test_controller_is_a_singleton_per_name():
    a = actor.get_or_spawn_controller("compat_ctl_one", Ctl).get(timeout=CALL_TIMEOUT)
    b = actor.get_or_spawn_controller("compat_ctl_one", Ctl).get(timeout=CALL_TIMEOUT)
    assert a.incr.call_one().get(timeout=CALL_TIMEOUT) == 1
    assert b.incr.call_one().get(timeout=CALL_TIMEOUT) == 2
    other = actor.get_or_spawn_controller("compat_ctl_two", Ctl).get(timeout=CALL_TIMEOUT)
    assert other.incr.call_one().get(timeout=CALL_TIMEOUT) == 1


def test_controller_reachable_from_actors(make_procs):
    users = make_procs(2).spawn("users", UsesCtl)
    pids = set(users.go.call("compat_ctl_shared").get(timeout=CALL_TIMEOUT).values())
    assert pids == {os.getpid()}


# --- shutdown_context (in a child interpreter: the client cannot restart) ------------------

_SHUTDOWN_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {here!r})
    from compat_impl import actor
    from test_compat_lifecycle import Cleaner
    procs = actor.this_host().spawn_procs(per_host={{"gpus": 2}})
    pids = list(procs.spawn("c", Cleaner).pid.call().get(timeout=60).values())
    print("PIDS", *pids, flush=True)
    actor.shutdown_context().get(timeout=60)
    actor.shutdown_context().get(timeout=60)
    print("DONE", flush=True)
    """
)


def _cleanups(path, n: int) -> list[str]:
    def read() -> list[str]:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        return lines if len(lines) >= n else []

    try:
        return wait_for(read, CALL_TIMEOUT, f"{n} cleanup(s)")
    except AssertionError:
        raise AssertionError(
            f"cleanups so far: {open(path).read() if os.path.exists(path) else None!r}"
        ) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); count it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_shutdown_context_kills_the_client_procs():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, COMPAT_IMPL=IMPL)
    out = subprocess.run(
        [sys.executable, "-c", _SHUTDOWN_SCRIPT.format(here=here)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=here,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "DONE" in out.stdout
    pids = [int(p) for p in lines["PIDS"].split()]
    assert len(pids) == 2
    wait_for(lambda: not any(_alive(p) for p in pids), 30, "procs to exit")


def test_logging_option_is_awaitable_and_checks_its_values(make_procs):
    procs = make_procs(1)

    async def options():
        assert await procs.logging_option(stream_to_client=True, aggregate_window_sec=None) is None
        with pytest.raises(ValueError, match="Invalid logging level"):
            await procs.logging_option(level=300)

    asyncio.run(options())


def test_logging_option_can_be_given_to_asyncio_run(make_procs):
    procs = make_procs(1)
    assert asyncio.run(procs.logging_option(stream_to_client=False, level=20)) is None


def test_host_mesh_flags():
    hosts = actor.this_host()
    assert hosts.is_fake_in_process is False
    assert hosts.stream_logs is False


class Interpreter(Actor):
    @endpoint
    def started_by(self):
        return os.environ.get("COMPAT_INTERPRETER")


def test_with_python_executable_starts_procs_with_it(tmp_path):
    wrapper = tmp_path / "wrapped-python"
    wrapper.write_text(f'#!/bin/sh\nCOMPAT_INTERPRETER="$0" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    procs = actor.this_host().with_python_executable(str(wrapper)).spawn_procs({"gpus": 2})
    try:
        marks = procs.spawn("interp", Interpreter).started_by.call().get(timeout=CALL_TIMEOUT)
        assert [mark for _, mark in marks.items()] == [str(wrapper)] * 2
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT)


def test_proc_mesh_sync_workspace_is_not_implemented(make_procs):
    procs = make_procs(1)
    message = "sync_workspace is not implemented for ProcMesh. Use HostMesh.sync_workspace"
    with pytest.raises(NotImplementedError, match=message):
        asyncio.run(procs.sync_workspace(None))
