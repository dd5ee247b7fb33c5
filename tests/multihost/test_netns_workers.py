"""Regency workers on namespace hosts: real addresses, no shared abstract sockets, real cuts."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import cloudpickle
import pytest
from netns import BRIDGE_IP, NetnsCluster

import regency.actor
from regency import config
from regency.actor import Actor, MeshFailure, SupervisionError, endpoint
from regency.job import attach_to_workers, worker_command, worker_env

pytestmark = pytest.mark.timeout(120)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")


class Here(Actor):
    """Reports the address its proc's network namespace uses toward the controller."""

    @endpoint
    def ip(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((BRIDGE_IP, 9))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])


class Failures:
    """The failures that reach the root, with a way to wait for them."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._cond:
            self.seen.append(str(failure))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 10) -> list[str]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.seen) >= count, timeout), self.seen
            return list(self.seen)


def _start_workers(cluster: NetnsCluster, secret: bytes) -> list[str]:
    """A worker daemon on every namespace host, listening on the host's own address."""
    addresses = []
    for host in cluster.hosts:
        proc = cluster.popen(
            host,
            worker_command(f"tcp://{host.ip}:0"),
            env={**os.environ, **worker_env(secret)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the worker prints it once bound, or exits
        found = LISTENING.search(line)
        assert found, f"worker on {host.netns} printed {line!r} (exit status {proc.poll()})"
        assert found.group(1).startswith(f"tcp://{host.ip}:")
        addresses.append(found.group(1))
    return addresses


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> Failures:
    recorder = Failures()
    monkeypatch.setattr(regency.actor, "unhandled_fault_hook", recorder)
    return recorder


@pytest.fixture
def hosts_and_workers(netns_cluster: NetnsCluster) -> Iterator[tuple[NetnsCluster, list[str]]]:
    secret = os.urandom(32)
    addresses = _start_workers(netns_cluster, secret)
    os.environ["REGENCY_JOB_SECRET"] = secret.hex()
    try:
        yield netns_cluster, addresses
    finally:
        del os.environ["REGENCY_JOB_SECRET"]


def test_actors_on_namespace_hosts(hosts_and_workers: tuple[NetnsCluster, list[str]]) -> None:
    cluster, addresses = hosts_and_workers
    hosts = attach_to_workers(addresses, timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        ips = list(procs.spawn("here", Here).ip.call().get(timeout=60).values())
        assert ips == [h.ip for h in cluster.hosts for _ in range(2)]
    finally:
        procs.stop().get(timeout=30)


def test_cut_host_is_declared_lost_and_the_others_serve_on(
    hosts_and_workers: tuple[NetnsCluster, list[str]], failures: Failures
) -> None:
    cluster, addresses = hosts_and_workers
    with config.configured(heartbeat_interval=0.25, heartbeat_timeout=1.5):
        hosts = attach_to_workers(addresses, timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        here = procs.spawn("here", Here)
        assert len(here.ip.call().get(timeout=60)) == len(cluster.hosts)
        cut = cluster.hosts[1]
        cluster.cut(cut)  # silent: no FIN, no RST, sends still succeed
        start = time.monotonic()
        pending = here.slice(hosts=1).ip.call_one()
        with pytest.raises(SupervisionError) as info:
            pending.get(timeout=30)
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert addresses[1] in message, message
        assert "no heartbeat" in message, message
        assert elapsed < 1.5 + 0.25 + 3.0, f"declared lost after {elapsed:.2f} s"
        assert here.slice(hosts=0).ip.call_one().get(timeout=30) == cluster.hosts[0].ip
        assert here.slice(hosts=2).ip.call_one().get(timeout=30) == cluster.hosts[2].ip
        assert any(addresses[1] in f for f in failures.wait_for(1))
        cluster.restore(cut)
        procs.stop().get(timeout=30)
