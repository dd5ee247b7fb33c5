"""Per-actor mailboxes: restore each sender's order and hold messages until the actor exists."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Delivery = tuple[Any, ...]  # (parts, rank, reply_override)
Sink = Callable[[Delivery], None]


class Mailbox:
    """Orders deliveries per sender by sequence number and hands them to the actor's queue.

    A message may overtake another from the same sender when one went down a casting tree and
    the other went direct; the mailbox holds it until the earlier one arrives. Messages that
    arrive before the actor is spawned wait here too.
    """

    __slots__ = ("_early", "_held", "_lock", "_next", "_sink")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._held: dict[int, dict[int, Delivery]] = {}
        self._sink: Sink | None = None
        self._early: list[Delivery] = []

    def post(self, sender: int, seq: int, delivery: Any) -> None:
        """Deliver message ``seq`` (starting at 1) from ``sender``; 0 means unordered."""
        with self._lock:
            if seq == 0:
                self._emit(delivery)
                return
            expected = self._next.get(sender, 1)
            if seq != expected:
                if seq > expected:
                    self._held.setdefault(sender, {})[seq] = delivery
                return
            sink = self._sink
            if sink is not None:
                sink(delivery)
            else:
                self._early.append(delivery)
            expected += 1
            held = self._held.get(sender) if self._held else None
            if held:
                while expected in held:
                    self._emit(held.pop(expected))
                    expected += 1
                if not held:
                    del self._held[sender]
            self._next[sender] = expected

    def _emit(self, delivery: Delivery) -> None:
        if self._sink is not None:
            self._sink(delivery)
        else:
            self._early.append(delivery)

    def attach(self, sink: Sink) -> None:
        """Start handing deliveries to ``sink``, beginning with those that arrived early."""
        with self._lock:
            early, self._early = self._early, []
            for delivery in early:
                sink(delivery)
            self._sink = sink

    def detach(self) -> list[Delivery]:
        """Stop delivering; return what was waiting for a sink."""
        with self._lock:
            self._sink = None
            early, self._early = self._early, []
            return early
