"""Failed handshakes, counted per peer so that a secret cannot be guessed online quickly.

A listener records each failed authentication under the peer's key (:func:`identify`): on this
machine the kernel says who the peer is, so a unix socket or loopback TCP peer counts as its uid
(``uid:<n>``) whichever loopback address it dials from, and a loopback peer whose uid cannot be
found counts as one machine (``host:loopback``); a peer on another host counts as its IP address.
A local process of this process's own user is not limited, as it could read the secret from this
process anyway. The first :data:`FREE_FAILURES` failures cost nothing; after that the peer is
*blocked* for a delay that doubles with each further failure, up to :data:`MAX_DELAY` seconds.
A successful handshake clears the peer's record. Besides each peer's record one record counts
every failure (:data:`GLOBAL_FREE_FAILURES` free ones), so that many peers together (many
addresses of another host, many local uids) get no more than one budget of quick answers.

What *blocked* costs is the listener's choice; the transport's listeners never refuse a proof
for it (the proof may be right: failures of others must not lock a peer out) but hold a
blocked peer's wrong proof unanswered until its connection's deadline.
Records of peers quiet for longer than :data:`FORGET_AFTER` are dropped, and at most
:data:`MAX_PEERS` are kept, so the table stays small whatever an attacker does.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from regency._transport.peer_identity import is_loopback, tcp_peer_uid, unix_peer_uid

FREE_FAILURES = 5
GLOBAL_FREE_FAILURES = 32
BASE_DELAY = 0.25
MAX_DELAY = 30.0
FORGET_AFTER = 600.0
MAX_PEERS = 4096


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is dialing: ``key`` names them for counting; ``limited``: failures count against
    them (not for a local process of this process's own user)."""

    key: str
    limited: bool


def identify(sock: socket.socket) -> Peer:
    """Who is at the other end of ``sock``, by what the kernel says where it can.

    ``uid:<n>`` for a unix socket or a TCP peer on this machine (loopback, or one of this
    machine's own addresses), ``host:loopback`` for a loopback peer whose uid is not found,
    ``ip:<address>`` for a peer on another host.
    """
    if sock.family == socket.AF_UNIX:
        uid = unix_peer_uid(sock)
        return _local(uid) if uid is not None else Peer("uid:unknown", True)
    try:
        ip = str(sock.getpeername()[0])
    except OSError:
        return Peer("ip:unknown", True)
    uid = tcp_peer_uid(sock) if is_loopback(ip) or _same_host(sock, ip) else None
    if uid is not None:
        return _local(uid)
    return Peer("host:loopback" if is_loopback(ip) else f"ip:{ip}", True)


def peer_key(sock: socket.socket) -> str | None:
    """:func:`identify`'s key, ``None`` for a local process of this process's own user (it is
    not limited)."""
    peer = identify(sock)
    return peer.key if peer.limited else None


def _local(uid: int) -> Peer:
    return Peer(f"uid:{uid}", uid != os.geteuid())


def _same_host(sock: socket.socket, ip: str) -> bool:
    """Whether the peer dialed from the address it reached (one of this machine's own)."""
    try:
        return str(sock.getsockname()[0]) == ip
    except OSError:
        return False


class _Record:
    __slots__ = ("blocked_until", "failures", "last")

    def __init__(self) -> None:
        self.failures = 0
        self.blocked_until = 0.0
        self.last = 0.0


def _count(record: _Record, now: float, free: int) -> None:
    record.failures += 1
    record.last = now
    extra = record.failures - free
    if extra > 0:
        delay = min(MAX_DELAY, BASE_DELAY * 2.0 ** min(extra - 1, 16))
        record.blocked_until = now + delay


class FailureLimiter:
    """Counts failed handshakes per peer key and says which peers to refuse for now."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
        self._all = _Record()  # every failure, whoever made it

    def blocked(self, key: str | None) -> float:
        """Seconds ``key`` stays refused (0.0: let it try)."""
        if key is None:
            return 0.0
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return 0.0
            return max(0.0, record.blocked_until - self._clock())

    def over_budget(self, key: str | None) -> bool:
        """Whether a failure of ``key`` now is past its own budget or the one of all peers
        together (``None``: never)."""
        if key is None:
            return False
        with self._lock:
            if self._all.blocked_until > self._clock():
                return True
        return self.blocked(key) > 0

    def failed(self, key: str | None) -> None:
        """Record a failed handshake from ``key``."""
        if key is None:
            return
        now = self._clock()
        with self._lock:
            record = self._records.get(key)
            if record is None:
                self._prune(now)
                record = self._records[key] = _Record()
            _count(record, now, FREE_FAILURES)
            if now - self._all.last > FORGET_AFTER:
                self._all = _Record()
            _count(self._all, now, GLOBAL_FREE_FAILURES)

    def succeeded(self, key: str | None) -> None:
        """Forget ``key``'s failures: it proved the secret."""
        if key is None:
            return
        with self._lock:
            self._records.pop(key, None)

    def __len__(self) -> int:
        return len(self._records)

    def _prune(self, now: float) -> None:
        if len(self._records) < MAX_PEERS:
            stale = [k for k, r in self._records.items() if now - r.last > FORGET_AFTER]
            for key in stale:
                del self._records[key]
            return
        # Full of recent peers: drop the quietest half.
        ordered = sorted(self._records, key=lambda k: self._records[k].last)
        for key in ordered[: len(ordered) // 2]:
            del self._records[key]
