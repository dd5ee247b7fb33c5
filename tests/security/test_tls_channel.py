"""§1: an on-path attacker can neither read nor change nor inject frames on a TCP channel.

Two transports in this process talk through ``OnPathProxy``. Each test also runs its control
with TLS off, which shows what the attacker gets without it (the finding of issue 12).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from collections.abc import Iterator

import pytest
from _attackers import OnPathProxy
from _transport_ends import LIMIT, SECRET, End, ends_through_proxy, marker

from regency._transport import address, frames, routing

# The proxy is on loopback: TLS there too (by default loopback has no path to be on).
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("tls_everywhere")]


@pytest.fixture
def pair() -> Iterator[tuple[End, End, OnPathProxy]]:
    with ends_through_proxy() as ends:
        yield ends


def _established(pair: tuple[End, End, OnPathProxy]) -> bytes:
    dialer, listener, proxy = pair
    first = marker()
    dialer.send(proxy.address, first)
    assert listener.frames.get(timeout=10) == first
    return first


def _check_reads(pair: tuple[End, End, OnPathProxy], visible: bool) -> None:
    dialer, listener, proxy = pair
    first = _established(pair)
    big = marker() * 50_000  # about 1 MiB: many TLS records
    dialer.send(proxy.address, big)
    assert listener.frames.get(timeout=10) == big
    wire = bytes(proxy.upstream)
    assert (first in wire) is visible
    assert (big[:4096] in wire) is visible
    assert SECRET not in wire
    assert SECRET.hex().encode() not in wire


def test_an_on_path_peer_cannot_read_frames(pair: tuple[End, End, OnPathProxy]) -> None:
    _check_reads(pair, visible=False)


@pytest.mark.usefixtures("tls_off")
def test_control_without_tls_the_frames_are_readable(pair: tuple[End, End, OnPathProxy]) -> None:
    _check_reads(pair, visible=True)


def _flip_next_chunk(proxy: OnPathProxy) -> None:
    armed = {"on": True}

    def flip(_offset: int, data: bytes) -> bytes:
        if not armed["on"] or len(data) < 64:
            return data
        armed["on"] = False
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]

    proxy.tamper = flip


def test_a_flipped_bit_closes_the_connection_and_delivers_nothing(
    pair: tuple[End, End, OnPathProxy],
) -> None:
    dialer, listener, proxy = pair
    _established(pair)
    _flip_next_chunk(proxy)
    dialer.send(proxy.address, marker() * 100)
    reason = listener.lost.get(timeout=10)
    assert "read failed" in reason, reason
    assert listener.frames.empty(), "a tampered frame was delivered"


@pytest.mark.usefixtures("tls_off")
def test_control_without_tls_a_flipped_bit_is_delivered(
    pair: tuple[End, End, OnPathProxy],
) -> None:
    dialer, listener, proxy = pair
    _established(pair)
    _flip_next_chunk(proxy)
    sent = marker() * 100
    dialer.send(proxy.address, sent)
    got = listener.frames.get(timeout=10)
    assert got != sent, "the flip went unnoticed"
    assert len(got) == len(sent)


def _inject(proxy: OnPathProxy, payload: bytes) -> None:
    """Have the proxy put a whole regency frame of its own in front of the next chunk."""
    forged = b"".join(bytes(b) for b in frames.encode(1, 5, [payload], seq=0, limit=LIMIT))
    armed = {"on": True}

    def inject(_offset: int, data: bytes) -> bytes:
        if not armed["on"]:
            return data
        armed["on"] = False
        return forged + data

    proxy.tamper = inject


def test_an_injected_frame_is_refused(pair: tuple[End, End, OnPathProxy]) -> None:
    dialer, listener, proxy = pair
    _established(pair)
    forged = b"FORGED-" + os.urandom(8).hex().encode()
    _inject(proxy, forged)
    dialer.send(proxy.address, marker())
    reason = listener.lost.get(timeout=10)
    assert "read failed" in reason, reason
    assert listener.frames.empty(), "an injected frame was delivered"


@pytest.mark.usefixtures("tls_off")
def test_control_without_tls_an_injected_frame_is_delivered(
    pair: tuple[End, End, OnPathProxy],
) -> None:
    dialer, listener, proxy = pair
    _established(pair)
    forged = b"FORGED-" + os.urandom(8).hex().encode()
    _inject(proxy, forged)
    dialer.send(proxy.address, marker())
    assert listener.frames.get(timeout=10) == forged


def test_a_peer_without_a_certificate_is_refused_before_any_frame(
    pair: tuple[End, End, OnPathProxy], caplog: pytest.LogCaptureFixture
) -> None:
    _, listener, _ = pair
    caplog.set_level(logging.WARNING)
    host = address.tcp_host(listener.transport.address)
    port = address.tcp_port(listener.transport.address)
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False
    anonymous.verify_mode = ssl.CERT_NONE  # it does not care who the listener is
    raw = socket.create_connection((host, port), timeout=5)
    raw.sendall(routing.preamble("", tls=True))
    try:
        with anonymous.wrap_socket(raw) as sock:
            forged = b"".join(bytes(b) for b in frames.encode(1, 5, [b"X"], seq=0, limit=LIMIT))
            try:
                sock.sendall(forged * 4)
                assert sock.recv(4096) == b""
            except (ssl.SSLError, ConnectionError):
                pass  # refused: the certificate-required alert
    except (ssl.SSLError, ConnectionError):
        pass
    deadline = time.monotonic() + 10
    while "presented no certificate" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "presented no certificate" in caplog.text, caplog.text
    assert listener.frames.empty()
    assert listener.transport._inbound.pending() == 0


def test_which_connections_run_tls() -> None:
    from regency._transport import tls

    tls.force_enabled(True)  # the default: every connection between hosts
    try:
        assert tls.applies("10.200.0.10")
        assert tls.applies("fd00::1")
        assert not tls.applies("127.0.0.1")  # loopback never leaves the machine
        assert not tls.applies("::1")
        tls.force_enabled("all")
        assert tls.applies("127.0.0.1")
        tls.force_enabled(False)
        assert not tls.applies("10.200.0.10")
    finally:
        tls.force_enabled("all")
