"""Large parts between procs of one host travel through the sender's shared-memory arena.

These tests look inside the runtime (the arena's bookkeeping) because what they pin down is not
visible in values: that the zero-copy path is taken, and that every region comes back.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest
from _bulk_helpers import arena_in_use, wait_until

from regency import config
from regency._runtime.kernel import state
from regency.actor import Actor, ProcMesh, SupervisionError, endpoint, this_host

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20
T = 30.0


def backing(x: np.ndarray) -> str:
    """What the memory under an array is: "arena" when it is a region of a sender's arena."""
    base = x.base
    while isinstance(base, np.ndarray):
        base = base.base
    owner = base.obj if isinstance(base, memoryview) else base
    return "arena" if isinstance(owner, ctypes.Array) else type(owner).__name__


class Sink(Actor):
    @endpoint
    def inspect(self, x: np.ndarray) -> tuple[str, int, int]:
        return backing(x), x.nbytes, int(x[::4096].astype(np.int64).sum())

    @endpoint
    def make(self, n: int, value: int) -> np.ndarray:
        return np.full(n, value, dtype=np.uint8)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hold(self, x: np.ndarray) -> int:
        self.held = x
        return x.nbytes

    @endpoint
    def arena_in_use(self) -> int:
        return arena_in_use()

    @endpoint
    def inspect_all(self, xs: list[np.ndarray]) -> tuple[int, int, list[str]]:
        return len(xs), sum(x.nbytes for x in xs), sorted({backing(x) for x in xs})


@pytest.fixture
def small_arena() -> Iterator[ProcMesh]:
    with config.configured(shm_arena_bytes=8 * MIB):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=T)


def test_large_arrays_arrive_mapped_and_regions_are_reused(small_arena: ProcMesh) -> None:
    sink = small_arena.spawn("sink", Sink)
    rng = np.random.default_rng(7)
    # 20 x 3 MiB through an 8 MiB arena only works if every region comes back.
    for i in range(20):
        data = rng.integers(0, 255, 3 * MIB, dtype=np.uint8)
        backing, nbytes, checksum = sink.inspect.call_one(data).get(timeout=T)
        assert (backing, nbytes) == ("arena", data.nbytes), f"send {i} did not use the arena"
        assert checksum == int(data[::4096].astype(np.int64).sum())
        assert wait_until(lambda: arena_in_use() == 0), "the receiver never released its region"


def test_large_replies_come_back_mapped_and_are_released(small_arena: ProcMesh) -> None:
    sink = small_arena.spawn("sink", Sink)
    for value in (1, 2, 3):
        array = sink.make.call_one(5 * MIB, value).get(timeout=T)
        assert backing(array) == "arena"
        assert array.nbytes == 5 * MIB
        assert int(array[0]) == value
        assert int(array[-1]) == value
        del array
        assert wait_until(lambda: sink.arena_in_use.call_one().get(timeout=T) == 0)


def test_mutating_after_send_does_not_change_what_arrived(small_arena: ProcMesh) -> None:
    sink = small_arena.spawn("sink", Sink)
    data = np.zeros(4 * MIB, dtype=np.uint8)
    assert sink.hold.call_one(data).get(timeout=T) == data.nbytes
    data[:] = 9
    assert sink.inspect.call_one(np.zeros(4 * MIB, dtype=np.uint8)).get(timeout=T)[2] == 0


def test_regions_held_by_a_killed_proc_are_freed(small_arena: ProcMesh) -> None:
    sink = small_arena.spawn("sink", Sink)
    pid = sink.pid.call_one().get(timeout=T)
    assert sink.hold.call_one(np.ones(3 * MIB, dtype=np.uint8)).get(timeout=T) == 3 * MIB
    assert arena_in_use() == 1, "the receiver keeps the array, so its region stays taken"
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError):
        sink.pid.call_one().get(timeout=T)
    assert wait_until(lambda: arena_in_use() == 0)


def test_a_full_arena_falls_back_to_the_socket(small_arena: ProcMesh) -> None:
    # The proc's arena is 8 MiB (it took the setting at spawn): while we hold a 6 MiB reply,
    # a 4 MiB reply cannot fit and must come through the socket instead.
    sink = small_arena.spawn("sink", Sink)
    held = sink.make.call_one(6 * MIB, 1).get(timeout=T)
    assert backing(held) == "arena"
    second = sink.make.call_one(4 * MIB, 5).get(timeout=T)
    assert backing(second) != "arena"
    assert second.nbytes == 4 * MIB
    assert int(second[0]) == 5
    assert int(second[-1]) == 5
    del held
    assert wait_until(lambda: sink.arena_in_use.call_one().get(timeout=T) == 0)


def test_a_message_with_all_the_parts_a_frame_holds_sends_its_large_part_by_socket(
    small_arena: ProcMesh,
) -> None:
    # Envelope, body and 253 out-of-band buffers: 255 parts, all a frame holds. The arena's
    # descriptor would be a 256th, so the 2 MiB part goes through the socket instead of making
    # the send fail after the sender took its sequence number (the next call would hang).
    sink = small_arena.spawn("sink", Sink)
    xs = [np.ones(2 * MIB, dtype=np.uint8)] + [
        np.ones(64 * 1024, dtype=np.uint8) for _ in range(252)
    ]
    total = 2 * MIB + 252 * 64 * 1024
    count, nbytes, backings = sink.inspect_all.call_one(xs).get(timeout=T)
    assert (count, nbytes) == (253, total)
    assert "arena" not in backings
    assert sink.pid.call_one().get(timeout=T) > 0


class Tally(Actor):
    def __init__(self) -> None:
        self.total = 0

    @endpoint
    def add(self, data: bytes) -> None:
        self.total += len(data)

    @endpoint
    def value(self) -> int:
        return self.total


def test_broadcasts_of_mid_size_payloads_arrive_whole(small_arena: ProcMesh) -> None:
    # 300 KiB: over the reader's chunk, so the frame gets a buffer of its own, yet under the
    # arena threshold; repeated broadcasts share one envelope.
    tally = small_arena.spawn("tally", Tally)
    payload = os.urandom(300 * 1024)
    for _ in range(5):
        tally.add.broadcast(payload)
    assert tally.value.call_one().get(timeout=T) == 5 * len(payload)


def test_a_dead_senders_arena_file_is_closed_and_its_data_stays_readable(
    small_arena: ProcMesh,
) -> None:
    sink = small_arena.spawn("sink", Sink)
    pid = sink.pid.call_one().get(timeout=T)
    array = sink.make.call_one(2 * MIB, 7).get(timeout=T)
    assert backing(array) == "arena"
    bulk = state.runtime().bulk
    assert any(key[1] == pid for key in bulk._maps), "we opened the proc's arena"
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not any(key[1] == pid for key in bulk._maps))
    assert int(array[0]) == 7
    assert int(array[-1]) == 7
