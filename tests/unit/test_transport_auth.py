"""The handshake between two real sockets: both sides must prove they hold the job's secret."""

from __future__ import annotations

import errno
import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from regency._transport import auth, outbound
from regency._transport.auth import AuthenticationError, ListenerHandshake, dialer_handshake

pytestmark = pytest.mark.timeout(60)

SECRET = os.urandom(32)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    dialer, listener = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    dialer.settimeout(10)
    listener.settimeout(10)
    yield dialer, listener
    dialer.close()
    listener.close()


def run_listener(sock: socket.socket, secret: bytes) -> str | None:
    """The listening side over a blocking socket; answers a wrong proof and closes like the
    transport."""
    shake = ListenerHandshake(secret)
    sock.sendall(shake.hello())
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                raise AuthenticationError("dialer hung up")
            proof = shake.feed(data)
            if proof is not None:
                sock.sendall(proof)
                return shake.peer_address
    except AuthenticationError:
        sock.sendall(auth.REFUSED)
        sock.shutdown(socket.SHUT_RDWR)
        raise


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``fn`` on a thread; the returned function joins it and returns or raises its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(10)
        assert not thread.is_alive()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


@pytest.mark.parametrize(
    "address", ["unix:@regency-abc-controller", "tcp://[::1]:65535", "tcp://host-é:1", ""]
)
def test_handshake_succeeds_and_carries_the_address(
    pair: tuple[socket.socket, socket.socket], address: str
) -> None:
    dialer, listener = pair
    join = in_thread(lambda: run_listener(listener, SECRET))
    dialer_handshake(dialer, SECRET, address)
    assert join() == address


def test_dialer_with_the_wrong_secret_is_rejected(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    dialer, listener = pair
    join = in_thread(lambda: run_listener(listener, SECRET))
    with pytest.raises(AuthenticationError, match="refused this process's proof: it holds a diff"):
        dialer_handshake(dialer, os.urandom(32), "unix:@intruder")
    with pytest.raises(AuthenticationError, match="wrong secret"):
        join()


def test_a_hang_up_after_the_proof_is_worth_another_try(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # A busy listener pushes out a connection whose proof it has not judged: no verdict on the
    # secret, and the dialer's retry loop (ECONNRESET) tries again.
    dialer, listener = pair

    def busy() -> None:
        listener.sendall(ListenerHandshake(SECRET).hello())
        listener.recv(4096)
        listener.shutdown(socket.SHUT_RDWR)

    join = in_thread(busy)
    with pytest.raises(ConnectionResetError, match="without judging") as raised:
        dialer_handshake(dialer, SECRET, "unix:@me")
    assert raised.value.errno == errno.ECONNRESET
    assert not isinstance(raised.value, AuthenticationError)
    join()


def test_a_proof_made_on_another_channel_is_refused() -> None:
    # What a relay terminating TLS on both sides forwards: a proof bound to its other channel.
    shake = ListenerHandshake(SECRET, channel=b"tls-unique:listener side")
    nonce_l = shake.hello()[len(auth.MAGIC) :]
    nonce_d = os.urandom(auth.NONCE)
    relayed = auth._mac(SECRET, b"dial", nonce_l, nonce_d, b"tls-unique:dialer side")
    with pytest.raises(AuthenticationError, match="wrong secret"):
        shake.feed(relayed + nonce_d)
    same = ListenerHandshake(SECRET, channel=b"tls-unique:one channel")
    nonce_l = same.hello()[len(auth.MAGIC) :]
    proof = auth._mac(SECRET, b"dial", nonce_l, nonce_d, b"tls-unique:one channel")
    assert same.feed(proof + nonce_d) is None  # verified; waiting for the address


def test_the_dialer_names_an_older_handshake(pair: tuple[socket.socket, socket.socket]) -> None:
    dialer, listener = pair
    listener.sendall(b"RGCY\x01" + os.urandom(auth.NONCE))
    with pytest.raises(AuthenticationError, match="another version"):
        dialer_handshake(dialer, SECRET, "unix:@me")


def test_listener_with_the_wrong_secret_is_rejected(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    # An impostor listener that accepts anyone and answers with its own secret: the dialer
    # must notice before it sends a single frame.
    dialer, listener = pair
    other = os.urandom(32)

    def impostor() -> None:
        shake = ListenerHandshake(other)
        listener.sendall(shake.hello())
        reply = listener.recv(4096)
        nonce_d = reply[auth.MAC : auth.MAC + auth.NONCE]
        nonce_l = shake.hello()[len(auth.MAGIC) :]
        listener.sendall(auth._mac(other, b"listen", nonce_d, nonce_l))

    join = in_thread(impostor)
    with pytest.raises(AuthenticationError, match="secret"):
        dialer_handshake(dialer, SECRET, "unix:@me")
    join()


def test_dialer_rejects_a_peer_that_is_not_regency(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    dialer, listener = pair
    listener.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(AuthenticationError, match="magic"):
        dialer_handshake(dialer, SECRET, "unix:@me")


def test_dialer_sees_a_listener_that_hangs_up(pair: tuple[socket.socket, socket.socket]) -> None:
    dialer, listener = pair
    listener.sendall(auth.MAGIC)
    listener.close()
    with pytest.raises(AuthenticationError, match="closed"):
        dialer_handshake(dialer, SECRET, "unix:@me")


def _dialer_reply(secret: bytes, hello: bytes, address: bytes = b"unix:@me") -> bytes:
    nonce_l = hello[len(auth.MAGIC) :]
    nonce_d = os.urandom(auth.NONCE)
    proof = auth._mac(secret, b"dial", nonce_l, nonce_d)
    addr_proof = auth._mac(secret, b"addr", nonce_l + nonce_d, address)
    return proof + nonce_d + struct.pack("<H", len(address)) + address + addr_proof


def test_a_rewritten_address_is_refused() -> None:
    shake = ListenerHandshake(SECRET)
    reply = bytearray(_dialer_reply(SECRET, shake.hello(), b"unix:@me"))
    start = auth.REPLY_HEAD
    reply[start : start + len(b"unix:@me")] = b"unix:@xx"
    with pytest.raises(AuthenticationError, match="address"):
        shake.feed(bytes(reply))


def test_listener_accepts_the_reply_byte_by_byte() -> None:
    shake = ListenerHandshake(SECRET)
    reply = _dialer_reply(SECRET, shake.hello())
    for i in range(len(reply) - 1):
        assert shake.feed(reply[i : i + 1]) is None
    assert shake.feed(reply[-1:]) is not None
    assert shake.peer_address == "unix:@me"


def test_a_recorded_reply_cannot_be_replayed() -> None:
    first = ListenerHandshake(SECRET)
    recorded = _dialer_reply(SECRET, first.hello())
    assert first.feed(recorded) is not None
    second = ListenerHandshake(SECRET)
    assert second.hello() != first.hello(), "each listener must pick a fresh nonce"
    with pytest.raises(AuthenticationError):
        second.feed(recorded)


def test_listener_rejects_data_before_the_handshake_completes() -> None:
    shake = ListenerHandshake(SECRET)
    with pytest.raises(AuthenticationError):
        shake.feed(_dialer_reply(SECRET, shake.hello()) + b"\0" * 60)


def test_listener_rejects_a_wrong_proof_without_waiting_for_an_address() -> None:
    # 66 bytes of garbage announce a 65535-byte address. The listener has all it needs to see the
    # proof is wrong (or that no address is that long); it must not wait for 64 KiB more first.
    shake = ListenerHandshake(SECRET)
    garbage = os.urandom(auth.MAC + auth.NONCE) + struct.pack("<H", 0xFFFF)
    with pytest.raises(AuthenticationError):
        shake.feed(garbage)


def _dial_twice(first: Callable[[socket.socket], Any]) -> None:
    """Dial a listener that does ``first`` with the first connection and serves the second:
    the dial goes on within its timeout, and the second try is served."""
    tries: list[Callable[[], Any]] = []

    def connect(limit: float) -> socket.socket:
        dialer, listener = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        dialer.settimeout(limit)
        listener.settimeout(limit)
        serve = first if not tries else (lambda sock: run_listener(sock, SECRET))
        tries.append(in_thread(lambda: serve(listener)))
        try:
            dialer_handshake(dialer, SECRET, "unix:@me")
        except BaseException:
            dialer.close()
            raise
        return dialer

    sock, reason = outbound.dial("unix:@busy", connect, 10, 5, lambda: False)
    assert sock is not None, reason
    assert len(tries) == 2
    for join in tries:
        join()
    sock.close()


def test_the_dialer_tries_again_after_a_busy_hang_up() -> None:
    # A listener busy with a flood pushes out the first try after its proof (no "different job
    # secret").
    def busy(sock: socket.socket) -> None:
        sock.sendall(ListenerHandshake(SECRET).hello())
        sock.recv(4096)
        sock.shutdown(socket.SHUT_RDWR)

    _dial_twice(busy)


def test_the_dialer_tries_again_after_a_hang_up_before_the_handshake() -> None:
    # A listener whose own deadline passed before it answered (hundreds of dials at once)
    # closes without a word.
    _dial_twice(lambda sock: sock.close())


def test_a_peer_hanging_up_in_the_tls_handshake_is_worth_another_try() -> None:
    dialer, listener = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    dialer.settimeout(5)
    listener.settimeout(5)
    # The listener reads the client's hello and hangs up without answering it.
    join = in_thread(lambda: (listener.recv(4096), listener.close()))
    with pytest.raises(ssl.SSLError) as caught:
        ssl.create_default_context().wrap_socket(dialer, server_hostname="peer")
    join()
    dialer.close()
    error = outbound.handshake_failure(caught.value)
    assert isinstance(error, ConnectionResetError)
    assert error.errno == errno.ECONNRESET
    assert "hung up during the TLS handshake" in str(error)
    # A refused certificate is not retried: it says the peer is another job's.
    refused = ssl.SSLError(1, "certificate verify failed")
    refused.reason = "CERTIFICATE_VERIFY_FAILED"
    assert isinstance(outbound.handshake_failure(refused), AuthenticationError)
