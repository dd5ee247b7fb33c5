"""The shared-CA relay between real hosts: a worker in namespace ``rgy-h0`` (10.200.0.10),
the controller in the root namespace, the relay on the bridge address (10.200.0.1) holding a
leaf of the CA both ends use (``REGENCY_TLS_CA``/``CERT``/``KEY`` on the worker, ``ca=``/
``private_key=`` on the controller).

The relay terminates TLS on both sides and relays the secret handshake unchanged; the handshake
is bound to each TLS channel, so the worker refuses it, the controller's attach fails naming the
refusal, and nothing of the relay's reaches the worker. Attaching straight to the worker works.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _tls_relay import TLSRelay
from _worker_helpers import LISTENING, RawWorker
from netns import BRIDGE_IP, NetnsCluster, unavailable_reason

from regency._transport import address, frames, tls
from regency.job import AttachError, attach_to_workers, worker_command, worker_env

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster() -> Iterator[NetnsCluster]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(1) as made:
        yield made


def _files(directory: Path, identity: tls.Identity) -> dict[str, str]:
    """The worker's ``REGENCY_TLS_*`` settings, its PEM files written under ``directory``."""
    paths = {}
    for env, data in (
        (tls.CA_ENV, identity.ca_pem),
        (tls.CERT_ENV, identity.cert_pem),
        (tls.KEY_ENV, identity.key_pem),
    ):
        path = directory / f"{env.lower()}.pem"
        path.write_bytes(data)
        path.chmod(0o600)
        paths[env] = str(path)
    return paths


def test_a_relay_between_hosts_holding_a_leaf_of_the_shared_ca_is_refused(
    cluster: NetnsCluster, tmp_path: Path
) -> None:
    worker_leaf, ca_key = tls.generate_ca_and_leaf("worker")
    controller_leaf, _ = tls.leaf_signed_by((worker_leaf.ca_pem, ca_key), "controller")
    relay_leaf, _ = tls.leaf_signed_by((worker_leaf.ca_pem, ca_key), "relay")
    secret = os.urandom(32)
    host = cluster.hosts[0]
    proc = cluster.popen(
        host,
        worker_command(f"tcp://{host.ip}:0"),
        env={**os.environ, **worker_env(secret), **_files(tmp_path, worker_leaf)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    found = LISTENING.search(proc.stdout.readline().decode())
    assert found
    worker = RawWorker(proc, found.group(1))
    forged = b"".join(bytes(b) for b in frames.encode(1, 5, [b"FORGED"], seq=0, limit=1 << 20))
    target = (address.tcp_host(worker.address), address.tcp_port(worker.address))
    relay = TLSRelay(target, relay_leaf, forged, BRIDGE_IP)
    # private_key= takes the key followed by its certificate
    mine = {
        "ca": controller_leaf.ca_pem,
        "private_key": controller_leaf.key_pem + controller_leaf.cert_pem,
    }
    try:
        with pytest.raises(AttachError) as refused:
            attach_to_workers([relay.address], secret=secret, timeout=20, **mine)
        assert relay.done.wait(20)
        # Without the binding: "relayed" (both ends accepted, the forged frame went in).
        assert relay.outcome == "refused by the listener", relay.outcome
        assert "refused this process's proof" in str(refused.value)
        assert "a relay holding a certificate of the same CA" in str(refused.value)
        line = worker.wait_for_log("rejected a connection from 10.200.0.1")
        assert "a proof relayed from another TLS channel" in line, line
        # The legitimate path: straight to the worker, with the same certificates.
        hosts = attach_to_workers([worker.address], secret=secret, timeout=30, **mine)
        hosts.shutdown().get(timeout=30)
    finally:
        relay.close()
        tls.set_user_identity(None)
