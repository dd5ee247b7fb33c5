"""A proc lost while the controller is sending one message to several procs.

The message took a sequence number for each destination before the first byte left. When the
first destination dies in the middle of the send, the others must still get the message (they
are healthy), so that the controller's later messages to them are not held back waiting for it:
later calls to the surviving ranks are answered, promptly and in order.

The window is made certain rather than hoped for: rank 0 is stopped (SIGSTOP), so the send of a
message larger than a socket's buffer blocks on it; once the controller's writer for it is
waiting, rank 0 is killed, and the blocked send fails there.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from _fault_helpers import kill_all, tracked_procs, wait_until

from regency import config
from regency._runtime.kernel import bulk
from regency.actor import (
    Actor,
    ActorMesh,
    Future,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    endpoint,
)

pytestmark = pytest.mark.timeout(90)

T = 20.0  # generous bound for a wait that normally ends far sooner
PROMPT = 5.0  # a call to healthy ranks is answered within this many seconds
# Sent inline (under the shared-memory threshold), far larger than a socket's buffer.
PAYLOAD = b"\x01" * (bulk.BULK_MIN * 3 // 4)


class Recorder(Actor):
    """Keeps the labels of the messages it took, in the order it took them."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def take(self, label: str, payload: bytes) -> int:
        self.labels.append(label)
        return len(payload)

    @endpoint
    def taken(self) -> list[str]:
        return self.labels


def _writers() -> set[str]:
    """The controller's connection writer threads (one starts when a peer stops taking bytes)."""
    return {t.name for t in threading.enumerate() if t.name.startswith("regency-writer-")}


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (``T``: stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def stopped_pids() -> Iterator[list[int]]:
    """Pids this test stops: killed at teardown whatever happened."""
    pids: list[int] = []
    yield pids
    kill_all(pids)


@pytest.mark.parametrize("fanout", [16, 2], ids=["direct", "tree"])
def test_ranks_after_one_killed_mid_send_still_answer_in_order(
    fanout: int,
    cleanup: tuple[list[ProcMesh], list[int]],
    hook: list[MeshFailure],
    stopped_pids: list[int],
) -> None:
    with config.configured(cast_fanout=fanout):
        procs = tracked_procs(cleanup, gpus=4)
        mesh: ActorMesh[Recorder] = procs.spawn("recorders", Recorder)
        pids = mesh.pid.call().get(timeout=T)
        cleanup[1].extend(pids.values())
        assert list(mesh.take.call("warm", b"").get(timeout=T).values()) == [0] * 4
        doomed = mesh.slice(gpus=0).pid.call_one().get(timeout=T)
        before = _writers()
        stopped_pids.append(doomed)
        os.kill(doomed, signal.SIGSTOP)
        assert wait_until(lambda: _state(doomed) == "T", T), "rank 0 did not stop"
        sent: list[object] = []

        def send_big() -> None:
            try:
                sent.append(mesh.take.call("big", PAYLOAD))
            except Exception as exc:  # asserted on below
                sent.append(exc)

        sender = threading.Thread(target=send_big)
        sender.start()
        # The send to rank 0 is blocked on its full socket: kill it now.
        assert wait_until(lambda: bool(_writers() - before), T), "the send never blocked"
        assert sender.is_alive(), f"the send did not block: {sent}"
        os.kill(doomed, signal.SIGKILL)
        sender.join(T)
        assert not sender.is_alive(), "the send did not end when its peer died"

        [future] = sent
        assert isinstance(future, Future), f"the call raised instead of failing its future: {sent}"
        with pytest.raises(SupervisionError, match=r"recorders\.take\(\) failed"):
            future.get(timeout=T)
        survivors = mesh.slice(gpus=slice(1, 4))
        answered = survivors.take.call("after", b"").get(timeout=PROMPT)
        assert list(answered.values()) == [0, 0, 0]
        taken = survivors.taken.call().get(timeout=PROMPT)
        assert list(taken.values()) == [["warm", "big", "after"]] * 3
        # The loss itself is reported as ever: the mesh failed at rank 0.
        assert wait_until(lambda: bool(hook), T)
        assert [f.crashed_ranks for f in hook] == [[0]]
