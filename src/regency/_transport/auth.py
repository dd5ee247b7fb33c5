"""Mutual authentication of a fresh connection with the job's shared secret.

Both sides prove knowledge of the secret with an HMAC over both nonces before either side
unpickles a byte. The dialer also tells the listener its own listening address, so the listener can
answer over the same connection.

    listener -> dialer : MAGIC | nonce_l(32)
    dialer   -> listener: mac("dial", nonce_l, nonce_d)(32) | nonce_d(32) | u16 len | address
                          | mac("addr", nonce_l + nonce_d, address)(32)
    listener -> dialer : mac("listen", nonce_d, nonce_l)(32)    or REFUSED(32)

The listener checks the first MAC as soon as it has arrived (garbage is refused at once); the
last one binds the announced address to this handshake, so it cannot be rewritten in transit.
A listener may accept several secrets (a worker daemon takes its job's secret and the secret of
the controller it serves); the one the dialer proved is used for the rest of the handshake. A
listener that refuses the proof answers :data:`REFUSED` (the dialer reports a proof refused); one
that hangs up without a word was busy or closing, and the dialer may try again.

**Bound to the channel.** Every MAC also covers the channel the handshake runs on
(:func:`channel_binding`): over TLS, the connection's ``tls-unique`` value, which in TLS 1.3 is
the client's Finished message, a MAC over the whole TLS handshake (both key shares and both
certificates). A party on the path that holds another certificate of the same CA and terminates
TLS on both sides has two TLS connections with two different values, so the proofs it relays
fail on both ends. Python's ``ssl`` has no RFC 5705 exporter; ``tls-unique`` is what it offers
that both ends compute alike. Unix sockets and plain loopback TCP have no TLS: their value is
empty.

:func:`wrap_secret` hands a secret to a peer over a connection authenticated with another one,
without ever putting it on the wire in the clear.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import struct
from typing import Protocol

from regency._errors import RegencyError
from regency._transport.secure_socket import SecureSocket

MAGIC = b"RGCY\x02"  # \x02: the MACs cover the channel
_FAMILY = MAGIC[:-1]
NONCE = 32
MAC = 32
_ADDR_LEN = struct.Struct("<H")
HELLO_LEN = len(MAGIC) + NONCE
REPLY_HEAD = MAC + NONCE + _ADDR_LEN.size
MAX_ADDRESS = 1024
# What a listener answers instead of its proof when it refuses the dialer's (never a MAC value:
# a MAC equal to it is as likely as guessing the secret).
REFUSED = b"RGCY refused the proof".ljust(MAC, b"\0")
_SALT = 16


MIN_SECRET = 16
# The environment variable that hands a worker daemon its job secret. Only the daemon reads it:
# it is removed from the environment procs (and the commands they run) are given.
SECRET_ENV = "REGENCY_JOB_SECRET"


def check_secret(secret: bytes, source: str) -> bytes:
    """``secret`` if it has at least :data:`MIN_SECRET` bytes; ``ValueError`` naming ``source``
    and the minimum otherwise (a short secret is guessed online in a few tries)."""
    if not isinstance(secret, bytes | bytearray):
        raise TypeError(f"{source}: a job secret is bytes, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET:
        raise ValueError(
            f"{source}: the job secret has {len(secret)} bytes; regency requires at least "
            f"{MIN_SECRET} random bytes (e.g. os.urandom(32), or secrets.token_hex(32) as hex)"
        )
    return bytes(secret)


class AuthenticationError(RegencyError, ConnectionError):
    """The peer failed the handshake: wrong secret, wrong protocol, or it hung up."""


class _Stream(Protocol):
    def recv(self, n: int, /) -> bytes: ...
    def sendall(self, data: bytes, /) -> None: ...


def channel_binding(sock: object) -> bytes:
    """What ties a handshake to the connection it runs on: a TLS connection's ``tls-unique``
    value; empty for a connection without TLS (unix sockets, plain loopback TCP)."""
    if isinstance(sock, SecureSocket):
        return sock.channel_binding()
    return b""


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes, channel: bytes = b"") -> bytes:
    bound = hashlib.sha256(channel).digest()
    return hmac.new(secret, role + bound + first + second, hashlib.sha256).digest()


def _recv_exact(sock: _Stream, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise AuthenticationError("peer closed the connection during the handshake")
        chunks += chunk
    return bytes(chunks)


def dialer_handshake(sock: _Stream, secret: bytes, my_address: str) -> None:
    """Run the dialing side of the handshake on a blocking socket.

    A peer that hangs up before saying anything raises a plain ``ConnectionError`` (it refused
    the connection, e.g. for a process that is gone); one that hangs up after this process's
    proof without answering raises ``ConnectionResetError`` (it was busy or closing: worth another
    try); a peer that refuses the proof, or proves another secret, raises
    :class:`AuthenticationError`.
    """
    channel = channel_binding(sock)
    first = sock.recv(HELLO_LEN)
    if not first:
        raise ConnectionError("peer closed the connection before the handshake")
    hello = first + _recv_exact(sock, HELLO_LEN - len(first)) if len(first) < HELLO_LEN else first
    if not hello.startswith(MAGIC):
        if hello.startswith(_FAMILY):
            raise AuthenticationError(
                "peer speaks another version of regency's handshake (a different regency version)"
            )
        raise AuthenticationError("peer is not a regency endpoint (bad handshake magic)")
    nonce_l = hello[len(MAGIC) :]
    nonce_d = os.urandom(NONCE)
    addr = my_address.encode()
    proof = _mac(secret, b"dial", nonce_l, nonce_d, channel)
    addr_proof = _mac(secret, b"addr", nonce_l + nonce_d, addr, channel)
    sock.sendall(proof + nonce_d + _ADDR_LEN.pack(len(addr)) + addr + addr_proof)
    try:
        answer = _recv_exact(sock, MAC)
    except AuthenticationError:
        raise ConnectionResetError(
            errno.ECONNRESET,
            "the peer hung up during the handshake without judging this process's proof "
            "(busy with other connections, or closing)",
        ) from None
    if answer == REFUSED:
        raise AuthenticationError(
            "the peer refused this process's proof: it holds a different job secret"
            + (
                ", or something on the way terminates TLS (a relay holding a certificate of the "
                "same CA)"
                if channel
                else ""
            )
        )
    if not hmac.compare_digest(answer, _mac(secret, b"listen", nonce_d, nonce_l, channel)):
        raise AuthenticationError("peer failed authentication (it does not hold this job's secret)")


class ListenerHandshake:
    """The listening side of the handshake, fed incrementally by the I/O loop.

    ``secret`` and ``others`` are the secrets a dialer may prove; ``secret`` is, once verified,
    the one it proved. ``channel`` is the connection's :func:`channel_binding`.
    """

    __slots__ = (
        "_buf",
        "_candidates",
        "_channel",
        "_nonce",
        "_verified",
        "peer_address",
        "secret",
    )

    def __init__(self, secret: bytes, *others: bytes, channel: bytes = b"") -> None:
        self.secret = secret
        self._channel = channel
        self._candidates = (secret, *others)
        self._nonce = os.urandom(NONCE)
        self._buf = bytearray()
        self._verified = False
        self.peer_address: str | None = None

    def hello(self) -> bytes:
        """Bytes to send as soon as the connection is accepted."""
        return MAGIC + self._nonce

    def feed(self, data: bytes) -> bytes | None:
        """Take received bytes; return the final proof to send once the dialer is verified.

        Returns ``None`` while more bytes are needed; raises :class:`AuthenticationError` when the
        dialer's proof is wrong.
        """
        self._buf += data
        if len(self._buf) < MAC + NONCE:
            return None
        if not self._verified:
            # Check the proof as soon as it is complete, before waiting for anything else.
            proof = bytes(self._buf[:MAC])
            nonce_d = bytes(self._buf[MAC : MAC + NONCE])
            for candidate in self._candidates:
                if hmac.compare_digest(
                    proof, _mac(candidate, b"dial", self._nonce, nonce_d, self._channel)
                ):
                    self.secret = candidate
                    break
            else:
                raise AuthenticationError(
                    "peer failed authentication (wrong secret"
                    + (", or a proof relayed from another TLS channel)" if self._channel else ")")
                )
            self._verified = True
        if len(self._buf) < REPLY_HEAD:
            return None
        (addr_len,) = _ADDR_LEN.unpack_from(self._buf, MAC + NONCE)
        if addr_len > MAX_ADDRESS:
            raise AuthenticationError(f"peer announced a {addr_len}-byte address")
        total = REPLY_HEAD + addr_len + MAC
        if len(self._buf) < total:
            return None
        if len(self._buf) > total:
            raise AuthenticationError("peer sent data before the handshake completed")
        nonce_d = bytes(self._buf[MAC : MAC + NONCE])
        addr = bytes(self._buf[REPLY_HEAD : REPLY_HEAD + addr_len])
        addr_proof = bytes(self._buf[REPLY_HEAD + addr_len :])
        expected = _mac(self.secret, b"addr", self._nonce + nonce_d, addr, self._channel)
        if not hmac.compare_digest(addr_proof, expected):
            raise AuthenticationError("peer's announced address failed authentication")
        self.peer_address = addr.decode(errors="replace")
        return _mac(self.secret, b"listen", nonce_d, self._nonce, self._channel)


def wrap_secret(key: bytes, secret: bytes) -> bytes:
    """``secret`` (at most 32 bytes) enciphered and sealed with ``key``: a fresh salt, the
    secret XORed with an HMAC-derived pad, and a tag over both."""
    if len(secret) > MAC:
        raise ValueError(f"can only wrap secrets of up to {MAC} bytes")
    salt = os.urandom(_SALT)
    pad = _mac(key, b"wrap", salt, b"")
    sealed = bytes(a ^ b for a, b in zip(secret, pad[: len(secret)], strict=True))
    return salt + sealed + _mac(key, b"seal", salt, sealed)


def unwrap_secret(key: bytes, blob: bytes) -> bytes:
    """The secret :func:`wrap_secret` wrapped with ``key``; :class:`AuthenticationError` if the
    blob was not made with ``key`` or was altered."""
    if not _SALT + MAC <= len(blob) <= _SALT + 2 * MAC:
        raise AuthenticationError(f"a wrapped secret has {_SALT} to {_SALT + 2 * MAC} bytes")
    salt, sealed, tag = blob[:_SALT], blob[_SALT:-MAC], blob[-MAC:]
    if not hmac.compare_digest(tag, _mac(key, b"seal", salt, sealed)):
        raise AuthenticationError("wrapped secret failed authentication")
    pad = _mac(key, b"wrap", salt, b"")
    return bytes(a ^ b for a, b in zip(sealed, pad[: len(sealed)], strict=True))
