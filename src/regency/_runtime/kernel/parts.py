"""What the router decides from a message's parts alone: their size, whether a frame of them is
small enough to post (coalesced with others), and copies for a receiver in this same process."""

from __future__ import annotations

from collections.abc import Sequence

from regency._runtime.kernel.refs import Part

# Frames of at most this many parts are envelope + pickle body: our own bytes, safe to hold.
OWN_PARTS = 2
COALESCE_MAX = 16 * 1024


def postable(nparts: int, frame_size: int) -> bool:
    """Whether a frame of a message of ``nparts`` parts and ``frame_size`` bytes is posted:
    small, and only our own bytes (out-of-band parts are far larger), so it can wait in an
    outbox to be coalesced with others and the sender never waits for the peer."""
    return nparts <= OWN_PARTS and frame_size <= COALESCE_MAX


def buffers_size(buffers: Sequence[Part]) -> int:
    """Total bytes of some buffers."""
    total = 0
    for b in buffers:
        total += b.nbytes if isinstance(b, memoryview) else len(b)
    return total


def own_copies(parts: Sequence[Part]) -> list[Part]:
    """Copies of out-of-band buffers for a receiver in this same process.

    The body (part 0) is a fresh pickle nobody else holds; larger parts are views of the
    sender's objects, which the sender may change after the send returns.
    """
    return [parts[0], *(bytes(p) for p in parts[1:])] if len(parts) > 1 else list(parts)
