"""Credit flow control for byte streams carried as actor messages (port forwards, shells).

A sender may have at most ``window`` bytes sent that its receiver has not yet consumed (written
to a socket, a pty or a terminal); the receiver returns credit for each chunk it consumed. A
slow consumer therefore stalls the producer at the far end instead of growing a queue without
bound, and nothing is dropped.
"""

from __future__ import annotations

import asyncio

from regency.actor import PortReceiver


class Credit:
    """The bytes a sender may still send before its receiver has consumed them."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.in_flight = 0
        self._changed = asyncio.Event()

    async def take(self, count: int) -> None:
        """Wait until the window has room, then count ``count`` more bytes in flight."""
        while self.in_flight >= self.window:
            self._changed.clear()
            await self._changed.wait()
        self.in_flight += count

    def give(self, count: int) -> None:
        """The receiver consumed ``count`` bytes."""
        self.in_flight -= count
        self._changed.set()


async def collect(receiver: PortReceiver[int], credit: Credit) -> None:
    """Add each credit that arrives on ``receiver`` to ``credit``, until cancelled."""
    while True:
        credit.give(await receiver.recv())
