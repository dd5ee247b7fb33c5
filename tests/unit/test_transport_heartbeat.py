"""Heartbeats: a TCP peer that falls silent (no FIN, no RST) is declared lost."""

from __future__ import annotations

import os
import queue
import socket
import time

import pytest

from regency._transport import address, frames, routing
from regency._transport.auth import dialer_handshake
from regency._transport.transport import Transport

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)


def test_silent_tcp_peer_is_lost_after_the_timeout_and_got_heartbeats() -> None:
    lost: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    transport = Transport(
        "tcp://127.0.0.1:0",
        SECRET,
        lambda conn, frame: None,
        lambda peer, reason: lost.put((peer, reason)),
        frame_limit=1 << 20,
        connect_timeout=5,
        heartbeat=lambda: (0.1, 0.5),
    )
    try:
        sock = address.dial(transport.address, timeout=5)
        sock.sendall(routing.preamble(""))
        dialer_handshake(sock, SECRET, "tcp://127.0.0.1:9/silent")
        start = time.monotonic()
        peer, reason = lost.get(timeout=10)  # the raw peer never sends a byte after this
        elapsed = time.monotonic() - start
        assert peer == "tcp://127.0.0.1:9/silent"
        assert "no heartbeat from tcp://127.0.0.1:9/silent" in reason
        assert 0.4 <= elapsed < 3, elapsed
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        beat = frames.HEADER.size
        assert len(received) >= 2 * beat, "heartbeats flowed while the peer was silent"
        assert len(received) % beat == 0
        assert all(received[i + 8] == frames.KIND_HEARTBEAT for i in range(0, len(received), beat))
        sock.close()
    finally:
        transport.close()
        transport.loop.stop()


def test_tcp_sockets_get_keepalive_and_a_user_timeout() -> None:
    with socket.socket() as sock:
        address.tune_tcp(sock, 1.0, 5.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
