"""RDMABuffer between network-namespace hosts: the TCP backend over real links, and a cut link."""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any

import cloudpickle
import numpy as np
import pytest
from netns import NetnsCluster

from regency.actor import Actor, endpoint, this_host
from regency.job import attach_to_workers
from regency.rdma import RDMABuffer, RDMAError

pytestmark = pytest.mark.timeout(120)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIB = 1 << 20
NBYTES = 8 * MIB + 123  # not a multiple of any chunk size


def random_bytes(seed: int, nbytes: int = NBYTES) -> Any:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def digest(array: Any) -> str:
    return hashlib.sha256(memoryview(array)).hexdigest()


class Owner(Actor):
    """Holds arrays and exposes them as buffers served over TCP."""

    def __init__(self) -> None:
        self.arrays: dict[int, Any] = {}

    @endpoint
    def make(self, seed: int) -> RDMABuffer:
        self.arrays[seed] = random_bytes(seed)
        return RDMABuffer(self.arrays[seed], backend="tcp")

    @endpoint
    def digest(self, seed: int) -> str:
        return digest(self.arrays[seed])


class Peer(Actor):
    """Reads and writes another host's buffer."""

    @endpoint
    def read(self, buf: RDMABuffer) -> str:
        local = np.zeros(NBYTES, np.uint8)
        buf.read_into(local, timeout=60).get(timeout=70)
        return digest(local)

    @endpoint
    def write(self, buf: RDMABuffer, seed: int) -> str:
        local = random_bytes(seed)
        buf.write_from(local, timeout=60).get(timeout=70)
        return digest(local)


def test_buffers_move_between_namespace_hosts_over_tcp(
    hosts_and_workers: tuple[NetnsCluster, list[str]],
) -> None:
    _, addresses = hosts_and_workers
    procs = attach_to_workers(addresses, timeout=30).spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner", Owner).slice(hosts=0, gpus=0)
        peer = procs.spawn("peer", Peer).slice(hosts=1, gpus=0)
        buf = owner.make.call_one(7).get(timeout=60)
        assert buf.backend == "tcp"
        assert peer.read.call_one(buf).get(timeout=90) == digest(random_bytes(7))
        written = peer.write.call_one(buf, 8).get(timeout=90)
        assert owner.digest.call_one(7).get(timeout=60) == written == digest(random_bytes(8))
        # The controller, outside every namespace, reads over the bridge too.
        local = np.zeros(NBYTES, np.uint8)
        buf.read_into(local, timeout=60).get(timeout=70)
        assert digest(local) == written
        buf.drop().get(timeout=30)
    finally:
        procs.stop().get(timeout=30)


def test_a_transfer_from_a_cut_off_host_fails_within_its_timeout(
    hosts_and_workers: tuple[NetnsCluster, list[str]],
) -> None:
    cluster, addresses = hosts_and_workers
    procs = attach_to_workers(addresses, timeout=30).spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner", Owner).slice(hosts=0, gpus=0)
        buf = owner.make.call_one(9).get(timeout=60)
        local = np.zeros(NBYTES, np.uint8)
        buf.read_into(local, timeout=60).get(timeout=70)  # connected and authenticated
        with cluster.cut_off(0):
            local[:] = 0
            started = time.monotonic()
            with pytest.raises(RDMAError):
                buf.read_into(local, timeout=2).get(timeout=30)
            assert time.monotonic() - started < 10
    finally:
        procs.stop().get(timeout=30)


def test_a_buffer_owned_on_the_controllers_machine_is_read_from_a_namespace_host(
    hosts_and_workers: tuple[NetnsCluster, list[str]],
) -> None:
    _, addresses = hosts_and_workers
    remote = attach_to_workers(addresses, timeout=30).spawn_procs(per_host={"gpus": 1})
    local = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = local.spawn("owner", Owner)
        peer = remote.spawn("peer", Peer).slice(hosts=2, gpus=0)
        buf = owner.make.call_one(11).get(timeout=60)
        # The owner serves every interface of this machine: the peer dials it on the address
        # its host reaches the controller by.
        assert peer.read.call_one(buf).get(timeout=90) == digest(random_bytes(11))
        written = peer.write.call_one(buf, 12).get(timeout=90)
        assert owner.digest.call_one(11).get(timeout=60) == written
    finally:
        local.stop().get(timeout=30)
        remote.stop().get(timeout=30)
