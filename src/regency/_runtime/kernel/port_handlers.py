"""Port handlers: the Protocol every port's handler implements, and the two every layer shares."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Protocol

from regency._runtime.kernel.refs import Part

log = logging.getLogger("regency.proc")


class PortHandler(Protocol):
    """Receives port messages on the I/O thread (or the local sender's thread)."""

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """Take one message; must not block or run user code."""

    def peer_lost(self, addr: str, reason: str) -> None:
        """A process this port was waiting on is gone."""


class PeerWatch:
    """A port that watches one peer: ``on_lost(peer, reason)`` runs, on the I/O thread, once the
    peer is gone. Nothing is ever sent to it."""

    __slots__ = ("_on_lost", "_peer")

    def __init__(self, peer: str, on_lost: Callable[[str, str], None]) -> None:
        self._peer = peer
        self._on_lost = on_lost

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """Nothing is ever sent here."""

    def peer_lost(self, addr: str, reason: str) -> None:
        """The peer is gone: tell ``on_lost``."""
        self._on_lost(self._peer, reason)


class ExitReports:
    """Port handler for host agents' ``(addr, reason)`` reports of procs that ended."""

    __slots__ = ("_on_ended",)

    def __init__(self, on_ended: Callable[[str, str], None]) -> None:
        self._on_ended = on_ended

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """Decode one report and pass it on."""
        try:
            addr, reason = pickle.loads(parts[0])
        except Exception as exc:
            log.warning("dropping an undecodable exit report: %s", exc)
            return
        self._on_ended(addr, reason)

    def peer_lost(self, addr: str, reason: str) -> None:
        """Nothing to do: this port watches no process."""
