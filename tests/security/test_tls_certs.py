"""§1: user-provided certificates (``REGENCY_TLS_*``, ``ca=``/``private_key=``) and a wrong CA.

The worker daemon gets its certificates from ``REGENCY_TLS_{CA,CERT,KEY}``; this controller
passes its own through ``attach_to_workers(ca=..., private_key=...)``. The worker's procs
inherit the worker's identity (bootstrap settings), so an actor call crosses both ways.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import LISTENING, RawWorker, kill_group

from regency._transport import tls
from regency.actor import Actor, endpoint
from regency.job import AttachError, attach_to_workers, worker_command, worker_env

# The workers are on 127.0.0.1: TLS on loopback too, here and in the workers.
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("tls_everywhere")]


class Echo(Actor):
    @endpoint
    def echo(self, value: bytes) -> bytes:
        return value


def _write(directory: Path, name: str, identity: tls.Identity) -> dict[str, Path]:
    paths = {}
    for part, data in (("ca", identity.ca_pem), ("cert", identity.cert_pem)):
        paths[part] = directory / f"{name}-{part}.pem"
        paths[part].write_bytes(data)
    paths["key"] = directory / f"{name}-key.pem"
    paths["key"].write_bytes(identity.key_pem)
    paths["key"].chmod(0o600)
    # private_key= takes the key followed by its certificate
    paths["bundle"] = directory / f"{name}-bundle.pem"
    paths["bundle"].write_bytes(identity.key_pem + identity.cert_pem)
    paths["bundle"].chmod(0o600)
    return paths


@pytest.fixture
def user_identity() -> Iterator[None]:
    try:
        yield
    finally:
        tls.set_user_identity(None)


def _worker(secret: bytes, files: dict[str, Path]) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        **worker_env(secret),
        tls.CA_ENV: str(files["ca"]),
        tls.CERT_ENV: str(files["cert"]),
        tls.KEY_ENV: str(files["key"]),
        tls.ENABLE_ENV: "all",
    }
    return subprocess.Popen(
        worker_command("tcp://127.0.0.1:0"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _address(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    found = LISTENING.search(line)
    assert found, f"worker printed {line!r}"
    return found.group(1)


def _stop(proc: subprocess.Popen[bytes]) -> str:
    kill_group(proc.pid)
    _, err = proc.communicate(timeout=10)
    return err.decode(errors="replace")


@pytest.mark.usefixtures("user_identity")
def test_user_provided_certificates_carry_calls_both_ways(tmp_path: Path) -> None:
    identity, ca_key = tls.generate_ca_and_leaf("worker")
    worker_files = _write(tmp_path, "worker", identity)
    # The controller's own leaf, signed by the same CA.
    mine, _ = tls.leaf_signed_by((identity.ca_pem, ca_key), "controller")
    controller_files = _write(tmp_path, "controller", mine)
    secret = os.urandom(32)
    proc = _worker(secret, worker_files)
    try:
        hosts = attach_to_workers(
            [_address(proc)],
            ca=controller_files["ca"],
            private_key=controller_files["bundle"],
            secret=secret,
            timeout=30,
        )
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        try:
            actor = procs.spawn("echo", Echo)
            assert actor.echo.call_one(b"through user certs").get(timeout=60) == (
                b"through user certs"
            )
        finally:
            procs.stop().get(timeout=30)
    finally:
        _stop(proc)


@pytest.mark.usefixtures("user_identity")
def test_a_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    worker_identity, _ = tls.generate_ca_and_leaf("worker")
    intruder, _ = tls.generate_ca_and_leaf("intruder")
    worker_files = _write(tmp_path, "worker", worker_identity)
    intruder_files = _write(tmp_path, "intruder", intruder)
    secret = os.urandom(32)  # the right secret: only the certificate is wrong
    proc = _worker(secret, worker_files)
    try:
        worker = RawWorker(proc, _address(proc))
        with pytest.raises(AttachError, match="another CA"):
            attach_to_workers(
                [worker.address],
                ca=intruder_files["ca"],
                private_key=intruder_files["bundle"],
                secret=secret,
                timeout=10,
            )
        line = worker.wait_for_log("rejected a connection")
        assert "TLS handshake failed" in line, line
    finally:
        _stop(proc)


def test_generated_per_job_certificates_are_the_same_in_every_process() -> None:
    secret = os.urandom(32)
    here = tls.derived_identity(secret)
    there = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from regency._transport import tls; "
            "sys.stdout.buffer.write(tls.derived_identity(bytes.fromhex(sys.argv[1])).ca_pem)",
            secret.hex(),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert there == here.ca_pem
    assert tls.derived_identity(os.urandom(32)).ca_pem != here.ca_pem
