"""``ProcMesh.stacks()``: every thread's Python stack of each proc, from the controller."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from regency._runtime.actors.observe.stacks import pyspy_path
from regency.actor import Actor, ProcMesh, ValueMesh, endpoint

pytestmark = pytest.mark.timeout(120)

STUCK_FOR = 60.0


class Stuck(Actor):
    """An actor whose endpoint blocks until released (or a minute passes)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    @endpoint
    def block_in_a_recognisable_place(self) -> None:
        self.release.wait(STUCK_FOR)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _stacks_showing(procs: ProcMesh, needle: str, **options: object) -> ValueMesh[str]:
    """``procs.stacks()`` once every rank's text shows ``needle`` (the actor threads get
    their messages independently of the proc agents that answer)."""
    deadline = time.monotonic() + 30
    while True:
        stacks = procs.stacks(**options).get(timeout=30)  # type: ignore[arg-type]
        if all(needle in text for text in stacks.values()):
            return stacks
        assert time.monotonic() < deadline, f"no {needle!r} in {list(stacks.values())}"


def test_a_stuck_endpoint_shows_in_every_ranks_builtin_dump(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)
    stuck = procs.spawn("stuck", Stuck)
    stuck.block_in_a_recognisable_place.broadcast()
    # The endpoint runs on the actor's thread: the proc agent still answers.
    stacks = _stacks_showing(procs, "block_in_a_recognisable_place", pyspy=False)
    assert [dict(point) for point, _ in stacks.items()] == [{"gpus": 0}, {"gpus": 1}]
    for text in stacks.values():
        assert text.startswith("(sys._current_frames)\nProcess ")
        assert "block_in_a_recognisable_place" in text
        assert '"regency-actor-stuck"' in text
        assert '"regency-io"' in text  # every thread, not just the actor's


@pytest.mark.skipif(pyspy_path() is None, reason="py-spy is not installed (pip install py-spy)")
def test_pyspy_dump_is_used_where_installed(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(1)
    stuck = procs.spawn("stuck", Stuck)
    stuck.block_in_a_recognisable_place.broadcast()
    text = _stacks_showing(procs, "Stuck.block_in_a_recognisable_place").item(gpus=0)
    assert text.startswith("(py-spy dump)\nProcess ")
    assert '"regency-actor-stuck"' in text


def test_a_killed_rank_says_it_is_gone_and_the_others_answer(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)
    stuck = procs.spawn("stuck", Stuck)
    pid = stuck.slice(gpus=1).pid.call_one().get(timeout=30)
    os.kill(pid, signal.SIGKILL)
    stacks = procs.stacks(pyspy=False).get(timeout=30)
    assert "Thread " in stacks.item(gpus=0)
    assert stacks.item(gpus=1).startswith("(no stacks: ")
    assert "is gone" in stacks.item(gpus=1)


def test_a_stopped_process_is_reported_silent_after_the_timeout(
    make_procs: Callable[..., ProcMesh],
) -> None:
    procs = make_procs(2)
    stuck = procs.spawn("stuck", Stuck)
    pid = stuck.slice(gpus=0).pid.call_one().get(timeout=30)
    os.kill(pid, signal.SIGSTOP)
    try:
        stacks = procs.stacks(pyspy=False, timeout=1.0).get(timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stacks.item(gpus=0).startswith("(no answer within 1 s")
    assert "Thread " in stacks.item(gpus=1)


def test_stacks_are_answered_while_the_bootstrap_still_runs(
    make_procs: Callable[..., ProcMesh], tmp_path: Path
) -> None:
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    procs = make_procs(1, bootstrap=_BlockingBootstrap(str(fifo)))
    # Answered by the proc agent while the bootstrap blocks the proc's main thread.
    _stacks_showing(procs, "wait_for_the_gate", pyspy=False)
    with open(fifo, "w") as gate:  # the bootstrap returns once the FIFO has a writer
        gate.write("go")
    assert procs.initialized.get(timeout=30) is True


class _BlockingBootstrap:
    """A bootstrap that waits until someone writes to a FIFO."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> None:
        wait_for_the_gate(self.path)


def wait_for_the_gate(path: str) -> None:
    with open(path) as gate:
        gate.read()


def test_timeout_must_be_positive(make_procs: Callable[..., ProcMesh]) -> None:
    procs = make_procs(1)
    with pytest.raises(ValueError, match="timeout"):
        procs.stacks(timeout=0)
