"""``Transport`` end to end inside this process: two real listeners on real sockets."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from regency._transport import auth, frames
from regency._transport import inbound as inbound_module
from regency._transport.connection import Connection
from regency._transport.frames import Frame
from regency._transport.names import FLAG_NAMED, KIND_NAME, NAMES_MAX, Named
from regency._transport.transport import BURST_WINDOW, PeerUnreachableError, Transport

pytestmark = pytest.mark.timeout(60)

LIMIT = 1 << 30


class Endpoint:
    """A transport plus queues of what it received and which peers it lost."""

    def __init__(self, secret: bytes, limit: int = LIMIT, connect_timeout: float = 5.0) -> None:
        self.frames: queue.SimpleQueue[tuple[str, Frame]] = queue.SimpleQueue()
        self.lost: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.transport = Transport(
            f"unix:@regency-unit-{os.urandom(6).hex()}",
            secret,
            self._on_frame,
            lambda peer, reason: self.lost.put((peer, reason)),
            frame_limit=limit,
            connect_timeout=connect_timeout,
        )
        self.address = self.transport.address

    def _on_frame(self, conn: Connection, frame: Frame) -> None:
        # Copy: the parts may be views of a buffer the reader reuses.
        frame.parts = [memoryview(bytes(p)) for p in frame.parts]
        self.frames.put((conn.peer, frame))

    def send(self, peer: str, *parts: bytes, seq: int = 0, wait: bool = True) -> None:
        self.transport.send(peer, frames.encode(1, 5, list(parts), seq=seq, limit=LIMIT), wait)

    def close(self) -> None:
        self.transport.close()
        self.transport.loop.stop()


@pytest.fixture
def make() -> Iterator[Callable[..., Endpoint]]:
    made: list[Endpoint] = []

    def factory(secret: bytes, **kw: float) -> Endpoint:
        endpoint = Endpoint(secret, **kw)  # type: ignore[arg-type]
        made.append(endpoint)
        return endpoint

    yield factory
    for endpoint in made:
        endpoint.close()


SECRET = os.urandom(32)


def test_frames_flow_both_ways_in_order(make: Callable[..., Endpoint]) -> None:
    a, b = make(SECRET), make(SECRET)
    for i in range(1, 1001):
        a.send(b.address, b"to b %d" % i, seq=i, wait=i % 2 == 0)
    for i in range(1, 1001):
        peer, frame = b.frames.get(timeout=10)
        assert peer == a.address, "the listener learns the dialer's address from the handshake"
        assert frame.seq == i
        assert bytes(frame.parts[0]) == b"to b %d" % i
    b.send(a.address, b"back")  # over the connection a opened, or a new one
    peer, frame = a.frames.get(timeout=10)
    assert (peer, bytes(frame.parts[0])) == (b.address, b"back")


def test_large_frame(make: Callable[..., Endpoint]) -> None:
    a, b = make(SECRET), make(SECRET)
    payload = os.urandom(16 << 20)
    a.send(b.address, b"envelope", payload)
    _, frame = b.frames.get(timeout=30)
    assert bytes(frame.parts[1]) == payload


def test_wrong_secret_fails_the_sender_and_is_logged(
    make: Callable[..., Endpoint], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = make(SECRET), make(os.urandom(32))
    caplog.set_level(logging.WARNING)
    with pytest.raises(PeerUnreachableError, match="authentication"):
        a.send(b.address, b"hello")
    peer, reason = a.lost.get(timeout=5)
    assert peer == b.address
    assert "authentication" in reason
    assert b.frames.empty()
    deadline = time.monotonic() + 5
    while "rejected a connection" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "rejected a connection" in caplog.text
    # The listener is still fine: a peer with the right secret gets through.
    c = make(b.transport.secret)
    c.send(b.address, b"right secret")
    assert bytes(b.frames.get(timeout=10)[1].parts[0]) == b"right secret"


def test_silent_client_is_dropped_after_the_handshake_timeout(
    make: Callable[..., Endpoint],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(inbound_module, "DEADLINE", 0.3)
    caplog.set_level(logging.WARNING)
    b = make(SECRET)
    name = b.address[len("unix:@") :]
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.settimeout(5)
    silent.connect("\0" + name)
    try:
        start = time.monotonic()
        hello = silent.recv(64)
        assert hello.startswith(auth.MAGIC)
        assert silent.recv(64) == b"", "a silent client should be hung up on"
        assert time.monotonic() - start < 3
    finally:
        silent.close()
    assert "handshake timed out" in caplog.text


def test_frame_over_the_receivers_limit_drops_the_connection(
    make: Callable[..., Endpoint],
) -> None:
    a, b = make(SECRET), make(SECRET, limit=4096)
    a.send(b.address, b"small")
    assert bytes(b.frames.get(timeout=10)[1].parts[0]) == b"small"
    a.send(b.address, b"x" * 10_000)  # a's own limit allows it; b's does not
    peer, _ = a.lost.get(timeout=10)
    assert peer == b.address
    assert b.frames.empty()


def test_unreachable_peer(make: Callable[..., Endpoint]) -> None:
    a = make(SECRET, connect_timeout=0.3)
    nowhere = f"unix:@regency-unit-nobody-{os.urandom(6).hex()}"
    start = time.monotonic()
    with pytest.raises(PeerUnreachableError):
        a.send(nowhere, b"hello")
    assert time.monotonic() - start < 5
    peer, _ = a.lost.get(timeout=5)
    assert peer == nowhere
    with pytest.raises(PeerUnreachableError):  # and it stays lost
        a.send(nowhere, b"again")


def test_peer_marked_lost_fails_sends_at_once(make: Callable[..., Endpoint]) -> None:
    a, b = make(SECRET), make(SECRET)
    a.send(b.address, b"first")
    b.frames.get(timeout=10)
    a.transport.mark_lost(b.address, "its process exited")
    with pytest.raises(PeerUnreachableError, match="its process exited"):
        a.send(b.address, b"second")


def test_posts_reach_live_peers_when_another_is_lost(make: Callable[..., Endpoint]) -> None:
    a, b, c, d = make(SECRET), make(SECRET), make(SECRET), make(SECRET)
    for peer in (b, c, d):  # connected: posts go through their connections
        a.send(peer.address, b"hello")
        peer.frames.get(timeout=10)
    a.transport.mark_lost(b.address, "its process exited")
    a.transport.mark_lost(d.address, "killed")
    posts = [(p.address, frames.encode(1, 5, [b"posted"], seq=2, limit=LIMIT)) for p in (b, c, d)]
    with pytest.raises(PeerUnreachableError) as info:
        a.transport.post([(peer, buffers, len(b"".join(buffers))) for peer, buffers in posts])
    assert "its process exited" in str(info.value)
    assert "killed" in str(info.value)
    a.transport.flush()
    _, frame = c.frames.get(timeout=10)
    assert (frame.seq, bytes(frame.parts[0])) == (2, b"posted")


def test_a_burst_is_the_senders_across_peers(make: Callable[..., Endpoint]) -> None:
    # A stream of casts comes back to each peer only every N frames: were a burst judged per
    # connection, beyond ~16 peers every frame would go out (and wake its receiver) alone.
    a, b, c, d = make(SECRET), make(SECRET), make(SECRET), make(SECRET)
    for peer in (b, c, d):
        a.send(peer.address, b"hello")
        peer.frames.get(timeout=10)

    def waiting(peer: Endpoint) -> bool:
        """Whether a frame to ``peer`` waits in its connection's outbox (to be coalesced)."""
        return bool(a.transport._peers[peer.address].conn._outbox)

    def post(peer: Endpoint, seq: int) -> None:
        buffers = frames.encode(1, 5, [b"posted"], seq=seq, limit=LIMIT)
        a.transport.post([(peer.address, buffers, len(b"".join(buffers)))])

    for seq in range(1, 50):
        a.transport.flush()  # as a thread about to wait does: what follows starts afresh
        began = time.monotonic()
        post(b, seq)
        post(c, seq)
        if time.monotonic() - began < BURST_WINDOW:  # not descheduled in between
            break
    else:
        pytest.skip("the machine never ran two posts within the burst window")
    # The first went out at once; the second, to another peer, waits to be coalesced.
    assert (waiting(b), waiting(c)) == (False, True)
    a.transport.flush()
    assert (waiting(b), waiting(c)) == (False, False)
    post(d, 1)  # after a flush: not part of a burst, out at once
    assert not waiting(d)
    for peer in (b, c, d):
        got = [peer.frames.get(timeout=10)[1] for _ in range(seq if peer is not d else 1)]
        assert bytes(got[-1].parts[0]) == b"posted"


@contextlib.contextmanager
def _raw_peer(b: Endpoint, name: str) -> Iterator[socket.socket]:
    """A connection to ``b`` from a hand-written peer called ``name``, past the handshake; on
    leaving, the bytes sent must have made ``b`` close it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect("\0" + b.address[len("unix:@") :])
    try:
        auth.dialer_handshake(sock, SECRET, name)
        yield sock
        assert sock.recv(64) == b"", "the receiver must close the connection"
    finally:
        sock.close()


def test_raw_client_sending_garbage_after_the_handshake(make: Callable[..., Endpoint]) -> None:
    b = make(SECRET)
    with _raw_peer(b, "unix:@regency-unit-raw") as sock:
        sock.sendall(struct.pack("<Q", 2**62) + b"\0" * 40)
    peer, reason = b.lost.get(timeout=5)
    assert peer == "unix:@regency-unit-raw"
    assert "limit" in reason


def _post_named(a: Endpoint, b: Endpoint, named: Named, seq: int) -> None:
    buffers = frames.encode(
        1, 5, [b"routing", named.name, b"m%d" % seq], flags=FLAG_NAMED, seq=seq, limit=LIMIT
    )
    a.transport.post([(b.address, buffers, len(b"".join(buffers)))], [named])


def test_named_parts_over_a_real_connection_come_back_whole(
    make: Callable[..., Endpoint],
) -> None:
    a, b = make(SECRET), make(SECRET)
    named = Named.of(os.urandom(2000))
    # The first goes while the connection is still being dialed, queued with its part.
    for seq in range(1, 6):
        _post_named(a, b, named, seq)
    a.transport.flush()
    for seq in range(1, 6):
        _, frame = b.frames.get(timeout=10)
        assert frame.seq == seq
        assert not frame.flags & FLAG_NAMED
        assert [bytes(p) for p in frame.parts] == [b"routing", named.blob, b"m%d" % seq]
    conn = a.transport._peers[b.address].conn
    assert conn is not None
    assert len(conn._names) == 1, "the part crossed the connection once"
    other = Named.of(b"another subtree")
    a.transport.send(
        b.address,
        frames.encode(1, 5, [b"r", other.name], flags=FLAG_NAMED, seq=6, limit=LIMIT),
        named=other,
    )
    _, frame = b.frames.get(timeout=10)
    assert bytes(frame.parts[1]) == other.blob
    assert len(conn._names) == 2


def test_a_peer_naming_a_part_it_never_sent_is_cut_off(make: Callable[..., Endpoint]) -> None:
    b = make(SECRET)
    with _raw_peer(b, "unix:@regency-unit-names") as sock:
        named = Named.of(b"never defined")
        bogus = frames.encode(1, 5, [b"r", named.name], flags=FLAG_NAMED, limit=LIMIT)
        sock.sendall(b"".join(bogus))
    peer, reason = b.lost.get(timeout=5)
    assert peer == "unix:@regency-unit-names"
    assert "protocol error" in reason
    assert "never sent" in reason
    assert b.frames.empty(), "nothing of the frame reached the router"


def test_a_name_frame_that_breaks_the_bounds_is_cut_off(make: Callable[..., Endpoint]) -> None:
    b = make(SECRET)
    with _raw_peer(b, "unix:@regency-unit-names-flood") as sock:
        for i in range(NAMES_MAX + 1):
            name = struct.pack("<QQ", i, 0)
            sock.sendall(b"".join(frames.encode(KIND_NAME, 0, [name, b"b", b""], limit=LIMIT)))
    _, reason = b.lost.get(timeout=5)
    assert "past what a connection holds" in reason
