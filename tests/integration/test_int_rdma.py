"""One-sided transfers between real processes: every backend, both directions, many sizes.

The controller and four procs exchange random data through ``RDMABuffer``s: the controller reads
and writes buffers that actors own, actors read and write the controller's buffers and each
other's, with each backend forced in turn (``cma``, ``shm``, ``tcp``). Data are random with a
period that is not a multiple of any chunk size, so a chunk landing at the wrong offset shows.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest

from regency.actor import Actor, ActorMesh, ProcMesh, endpoint
from regency.rdma import (
    RDMAAction,
    RDMABuffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

pytestmark = pytest.mark.timeout(90)

T = 30.0
KIB = 1 << 10
MIB = 1 << 20
BACKENDS = ["cma", "shm", "tcp"]
_PERIOD = MIB + 7  # not a multiple of any chunk size


def pattern(seed: int, nbytes: int) -> np.ndarray:
    """Random bytes; large sizes repeat a random block of an odd length (fast to make)."""
    rng = np.random.default_rng(seed)
    if nbytes <= _PERIOD:
        return rng.integers(0, 256, nbytes, dtype=np.uint8)
    return np.resize(rng.integers(0, 256, _PERIOD, dtype=np.uint8), nbytes)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.nbytes != b.nbytes:
        return False
    if a.nbytes % 8 == 0:
        return bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    return bool(np.array_equal(a, b))


def as_array(obj: Any) -> np.ndarray:
    """A uint8 numpy view of any registered or destination object."""
    if isinstance(obj, np.ndarray):
        return obj.view(np.uint8)
    if type(obj).__module__.startswith("torch"):
        return obj.cpu().numpy().view(np.uint8)  # a view for CPU tensors, a copy for CUDA ones
    return np.frombuffer(obj, dtype=np.uint8)


def make_object(data: np.ndarray, kind: str) -> Any:
    """``data`` as a fresh object of ``kind``."""
    if kind == "numpy":
        return data.copy()
    if kind == "torch":
        import torch

        return torch.from_numpy(data.copy())
    if kind == "cuda":
        import torch

        return torch.from_numpy(data.copy()).cuda()
    if kind == "bytearray":
        return bytearray(data.tobytes())
    if kind == "memoryview":
        return memoryview(bytearray(data.tobytes()))
    if kind == "bytes":
        return data.tobytes()
    raise AssertionError(kind)


class Peer(Actor):
    """Owns buffers, reads and writes other processes' buffers."""

    def __init__(self) -> None:
        self.mem: dict[str, Any] = {}
        self.bufs: dict[str, RDMABuffer] = {}

    @endpoint
    def make(
        self, key: str, nbytes: int, seed: int, kind: str = "numpy", backend: str | None = None
    ) -> RDMABuffer:
        self.mem[key] = make_object(pattern(seed, nbytes), kind)
        self.bufs[key] = RDMABuffer(self.mem[key], backend=backend)
        return self.bufs[key]

    @endpoint
    def check(self, key: str, seed: int, nbytes: int) -> bool:
        return same(as_array(self.mem[key])[:nbytes], pattern(seed, nbytes))

    @endpoint
    def forget(self, key: str) -> None:
        self.bufs.pop(key).drop().get(timeout=T)
        del self.mem[key]

    @endpoint
    def read(self, buf: RDMABuffer, seed: int, copies: int = 1) -> int:
        """Read ``buf`` ``copies`` times at once; how many copies hold the expected bytes."""
        dsts = [np.empty(buf.size(), dtype=np.uint8) for _ in range(copies)]
        futures = [buf.read_into(dst, timeout=T) for dst in dsts]
        for future in futures:
            future.get(timeout=T)
        expected = pattern(seed, buf.size())
        return sum(same(dst, expected) for dst in dsts)

    @endpoint
    def write(self, buf: RDMABuffer, seed: int, nbytes: int) -> None:
        buf.write_from(pattern(seed, nbytes), timeout=T).get(timeout=T)

    @endpoint
    def backend_of(self, buf: RDMABuffer) -> str:
        return buf.backend

    @endpoint
    def echo(self, buf: RDMABuffer) -> RDMABuffer:
        return buf

    @endpoint
    def hold(self, key: str, timeout: float) -> bool:
        """Block this actor until a remote writer sets the last byte to 0xA5."""
        mem = as_array(self.mem[key])
        mem[:] = 0x5A  # tells the reader that the handler is running
        deadline = time.monotonic() + timeout
        while mem[-1] != 0xA5:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def peers(procs4: ProcMesh) -> ActorMesh[Peer]:
    return procs4.spawn("peers", Peer)


def at(peers: ActorMesh[Peer], rank: int) -> Any:
    return peers.slice(gpus=rank)


def fresh(nbytes: int, kind: str = "numpy") -> Any:
    return make_object(np.zeros(nbytes, dtype=np.uint8), kind)


# -- sizes, directions, backends ---------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_controller_reads_and_writes_an_actors_buffer(peers: ActorMesh[Peer], backend: str) -> None:
    owner = at(peers, 0)
    for i, nbytes in enumerate([1, 4 * KIB, MIB]):
        buf = owner.make.call_one(f"c{backend}{i}", nbytes, seed=i, backend=backend).get(T)
        assert buf.size() == nbytes
        assert buf.backend == backend
        assert buf.owner == "<root>.<test_int_rdma.Peer peers{'gpus': 0/4}>"
        dst = fresh(nbytes)
        buf.read_into(dst).get(timeout=T)
        assert same(dst, pattern(i, nbytes))
        buf.write_from(pattern(100 + i, nbytes)).get(timeout=T)
        assert owner.check.call_one(f"c{backend}{i}", 100 + i, nbytes).get(T)
        if nbytes > 1:  # a smaller source writes a prefix
            buf.write_from(pattern(200 + i, nbytes // 2)).get(timeout=T)
            assert owner.check.call_one(f"c{backend}{i}", 200 + i, nbytes // 2).get(T)
        owner.forget.call_one(f"c{backend}{i}").get(T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_64_mib_both_ways(peers: ActorMesh[Peer], backend: str) -> None:
    owner = at(peers, 1)
    nbytes = 64 * MIB
    buf = owner.make.call_one("big", nbytes, seed=7, backend=backend).get(T)
    dst = fresh(nbytes)
    buf.read_into(dst).get(timeout=T)
    assert same(dst, pattern(7, nbytes))
    buf.write_from(pattern(8, nbytes)).get(timeout=T)
    assert owner.check.call_one("big", 8, nbytes).get(T)
    owner.forget.call_one("big").get(T)


def test_256_mib_over_cross_memory_attach(peers: ActorMesh[Peer]) -> None:
    owner = at(peers, 2)
    nbytes = 256 * MIB
    buf = owner.make.call_one("huge", nbytes, seed=9, backend="cma").get(T)
    dst = fresh(nbytes)
    buf.read_into(dst).get(timeout=T)
    assert same(dst, pattern(9, nbytes))
    src = pattern(10, nbytes)
    buf.write_from(src).get(timeout=T)
    assert owner.check.call_one("huge", 10, nbytes).get(T)
    owner.forget.call_one("huge").get(T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_actors_read_and_write_the_controllers_buffer(peers: ActorMesh[Peer], backend: str) -> None:
    nbytes = MIB + 3
    mine = pattern(11, nbytes)
    buf = RDMABuffer(mine, backend=backend)
    assert buf.owner == "<root>"
    try:
        assert at(peers, 3).backend_of.call_one(buf).get(T) == backend
        assert at(peers, 3).read.call_one(buf, 11).get(T) == 1
        at(peers, 2).write.call_one(buf, 12, nbytes).get(T)
        assert same(mine, pattern(12, nbytes))
    finally:
        buf.drop().get(timeout=T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_actor_to_actor(peers: ActorMesh[Peer], backend: str) -> None:
    nbytes = 3 * MIB + 1
    buf = at(peers, 0).make.call_one("a2a", nbytes, seed=13, backend=backend).get(T)
    assert at(peers, 1).read.call_one(buf, 13).get(T) == 1
    at(peers, 2).write.call_one(buf, 14, nbytes).get(T)
    assert at(peers, 0).check.call_one("a2a", 14, nbytes).get(T)
    assert at(peers, 3).read.call_one(buf, 14).get(T) == 1
    at(peers, 0).forget.call_one("a2a").get(T)


# -- memory kinds --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "torch", "bytearray", "memoryview", "bytes"])
def test_every_kind_of_memory_registers_and_receives(peers: ActorMesh[Peer], kind: str) -> None:
    nbytes = 64 * KIB + 5
    owner = at(peers, 1)
    buf = owner.make.call_one(f"kind-{kind}", nbytes, seed=21, kind=kind).get(T)
    assert buf.writable is (kind != "bytes")
    if kind != "bytes":  # a destination must be writable
        dst = fresh(nbytes, kind)
        buf.read_into(dst).get(timeout=T)
        assert same(as_array(dst), pattern(21, nbytes))
        buf.write_from(make_object(pattern(22, nbytes), kind)).get(timeout=T)
        assert owner.check.call_one(f"kind-{kind}", 22, nbytes).get(T)
    else:
        dst = fresh(nbytes)
        buf.read_into(dst).get(timeout=T)
        assert same(dst, pattern(21, nbytes))
    owner.forget.call_one(f"kind-{kind}").get(T)


def test_torch_tensor_of_floats_in_the_controller(peers: ActorMesh[Peer]) -> None:
    import torch

    weights = torch.arange(1 << 16, dtype=torch.float32)
    buf = RDMABuffer(weights)
    assert buf.size() == weights.numel() * 4
    data = weights.numpy().view(np.uint8).copy()
    try:
        # The actor checks the bytes it reads against what it is told to expect.
        dst = torch.zeros_like(weights)
        buf.read_into(dst).get(timeout=T)
        assert torch.equal(dst, weights)
        at(peers, 0).write.call_one(buf, 5, buf.size()).get(T)
        assert same(weights.numpy().view(np.uint8), pattern(5, buf.size()))
        assert not same(weights.numpy().view(np.uint8), data)
    finally:
        buf.drop().get(timeout=T)


# -- concurrency and batches ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_concurrent_transfers_to_one_buffer_from_four_procs(
    peers: ActorMesh[Peer], backend: str
) -> None:
    nbytes = 2 * MIB + 9
    mine = pattern(31, nbytes)
    buf = RDMABuffer(mine, backend=backend)
    try:
        counts = peers.read.call(buf, 31, copies=4).get(T)
        assert sorted(counts.values()) == [4, 4, 4, 4]
        # Four writers of the same bytes at once: the result is those bytes.
        peers.write.call(buf, 32, nbytes).get(T)
        assert same(mine, pattern(32, nbytes))
    finally:
        buf.drop().get(timeout=T)


def test_rdma_action_batches_reads_and_writes(peers: ActorMesh[Peer]) -> None:
    n = 512 * KIB + 1
    sources = [at(peers, r).make.call_one(f"act{r}", n, seed=40 + r).get(T) for r in range(4)]
    dst0, dst1 = fresh(n), fresh(n)
    action = (
        RDMAAction()
        .read_remote(dst0, sources[0])
        .read_remote(dst1, sources[1])
        .write_remote(sources[2], pattern(50, n))
        .write_remote(sources[3], pattern(51, n))
    )
    assert len(action) == 4
    action.submit(timeout=T).get(timeout=T)
    assert same(dst0, pattern(40, n))
    assert same(dst1, pattern(41, n))
    assert at(peers, 2).check.call_one("act2", 50, n).get(T)
    assert at(peers, 3).check.call_one("act3", 51, n).get(T)
    # Submitting again runs the batch again.
    dst0[:] = 0
    action.submit(timeout=T).get(timeout=T)
    assert same(dst0, pattern(40, n))
    for r in range(4):
        at(peers, r).forget.call_one(f"act{r}").get(T)


# -- one-sidedness and handles in messages -------------------------------------------------------


@pytest.mark.parametrize("backend", ["cma", "tcp"])
def test_transfers_need_nothing_from_a_blocked_owner(peers: ActorMesh[Peer], backend: str) -> None:
    owner = at(peers, 3)
    nbytes = MIB
    buf = owner.make.call_one("blocked", nbytes, seed=60, backend=backend).get(T)
    blocked = owner.hold.call_one("blocked", T)
    dst = fresh(nbytes)
    deadline = time.monotonic() + T
    while not (dst == 0x5A).all():  # reads made while the handler runs show its first write
        assert time.monotonic() < deadline, "the owner's handler never started"
        buf.read_into(dst).get(timeout=T)
    queued = owner.pid.call_one()
    with pytest.raises(TimeoutError):
        queued.get(timeout=0.2)  # the actor is busy: its mailbox is not being served
    buf.read_into(dst).get(timeout=T)
    assert (dst == 0x5A).all()
    buf.write_from(np.full(nbytes, 0xA5, dtype=np.uint8)).get(timeout=T)
    assert blocked.get(timeout=T) is True  # the handler saw the write while it was blocked
    assert queued.get(timeout=T) > 0
    owner.forget.call_one("blocked").get(T)


def test_buffers_travel_in_messages_and_come_home(peers: ActorMesh[Peer]) -> None:
    nbytes = 100 * KIB
    mine = pattern(70, nbytes)
    buf = RDMABuffer(mine)
    try:
        back = at(peers, 1).echo.call_one(buf).get(T)
        assert back == buf
        assert hash(back) == hash(buf)
        assert back.backend == "cma"  # what peers on this host use; here it is a plain copy
        dst = fresh(nbytes)
        back.read_into(dst).get(timeout=T)
        assert same(dst, mine)
        theirs = at(peers, 2).make.call_one("home", nbytes, seed=71).get(T)
        assert at(peers, 2).read.call_one(theirs, 71).get(T) == 1
        at(peers, 2).forget.call_one("home").get(T)
    finally:
        buf.drop().get(timeout=T)


def test_backend_discovery_and_forcing(
    peers: ActorMesh[Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without an RDMA NIC (as on the CI machine) CMA is the best backend.
    assert get_rdma_backend() == ("ibverbs" if is_ibverbs_available() else "cma")
    assert is_rdma_available() is True
    buf = at(peers, 0).make.call_one("disc", 4 * KIB, seed=80).get(T)
    assert buf.backend == "cma"
    for forced in ("shm", "tcp"):
        monkeypatch.setenv("REGENCY_RDMA_BACKEND", forced)
        assert buf.backend == forced
        dst = fresh(4 * KIB)
        buf.read_into(dst).get(timeout=T)
        assert same(dst, pattern(80, 4 * KIB))
    at(peers, 0).forget.call_one("disc").get(T)


# -- GPU memory (runs only where CUDA is present) ------------------------------------------------


def test_cuda_tensors_same_host_ipc_and_staged_tcp(peers: ActorMesh[Peer]) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    n = 8 * MIB + 3
    for i, backend in enumerate([None, "tcp"]):
        key = f"gpu{i}"
        buf = at(peers, 0).make.call_one(key, n, 110 + i, kind="cuda", backend=backend).get(T)
        assert buf.backend == ("cuda_ipc" if backend is None else "tcp")
        host = fresh(n)
        buf.read_into(host).get(timeout=T)
        assert same(host, pattern(110 + i, n))
        device = torch.zeros(n, dtype=torch.uint8, device="cuda")
        buf.read_into(device).get(timeout=T)
        assert same(device.cpu().numpy(), pattern(110 + i, n))
        buf.write_from(torch.from_numpy(pattern(120 + i, n)).cuda()).get(timeout=T)
        assert at(peers, 0).check.call_one(key, 120 + i, n).get(T)
        buf.write_from(pattern(130 + i, n)).get(timeout=T)
        assert at(peers, 0).check.call_one(key, 130 + i, n).get(T)
        at(peers, 0).forget.call_one(key).get(T)
    mine = torch.from_numpy(pattern(140, n)).cuda()
    buf = RDMABuffer(mine)
    try:
        assert at(peers, 1).read.call_one(buf, 140).get(T) == 1
        at(peers, 2).write.call_one(buf, 141, n).get(T)
        assert same(mine.cpu().numpy(), pattern(141, n))
    finally:
        buf.drop().get(timeout=T)
