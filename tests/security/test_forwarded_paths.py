"""§6 out-of-cluster path: a forwarded port keeps TLS, cannot be downgraded, and reverse
connections nobody asked for are refused.

A forward (``kubectl port-forward``) delivers a remote controller's connections to a worker's
*loopback*, where TLS does not apply by default. The dialer's preamble asks for TLS, and the
listener goes along; ``OnPathProxy`` plays the forward (and the attacker on it).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator

import pytest
from _attackers import OnPathProxy
from _transport_ends import LIMIT, SECRET, End, ends_through_proxy, marker

from regency._transport import address, frames, routing
from regency._transport.transport import PeerUnreachableError

pytestmark = pytest.mark.timeout(60)

# The worker's address as the controller names it: another host (TLS applies to it), reached
# only through the forward (never dialed itself: TEST-NET-2).
NAMED = "tcp://198.51.100.7:26600"


@pytest.fixture
def forwarded() -> Iterator[tuple[End, End, OnPathProxy]]:
    """A dialer that reaches ``NAMED`` through a forward to a listener on loopback."""
    with ends_through_proxy() as (dialer, listener, proxy):
        dialer.transport.paths.via[NAMED] = proxy.address
        yield dialer, listener, proxy


def _send(end: End, payload: bytes) -> None:
    end.transport.send(NAMED, frames.encode(1, 5, [payload], seq=0, limit=LIMIT))


def test_a_listener_on_loopback_runs_tls_for_a_forwarded_dialer(
    forwarded: tuple[End, End, OnPathProxy],
) -> None:
    dialer, listener, proxy = forwarded
    plain = marker()
    _send(dialer, plain)
    assert listener.frames.get(timeout=10) == plain
    wire = bytes(proxy.upstream)
    assert wire.startswith(routing.MAGIC_TLS), wire[:8]
    assert plain not in wire
    assert SECRET not in wire


def test_stripping_the_tls_request_on_the_way_gets_nothing(
    forwarded: tuple[End, End, OnPathProxy],
) -> None:
    """The forward rewrites the preamble to 'no TLS': the listener (on loopback) agrees, but the
    dialer never speaks without TLS, so the connection fails and nothing is delivered."""
    dialer, listener, proxy = forwarded

    def downgrade(offset: int, data: bytes) -> bytes:
        if offset == 0 and data.startswith(routing.MAGIC_TLS):
            return routing.MAGIC + data[len(routing.MAGIC) :]
        return data

    proxy.tamper = downgrade
    plain = marker()
    with pytest.raises(PeerUnreachableError, match="authentication failed"):
        _send(dialer, plain)
    assert listener.frames.empty()
    assert plain not in bytes(proxy.upstream)
    assert SECRET not in bytes(proxy.upstream) + bytes(proxy.downstream)


@pytest.mark.usefixtures("tls_everywhere")
def test_a_dialer_that_does_not_start_tls_is_refused_where_tls_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = End()
    caplog.set_level(logging.WARNING)
    try:
        host, port = (
            address.tcp_host(listener.transport.address),
            address.tcp_port(listener.transport.address),
        )
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(routing.preamble(""))
            assert sock.recv(64) == b"", "the listener greeted a plain dialer"
        assert "did not start TLS" in caplog.text, caplog.text
        assert listener.transport._inbound.pending() == 0
    finally:
        listener.close()


def test_a_reverse_connection_nobody_asked_for_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A made-up (or replayed) token: closed at once, handed to no process."""
    listener = End()
    board = routing.Switchboard(listener.transport.loop.call_later)
    listener.transport.router = board
    caplog.set_level(logging.WARNING)
    try:
        host, port = (
            address.tcp_host(listener.transport.address),
            address.tcp_port(listener.transport.address),
        )
        started = time.monotonic()
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(routing.reverse_preamble(os.urandom(16)))
            assert sock.recv(64) == b""
        assert time.monotonic() - started < 5
        assert "refused a reverse connection: no process here asked for it" in caplog.text
        deadline = time.monotonic() + 5  # the I/O thread takes it off its books right after
        while listener.transport._inbound.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.transport._inbound.pending() == 0
    finally:
        board.close()
        listener.close()
