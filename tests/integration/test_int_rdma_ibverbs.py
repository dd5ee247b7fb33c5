"""The ibverbs backend with real procs: RDMA READ / WRITE through pyverbs, and its fallbacks.

Most tests need an RDMA NIC that pyverbs can open (``is_ibverbs_available()``); without one they
are skipped, saying why. On a single host they force ``backend="ibverbs"`` (automatic choice
only picks it between hosts; on one host the NIC loops the traffic back), so a machine with one
NIC, or with soft-RoCE (``rdma link add rxe0 type rxe netdev eth0``), runs the real data path::

    sudo apt-get install python3-pyverbs rdma-core   # or build rdma-core; pyverbs must import
    ulimit -l unlimited                              # registered memory is pinned
    pytest tests/integration/test_int_rdma_ibverbs.py

The last tests need no NIC: they check what a forced ``ibverbs`` says without one, and that a
device which fails to open falls back to TCP with one warning.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from regency.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host
from regency.rdma import (
    RDMAAction,
    RDMABackendError,
    RDMABuffer,
    RDMABufferDroppedError,
    RDMAOwnerGoneError,
    RDMATcpFallbackWarning,
    RDMATimeoutError,
    is_ibverbs_available,
)
from regency.rdma._backends import choice as _choice
from regency.rdma._host import HostIdentity
from regency.rdma._ibverbs.probe import availability

pytestmark = pytest.mark.timeout(120)

T = 30.0
FAST = 5.0
KIB = 1 << 10
MIB = 1 << 20
SIZES = [1, 4 * KIB, MIB, MIB + 1, 8 * MIB + 3, 64 * MIB]  # staging up to 1 MiB, then registered
OTHER_HOST = HostIdentity("a-boot-id-of-another-host", "pid:[1]", "net:[1]", "node-b")

needs_nic = pytest.mark.skipif(
    not is_ibverbs_available(),
    reason=f"no usable RDMA NIC for pyverbs here ({availability().detail}); "
    "the ibverbs data path has not run on this machine",
)


def pattern(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Owner(Actor):
    """Owns buffers; reads and writes other processes' buffers."""

    def __init__(self) -> None:
        self.mem: dict[str, Any] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    def make(
        self,
        key: str,
        nbytes: int,
        seed: int,
        backend: str | None = "ibverbs",
        readonly: bool = False,
    ) -> RDMABuffer:
        data = pattern(seed, nbytes)
        self.mem[key] = data.tobytes() if readonly else data
        self.bufs[key] = RDMABuffer(self.mem[key], backend=backend)
        return self.bufs[key]

    @endpoint
    def check(self, key: str, seed: int, nbytes: int) -> bool:
        mem = np.frombuffer(self.mem[key], dtype=np.uint8)
        return bool(np.array_equal(mem[:nbytes], pattern(seed, nbytes)))

    @endpoint
    def drop(self, key: str) -> None:
        self.bufs.pop(key).drop().get(timeout=T)

    @endpoint
    def read(self, buf: RDMABuffer, seed: int, copies: int = 1) -> int:
        dsts = [np.zeros(buf.size(), dtype=np.uint8) for _ in range(copies)]
        for future in [buf.read_into(dst, timeout=T) for dst in dsts]:
            future.get(timeout=T)
        expected = pattern(seed, buf.size())
        return sum(bool(np.array_equal(dst, expected)) for dst in dsts)

    @endpoint
    def write(self, buf: RDMABuffer, seed: int, nbytes: int) -> None:
        buf.write_from(pattern(seed, nbytes), timeout=T).get(timeout=T)

    @endpoint
    def backend_of(self, buf: RDMABuffer) -> str:
        return buf.backend

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def owners(procs4: ProcMesh) -> ActorMesh[Owner]:
    return procs4.spawn("ibv_owners", Owner)


@pytest.fixture
def lone_owner() -> Iterator[tuple[ActorMesh[Owner], int]]:
    """An owner in a proc of its own, which a test may stop or kill; cleaned up after."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    owner = procs.spawn("lone", Owner)
    pid = owner.pid.call_one().get(timeout=T)
    try:
        yield owner, pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=T)


def at(owners: ActorMesh[Owner], rank: int) -> Any:
    return owners.slice(gpus=rank)


def wait_exited(pid: int, timeout: float) -> None:
    """Block until process ``pid`` has exited (a pidfd turns readable then)."""
    fd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, f"process {pid} did not exit within {timeout} s"
    finally:
        os.close(fd)


def expect(future: Any, kind: type[BaseException]) -> BaseException:
    start = time.monotonic()
    with pytest.raises(kind) as info:
        future.get(timeout=FAST)
    assert time.monotonic() - start < FAST
    return info.value


# -- the data path (needs an RDMA NIC) -----------------------------------------------------------


@needs_nic
@pytest.mark.parametrize("nbytes", SIZES)
def test_controller_reads_and_writes_an_actors_buffer(
    owners: ActorMesh[Owner], nbytes: int
) -> None:
    owner = at(owners, 0)
    buf = owner.make.call_one(f"c{nbytes}", nbytes, seed=nbytes).get(T)
    assert buf.backend == "ibverbs"
    dst = np.zeros(nbytes, dtype=np.uint8)
    buf.read_into(dst, timeout=T).get(timeout=T)
    assert np.array_equal(dst, pattern(nbytes, nbytes))
    buf.write_from(pattern(nbytes + 1, nbytes), timeout=T).get(timeout=T)
    assert owner.check.call_one(f"c{nbytes}", nbytes + 1, nbytes).get(T)
    if nbytes > 1:  # a smaller source writes a prefix
        buf.write_from(pattern(nbytes + 2, nbytes // 2), timeout=T).get(timeout=T)
        assert owner.check.call_one(f"c{nbytes}", nbytes + 2, nbytes // 2).get(T)
    owner.drop.call_one(f"c{nbytes}").get(T)


@needs_nic
def test_actors_read_and_write_the_controllers_buffer_and_each_other(
    owners: ActorMesh[Owner],
) -> None:
    nbytes = 3 * MIB + 5
    mine = pattern(10, nbytes)
    buf = RDMABuffer(mine, backend="ibverbs")
    try:
        assert at(owners, 1).backend_of.call_one(buf).get(T) == "ibverbs"
        assert at(owners, 1).read.call_one(buf, 10).get(T) == 1
        at(owners, 2).write.call_one(buf, 11, nbytes).get(T)
        assert np.array_equal(mine, pattern(11, nbytes))
    finally:
        buf.drop().get(timeout=T)
    theirs = at(owners, 3).make.call_one("a2a", nbytes, 12).get(T)
    assert at(owners, 0).read.call_one(theirs, 12).get(T) == 1
    at(owners, 1).write.call_one(theirs, 13, nbytes).get(T)
    assert at(owners, 3).check.call_one("a2a", 13, nbytes).get(T)
    at(owners, 3).drop.call_one("a2a").get(T)


@needs_nic
def test_concurrent_reads_from_four_procs_and_a_batch(owners: ActorMesh[Owner]) -> None:
    nbytes = 2 * MIB + 9
    mine = pattern(20, nbytes)
    buf = RDMABuffer(mine, backend="ibverbs")
    try:
        counts = owners.read.call(buf, 20, copies=4).get(T)
        assert sorted(counts.values()) == [4, 4, 4, 4]
    finally:
        buf.drop().get(timeout=T)
    a = at(owners, 0).make.call_one("batch-a", MIB, 21).get(T)
    b = at(owners, 1).make.call_one("batch-b", MIB, 22).get(T)
    dst = np.zeros(MIB, dtype=np.uint8)
    RDMAAction().read_remote(dst, a).write_remote(b, pattern(23, MIB)).submit(timeout=T).get(T)
    assert np.array_equal(dst, pattern(21, MIB))
    assert at(owners, 1).check.call_one("batch-b", 23, MIB).get(T)
    at(owners, 0).drop.call_one("batch-a").get(T)
    at(owners, 1).drop.call_one("batch-b").get(T)


@needs_nic
def test_read_only_memory_is_registered_for_remote_reads_only(owners: ActorMesh[Owner]) -> None:
    buf = at(owners, 2).make.call_one("ro", 2 * MIB, 30, readonly=True).get(T)
    assert buf.writable is False
    dst = np.zeros(2 * MIB, dtype=np.uint8)
    buf.read_into(dst, timeout=T).get(timeout=T)
    assert np.array_equal(dst, pattern(30, 2 * MIB))
    with pytest.raises(ValueError, match="registered read-only"):
        buf.write_from(dst)
    at(owners, 2).drop.call_one("ro").get(T)


@needs_nic
def test_a_stopped_owner_is_not_needed(lone_owner: tuple[ActorMesh[Owner], int]) -> None:
    owner, pid = lone_owner
    nbytes = 16 * MIB
    buf = owner.make.call_one("stopped", nbytes, 40).get(T)
    dst = np.zeros(nbytes, dtype=np.uint8)
    buf.read_into(dst, timeout=T).get(timeout=T)  # connects and fetches the key
    os.kill(pid, signal.SIGSTOP)  # the owner's process (service included) is frozen
    try:
        dst[:] = 0
        buf.read_into(dst, timeout=FAST).get(timeout=FAST)
        assert np.array_equal(dst, pattern(40, nbytes))
        buf.write_from(pattern(41, nbytes), timeout=FAST).get(timeout=FAST)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert owner.check.call_one("stopped", 41, nbytes).get(T)


@needs_nic
def test_a_dropped_buffer_fails_reads_and_writes(lone_owner: tuple[ActorMesh[Owner], int]) -> None:
    owner, _ = lone_owner
    nbytes = 4 * MIB
    buf = owner.make.call_one("gone", nbytes, 50).get(T)
    dst = np.zeros(nbytes, dtype=np.uint8)
    buf.read_into(dst, timeout=T).get(timeout=T)  # the key is cached: the NIC must refuse it
    owner.drop.call_one("gone").get(T)
    err = expect(buf.read_into(dst, timeout=T), RDMABufferDroppedError)
    assert "dropped" in str(err)
    expect(buf.write_from(dst, timeout=T), RDMABufferDroppedError)
    small = owner.make.call_one("gone-small", 100, 51).get(T)  # through the staging region
    owner.drop.call_one("gone-small").get(T)
    expect(small.read_into(np.zeros(100, np.uint8), timeout=T), RDMABufferDroppedError)


@needs_nic
def test_a_killed_owner_fails_transfers(lone_owner: tuple[ActorMesh[Owner], int]) -> None:
    owner, pid = lone_owner
    nbytes = 8 * MIB
    buf = owner.make.call_one("killed", nbytes, 60).get(T)
    dst = np.zeros(nbytes, dtype=np.uint8)
    buf.read_into(dst, timeout=T).get(timeout=T)
    os.kill(pid, signal.SIGKILL)
    wait_exited(pid, FAST)
    err = expect(buf.read_into(dst, timeout=T), RDMAOwnerGoneError)
    assert f"pid {pid}" in str(err)
    expect(buf.write_from(dst, timeout=T), RDMAOwnerGoneError)


@needs_nic
def test_a_transfer_past_its_timeout_fails_and_the_next_one_works(
    owners: ActorMesh[Owner],
) -> None:
    nbytes = 64 * MIB
    buf = at(owners, 3).make.call_one("slow", nbytes, 70).get(T)
    dst = np.zeros(nbytes, dtype=np.uint8)
    err = expect(buf.read_into(dst, timeout=1e-4), RDMATimeoutError)
    assert isinstance(err, TimeoutError)
    buf.read_into(dst, timeout=T).get(timeout=T)
    assert np.array_equal(dst, pattern(70, nbytes))
    at(owners, 3).drop.call_one("slow").get(T)


# -- without a NIC -------------------------------------------------------------------------------


@pytest.mark.skipif(is_ibverbs_available(), reason="checks the refusal on a machine without a NIC")
def test_forcing_ibverbs_without_a_nic_says_why(
    owners: ActorMesh[Owner], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RDMABackendError, match="not usable in this process") as info:
        RDMABuffer(np.zeros(16, np.uint8), backend="ibverbs")
    assert availability().detail in str(info.value)
    buf = at(owners, 0).make.call_one("forced", 64, 80, backend=None).get(T)
    monkeypatch.setenv(_choice.BACKEND_ENV, "ibverbs")
    expect(buf.read_into(np.zeros(64, np.uint8), timeout=T), RDMABackendError)
    monkeypatch.delenv(_choice.BACKEND_ENV)
    at(owners, 0).drop.call_one("forced").get(T)


@pytest.mark.skipif(is_ibverbs_available(), reason="needs a device that fails to open")
def test_a_device_that_fails_to_open_falls_back_to_tcp_once(
    owners: ActorMesh[Owner], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Detection said yes on both sides, but this process's device cannot be opened.

    The buffer's handle is made to look as if it came from another host whose owner has a NIC,
    and this process's detection answer is overridden to "yes"; opening the device then fails
    for real (no NIC here), the transfer moves over TCP with one warning, and later transfers to
    that owner skip ibverbs.
    """
    nbytes = 2 * MIB + 1
    real = at(owners, 1).make.call_one("fallback", nbytes, 90, backend=None).get(T)
    remote = RDMABuffer._from_handle(real._handle._replace(host=OTHER_HOST, ibverbs=True))
    monkeypatch.setattr(_choice, "is_ibverbs_available", lambda: True)
    monkeypatch.setattr(_choice, "_warned", set())
    monkeypatch.setattr(_choice, "_ibverbs_denied", set())
    assert remote.backend == "ibverbs"
    dst = np.zeros(nbytes, dtype=np.uint8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        remote.read_into(dst, timeout=T).get(timeout=T)
        assert np.array_equal(dst, pattern(90, nbytes))
        assert remote.backend == "tcp"  # this owner is skipped from now on
        remote.write_from(pattern(91, nbytes), timeout=T).get(timeout=T)
    shown = [w for w in seen if issubclass(w.category, RDMATcpFallbackWarning)]
    assert len(shown) == 1, [str(w.message) for w in shown]
    assert str(shown[0].message).startswith("RDMA backend 'ibverbs' is not available (")
    assert at(owners, 1).check.call_one("fallback", 91, nbytes).get(T)
    at(owners, 1).drop.call_one("fallback").get(T)
