"""Exits that must not wait out the stop timeout (issue 18 item 9), in a real controller process.

An actor that owns a mesh on its own proc (``context().actor_instance.proc.spawn(...)``), or an
actor stuck in ``__init__``, used to make the controller's exit take the 10 s stop timeout and
end in a force-kill. Monarch 0.7 exits at once in the first case and after its 3 s
``cleanup_timeout`` in the second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fault_helpers import Controller, kill_all, wait_gone, write_script

pytestmark = pytest.mark.timeout(60)

SCRIPT = """
import os, sys, threading
from regency.actor import Actor, context, endpoint, this_host
from regency.config import configure

configure(cleanup_timeout=1.0)


class Child(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    def __init__(self) -> None:
        self.child = context().actor_instance.proc.spawn("child", Child)

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get(timeout=30)


class Stuck(Actor):
    def __init__(self) -> None:
        threading.Event().wait()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 2})
if sys.argv[1] == "owner":
    pids = sorted(procs.spawn("owners", Owner).child_pid.call().get(timeout=30).values())
else:
    procs.spawn("stuck", Stuck)
    pids = sorted(procs.spawn("other", Child).pid.call().get(timeout=30).values())
emit("PIDS", pids)
emit("EXITING", time.monotonic())
"""


@pytest.fixture
def started() -> Iterator[list[tuple[Controller, list[int]]]]:
    """Controllers and their procs' pids; killed at teardown if still alive."""
    running: list[tuple[Controller, list[int]]] = []
    yield running
    for controller, pids in running:
        controller.close()
        kill_all(pids)


@pytest.mark.parametrize(("mode", "bound"), [("owner", 4.0), ("stuck", 6.0)])
def test_exit_is_prompt(
    tmp_path: Path, started: list[tuple[Controller, list[int]]], mode: str, bound: float
) -> None:
    controller = Controller(write_script(tmp_path, SCRIPT), mode)
    pids: list[int] = []
    started.append((controller, pids))
    pids.extend(controller.expect("PIDS", 45))
    controller.expect("EXITING", 10)
    exiting = time.monotonic()
    assert controller.wait(30) == 0, controller.describe()
    took = time.monotonic() - exiting
    assert took < bound, f"exit took {took:.1f} s\n{controller.describe()}"
    assert "killing it" not in "".join(controller.stderr), controller.describe()
    assert wait_gone(pids, 10) == []
