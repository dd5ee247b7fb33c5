"""§1 across real hosts: an on-path relay between the controller and a namespace host's worker.

The worker runs in network namespace ``rgy-h0`` (10.200.0.10); the relay listens on the bridge
address of the root namespace (10.200.0.1), so the traffic crosses the bridge as it would cross
a switch. The controller's settings travel in the attach request: with TLS (the default between
hosts) a marker among them never shows on the wire; the control without TLS shows it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest
from _attackers import OnPathProxy
from netns import BRIDGE_IP, NetnsCluster, unavailable_reason

from regency import config
from regency._transport import address, tls
from regency.job import attach_to_workers, worker_command, worker_env

pytestmark = pytest.mark.timeout(120)
LISTENING = re.compile(r"regency worker listening on (tcp://\S+)")


@pytest.fixture
def cluster() -> Iterator[NetnsCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(1) as made:
        yield made


def _attach_through_relay(cluster: NetnsCluster, tls_on: bool) -> bytes:
    secret = os.urandom(32)
    host = cluster.hosts[0]
    env = {**os.environ, **worker_env(secret), tls.ENABLE_ENV: "1" if tls_on else "0"}
    proc = cluster.popen(
        host,
        worker_command(f"tcp://{host.ip}:0"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    found = LISTENING.search(proc.stdout.readline())
    assert found
    worker = found.group(1)
    relay = OnPathProxy((address.tcp_host(worker), address.tcp_port(worker)), host=BRIDGE_IP)
    marker = "MARKER-" + os.urandom(8).hex()
    tls.force_enabled(tls_on)
    try:
        with config.configured(file_log_level=marker):
            hosts = attach_to_workers([relay.address], secret=secret, timeout=30)
            hosts.shutdown().get(timeout=30)
    finally:
        tls.force_enabled(None)
        relay.close()
    wire = bytes(relay.upstream) + bytes(relay.downstream)
    assert len(relay.upstream) > 200, "nothing crossed the relay"
    return wire if marker.encode() in wire else b""


def test_between_hosts_an_on_path_relay_sees_no_plaintext(cluster: NetnsCluster) -> None:
    assert _attach_through_relay(cluster, tls_on=True) == b""


def test_control_without_tls_the_relay_reads_the_settings(cluster: NetnsCluster) -> None:
    assert _attach_through_relay(cluster, tls_on=False) != b""
