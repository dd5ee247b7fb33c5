"""A relay holding another leaf of a shared CA cannot splice itself into a channel.

With a user-provided CA (``REGENCY_TLS_CA``/``CERT``/``KEY``) every leaf of that CA passes the
TLS checks, so a party on the path holding one can terminate TLS on both sides. The secret
handshake inside is bound to each TLS channel (its ``tls-unique`` value), so the proofs it relays
unchanged fail: the listener refuses, the dialer reports it, and no frame of the relay's is
delivered. The legitimate path keeps working. Here both ends are transports of this process on
loopback (TLS there too); ``test_tls_relay_netns.py`` runs the same attack between hosts.
"""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Iterator

import pytest
from _tls_relay import TLSRelay
from _transport_ends import LIMIT, End, marker

from regency._transport import address, frames, tls
from regency._transport.transport import PeerUnreachableError

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("tls_everywhere")]


@pytest.fixture
def shared_ca() -> Iterator[tls.Identity]:
    """This process presents a leaf of a user CA; the returned identity is another leaf of
    the same CA (the relay's)."""
    mine, ca_key = tls.generate_ca_and_leaf("job")
    other, _ = tls.leaf_signed_by((mine.ca_pem, ca_key), "relay")
    tls.set_user_identity(mine)
    try:
        yield other
    finally:
        tls.set_user_identity(None)


def forged_frame(payload: bytes) -> bytes:
    """A whole regency frame the relay writes on its own."""
    return b"".join(bytes(b) for b in frames.encode(1, 5, [payload], seq=0, limit=LIMIT))


def test_a_relay_with_a_leaf_of_the_same_ca_is_refused_by_both_ends(
    shared_ca: tls.Identity,
) -> None:
    dialer, listener = End(), End()
    target = (
        address.tcp_host(listener.transport.address),
        address.tcp_port(listener.transport.address),
    )
    forged = b"FORGED-" + os.urandom(8).hex().encode()
    relay = TLSRelay(target, shared_ca, forged_frame(forged), "127.0.0.1")
    try:
        first = marker()
        error = ""
        try:
            dialer.send(relay.address, first)
        except PeerUnreachableError as exc:
            error = str(exc)
        assert relay.done.wait(20)
        with contextlib.suppress(queue.Empty):
            got = listener.frames.get(timeout=1)
            pytest.fail(f"the listener delivered a frame through the relay: {got[:40]!r}")
        assert relay.outcome == "refused by the listener", relay.outcome
        assert "refused this process's proof" in error, error
        assert "a relay holding a certificate of the same CA" in error, error
        assert first not in relay.seen
        # The legitimate path, straight to the listener, still works.
        second = marker()
        dialer.send(listener.transport.address, second)
        assert listener.frames.get(timeout=10) == second
    finally:
        relay.close()
        dialer.close()
        listener.close()
