"""Who may hold a connection to an observation listener before proving a secret, and how many.

The admin API and the debugger each accept connections that have not authenticated yet (no
bearer token seen, no handshake answered). Each such connection is counted under its client,
as the kernel names it (:func:`client_key`): the listener's own user (the owner), another
local user (by uid), or another machine (by address). The owner has a pool of its own, so
nobody else can crowd it out; everybody else shares a pool, with a smaller bound per client.
A connection over a bound pushes out the oldest one of its client (or of the pool): a new
client is never refused for old ones that are still silent.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from regency._transport.peer_identity import ConnectedSocket, tcp_peer_uid, unix_peer_uid

C = TypeVar("C")

#: The key of the listener's own user: processes that could read its secrets anyway.
OWNER: str | None = None


def client_key(sock: ConnectedSocket) -> str | None:
    """Who is at the other end of ``sock``: :data:`OWNER`, ``uid:N`` or ``ip:ADDRESS``.

    A unix socket's peer, or a TCP peer on this machine, is named by the uid the kernel gives;
    a peer elsewhere by its address. ``uid:unknown`` where the kernel does not say (the peer
    left already).
    """
    unix = sock.family == socket.AF_UNIX  # asked once: each ask makes an enum
    uid = unix_peer_uid(sock) if unix else tcp_peer_uid(sock)
    if uid is not None:
        return OWNER if uid == os.geteuid() else f"uid:{uid}"
    if unix:
        return "uid:unknown"
    try:
        return f"ip:{sock.getpeername()[0]}"
    except OSError:
        return "uid:unknown"


class Admission(Generic[C]):
    """Counts unauthenticated connections per client and says which to close to admit one more.

    ``others`` bounds the connections of everybody but the owner together, ``per_client`` those
    of one of them, ``owner`` the owner's. ``clock`` times how long each has been waiting.
    """

    def __init__(
        self,
        others: int,
        per_client: int,
        owner: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._others, self._per_client, self._owner = others, per_client, owner
        self._clock = clock
        self._waiting: dict[C, tuple[str | None, float]] = {}  # oldest first
        self._counts: dict[str | None, int] = {}

    def admit(self, key: str | None, conn: C) -> list[C]:
        """Count ``conn`` of client ``key``; the connections to close to make room for it."""
        pushed: list[C] = []
        if key is OWNER:
            if self._counts.get(OWNER, 0) >= self._owner:
                pushed.append(self._oldest(lambda k: k is OWNER))
        elif self._counts.get(key, 0) >= self._per_client:
            pushed.append(self._oldest(lambda k: k == key))
        elif len(self._waiting) - self._counts.get(OWNER, 0) >= self._others:
            pushed.append(self._oldest(lambda k: k is not OWNER))
        for old in pushed:
            self.release(old)
        self._waiting[conn] = (key, self._clock())
        self._counts[key] = self._counts.get(key, 0) + 1
        return pushed

    def release(self, conn: C) -> str | None:
        """Stop counting ``conn`` (it authenticated or closed); its client's key."""
        entry = self._waiting.pop(conn, None)
        if entry is None:
            return None
        key = entry[0]
        self._counts[key] -= 1
        if not self._counts[key]:
            del self._counts[key]
        return key

    def waiting_since(self, limit: float) -> list[C]:
        """The connections that have waited ``limit`` seconds or longer."""
        cutoff = self._clock() - limit
        return [conn for conn, (_, since) in self._waiting.items() if since <= cutoff]

    def __len__(self) -> int:
        return len(self._waiting)

    def _oldest(self, of: Callable[[str | None], bool]) -> C:
        return next(conn for conn, (key, _) in self._waiting.items() if of(key))


def describe(key: str | None) -> str:
    """``key`` for a log line: ``this user``, ``uid 1001``, ``127.0.0.2``."""
    if key is None:  # OWNER
        return "this user"
    kind, _, value = key.partition(":")
    return f"uid {value}" if kind == "uid" else value
