"""One port per machine: route preambles, connection handoff, addresses, wrapped secrets."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from regency._transport import address, routing
from regency._transport.auth import (
    AuthenticationError,
    ListenerHandshake,
    dialer_handshake,
    unwrap_secret,
    wrap_secret,
)

pytestmark = pytest.mark.timeout(60)


def test_route_keys_and_addresses() -> None:
    assert address.route_key("tcp://10.0.0.1:7000") == ""
    assert address.route_key("tcp://10.0.0.1:7000/regency-ab-m-1") == "regency-ab-m-1"
    assert address.route_key("unix:@regency-ab-controller") == "unix:@regency-ab-controller"
    assert address.behind("tcp://h:7/x", "p") == "tcp://h:7/p"
    assert address.behind("unix:@regency-ab-controller", "p") == "unix:@p"
    assert address.tcp_host("tcp://[::1]:7000/p") == "::1"
    assert address.tcp_address("::1", 5) == "tcp://[::1]:5"
    with pytest.raises(address.AddressError, match="its host listens for it"):
        address.listen("tcp://127.0.0.1:0/p")


def test_preamble_round_trip_in_pieces() -> None:
    data = routing.preamble("regency-ab-mesh-1")
    reader = routing.PreambleReader()
    for i in range(len(data) - 1):
        assert reader.feed(data[i : i + 1]) is None
    assert reader.feed(data[-1:]) == routing.Route("regency-ab-mesh-1")
    assert routing.PreambleReader().feed(routing.preamble("")) == routing.Route("")


def test_preambles_say_what_follows() -> None:
    assert routing.PreambleReader().feed(routing.preamble("p", tls=True)) == routing.Route(
        "p", tls=True
    )
    token = os.urandom(16)
    reverse = routing.PreambleReader().feed(routing.reverse_preamble(token))
    assert reverse == routing.Route(token.hex(), reverse=True)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"GET / HTTP/1.1\r\n", "route preamble"),
        (routing.preamble("p") + b"x", "before its route"),
    ],
)
def test_bad_preambles_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(routing.RouteError, match=match):
        routing.PreambleReader().feed(data)


def test_route_keys_are_bounded() -> None:
    with pytest.raises(routing.RouteError, match="over 255"):
        routing.preamble("x" * 256)


def test_switchboard_holds_a_connection_until_its_process_registers() -> None:
    timers: list[object] = []
    board = routing.Switchboard(lambda delay, fn: timers.append(fn))
    dialer, accepted = socket.socketpair()
    board.route("p", accepted)  # the process is not started yet: held
    host_end, proc_end = routing.handoff_pair()
    board.register("p", host_end)
    proc_end.settimeout(5)
    _, fds, _, _ = socket.recv_fds(proc_end, 1, 4)
    assert len(fds) == 1
    with socket.socket(fileno=fds[0]) as handed:
        dialer.sendall(b"ping")
        assert handed.recv(4) == b"ping", "the process got the very connection"
    board.unregister("p")
    late_dialer, late = socket.socketpair()
    board.route("p", late)  # a process that is gone: refused at once
    late_dialer.settimeout(5)
    assert late_dialer.recv(1) == b""
    for sock in (dialer, proc_end, late_dialer):
        sock.close()
    board.close()


def test_wrapped_secret_needs_the_key() -> None:
    key, secret = os.urandom(32), os.urandom(32)
    blob = wrap_secret(key, secret)
    assert secret not in blob
    assert unwrap_secret(key, blob) == secret
    with pytest.raises(AuthenticationError):
        unwrap_secret(os.urandom(32), blob)
    tampered = bytearray(blob)
    tampered[20] ^= 1
    with pytest.raises(AuthenticationError):
        unwrap_secret(key, bytes(tampered))


@pytest.mark.parametrize("which", [0, 1])
def test_listener_accepts_either_of_its_secrets(which: int) -> None:
    secrets = [os.urandom(32), os.urandom(32)]
    dialer, listener = socket.socketpair()
    dialer.settimeout(10)
    shake = ListenerHandshake(*secrets)
    listener.sendall(shake.hello())
    thread = threading.Thread(
        target=dialer_handshake, args=(dialer, secrets[which], "unix:@d"), daemon=True
    )
    thread.start()
    proof = None
    while proof is None:
        proof = shake.feed(listener.recv(4096))
    listener.sendall(proof)
    thread.join(10)
    assert not thread.is_alive()
    assert shake.secret == secrets[which]
    assert shake.peer_address == "unix:@d"
    dialer.close()
    listener.close()
