"""The casting tree: a message to many procs fans out with bounded fan-out, replies merge back.

The sender splits its destination list into at most ``fanout`` contiguous groups and sends the
message once to the head of each group, with the rest of the group attached. Each head delivers
to its own actor and does the same for its rest, so the tree has depth ``log_fanout(n)``. For
``call`` each head also gathers its subtree's replies into one message before passing it up.

A frame describes its head's subtree compactly (:mod:`.routing`) and the sender numbers a
stream of casts to one view by counting them (:mod:`.seqs`), so a cast costs its sender and
each head per frame it sends, not per destination below.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from regency import config
from regency._config_keys import CAST_FANOUT
from regency._runtime.kernel import wire
from regency._runtime.kernel.refs import Part, PortRef

# Where a node acknowledges a cast frame: its parent's address and port, and the frame's token
# (:mod:`.forwards`). A plain tuple, as it travels in the frame's routing part.
Ack = tuple[str, int, int]


class Dest(NamedTuple):
    """One destination actor: its process, the sender's sequence number for it, its rank."""

    addr: str
    seq: int
    rank: int


class Group(NamedTuple):
    """A subtree: the head receives the message and forwards it to ``rest`` (a tuple, or a
    :class:`~.routing.Subtree`, which lists them without making them one by one)."""

    head: Dest
    rest: Sequence[Dest]


# At most this many (position, extra) pairs in a subtree's sequence numbers: messages sent
# straight to its destinations since its base numbers were taken (the sender rebases after).
PATCH_MAX = 64


_fanout = (-1, 0)  # (config.changes() when read, cast_fanout then); -1: not read yet


def fanout() -> int:
    """``cast_fanout``, read from :mod:`regency.config` again only after a change there.

    A forwarding process plans every cast frame it relays with it: one comparison instead of a
    lookup that ends in the environment.
    """
    global _fanout
    seen, value = _fanout
    now = config.changes()
    if seen != now:
        value = config.value(CAST_FANOUT)
        _fanout = (now, value)
    return value


def spans(n: int, fanout: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of at most ``fanout`` contiguous subtrees of near-equal size over
    ``n`` destinations, the larger first."""
    if n <= fanout:
        return [(i, i + 1) for i in range(n)]
    out = []
    base, extra = divmod(n, fanout)
    start = 0
    for i in range(fanout):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def plan(dests: Sequence[Dest], fanout: int) -> list[Group]:
    """Split ``dests`` into at most ``fanout`` subtrees of near-equal size."""
    return [Group(dests[s], tuple(dests[s + 1 : e])) for s, e in spans(len(dests), fanout)]


# A pickled destination takes at most this many bytes besides its address (its address, rank
# and sequence number in the roster and the array), a routing part at most this many besides
# its destinations, its reply port's address and its acknowledgement's (a full patch
# included), and an acknowledgement (port and token) this many besides its address.
_DEST_BYTES = 40
_ROUTING_BYTES = 256 + 24 * PATCH_MAX
_ACK_BYTES = 40


def routing_bound(addrs: Sequence[str], sender: str) -> int:
    """At most how many bytes the routing part of a cast frame to a subtree of ``addrs`` takes,
    its reply port's address aside, when ``sender`` (its address) sends it.

    The frame asks the node that gets it to acknowledge it to the process that sent it: the
    sender, or one of ``addrs`` passing it on.
    """
    longest = max(len(a.encode()) for a in (sender, *addrs))
    return _ROUTING_BYTES + _ACK_BYTES + longest + sum(len(a.encode()) + _DEST_BYTES for a in addrs)


Entry = tuple[int, int, list["Part"]]  # (rank, flags, parts)


def pack_entries(entries: Sequence[Entry]) -> list[Part]:
    """Merge several replies into the parts of one FLAG_GATHER port message."""
    index = [(rank, flags, len(parts)) for rank, flags, parts in entries]
    out: list[Part] = [pickle.dumps(index, protocol=5)]
    for _, _, parts in entries:
        out.extend(parts)
    return out


def unpack_entries(rank: int, flags: int, parts: Sequence[Part]) -> list[Entry]:
    """The replies inside one port message (one, or several when FLAG_GATHER is set)."""
    if not flags & wire.FLAG_GATHER:
        return [(rank, flags, list(parts))]
    index = pickle.loads(parts[0])
    entries: list[Entry] = []
    offset = 1
    for entry_rank, entry_flags, count in index:
        entries.append((entry_rank, entry_flags, list(parts[offset : offset + count])))
        offset += count
    return entries


class PortSender(Protocol):
    """What a relay needs of its process's router (implemented by ``ProcRuntime``)."""

    def close_port(self, port: int, watch: Sequence[str] = ()) -> None:
        """Forget a port; later messages to it are dropped."""

    def send_port(
        self, ref: PortRef, rank: int, flags: int, parts: Sequence[Part], wait: bool = True
    ) -> None:
        """Send a value to a port (anywhere)."""


class GatherRelay:
    """A tree node's accumulator: collects its subtree's replies, then sends them up as one."""

    def __init__(self, runtime: PortSender, upstream: PortRef | None, expected: int) -> None:
        self._runtime = runtime
        self._upstream = upstream
        self._expected = expected
        self._entries: list[Entry] = []
        self._lock = threading.Lock()
        self._port = -1
        self._watch: list[str] = []

    def bind(self, port: int, watch: list[str]) -> None:
        """Remember the port id this relay was registered under."""
        self._port = port
        self._watch = watch

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """Take one reply or merged group of replies from the subtree."""
        with self._lock:
            self._entries.extend(unpack_entries(rank, flags, parts))
            self._expected -= 1
            if self._expected:
                return
            entries, self._entries = self._entries, []
        self._runtime.close_port(self._port, self._watch)
        if self._upstream is not None:
            self._runtime.send_port(
                self._upstream, 0, wire.FLAG_GATHER, pack_entries(entries), wait=False
            )

    def peer_lost(self, addr: str, reason: str) -> None:
        """A subtree head died: the caller learns of it through supervision, not from here."""
        self._runtime.close_port(self._port, self._watch)
