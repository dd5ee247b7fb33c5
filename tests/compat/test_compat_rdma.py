"""monarch.rdma on CPU memory (monarch-api.md §1.5)."""

from __future__ import annotations

import pytest
from compat_impl import actor, rdma
from compat_util import CALL_TIMEOUT

torch = pytest.importorskip("torch")

Actor = actor.Actor
endpoint = actor.endpoint


class Owner(Actor):
    def __init__(self) -> None:
        self.data = torch.arange(16, dtype=torch.uint8)
        self.buffer = rdma.RDMABuffer(self.data)

    @endpoint
    def buf(self):
        return self.buffer

    @endpoint
    def contents(self) -> list[int]:
        return self.data.tolist()

    @endpoint
    def nbytes(self) -> int:
        return self.buffer.size()


class Reader(Actor):
    @endpoint
    def read(self, buf) -> list[int]:
        dst = torch.zeros(buf.size(), dtype=torch.uint8)
        buf.read_into(dst).get()
        return dst.tolist()

    @endpoint
    def write(self, buf, value: int) -> None:
        buf.write_from(torch.full((buf.size(),), value, dtype=torch.uint8)).get()


@pytest.fixture(scope="module")
def owner(procs2):
    mesh = procs2.spawn("rdma_owner", Owner).slice(gpus=0)
    mesh.initialized.get(timeout=CALL_TIMEOUT)
    return mesh


def test_backend_name_is_a_string():
    assert rdma.get_rdma_backend() in ("ibverbs", "tcp", "none", "cma")


def test_is_ibverbs_available_is_bool():
    assert isinstance(rdma.is_ibverbs_available(), bool)


def test_size_zero_is_value_error():
    with pytest.raises(ValueError):
        rdma.RDMABuffer(memoryview(bytearray(0)))


def test_2d_tensor_is_value_error():
    with pytest.raises(ValueError):
        rdma.RDMABuffer(torch.zeros(4, 4))


def test_non_contiguous_tensor_is_value_error():
    with pytest.raises(ValueError):
        rdma.RDMABuffer(torch.zeros(8)[::2])


def test_size_in_bytes():
    assert rdma.RDMABuffer(torch.zeros(8, dtype=torch.float32)).size() == 32
    assert rdma.RDMABuffer(memoryview(bytearray(b"abcdefgh"))).size() == 8


def test_local_read_and_write():
    src = bytearray(b"abcdefgh")
    buf = rdma.RDMABuffer(memoryview(src))
    dst = bytearray(8)
    assert buf.read_into(memoryview(dst)).get(timeout=CALL_TIMEOUT) is None
    assert dst == b"abcdefgh"
    buf.write_from(memoryview(bytearray(b"12345678"))).get(timeout=CALL_TIMEOUT)
    assert src == b"12345678"


def test_read_into_smaller_destination_is_value_error():
    buf = rdma.RDMABuffer(memoryview(bytearray(8)))
    with pytest.raises(ValueError):
        buf.read_into(memoryview(bytearray(4))).get(timeout=CALL_TIMEOUT)


def test_write_from_larger_source_is_value_error():
    buf = rdma.RDMABuffer(memoryview(bytearray(8)))
    with pytest.raises(ValueError):
        buf.write_from(memoryview(bytearray(16))).get(timeout=CALL_TIMEOUT)


def test_read_after_drop_fails():
    buf = rdma.RDMABuffer(memoryview(bytearray(8)))
    assert buf.drop().get(timeout=CALL_TIMEOUT) is None
    with pytest.raises(Exception):
        buf.read_into(memoryview(bytearray(8))).get(timeout=CALL_TIMEOUT)


def test_client_reads_a_remote_buffer(owner):
    buf = owner.buf.call_one().get(timeout=CALL_TIMEOUT)
    assert buf.size() == 16
    dst = torch.zeros(16, dtype=torch.uint8)
    buf.read_into(dst).get(timeout=CALL_TIMEOUT)
    assert dst.tolist() == list(range(16))


def test_client_writes_a_remote_buffer(procs2):
    mesh = procs2.spawn("rdma_w", Owner).slice(gpus=1)
    buf = mesh.buf.call_one().get(timeout=CALL_TIMEOUT)
    buf.write_from(torch.full((16,), 7, dtype=torch.uint8)).get(timeout=CALL_TIMEOUT)
    assert mesh.contents.call_one().get(timeout=CALL_TIMEOUT) == [7] * 16


def test_actor_reads_another_actors_buffer(procs2, owner):
    reader = procs2.spawn("rdma_reader", Reader).slice(gpus=1)
    buf = owner.buf.call_one().get(timeout=CALL_TIMEOUT)
    assert reader.read.call_one(buf).get(timeout=CALL_TIMEOUT) == list(range(16))


def test_rdma_action_batches_reads_and_writes(procs2):
    mesh = procs2.spawn("rdma_act", Owner).slice(gpus=1)
    buf = mesh.buf.call_one().get(timeout=CALL_TIMEOUT)
    dst = torch.zeros(16, dtype=torch.uint8)
    rdma.RDMAAction().read_remote(dst, buf).submit().get(timeout=CALL_TIMEOUT)
    assert dst.tolist() == list(range(16))
    src = torch.full((16,), 3, dtype=torch.uint8)
    rdma.RDMAAction().write_remote(buf, src).submit().get(timeout=CALL_TIMEOUT)
    assert mesh.contents.call_one().get(timeout=CALL_TIMEOUT) == [3] * 16


def test_warning_classes_exported():
    for name in ("RDMAReadTransferWarning", "RDMAWriteTransferWarning", "RDMATcpFallbackWarning"):
        assert issubclass(getattr(rdma, name), Warning)
