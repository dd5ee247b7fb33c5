"""Process lifecycle as Monarch has it: first imports in new procs, clean exits, bootstraps,
host shutdown and Ctrl-C (issue 18, items 7, 8, 10, 11 and 13).

Most scenarios run a controller script of their own in a subprocess: what is checked is what a
user of the script sees (its exit code, its output).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import regency.actor
from regency._runtime.host.launcher import Launcher
from regency._transport.io_loop import IOLoop
from regency.actor import Actor, ActorError, MeshFailure, ProcMesh, endpoint, this_proc


def run_script(
    tmp_path: Path, source: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a controller script (its own ``__main__``); return the finished run."""
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def describe(run: subprocess.CompletedProcess[str]) -> str:
    """The run's exit code and output, for assertion messages."""
    return f"exit code {run.returncode}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"


# -- item 7: several actors of one new proc unpickle their classes at once --------------------

TORCH_CLASSES = """
import torch.nn
from regency.actor import Actor, endpoint, this_host


class Linear(Actor):
    kind = torch.nn.Linear

    @endpoint
    def name(self) -> str:
        return self.kind.__name__


class Parameter(Actor):
    kind = torch.nn.Parameter

    @endpoint
    def name(self) -> str:
        return self.kind.__name__


class Module(Actor):
    kind = torch.nn.Module

    @endpoint
    def name(self) -> str:
        return self.kind.__name__


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    meshes = [procs.spawn(f"m{i}", cls) for i, cls in enumerate([Linear, Parameter, Module] * 2)]
    names = [m.name.call().get(timeout=60) for m in meshes]
    print("NAMES", sorted({v for values in names for _, v in values.items()}))
    procs.stop().get(timeout=30)
"""


@pytest.mark.timeout(120)
def test_actors_of_a_new_proc_import_torch_at_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = run_script(tmp_path, TORCH_CLASSES)
    assert run.returncode == 0, describe(run)
    assert "NAMES ['Linear', 'Module', 'Parameter']" in run.stdout, describe(run)
    assert "partially initialized" not in run.stderr
    assert "Deadlock" not in run.stderr


# -- item 8: a proc stopped on purpose is never a failure, however slowly it exits ------------

SLOW_EXIT = """
import atexit
import sys
import time

from regency.actor import Actor, endpoint, this_host


def linger() -> None:
    time.sleep(2.5)  # as torch's exit handlers can


class Slow(Actor):
    def __init__(self) -> None:
        atexit.register(linger)

    @endpoint
    def value(self) -> int:
        return 7


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    slow = procs.spawn("slow", Slow)
    print("VALUES", sorted(v for _, v in slow.value.call().get(timeout=60).items()))
    if sys.argv[1:] == ["stop"]:
        procs.stop().get(timeout=30)
    print("DONE")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ending", ["exit", "stop"])
def test_a_clean_run_whose_procs_exit_slowly_exits_0(tmp_path: Path, ending: str) -> None:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(SLOW_EXIT))
    run = subprocess.run(
        [sys.executable, str(script), ending],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, describe(run)
    assert "VALUES [7, 7]" in run.stdout, describe(run)
    assert "DONE" in run.stdout, describe(run)
    assert "supervision failure" not in run.stderr, describe(run)
    assert "connection lost" not in run.stderr, describe(run)


# -- item 11: the bootstrap runs with the proc serving, and its failure fails the proc's actors -


class EnvReader(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def bootstrap_calling_this_proc() -> None:
    started = time.monotonic()
    local = this_proc().spawn("in_bootstrap", EnvReader)
    same = local.pid.call_one().get(timeout=20) == os.getpid()
    os.environ["LIFECYCLE_BOOT"] = f"same proc {same} in {time.monotonic() - started:.1f} s"


def bootstrap_raising() -> None:
    raise ValueError("the bootstrap broke on purpose")


@pytest.fixture
def fault_hook(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """Failures that reach the root, recorded instead of ending the test run."""
    seen: list[MeshFailure] = []
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", seen.append)
    return seen


@pytest.mark.timeout(60)
def test_a_bootstrap_spawns_and_calls_actors_on_this_proc(
    make_procs: Callable[..., ProcMesh],
) -> None:
    started = time.monotonic()
    procs = make_procs(2, bootstrap=bootstrap_calling_this_proc)
    readers = procs.spawn("readers", EnvReader)
    found = readers.env.call("LIFECYCLE_BOOT").get(timeout=30)
    assert procs.initialized.get(timeout=30) is True
    assert time.monotonic() - started < 10  # the stall it replaced was 20 s
    for _, text in found.items():
        assert text is not None, "actors ran before the bootstrap had returned"
        assert text.startswith("same proc True in ")


@pytest.mark.timeout(60)
def test_a_failed_bootstrap_fails_the_spawns_and_calls_on_its_procs(
    make_procs: Callable[..., ProcMesh], fault_hook: list[MeshFailure]
) -> None:
    procs = make_procs(2, bootstrap=bootstrap_raising)
    readers = procs.spawn("readers", EnvReader)
    with pytest.raises(ActorError, match="ValueError: the bootstrap broke on purpose"):
        readers.initialized.get(timeout=30)
    with pytest.raises(ActorError) as called:
        readers.env.call("HOME").get(timeout=30)
    assert "Endpoint call readers.env() failed" in str(called.value)
    assert "ValueError: the bootstrap broke on purpose" in str(called.value)
    with pytest.raises(ActorError, match="ValueError: the bootstrap broke on purpose"):
        procs.initialized.get(timeout=30)
    later = procs.spawn("later", EnvReader)  # also once the failure is known
    with pytest.raises(ActorError, match="the bootstrap broke on purpose"):
        later.pid.call().get(timeout=30)
    procs.stop().get(timeout=30)
    assert fault_hook == [], "a failed bootstrap is reported to the caller, not the fault hook"


# -- item 13: Ctrl-C shows the controller's KeyboardInterrupt, and nothing from its procs ------

WAIT_FOR_CTRL_C = """
import os
import signal
import time

# Ctrl-C as in a terminal: a test run in a shell's background inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

from regency.actor import Actor, endpoint, this_host


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    pids = sorted(v for _, v in procs.spawn("pids", Pid).pid.call().get(timeout=60).items())
    print("READY", *pids, flush=True)
    time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.timeout(90)
def test_ctrl_c_prints_only_the_controllers_keyboard_interrupt(tmp_path: Path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(WAIT_FOR_CTRL_C))
    # Its own session and process group, as a terminal runs it; Ctrl-C signals the whole group.
    controller = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert controller.stdout is not None
        line = controller.stdout.readline()
        assert line.startswith("READY"), line
        pids = [int(p) for p in line.split()[1:]]
        os.killpg(controller.pid, signal.SIGINT)
        _, stderr = controller.communicate(timeout=30)
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait(10)
    assert controller.returncode == -signal.SIGINT, stderr
    assert stderr.count("Traceback (most recent call last)") == 1, stderr
    assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
    assert "controller.py" in stderr, stderr
    for name in ("zygote", "bootstrap", "threading.py"):
        assert name not in stderr, stderr
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "procs outlived their interrupted controller"


# -- shutdown racing a spawn: a controller that exits right after spawn_procs -----------------


@pytest.mark.timeout(30)
def test_a_closed_launcher_starts_no_zygote_and_no_proc() -> None:
    # A script that exits right after spawn_procs closes its host agent while the zygote is
    # still starting and the spawn is in flight; neither may start a process afterwards (it
    # printed "I/O operation on closed epoll object" or "Address already in use" tracebacks).
    loop = IOLoop("regency-test-launcher")
    exits: list[tuple[int, int]] = []
    launcher = Launcher(loop, lambda pid, status: exits.append((pid, status)))
    ours, theirs = socket.socketpair()
    try:
        launcher.close()
        launcher.start_zygote()
        assert launcher._zygote is None
        with pytest.raises(OSError, match="the host agent is shutting down"):
            launcher.launch({"address": "unix:@regency-test-never"}, theirs)
    finally:
        ours.close()
        theirs.close()
        loop.stop()
    assert exits == []


@pytest.mark.timeout(60)
def test_the_controller_warms_its_zygote_at_boot_before_any_spawn() -> None:
    # The controller's boot posts WarmZygote to its own host agent, so the template process is
    # starting before the first spawn_procs needs it.
    script = textwrap.dedent(
        """
        import os, sys, time
        import regency.actor
        regency.actor.context()  # boots the controller's runtime, spawns nothing
        me = str(os.getpid())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        ppid = f.read().rsplit(")", 1)[1].split()[1]
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if ppid == me and b"regency._runtime.host.zygote" in cmd:
                    print("ZYGOTE", flush=True)
                    sys.exit(0)
            time.sleep(0.02)
        print("NO ZYGOTE", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.stdout.strip() == "ZYGOTE", done.stdout + done.stderr
