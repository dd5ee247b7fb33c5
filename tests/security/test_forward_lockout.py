"""Another local user filling a ``PortForwarder``'s listener does not lock its owner out.

The forward's listener is the one socket it opens to unauthenticated peers; it caps connections
per "this process's uid" and "anyone else", the uid of a loopback peer as the kernel says. The
other user is a second uid (``_attacker``) holding connections with the system's Python.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _attacker import Attacker, attacker

from regency.actor import ProcMesh, this_host, this_proc
from regency.job import PortForwarder

pytestmark = pytest.mark.timeout(120)
__all__ = ["attacker"]  # fixtures
SYSTEM_PYTHON = Path("/usr/bin/python3")
# Opens `count` connections to the port, says which got their "ping" echoed, holds them all
# until its stdin closes.
_HOLDER = textwrap.dedent("""
    import json, socket, sys
    port, count = int(sys.argv[1]), int(sys.argv[2])
    held, echoed = [], []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        held.append(conn)
        try:
            conn.sendall(b"ping")
            echoed.append(conn.recv(4) == b"ping")
        except OSError:
            echoed.append(False)
    print(json.dumps(echoed), flush=True)
    sys.stdin.read()
""")


def _echo_server() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


@pytest.fixture
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield mesh
    finally:
        mesh.stop().get(timeout=30)


def test_another_user_filling_the_forward_does_not_lock_the_owner_out(
    attacker: Attacker, procs: ProcMesh
) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the second user to hold connections with")
    server = _echo_server()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    forwarder = this_proc().spawn("forwarder", PortForwarder)
    try:
        forwarder.forward.call_one(
            procs.slice(gpus=0),
            server.getsockname()[1],
            procs.slice(gpus=1),
            f"127.0.0.1:{port}",
            max_connections=2,
        ).get(timeout=60)
        with subprocess.Popen(
            [str(SYSTEM_PYTHON), "-I", "-c", _HOLDER, str(port), "3"],
            user=attacker.name,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        ) as holder:
            assert holder.stdout is not None
            assert holder.stdin is not None
            # the other user got its share and no more
            assert json.loads(holder.stdout.readline()) == [True, True, False]
            mine = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
            for conn in mine:
                conn.sendall(b"mine")
                assert conn.recv(4) == b"mine"
                conn.close()
            holder.stdin.close()
            holder.wait(timeout=30)
    finally:
        forwarder.stop().get(timeout=30)
        server.close()
