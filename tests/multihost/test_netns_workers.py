"""Regency workers on namespace hosts: real addresses, no shared abstract sockets, real cuts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
from _worker_helpers import Failures
from netns import BRIDGE_IP, NetnsCluster

from regency import config
from regency.actor import Actor, SupervisionError, endpoint
from regency.job import attach_to_workers

pytestmark = pytest.mark.timeout(120)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Here(Actor):
    """Reports the address its proc's network namespace uses toward the controller."""

    @endpoint
    def ip(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((BRIDGE_IP, 9))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])


class Counter(Actor):
    """Counts broadcasts; answers with its namespace's address."""

    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def incr(self) -> None:
        self.count += 1

    @endpoint
    def value(self) -> int:
        return self.count

    @endpoint
    def ping(self, other: Here) -> str:
        # A call from one namespace host to an actor on another, over their own addresses.
        return str(other.ip.call_one().get(timeout=30))

    @endpoint
    def wait_on(self, other: Sleeper, flag: str) -> tuple[float, str]:
        """Call ``other`` (on another host) for a long sleep (it creates ``flag`` once under
        way); when that call failed (``time.monotonic()``) and its error."""
        try:
            other.sleep.call_one(flag, 60.0).get(timeout=60)
        except Exception as exc:
            return time.monotonic(), f"{type(exc).__name__}: {exc}"
        return time.monotonic(), "returned"


class Sleeper(Actor):
    """Sleeps when asked."""

    @endpoint
    def sleep(self, flag: str, seconds: float) -> None:
        with open(flag, "w"):
            pass
        time.sleep(seconds)


def test_actors_on_namespace_hosts(hosts_and_workers: tuple[NetnsCluster, list[str]]) -> None:
    cluster, addresses = hosts_and_workers
    hosts = attach_to_workers(addresses, timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        ips = list(procs.spawn("here", Here).ip.call().get(timeout=60).values())
        assert ips == [h.ip for h in cluster.hosts for _ in range(2)]
        counters = procs.spawn("counters", Counter)
        for _ in range(5):
            counters.incr.broadcast()
        values = counters.value.call().get(timeout=60)
        assert list(values.values()) == [5] * len(ips)
        last = len(cluster.hosts) - 1
        assert values.item(hosts=last, gpus=1) == 5
        here = procs.spawn("here2", Here)
        reached = counters.slice(hosts=0, gpus=0).ping.call_one(here.slice(hosts=last, gpus=1))
        assert reached.get(timeout=60) == cluster.hosts[last].ip
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
    # Back on the network, the cut host's worker (which lost its controller too and stopped
    # its procs) serves the next controller.
    assert _serves_a_new_controller(addresses[1], cut.ip)


def test_a_call_between_procs_across_a_cut_fails_within_the_timeout(
    hosts_and_workers: tuple[NetnsCluster, list[str]], failures: Failures, tmp_path: Path
) -> None:
    """Procs send no heartbeats (their hosts answer for them); a proc's call to a proc on a
    host that is cut off fails all the same, by the kernel's keepalive on their connection."""
    cluster, addresses = hosts_and_workers
    with config.configured(heartbeat_interval=0.25, heartbeat_timeout=1.5):
        hosts = attach_to_workers(addresses, timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        caller = procs.spawn("caller", Counter).slice(hosts=0, gpus=0)
        sleeper = procs.spawn("sleeper", Sleeper).slice(hosts=1, gpus=0)
        flag = tmp_path / "sleeping"
        pending = caller.wait_on.call_one(sleeper, str(flag))
        deadline = time.monotonic() + 60
        while not flag.exists():  # the call from host 0 is under way on host 1
            assert time.monotonic() < deadline, "the sleeper never started"
            time.sleep(0.01)
        cluster.cut(cluster.hosts[1])
        cut_at = time.monotonic()
        failed_at, error = pending.get(timeout=60)
        assert error.startswith("SupervisionError"), error
        assert "tcp://" in error, error
        assert "the connection timed out or was reset (the peer did not close it)" in error, error
        # A keepalive probe after 2 s of quiet (the 1.5 s timeout in whole seconds), unanswered
        # 1 s later (the interval, at least 1 s): about 3 s; then slack for a loaded machine.
        assert failed_at - cut_at < 2.0 + 1.0 + 3.0, f"failed after {failed_at - cut_at:.2f} s"
        assert any(addresses[1] in f for f in failures.wait_for(1))
        cluster.restore(cluster.hosts[1])
        procs.stop().get(timeout=30)


NEXT_CONTROLLER = """
import socket, sys
from regency.actor import Actor, endpoint
from regency.job import attach_to_workers

class Here(Actor):
    def __init__(self, bridge: str) -> None:
        self.bridge = bridge

    @endpoint
    def ip(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((self.bridge, 9))
            return str(probe.getsockname()[0])

procs = attach_to_workers([sys.argv[1]], timeout=10).spawn_procs(per_host={"gpus": 1})
here = procs.spawn("here", Here, sys.argv[2])
print("IP", here.ip.call_one().get(timeout=30), flush=True)
procs.stop().get(timeout=30)
"""


def _serves_a_new_controller(address: str, expected_ip: str, within: float = 40.0) -> bool:
    """Run controllers in fresh processes until one is served by ``address`` (a worker refuses
    a second controller until it has given up the first)."""
    deadline = time.monotonic() + within
    outputs = []
    while time.monotonic() < deadline:
        run = subprocess.run(
            [sys.executable, "-c", NEXT_CONTROLLER, address, BRIDGE_IP],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=os.environ.copy(),
        )
        if run.returncode == 0 and f"IP {expected_ip}" in run.stdout:
            return True
        outputs.append(run.stderr[-400:])
        assert "already serves" in run.stderr, outputs[-1]
    raise AssertionError(f"no controller was served within {within} s: {outputs[-1:]}")
