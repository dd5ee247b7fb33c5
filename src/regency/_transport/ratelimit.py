"""Failed handshakes, rate-limited per peer so that a secret cannot be guessed online quickly.

A listener records each failed authentication under the peer's key (its IP address for TCP, its
uid for a unix socket; a local process of this process's own user is not limited, as it could
read the secret from this process anyway). The first :data:`FREE_FAILURES` failures cost
nothing; after that the peer is refused outright (closed before the handshake starts) for a
delay that doubles with each further failure, up to :data:`MAX_DELAY` seconds. A successful
handshake clears the peer's record.
Records of peers quiet for longer than :data:`FORGET_AFTER` are dropped, and at most
:data:`MAX_PEERS` are kept, so the table stays small whatever an attacker does.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable

FREE_FAILURES = 5
BASE_DELAY = 0.25
MAX_DELAY = 30.0
FORGET_AFTER = 600.0
MAX_PEERS = 4096
_UCRED = struct.Struct("3i")


def peer_key(sock: socket.socket) -> str | None:
    """Who is dialing, as the rate limit counts them: ``ip:<address>`` or ``uid:<n>``.

    ``None`` for a local process of this process's own user (it is not limited).
    """
    if sock.family == socket.AF_UNIX:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        except OSError:
            return "uid:unknown"
        _pid, uid, _gid = _UCRED.unpack(creds)
        return None if uid == os.geteuid() else f"uid:{uid}"
    try:
        name = sock.getpeername()
    except OSError:
        return "ip:unknown"
    return f"ip:{name[0]}"


class _Record:
    __slots__ = ("blocked_until", "failures", "last")

    def __init__(self) -> None:
        self.failures = 0
        self.blocked_until = 0.0
        self.last = 0.0


class FailureLimiter:
    """Counts failed handshakes per peer key and says which peers to refuse for now."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}

    def blocked(self, key: str | None) -> float:
        """Seconds ``key`` stays refused (0.0: let it try)."""
        if key is None:
            return 0.0
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return 0.0
            return max(0.0, record.blocked_until - self._clock())

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
            record.failures += 1
            record.last = now
            extra = record.failures - FREE_FAILURES
            if extra > 0:
                delay = min(MAX_DELAY, BASE_DELAY * 2.0 ** min(extra - 1, 16))
                record.blocked_until = now + delay

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
