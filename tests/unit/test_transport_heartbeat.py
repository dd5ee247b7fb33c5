"""Heartbeats: a TCP peer that falls silent (no FIN, no RST) is declared lost; an idle
connection costs one ping and one answer per interval, a busy one and a proc's none."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from regency._transport import address, frames, routing
from regency._transport.auth import dialer_handshake
from regency._transport.transport import Transport

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)
LIMIT = 1 << 20


class Peer:
    """A TCP transport on loopback with queues of its frames and its losses."""

    def __init__(self, settings: tuple[float, float], quiet: bool = False) -> None:
        self.frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.lost: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.transport = Transport(
            "tcp://127.0.0.1:0",
            SECRET,
            lambda conn, frame: self.frames.put(bytes(frame.parts[0])),
            lambda peer, reason: self.lost.put((peer, reason)),
            frame_limit=LIMIT,
            connect_timeout=5,
            heartbeat=lambda: settings,
            quiet=quiet,
        )
        self.address = self.transport.address

    def send(self, peer: str, body: bytes) -> None:
        self.transport.send(peer, frames.encode(1, 5, [body], limit=LIMIT))

    def stats(self) -> dict[str, int]:
        return self.transport.heartbeat.statistics()

    def close(self) -> None:
        self.transport.close()
        self.transport.loop.stop()


@pytest.fixture
def make() -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def factory(settings: tuple[float, float], quiet: bool = False) -> Peer:
        made.append(Peer(settings, quiet))
        return made[-1]

    yield factory
    for peer in made:
        peer.close()


def wait_for(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def connected(dialer: Peer, listener: Peer) -> None:
    """Open the connection ``dialer`` -> ``listener`` with one frame, and wait for it."""
    dialer.send(listener.address, b"hello")
    assert listener.frames.get(timeout=10) == b"hello"


def test_silent_tcp_dialer_is_lost_after_the_timeout_and_is_not_pinged() -> None:
    lost: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    transport = Transport(
        "tcp://127.0.0.1:0",
        SECRET,
        lambda conn, frame: None,
        lambda peer, reason: lost.put((peer, reason)),
        frame_limit=LIMIT,
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
        assert received == b"", "the side that accepted only answers pings; it sends none"
        sock.close()
    finally:
        transport.close()
        transport.loop.stop()


def test_idle_connection_gets_one_ping_and_one_answer_per_interval(
    make: Callable[..., Peer],
) -> None:
    a, b = make((0.05, 0.5)), make((0.05, 0.5))
    connected(a, b)
    wait_for(lambda: a.stats()["pings"] >= 20)  # 20 sweeps of a, ~1 s: twice the timeout
    wait_for(lambda: b.stats()["answers"] >= a.stats()["pings"] - 1)
    assert b.stats()["pings"] == 0, "only the side that dialed pings"
    assert a.stats()["answers"] == 0
    assert a.stats()["watched"] == b.stats()["watched"] == 1
    assert a.lost.empty(), "answered pings keep both sides alive"
    assert b.lost.empty()


def test_a_connection_that_carries_traffic_both_ways_needs_no_ping(
    make: Callable[..., Peer],
) -> None:
    a, b = make((0.1, 1.0)), make((0.1, 1.0))
    connected(a, b)
    b.send(a.address, b"back")
    assert a.frames.get(timeout=10) == b"back"
    done = threading.Event()

    def chatter(sender: Peer, to: str) -> None:
        while not done.is_set():
            sender.send(to, b"traffic")
            time.sleep(0.002)

    threads = [
        threading.Thread(target=chatter, args=(a, b.address)),
        threading.Thread(target=chatter, args=(b, a.address)),
    ]
    for thread in threads:
        thread.start()
    try:
        before = a.stats()["pings"]
        wait_for(lambda: b.frames.qsize() > 1000 and a.frames.qsize() > 1000)
        time.sleep(2.0)  # 20 sweeps of traffic: the count of pings is what is measured
        pings = a.stats()["pings"] - before
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert pings <= 4, f"{pings} pings in 20 sweeps on a busy connection"
    wait_for(lambda: a.stats()["pings"] >= before + pings + 5)  # idle again: pings resume
    assert a.lost.empty()
    assert b.lost.empty()


def test_a_quiet_transport_takes_no_part_where_it_is_dialed(make: Callable[..., Peer]) -> None:
    quiet, loud = make((0.05, 0.3), quiet=True), make((0.05, 0.3))
    connected(loud, quiet)
    with pytest.raises(queue.Empty):  # five timeouts of silence: nobody is declared lost
        loud.lost.get(timeout=1.5)
    # (At most one ping, sent before the quiet side's word arrived.)
    assert loud.stats()["pings"] <= 1
    assert (loud.stats()["answers"], loud.stats()["watched"]) == (0, 0)
    assert quiet.stats() == {"sweeps": 0, "pings": 0, "answers": 0, "watched": 0}
    assert quiet.lost.empty()


def test_a_quiet_transport_pings_a_host_agent_it_dials(make: Callable[..., Peer]) -> None:
    """A proc that dials a host agent (``tcp://host:port``: to spawn procs there) watches it
    as any owner must; the agent answers and watches it in turn."""
    quiet, agent = make((0.05, 0.5), quiet=True), make((0.05, 0.5))
    connected(quiet, agent)
    wait_for(lambda: quiet.stats()["pings"] >= 10)
    wait_for(lambda: agent.stats()["answers"] >= quiet.stats()["pings"] - 1)
    assert quiet.stats()["watched"] == agent.stats()["watched"] == 1
    assert quiet.lost.empty()
    assert agent.lost.empty()
    agent.transport.loop.stop()  # the host agent hangs: the proc finds out
    peer, reason = quiet.lost.get(timeout=10)
    assert peer == agent.address
    assert f"no heartbeat from {agent.address}" in reason


def test_a_dialed_peer_whose_io_stops_is_lost_after_the_timeout(
    make: Callable[..., Peer],
) -> None:
    a, b = make((0.1, 0.5)), make((0.1, 0.5))
    connected(a, b)
    b.transport.loop.stop()  # b's process is alive for the kernel, but answers nothing
    start = time.monotonic()
    peer, reason = a.lost.get(timeout=10)
    elapsed = time.monotonic() - start
    assert peer == b.address
    assert f"no heartbeat from {b.address}" in reason
    assert 0.4 <= elapsed < 3, elapsed


def test_tcp_sockets_get_keepalive_and_a_user_timeout() -> None:
    with socket.socket() as sock:
        address.tune_tcp(sock, 1.0, 5.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        # Quiet for the timeout before the first probe: one probe per 5 s on an idle link.
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
