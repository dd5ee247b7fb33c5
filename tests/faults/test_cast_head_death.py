"""A casting-tree head that dies after it took a broadcast and before it passed it on.

Every destination of a broadcast took the controller's next sequence number for it, and each
mailbox holds the controller's later messages until the earlier ones came. So a subtree left
without the message would never run another message from the controller. The controller keeps
each broadcast until the subtree heads acknowledge it, and sends it straight to the subtree of a
head lost first: the survivors run every message, once, in order, and no call hangs.

The window is made certain: the head is stopped (SIGSTOP) so the broadcast's frame sits unread
in its socket, then killed. A second test kills heads at random moments of a broadcast stream.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from _fault_helpers import tracked_procs, wait_until

from regency import config
from regency.actor import Actor, ActorMesh, MeshFailure, ProcMesh, endpoint

pytestmark = pytest.mark.timeout(120)

T = 20.0
PROMPT = 5.0  # a call to healthy ranks is answered within this many seconds
N = 8  # procs; with cast_fanout=2 the tree is three levels deep


class Recorder(Actor):
    """Keeps what it was sent, in the order it ran it."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def take(self, value: int) -> None:
        self.seen.append(value)

    @endpoint
    def taken(self) -> list[int]:
        return self.seen


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _spawn(cleanup: tuple[list[ProcMesh], list[int]]) -> tuple[ActorMesh[Recorder], list[int]]:
    procs = tracked_procs(cleanup, gpus=N)
    mesh: ActorMesh[Recorder] = procs.spawn("recorders", Recorder)
    pids = list(mesh.pid.call().get(timeout=T).values())
    cleanup[1].extend(pids)
    return mesh, pids


def test_a_head_killed_holding_an_unread_broadcast_leaves_its_subtree_in_order(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    with config.configured(cast_fanout=2):
        mesh, pids = _spawn(cleanup)
        alive = list(range(N))
        sent: list[int] = []
        # Each round the view is the survivors, and its first rank heads the first subtree.
        for value in range(3):
            view = mesh.slice(gpus=slice(alive[0], N))
            head = alive[0]
            os.kill(pids[head], signal.SIGSTOP)
            assert wait_until(lambda head=head: _state(pids[head]) == "T", T)
            view.take.broadcast(value)  # rank `head` never reads it
            sent.append(value)
            os.kill(pids[head], signal.SIGKILL)
            alive.remove(head)
            assert wait_until(lambda value=value: len(hook) == value + 1, T), hook
            survivors = mesh.slice(gpus=slice(alive[0], N))
            taken = survivors.taken.call().get(timeout=PROMPT)
            assert list(taken.values()) == [sent] * len(alive)
    assert [f.crashed_ranks for f in hook] == [[0], [1], [2]]


def test_heads_killed_during_a_broadcast_stream_leave_no_survivor_waiting(
    cleanup: tuple[list[ProcMesh], list[int]], hook: list[MeshFailure]
) -> None:
    with config.configured(cast_fanout=2):
        mesh, pids = _spawn(cleanup)
        done = threading.Event()
        sent: list[int] = []
        alive = list(range(N))

        def stream() -> None:
            value = 0
            while not done.is_set():
                view = mesh.slice(gpus=slice(alive[0], N))
                value += 1
                try:
                    view.take.broadcast(value)
                except Exception:
                    continue  # a head died just now: the next view leaves it out
                sent.append(value)

        streamer = threading.Thread(target=stream)
        streamer.start()
        try:
            for _ in range(3):
                start = len(sent)
                assert wait_until(lambda start=start: len(sent) > start + 200, T)
                head = alive[0]
                alive.remove(head)  # the streamer's next views leave it out
                os.kill(pids[head], signal.SIGKILL)
                assert wait_until(lambda n=N - len(alive): len(hook) == n, T), hook
        finally:
            done.set()
            streamer.join(T)
        assert not streamer.is_alive()
        survivors = mesh.slice(gpus=slice(alive[0], N))
        taken = list(survivors.taken.call().get(timeout=PROMPT).values())
        # Every survivor was in every view: each ran the same values, once each, in the order
        # sent, every broadcast that returned among them (one that raised, its head found dead
        # while sending, may still have reached them).
        first = taken[0]
        assert all(seen == first for seen in taken), [len(s) for s in taken]
        assert first == sorted(set(first))
        assert set(sent) <= set(first)
