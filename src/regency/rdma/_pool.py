"""Idle authenticated connections to transfer services, kept for the next transfer."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

_MAX_IDLE_PER_TARGET = 8


class Closeable(Protocol):
    """Anything with ``close()``."""

    def close(self) -> None:
        """Release it."""


C = TypeVar("C", bound=Closeable)


class ConnectionPool(Generic[C]):
    """Per-target stacks of idle connections; a connection in use belongs to its user."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[C]] = {}
        os.register_at_fork(after_in_child=self._forget)

    def take(
        self, target: str, dial: Callable[[], C], usable: Callable[[C], bool] | None = None
    ) -> C:
        """An idle connection to ``target``, or a new one from ``dial()``.

        With ``usable``, an idle connection it refuses (e.g. its peer closed it) is closed and
        the next one tried; a new connection is not checked.
        """
        while True:
            with self._lock:
                idle = self._idle.get(target)
                conn = idle.pop() if idle else None
            if conn is None:
                return dial()
            if usable is None or usable(conn):
                return conn
            _close_quietly(conn)

    @contextlib.contextmanager
    def lease(
        self, target: str, dial: Callable[[], C], usable: Callable[[C], bool] | None = None
    ) -> Iterator[C]:
        """A connection for one exchange (see :meth:`take`), given back when the block ends.

        If the block raises, the connection is closed instead: an exchange may be half done on it.
        """
        conn = self.take(target, dial, usable)
        try:
            yield conn
        except BaseException:
            _close_quietly(conn)
            raise
        self.give(target, conn)

    def give(self, target: str, conn: C) -> None:
        """Return a healthy connection (one with no exchange half done)."""
        with self._lock:
            idle = self._idle.setdefault(target, [])
            if len(idle) < _MAX_IDLE_PER_TARGET:
                idle.append(conn)
                return
        _close_quietly(conn)

    def discard(self, target: str) -> None:
        """Close every idle connection to ``target`` (its service is gone)."""
        with self._lock:
            idle = self._idle.pop(target, [])
        for conn in idle:
            _close_quietly(conn)

    def close_all(self) -> None:
        """Close every idle connection (at interpreter exit)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                _close_quietly(conn)

    def _forget(self) -> None:
        # The child shares these sockets with its parent; it must neither use nor close them.
        self._lock = threading.Lock()
        self._idle = {}


def _close_quietly(conn: Closeable) -> None:
    with contextlib.suppress(OSError):
        conn.close()
