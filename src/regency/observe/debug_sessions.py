"""The controller's record of the procs paused in ``breakpoint()``: one session per (actor, rank).

The debuggee's side (:mod:`regency.observe.pdb_session`) reports a session's start, each batch
of ``pdb`` output (ending with the prompt when it waits for a command) and its end; the
debugger's clients (:mod:`regency.observe.debug_repl`) read that output and send it commands.
Both sides run on different threads of the controller, so everything here is under one
condition variable, which also wakes a client waiting for a rank to answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from regency._lowlevel import PeerLostError, Port

SessionKey = tuple[str, int]  # (actor name, rank): as in Monarch, one session per actor rank


@dataclass(frozen=True)
class Location:
    """Where a paused rank is: ``module.function`` and the line."""

    function: str
    lineno: int
    filename: str = ""


@dataclass(frozen=True)
class SessionInfo:
    """What ``list`` shows of a paused rank."""

    actor_name: str
    rank: int
    coords: dict[str, int]
    hostname: str
    location: Location

    @property
    def key(self) -> SessionKey:
        """The session's key: its actor's name and rank."""
        return (self.actor_name, self.rank)


@dataclass
class Session:
    """One paused rank: its latest location, output not yet shown, and where commands go."""

    info: SessionInfo
    port: Port[tuple[str, str]]
    location: Location
    pending: list[str] = field(default_factory=list)
    waiting: bool = False
    ended: str | None = None

    @property
    def label(self) -> str:
        """``rank N (host)``, as the debugger's messages name a session."""
        return f"rank {self.info.rank} ({self.info.hostname})"


class Sessions:
    """Every open session, by key; thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open: dict[SessionKey, Session] = {}

    def start(self, info: SessionInfo, port: Port[tuple[str, str]]) -> None:
        """A rank paused: record it (replacing a stale session under the same key)."""
        with self._changed:
            old = self._open.get(info.key)
            if old is not None:
                old.ended = "replaced by a new session"
            self._open[info.key] = Session(info, port, info.location)
            self._changed.notify_all()

    def output(self, key: SessionKey, text: str, location: Location, waiting: bool) -> None:
        """``pdb`` wrote ``text``; ``waiting``: it now waits for a command."""
        with self._changed:
            session = self._open.get(key)
            if session is None:
                return
            if text:
                session.pending.append(text)
            session.location = location
            session.waiting = waiting
            self._changed.notify_all()

    def end(self, key: SessionKey, text: str, reason: str) -> None:
        """The rank left ``pdb`` (continued, quit, or its endpoint finished)."""
        with self._changed:
            session = self._open.pop(key, None)
            if session is None:
                return
            if text:
                session.pending.append(text)
            session.waiting = False
            session.ended = reason
            self._changed.notify_all()

    def listed(self) -> list[Session]:
        """The open sessions, by actor name and rank."""
        with self._changed:
            return [self._open[key] for key in sorted(self._open)]

    def find(self, actor_name: str, rank: int) -> Session | None:
        """The open session of ``actor_name`` rank ``rank``, if any."""
        with self._changed:
            return self._open.get((actor_name, rank))

    def send(self, session: Session, kind: str, line: str = "") -> bool:
        """Hand a paused rank a command; False when the rank is gone (its session then ends).

        ``kind`` is ``"line"`` (a pdb command), or ``"continue"``: clear its breakpoints and
        continue.
        """
        with self._changed:
            if session.ended is not None:
                return False
            session.waiting = False
        try:
            session.port.send((kind, line))
        except PeerLostError:
            self.end(session.info.key, "", "its proc is gone")
            return False
        return True

    def take(self, session: Session) -> str:
        """The session's output not yet shown (emptied)."""
        with self._changed:
            text = "".join(session.pending)
            session.pending.clear()
            return text

    def wait(self, sessions: Iterable[Session], timeout: float | None) -> list[Session]:
        """Wait until each session waits for a command or has ended.

        Returns those still running when ``timeout`` (seconds; ``None``: no limit) ran out.
        """
        chosen = list(sessions)
        deadline = None if timeout is None else time.monotonic() + timeout

        def running() -> list[Session]:
            return [s for s in chosen if not s.waiting and s.ended is None]

        with self._changed:
            while running():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left if left is not None else 1.0)
            return running()

    def snapshot(self) -> list[dict[str, Any]]:
        """The open sessions as plain data (``DebugController.list``)."""
        return [
            {
                "actor_name": s.info.actor_name,
                "rank": s.info.rank,
                "coords": dict(s.info.coords),
                "hostname": s.info.hostname,
                "function": s.location.function,
                "lineno": s.location.lineno,
                "waiting": s.waiting,
            }
            for s in self.listed()
        ]
