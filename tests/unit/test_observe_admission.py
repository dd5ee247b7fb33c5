"""Who holds an unauthenticated connection (the kernel's answer) and how many each may hold."""

from __future__ import annotations

import os
import socket

import pytest

from regency._transport.peer_identity import tcp_peer_uid, unix_peer_uid
from regency.observe.admission import OWNER, Admission, client_key, describe

pytestmark = pytest.mark.timeout(30)


def _pair(family: socket.AddressFamily, host: str) -> tuple[socket.socket, socket.socket]:
    """A dialer and the listener's end of its connection."""
    with socket.create_server((host, 0), family=family) as listener:
        dialer = socket.create_connection(listener.getsockname()[:2], timeout=5)
        accepted, _ = listener.accept()
    return dialer, accepted


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_a_loopback_peer_of_this_user_is_this_uid(family: socket.AddressFamily, host: str) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    dialer, accepted = _pair(family, host)
    with dialer, accepted:
        assert tcp_peer_uid(accepted) == os.geteuid()
        assert client_key(accepted) is OWNER


def test_an_ipv4_peer_of_a_dual_stack_listener_is_found() -> None:
    with socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as listener:
        dialer = socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5)
        accepted, (peer, *_) = listener.accept()
    with dialer, accepted:
        assert peer == "::ffff:127.0.0.1"
        assert tcp_peer_uid(accepted) == os.geteuid()


def test_a_peer_that_closed_is_unknown_and_named_by_address() -> None:
    dialer, accepted = _pair(socket.AF_INET, "127.0.0.1")
    with accepted:
        dialer.close()
        assert tcp_peer_uid(accepted) is None
        assert client_key(accepted) == "ip:127.0.0.1"


def test_a_unix_peer_is_named_by_its_credentials() -> None:
    one, other = socket.socketpair()
    with one, other:
        assert unix_peer_uid(one) == os.geteuid()
        assert tcp_peer_uid(one) is None
        assert client_key(one) is OWNER
    dialer, accepted = _pair(socket.AF_INET, "127.0.0.1")
    with dialer, accepted:
        assert unix_peer_uid(accepted) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_client_over_its_bound_pushes_out_its_own_oldest() -> None:
    admission: Admission[str] = Admission(others=8, per_client=2, owner=2)
    assert admission.admit("uid:7", "a") == []
    assert admission.admit("uid:8", "b") == []
    assert admission.admit("uid:7", "c") == []
    assert admission.admit("uid:7", "d") == ["a"]  # uid 8's connection stays
    assert len(admission) == 3


def test_others_over_their_bound_push_out_the_oldest_but_never_the_owners() -> None:
    admission: Admission[str] = Admission(others=2, per_client=2, owner=2)
    admission.admit(OWNER, "mine")
    admission.admit("uid:7", "a")
    admission.admit("ip:10.0.0.9", "b")
    assert admission.admit("uid:9", "c") == ["a"]
    assert admission.admit("uid:10", "d") == ["b"]
    assert admission.admit(OWNER, "mine too") == []  # the owner's pool is its own
    assert admission.admit(OWNER, "mine three") == ["mine"]


def test_released_connections_free_their_slot_and_old_ones_are_listed() -> None:
    clock = _Clock()
    admission: Admission[str] = Admission(others=2, per_client=1, owner=1, clock=clock)
    admission.admit("uid:7", "a")
    clock.now += 3
    admission.admit("uid:8", "b")
    assert admission.waiting_since(3) == ["a"]
    assert admission.release("a") == "uid:7"
    assert admission.release("a") is None
    assert admission.admit("uid:7", "c") == []
    assert admission.waiting_since(0) == ["b", "c"]


def test_describe_names_the_client_for_a_log_line() -> None:
    assert describe(OWNER) == "this user"
    assert describe("uid:1001") == "uid 1001"
    assert describe("ip:10.1.2.3") == "10.1.2.3"
