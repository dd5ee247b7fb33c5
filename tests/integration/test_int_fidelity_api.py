"""Monarch's API surface on live meshes (issue 18 item 12): endpoint names, spawn_procs options.

Expected behaviour was read off torchmonarch 0.7.0 running the same scenarios.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from regency.actor import (
    Actor,
    ActorError,
    BootstrapCommand,
    Point,
    Port,
    ProcMesh,
    as_endpoint,
    default_bootstrap_cmd,
    endpoint,
    this_host,
    this_proc,
)

pytestmark = pytest.mark.timeout(120)


class MeshWords(Actor):
    """Endpoints named like attributes Monarch's ActorMesh does not have."""

    @endpoint
    def shape(self) -> str:
        return "my shape"

    @endpoint
    def restarts(self) -> int:
        return 41

    @endpoint
    def restarted(self, n: int) -> int:
        return n + 1


def test_endpoints_named_shape_restarts_restarted_work() -> None:
    mesh = this_proc().spawn("words", MeshWords)
    try:
        assert mesh.shape.call_one().get(timeout=30) == "my shape"
        assert mesh.restarts.call_one().get(timeout=30) == 41
        assert mesh.restarted.call_one(1).get(timeout=30) == 2
        view = mesh.slice()
        assert view.shape.call_one().get(timeout=30) == "my shape"
    finally:
        mesh.stop().get(timeout=30)


class Plain(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def test_a_mesh_without_such_endpoints_keeps_its_attributes(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("plain", Plain)
    try:
        assert dict(mesh.shape.extent)["gpus"] == 4
        assert mesh.restarts == 0
    finally:
        mesh.stop().get(timeout=30)


@pytest.mark.parametrize(
    "name",
    [
        "stop",
        "slice",
        "initialized",
        "size",
        "sizes",
        "extent",
        "flatten",
        "rename",
        "split",
        "_class",
        "_name",
        "_shape",
        "_proc_mesh",
        "__len__",
        "__repr__",
    ],
)
def test_endpoint_names_monarch_refuses(name: str) -> None:
    def method(self: Actor) -> int:
        return 1

    method.__name__ = name
    cls = type(f"Clash_{name.strip('_')}", (Actor,), {name: endpoint(method)})
    expected = f"ActorMesh has an attribute that collides with an endpoint name: attribute={name}"
    with pytest.raises(ValueError, match=expected):
        this_proc().spawn("clash", cls)


class Where(Actor):
    @endpoint
    def where(self) -> tuple[list[int], str | None]:
        return sorted(os.sched_getaffinity(0)), os.environ.get("FIDELITY_POINT")

    def helper(self, x: int) -> int:
        return x * 2

    def reply_later(self, port: Port[int], x: int) -> None:
        port.send(x + 1)

    async def not_on_this_actor(self) -> int:
        return 1


class AsyncWhere(Actor):
    @endpoint
    async def ping(self) -> int:
        return 0

    def helper(self, x: int) -> int:
        return x * 3


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to")
def test_proc_bind_cpus_pins_each_proc(make_procs: Callable[..., ProcMesh]) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    procs = make_procs(2, proc_bind=[{"cpus": str(cpus[1])}, {"cpus": str(cpus[0])}])
    values = procs.spawn("where", Where).where.call().get(timeout=60)
    assert [aff for aff, _ in values.values()] == [[cpus[1]], [cpus[0]]]


def test_proc_bind_length_must_equal_procs_per_host() -> None:
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="not a CPU list"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "zero"}])


@pytest.mark.skipif(shutil.which("numactl") is not None, reason="numactl is installed here")
def test_numactl_binding_without_numactl_fails_the_proc_naming_it(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(1, proc_bind=[{"cpunodebind": "0"}])
    with pytest.raises(Exception, match="numactl"):
        procs.spawn("where", Where).where.call().get(timeout=60)


def test_bootstrap_command_per_point(make_procs: Callable[..., ProcMesh]) -> None:
    def command(point: Point) -> BootstrapCommand:
        return default_bootstrap_cmd().with_env({"FIDELITY_POINT": f"{point.rank}"})

    procs = make_procs(2, bootstrap_command=command)
    values = procs.spawn("where", Where).where.call().get(timeout=60)
    assert [point for _, point in values.values()] == ["0", "1"]
    uniform = make_procs(
        1, bootstrap_command=default_bootstrap_cmd().with_env({"FIDELITY_POINT": "u"})
    )
    assert uniform.spawn("where", Where).where.call_one().get(timeout=60)[1] == "u"


def test_as_endpoint_calls_a_plain_method(procs4: ProcMesh) -> None:
    mesh = procs4.spawn("plain", Where)
    try:
        with pytest.raises(RuntimeError, match="is not annotated as an endpoint"):
            mesh.helper(1)
        assert list(as_endpoint(mesh.helper).call(4).get(timeout=30).values()) == [8] * 4
        one = mesh.slice(gpus=0)
        port_ep = as_endpoint(one.reply_later, explicit_response_port=True)
        assert port_ep.call_one(4).get(timeout=30) == 5
        with pytest.raises(ActorError, match="no event loop"):
            as_endpoint(mesh.not_on_this_actor).call().get(timeout=30)
        with pytest.raises(ValueError, match="expected an method of a spawned actor"):
            as_endpoint(mesh.where)
        with pytest.raises(TypeError):
            as_endpoint(mesh.helper).call(1, 2)
    finally:
        mesh.stop().get(timeout=30)
    amesh = procs4.spawn("aplain", AsyncWhere)
    try:
        assert list(as_endpoint(amesh.helper).call(2).get(timeout=30).values()) == [6] * 4
    finally:
        amesh.stop().get(timeout=30)


ENABLE_TRANSPORT = """
from regency.actor import ChannelTransport, enable_transport, this_proc
enable_transport("ipc")
enable_transport(ChannelTransport.Unix)
try:
    enable_transport("tcp")
except RuntimeError as exc:
    print("second:", exc)
this_proc()
enable_transport("ipc")
for other in ("tcp", ChannelTransport.TcpWithLocalhost):
    try:
        enable_transport(other)
    except RuntimeError as exc:
        print("after start:", exc)
try:
    enable_transport("bogus")
except ValueError as exc:
    print("bogus:", exc)
from regency import config
print("configured:", config.get("default_transport"))
"""


def test_enable_transport_like_monarch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ENABLE_TRANSPORT],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "second: Only one transport type may be enabled at one time. Currently enabled transport"
        " type is `unix`. Attempted to enable transport type `tcp(Hostname)`."
    )
    for line in lines[1:3]:
        assert line.startswith("after start: `enable_transport()` must be called before any other")
    assert lines[3].startswith("bogus: invalid str for BindSpec 'bogus'")
    assert lines[4] == "configured: ChannelTransport.Unix"


def test_host_mesh_initialized_resolves_true() -> None:
    assert this_host().initialized.get(timeout=10) is True


SHUTDOWN_HOST_TIMEOUT = """
from regency.actor import Actor, endpoint, shutdown_context, this_host

class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x

print("no runtime:", shutdown_context(host_timeout=-1).get())
procs = this_host().spawn_procs(per_host={"g": 2})
echo = procs.spawn("echo", Echo)
for bad in (-1, float("inf"), float("nan"), "x"):
    try:
        shutdown_context(host_timeout=bad)
    except (TypeError, ValueError) as exc:
        print("bad:", type(exc).__name__, exc)
print("still up:", list(echo.echo.call(3).get(timeout=30).values()))
print("shut:", shutdown_context(host_timeout=5).get())
print("again:", shutdown_context(host_timeout=-1).get())
"""


def test_shutdown_context_takes_monarchs_host_timeout() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_HOST_TIMEOUT],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    invalid = (
        "bad: ValueError host_timeout must be finite, non-negative and less than 2**64 seconds"
    )
    assert out.stdout.splitlines() == [
        "no runtime: None",
        invalid,
        invalid,
        invalid,
        "bad: TypeError must be real number, not str",
        "still up: [3, 3]",
        "shut: None",
        "again: None",
    ]


class Interpreter(Actor):
    @endpoint
    def started_by(self) -> tuple[str | None, str | None]:
        return os.environ.get("FIDELITY_INTERPRETER"), os.environ.get("FIDELITY_WRAPPER_PID")

    @endpoint
    def spawn_inner(self) -> tuple[str | None, str | None]:
        inner = this_host().spawn_procs(per_host={"inner": 1})
        try:
            mark: tuple[str | None, str | None] = (
                inner.spawn("inner", Interpreter).started_by.call_one().get(timeout=60)
            )
        finally:
            inner.stop().get(timeout=60)
        return mark


def test_with_python_executable_starts_procs_with_that_interpreter(tmp_path: Path) -> None:
    # A wrapper interpreter that leaves a mark in the environment of what it runs.
    wrapper = tmp_path / "wrapped-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'FIDELITY_INTERPRETER="$0" FIDELITY_WRAPPER_PID=$$ exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    hosts = this_host().with_python_executable(str(wrapper))
    assert hosts.is_fake_in_process is False
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    plain = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        actors = procs.spawn("interp", Interpreter)
        marks = list(actors.started_by.call().get(timeout=60).values())
        assert [interpreter for interpreter, _ in marks] == [str(wrapper)] * 2
        # A proc started with it starts its own procs with it too (the wrapper runs again).
        inner, inner_pid = actors.slice(gpus=0).spawn_inner.call_one().get(timeout=90)
        assert inner == str(wrapper)
        assert inner_pid != marks[0][1]
        other = plain.spawn("interp", Interpreter)
        assert other.started_by.call_one().get(timeout=60) == (None, None)
        assert other.spawn_inner.call_one().get(timeout=90) == (None, None)
    finally:
        procs.stop().get(timeout=60)
        plain.stop().get(timeout=60)


def test_with_python_executable_needs_a_path() -> None:
    with pytest.raises(TypeError, match="python_executable must be a non-empty path"):
        this_host().with_python_executable("")


def test_host_mesh_flags_read_as_in_monarch() -> None:
    assert this_host().is_fake_in_process is False
    assert this_host().stream_logs is False


def test_to_table_draws_the_mesh_as_monarch_does(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(3)
    assert procs.to_table() == (
        f"{'gpus':^34}\n"  # centred over the table, as tabulate's output is in Monarch
        "+----------+----------+----------+\n"
        "|        0 |        1 |        2 |\n"
        "+==========+==========+==========+\n"
        "| 0.gpu[0] | 0.gpu[1] | 0.gpu[2] |\n"
        "+----------+----------+----------+"
    )
    with pytest.raises(ValueError, match="1 to 3 dimensions, not 0"):
        this_proc().to_table()


def test_proc_mesh_sync_workspace_says_to_use_the_host_mesh(procs4: ProcMesh) -> None:
    with pytest.raises(NotImplementedError, match="not implemented for ProcMesh"):
        asyncio.run(procs4.sync_workspace(None))
    with pytest.raises(NotImplementedError, match=r"regency\.job\.sync_workspace"):
        procs4.sync_workspace(None).get(timeout=5)
