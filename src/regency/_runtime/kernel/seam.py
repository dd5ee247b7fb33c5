"""The send seam: what the router needs of the transport under it, as Protocols.

:class:`~.router.FrameRouter` sends through a :class:`FrameTransport` and schedules its few
deferred steps on a :class:`Timers`. A real process plugs in :class:`regency._transport.transport.
Transport` and its I/O loop (:class:`~.proc_runtime.ProcRuntime` does); unit tests plug in the
in-memory :mod:`.loopback`, so that several routers exchange real frames in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from regency._transport import frames
from regency._transport.connection import Buffer
from regency._transport.names import Named


class FrameSource(Protocol):
    """Where a received frame came from: the peer's address, and a way to drop the peer."""

    peer: str

    def close(self, reason: str) -> None:
        """Close the connection the frame came on."""


FrameSink = Callable[[FrameSource, frames.Frame], None]
"""Called with each frame received, and where it came from."""
LossSink = Callable[[str, str], None]
"""Called with a peer's address and the reason once the transport has lost it."""


class FrameTransport(Protocol):
    """Sends frames (lists of buffers, header first) to peers by address."""

    address: str

    def send(self, peer: str, buffers: Sequence[Buffer], wait: bool = True) -> None:
        """Send one frame to ``peer``; raise ``PeerUnreachableError`` if it is lost."""

    def post(
        self,
        frames: Sequence[tuple[str, Sequence[Buffer], int]],
        named: Sequence[Named | None] = (),
    ) -> None:
        """Send small frames ``(peer, buffers, size)``, possibly coalesced with others until
        :meth:`flush`; frames to live peers go even when one peer is lost, then
        ``PeerUnreachableError`` names it (its ``peers`` too). ``named``: frame by frame, the
        part each names (see :mod:`regency._transport.names`), if any."""

    def post_one(self, peer: str, buffers: Sequence[Buffer], size: int) -> None:
        """:meth:`post` of one frame."""

    def flush(self) -> None:
        """Send every frame waiting to be coalesced."""

    def is_local(self, peer: str) -> bool:
        """Whether ``peer`` is on this host (large parts may then move to shared memory)."""

    def mark_lost(self, peer: str, reason: str) -> None:
        """``peer`` is gone: later sends to it raise ``PeerUnreachableError``."""

    def forget_lost(self, peer: str) -> None:
        """A new process now answers at ``peer``, whose earlier one was lost: reach it again."""

    def close(self) -> None:
        """Close every connection."""


class Timers(Protocol):
    """Runs a callable soon or after a delay (the I/O loop's thread, in a real process)."""

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` soon."""

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay`` seconds."""
