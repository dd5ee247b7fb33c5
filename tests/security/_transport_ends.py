"""Two TCP transports of this process talking through an on-path proxy (the attacker's seat)."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Iterator

from _attackers import OnPathProxy

from regency._transport import address, frames
from regency._transport.connection import Connection
from regency._transport.frames import Frame
from regency._transport.transport import Transport

SECRET = os.urandom(32)
LIMIT = 1 << 30


class End:
    """A TCP transport on loopback and what it received or lost."""

    def __init__(self) -> None:
        self.frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.lost: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.transport = Transport(
            "tcp://127.0.0.1:0",
            SECRET,
            self._on_frame,
            lambda peer, reason: self.lost.put(reason),
            frame_limit=LIMIT,
            connect_timeout=5,
        )

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        self.frames.put(b"".join(bytes(p) for p in frame.parts))

    def send(self, peer: str, payload: bytes) -> None:
        """Send ``payload`` as one frame to ``peer``."""
        self.transport.send(peer, frames.encode(1, 5, [payload], seq=0, limit=LIMIT))

    def close(self) -> None:
        self.transport.close()
        self.transport.loop.stop()


@contextlib.contextmanager
def ends_through_proxy() -> Iterator[tuple[End, End, OnPathProxy]]:
    """A dialer, a listener, and a proxy forwarding to the listener (not yet used by anyone)."""
    dialer, listener = End(), End()
    target = (
        address.tcp_host(listener.transport.address),
        address.tcp_port(listener.transport.address),
    )
    proxy = OnPathProxy(target)
    try:
        yield dialer, listener, proxy
    finally:
        proxy.close()
        dialer.close()
        listener.close()


def marker() -> bytes:
    """Bytes that must not appear on the wire where TLS is on: unique to each call."""
    return b"PLAINTEXT-MARKER-" + os.urandom(8).hex().encode()
