"""``PortForwarder`` and ``shell`` across namespace hosts: a loopback-only service on another host
reached through a local port, and a shell that runs on the host it was asked for."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from netns import NetnsCluster

from regency.actor import this_proc
from regency.job import PortForwarder, attach_to_workers

pytestmark = pytest.mark.timeout(180)

SRC = str(Path(__file__).resolve().parents[2] / "src")
# A service that only listens on its host's loopback: it greets with its namespace, then echoes.
_SERVICE = textwrap.dedent("""
    import socket, sys, threading
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    def serve(conn):
        with conn:
            conn.sendall(sys.argv[1].encode() + b"|")
            while data := conn.recv(65536):
                conn.sendall(data)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
""")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_local_port_reaches_a_loopback_service_on_a_namespace_host(
    hosts_and_workers: tuple[NetnsCluster, list[str]],
) -> None:
    cluster, addresses = hosts_and_workers
    host = cluster.hosts[1]
    service = cluster.popen(
        host,
        [sys.executable, "-c", _SERVICE, host.netns],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert service.stdout is not None
    service_port = int(service.stdout.readline())
    hosts = attach_to_workers(addresses, timeout=30)
    procs = hosts.slice(hosts=1).spawn_procs()
    forwarder = this_proc().spawn("forwarder", PortForwarder)
    try:
        local_port = _free_port()
        forwarder.forward.call_one(procs, service_port, this_proc(), f"127.0.0.1:{local_port}").get(
            timeout=60
        )
        payload = os.urandom(1 << 20)
        with socket.create_connection(("127.0.0.1", local_port), timeout=30) as conn:
            greeting = conn.recv(len(host.netns) + 1)
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            echoed = b"".join(iter(lambda: conn.recv(65536), b""))
        assert greeting == host.netns.encode() + b"|"
        assert echoed == payload
    finally:
        forwarder.stop().get(timeout=30)
        procs.stop().get(timeout=30)


def test_shell_runs_on_the_namespace_host_it_was_given(
    hosts_and_workers: tuple[NetnsCluster, list[str]],
) -> None:
    cluster, addresses = hosts_and_workers
    code = textwrap.dedent(f"""
        import sys
        from regency.job import attach_to_workers, shell
        hosts = attach_to_workers({addresses!r}, timeout=30)
        status = shell(hosts.slice(hosts=2), env={{"SHELL": "/bin/sh"}})
        print(f"STATUS={{status}}", file=sys.stderr)
    """)
    # stdin stays open until the shell exits by itself: its end would hang the shell up
    read_end, write_end = os.pipe()
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=read_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    ) as child:
        os.close(read_end)
        os.write(write_end, b"ip -4 -o addr show; exit 3\n")
        try:
            stdout, stderr = child.communicate(timeout=120)
        finally:
            os.close(write_end)
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    assert "STATUS=3" in err, err[-3000:]
    assert f"inet {cluster.hosts[2].ip}/" in out
    assert f"inet {cluster.hosts[0].ip}/" not in out
