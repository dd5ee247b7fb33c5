"""What a user of ``regency.rdma`` sees when things go wrong.

Bad arguments fail at once, before any byte moves; a dropped buffer, a dead or stopped owner
and a timeout fail the transfer's future with a clear error, never a hang and never wrong data
reported as success; a peer without the job secret gets nothing from a transfer service.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _fault_helpers import (
    HELLO_LEN,
    MAGIC,
    REFUSED,
    connect,
    handshake,
    kill_all,
    read_until_closed,
    recv_exact,
    send_quietly,
    wait_gone,
)

from regency._runtime.kernel import state
from regency.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host
from regency.rdma import (
    RDMAAction,
    RDMABackendError,
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAError,
    RDMAFallbackWarning,
    RDMAOwnerGoneError,
    RDMATimeoutError,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0
FAST = 5.0  # a failure must be reported well within this
MIB = 1 << 20
BACKENDS = ["cma", "shm", "tcp"]
# The transfer service's request and reply heads, from the protocol's documentation.
REQUEST = struct.Struct("<BQQQQQ")
REPLY = struct.Struct("<BQ")
OP_READ = 1


def pattern(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Owner(Actor):
    def __init__(self) -> None:
        self.mem: dict[str, Any] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, key: str, nbytes: int, seed: int, backend: str | None = None) -> RDMABuffer:
        self.mem[key] = pattern(seed, nbytes)
        self.bufs[key] = RDMABuffer(self.mem[key], backend=backend)
        return self.bufs[key]

    @endpoint
    def drop(self, key: str) -> None:
        self.bufs[key].drop().get(timeout=T)

    @endpoint
    def read_own(self, key: str) -> str:
        """Read one of its own buffers in-process; the error's type name, or "ok"."""
        try:
            self.bufs[key].read_into(np.empty(self.mem[key].nbytes, np.uint8)).get(timeout=T)
        except RDMAError as exc:
            return type(exc).__name__
        return "ok"

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def read_as_other_user(self, buf: RDMABuffer, seed: int) -> tuple[bool, bool, list[str]]:
        """Become an unprivileged user, then read ``buf`` twice; (ok, ok, warnings seen)."""
        expected = pattern(seed, buf.size())  # imports what it needs while it still can
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        oks = []
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(2):
                dst = np.zeros(buf.size(), np.uint8)
                buf.read_into(dst).get(timeout=T)
                oks.append(bool(np.array_equal(dst, expected)))
        shown = [
            f"{w.category.__name__}: {w.message}"
            for w in seen
            if issubclass(w.category, RDMAFallbackWarning)
        ]
        return oks[0], oks[1], shown


@pytest.fixture
def make_owner() -> Iterator[Callable[[], tuple[ActorMesh[Owner], int]]]:
    """One-proc meshes with an ``Owner`` each, and its pid; stopped (or killed) at teardown."""
    made: list[tuple[ProcMesh, int]] = []

    def factory() -> tuple[ActorMesh[Owner], int]:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        owner = procs.spawn("owner", Owner)
        pid = owner.pid.call_one().get(timeout=T)
        made.append((procs, pid))
        return owner, pid

    yield factory
    for procs, pid in made:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=T)
    pids = [pid for _, pid in made]
    kill_all(wait_gone(pids, 10))


def expect_failure(future: Any, kind: type[BaseException], within: float = FAST) -> BaseException:
    """Assert that ``future`` fails with ``kind`` within ``within`` seconds; return the error."""
    start = time.monotonic()
    with pytest.raises(kind) as info:
        future.get(timeout=within)
    assert time.monotonic() - start < within
    return info.value


# -- bad arguments -------------------------------------------------------------------------------


def test_bad_registrations_raise_at_once() -> None:
    with pytest.raises(ValueError, match="at least one byte"):
        RDMABuffer(np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="at least one byte"):
        RDMABuffer(b"")
    with pytest.raises(TypeError, match="contiguous"):
        RDMABuffer([1, 2, 3])
    with pytest.raises(TypeError):
        RDMABuffer("text")
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        RDMABuffer(np.zeros(10, np.uint8)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        RDMABuffer(memoryview(np.zeros((4, 4), np.uint8)).toreadonly()[::2])
    with pytest.raises(TypeError, match="objects"):
        RDMABuffer(np.array([object()] * 4))
    with pytest.raises(ValueError, match="unknown RDMA backend"):
        RDMABuffer(np.zeros(4, np.uint8), backend="nvlink")
    with pytest.raises(RDMABackendError, match="ibverbs"):
        RDMABuffer(np.zeros(4, np.uint8), backend="ibverbs")


def test_bad_torch_registrations_raise_at_once() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="contiguous"):
        RDMABuffer(torch.arange(10)[::2])
    with pytest.raises(ValueError, match="1-D"):
        RDMABuffer(torch.zeros(2, 2))
    with pytest.raises(TypeError, match="dense"):
        RDMABuffer(torch.zeros(4).to_sparse())


def test_bad_transfers_raise_before_anything_moves() -> None:
    mine = np.arange(100, dtype=np.uint8)
    buf = RDMABuffer(mine)
    small = np.full(99, 7, np.uint8)
    with pytest.raises(ValueError, match="destination of 99 bytes is smaller"):
        buf.read_into(small)
    assert (small == 7).all()
    with pytest.raises(ValueError, match="source of 101 bytes is larger"):
        buf.write_from(np.zeros(101, np.uint8))
    assert (mine == np.arange(100, dtype=np.uint8)).all()
    with pytest.raises(ValueError, match="read-only destination"):
        buf.read_into(bytes(100))
    with pytest.raises(ValueError, match="timeout"):
        buf.read_into(np.zeros(100, np.uint8), timeout=0)
    with pytest.raises(TypeError, match="timeout"):
        buf.read_into(np.zeros(100, np.uint8), timeout="soon")  # type: ignore[arg-type]
    readonly = RDMABuffer(bytes(range(100)))
    assert readonly.writable is False
    with pytest.raises(ValueError, match="registered read-only"):
        readonly.write_from(b"x")
    buf.drop().get(timeout=T)
    readonly.drop().get(timeout=T)


def test_rdma_action_validates_every_operation_and_refuses_self_races() -> None:
    a = RDMABuffer(np.zeros(64, np.uint8))
    b = RDMABuffer(np.zeros(64, np.uint8))
    dst = np.zeros(128, np.uint8)
    with pytest.raises(ValueError, match="smaller"):
        RDMAAction().read_remote(np.zeros(10, np.uint8), a)
    with pytest.raises(TypeError, match="RDMABuffer"):
        RDMAAction().read_remote(dst, "not a buffer")  # type: ignore[arg-type]
    overlapping = RDMAAction().read_remote(dst[:64], a).read_remote(dst[32:96], b)
    with pytest.raises(ValueError, match="overlaps"):
        overlapping.submit()
    with pytest.raises(ValueError, match="same remote buffer"):
        RDMAAction().write_remote(a, dst[:64]).write_remote(a, dst[64:]).submit()
    with pytest.raises(ValueError, match="same remote buffer"):
        RDMAAction().read_remote(dst[:64], a).write_remote(a, dst[64:]).submit()
    # Disjoint destinations and reads of one buffer twice are fine.
    RDMAAction().read_remote(dst[:64], a).read_remote(dst[64:], a).submit().get(timeout=T)
    a.drop().get(timeout=T)
    b.drop().get(timeout=T)


# -- dropped buffers -----------------------------------------------------------------------------


def test_dropped_buffers_fail_every_backend(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]],
) -> None:
    owner, _ = make_owner()
    nbytes = MIB
    bufs = {be: owner.make.call_one(f"d{be}", nbytes, 1, backend=be).get(T) for be in BACKENDS}
    for be in BACKENDS:
        owner.drop.call_one(f"d{be}").get(T)
        err = expect_failure(bufs[be].read_into(np.zeros(nbytes, np.uint8)), RDMABufferDroppedError)
        assert "dropped" in str(err)
        assert "owner" in str(err)
        expect_failure(bufs[be].write_from(np.zeros(nbytes, np.uint8)), RDMABufferDroppedError)
        assert owner.read_own.call_one(f"d{be}").get(T) == "RDMABufferDroppedError"
    # Another process may drop a buffer too (through the owner's transfer service); twice is fine.
    other = owner.make.call_one("remote-drop", nbytes, 2).get(T)
    other.drop().get(timeout=T)
    other.drop().get(timeout=T)
    expect_failure(other.read_into(np.zeros(nbytes, np.uint8)), RDMABufferDroppedError)
    assert owner.read_own.call_one("remote-drop").get(T) == "RDMABufferDroppedError"


def test_a_dropped_local_buffer_fails_in_its_owner() -> None:
    buf = RDMABuffer(np.ones(16, np.uint8))
    buf.drop().get(timeout=T)
    expect_failure(buf.read_into(np.zeros(16, np.uint8)), RDMABufferDroppedError)


# -- dead, stopped and slow owners ---------------------------------------------------------------


def test_a_dead_owner_fails_every_backend_fast(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]],
) -> None:
    owner, pid = make_owner()
    bufs = {be: owner.make.call_one(f"k{be}", MIB, 3, backend=be).get(T) for be in BACKENDS}
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone([pid], 10)
    for be in BACKENDS:
        err = expect_failure(bufs[be].read_into(np.zeros(MIB, np.uint8)), RDMAOwnerGoneError)
        assert f"pid {pid}" in str(err)
        expect_failure(bufs[be].write_from(np.zeros(MIB, np.uint8)), RDMAOwnerGoneError)
        bufs[be].drop().get(timeout=FAST)  # nothing left to drop: not an error


@pytest.mark.parametrize(("backend", "direction"), [("tcp", "read"), ("shm", "write")])
def test_owner_killed_mid_transfer_fails_the_transfer(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]], backend: str, direction: str
) -> None:
    owner, pid = make_owner()
    nbytes = 64 * MIB
    buf = owner.make.call_one("mid", nbytes, 4, backend=backend).get(T)
    local = np.zeros(nbytes, np.uint8)
    buf.read_into(local).get(timeout=T)  # connections are open and authenticated
    os.kill(pid, signal.SIGSTOP)  # the transfer service freezes mid-transfer
    move = buf.read_into if direction == "read" else buf.write_from
    future = move(local, timeout=T)
    with pytest.raises(TimeoutError):
        future.get(timeout=0.3)  # it cannot finish while the owner is stopped
    os.kill(pid, signal.SIGKILL)
    err = expect_failure(future, RDMAOwnerGoneError)
    assert "owner's process" in str(err)


def test_owner_killed_during_cross_memory_attach_reads(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]],
) -> None:
    owner, pid = make_owner()
    nbytes = 64 * MIB
    buf = owner.make.call_one("cma", nbytes, 5, backend="cma").get(T)
    expected = pattern(5, nbytes)
    outcomes: list[str] = []
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        dst = np.zeros(nbytes, np.uint8)
        future = buf.read_into(dst, timeout=T)
        if len(outcomes) == 2:
            os.kill(pid, signal.SIGKILL)  # lands while this read (or a later one) is in flight
        try:
            future.get(timeout=FAST)
        except RDMAOwnerGoneError:
            outcomes.append("gone")
            break
        # Reads that finished before the owner died hold exactly its bytes.
        assert np.array_equal(dst, expected), "a read reported success with wrong data"
        outcomes.append("ok")
    assert outcomes[-1] == "gone", outcomes
    assert not wait_gone([pid], FAST)


def test_a_stopped_owner_times_out_and_recovers(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]],
) -> None:
    owner, pid = make_owner()
    nbytes = 16 * MIB
    buf = owner.make.call_one("slow", nbytes, 6, backend="tcp").get(T)
    dst = np.zeros(nbytes, np.uint8)
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        future = buf.read_into(dst, timeout=2.0)
        assert time.monotonic() - start < 1.0, "read_into blocked its caller"
        err = expect_failure(future, RDMATimeoutError)
        assert isinstance(err, TimeoutError)
        assert "within 2 s" in str(err)
    finally:
        os.kill(pid, signal.SIGCONT)
    buf.read_into(dst).get(timeout=T)
    assert np.array_equal(dst, pattern(6, nbytes))
    # Cross-memory attach checks its deadline between chunks.
    cma = owner.make.call_one("slow-cma", nbytes, 7, backend="cma").get(T)
    expect_failure(cma.read_into(dst, timeout=1e-6), RDMATimeoutError)


# -- authentication ------------------------------------------------------------------------------


def test_a_peer_without_the_job_secret_gets_nothing() -> None:
    secret_data = pattern(8, 4096)
    buf = RDMABuffer(secret_data)
    handle = buf._handle
    request = REQUEST.pack(OP_READ, handle.buffer_id, handle.token, 0, 4096, 0)
    try:
        for address in (handle.tcp_address, handle.unix_address):
            # Wrong secret: the service refuses the first proof and answers nothing more.
            sock = connect(address)
            try:
                assert handshake(sock, os.urandom(32), "intruder") is False
                send_quietly(sock, request)
                rest, closed = read_until_closed(sock, FAST)
                assert closed
                assert rest == b""
            finally:
                sock.close()
            # No handshake at all: a request where the proof belongs is refused the same way.
            sock = connect(address)
            try:
                hello = recv_exact(sock, HELLO_LEN)
                assert hello.startswith(MAGIC)
                send_quietly(sock, request * 2)
                rest, closed = read_until_closed(sock, FAST)
                assert closed
                assert rest == REFUSED, "the refusal of the proof, and nothing of the buffer"
            finally:
                sock.close()
            # The job's secret opens it: the same request returns the data.
            sock = connect(address)
            try:
                assert handshake(sock, state.runtime().secret, "friend") is True
                sock.sendall(request)
                status, n = REPLY.unpack(recv_exact(sock, REPLY.size))
                assert (status, n) == (0, 4096)
                assert recv_exact(sock, n) == secret_data.tobytes()
            finally:
                sock.close()
    finally:
        buf.drop().get(timeout=T)


# -- permission fallback -------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a proc as another user")
def test_cross_memory_attach_refused_falls_back_to_shared_memory_and_warns_once(
    make_owner: Callable[[], tuple[ActorMesh[Owner], int]],
) -> None:
    reader, _ = make_owner()
    nbytes = 2 * MIB + 1
    mine = pattern(9, nbytes)
    buf = RDMABuffer(mine)  # automatic choice: cma first
    try:
        first, second, shown = reader.read_as_other_user.call_one(buf, 9).get(T)
        assert first
        assert second
        assert len(shown) == 1, shown
        assert shown[0].startswith(f"{RDMAFallbackWarning.__name__}: RDMA backend 'cma'"), shown
        assert "'shm'" in shown[0]
    finally:
        buf.drop().get(timeout=T)
