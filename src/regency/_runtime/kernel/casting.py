"""The casting tree: a message to many procs fans out with bounded fan-out, replies merge back.

The sender splits its destination list into at most ``fanout`` contiguous groups and sends the
message once to the head of each group, with the rest of the group attached. Each head delivers
to its own actor and does the same for its rest, so the tree has depth ``log_fanout(n)``. For
``call`` each head also gathers its subtree's replies into one message before passing it up.

A frame describes its head's subtree compactly (:class:`Subtree`): a :class:`Roster` of its
addresses and ranks, pickled once by whoever made it and keyed by its digest, and the sender's
sequence numbers for it as one array plus a common ``bump`` (the sender numbers a stream of
casts to one view by counting them, :mod:`.seqs`). A head splits a roster into its children's
once and keeps the plan (:class:`Plans`), so a cast costs its sender and each head per frame it
sends, not per destination below.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from array import array
from collections.abc import Sequence
from typing import NamedTuple, Protocol, overload

from regency import config
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
    :class:`Subtree`, which lists the same destinations without making them one by one)."""

    head: Dest
    rest: Sequence[Dest]


# A subtree's sequence numbers travel as one array of unsigned 64-bit integers.
_SEQ_CODE = "Q"
# At most this many (position, extra) pairs in a subtree's sequence numbers: messages sent
# straight to its destinations since its base numbers were taken (the sender rebases after).
PATCH_MAX = 64


class Roster:
    """The addresses and ranks of a run of destinations, pickled once.

    A cast frame carries its subtree's roster as these bytes (copied, never pickled again) and
    its ``key``, under which the head keeps its plan of the subtree: a stream of casts to one
    mesh costs its sender and each head per frame, not per destination.
    """

    __slots__ = ("addrs", "blob", "key", "ranks")

    def __init__(self, addrs: tuple[str, ...], ranks: tuple[int, ...]) -> None:
        self.addrs = addrs
        self.ranks = ranks
        self.blob = pickle.dumps((addrs, ranks), protocol=5)
        self.key = hashlib.blake2b(self.blob, digest_size=16).digest()


class Subtree(Sequence[Dest]):
    """The destinations of a subtree below its head: a roster, and the sequence numbers the
    sender took for them: ``seqs[i] + bump``, plus ``patch[i]`` where it lists ``i``.

    A sequence of :class:`Dest`, made one by one only when read (a head that was lost and is
    gone around, its subtree sent to directly): sending it costs a frame, whatever its size.
    """

    __slots__ = ("bump", "patch", "roster", "seqs")

    def __init__(
        self, roster: Roster, seqs: array[int], bump: int, patch: dict[int, int] | None
    ) -> None:
        self.roster = roster
        self.seqs = seqs
        self.bump = bump
        self.patch = patch

    @classmethod
    def of(cls, dests: Sequence[Dest]) -> Subtree:
        """The subtree of these destinations."""
        roster = Roster(tuple(d.addr for d in dests), tuple(d.rank for d in dests))
        return cls(roster, array(_SEQ_CODE, [d.seq for d in dests]), 0, None)

    def seq(self, index: int) -> int:
        """The sequence number of destination ``index``."""
        patch = self.patch
        return self.seqs[index] + self.bump + (patch.get(index, 0) if patch else 0)

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, index: int) -> Dest: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Dest, ...]: ...

    def __getitem__(self, index: int | slice) -> Dest | tuple[Dest, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("subtree index out of range")
        roster = self.roster
        return Dest(roster.addrs[index], self.seq(index), roster.ranks[index])

    def part(self, start: int, stop: int, roster: Roster) -> Subtree:
        """Destinations ``start`` to ``stop`` of this subtree, whose roster is ``roster``."""
        patch = self.patch
        sub = None
        if patch:
            sub = {i - start: extra for i, extra in patch.items() if start <= i < stop} or None
        return Subtree(roster, self.seqs[start:stop], self.bump, sub)


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
        value = int(config.get("cast_fanout"))
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


class Plan(NamedTuple):
    """How a head splits the subtree of one roster: the roster, each child subtree's span of
    it and its roster (``None`` for a leaf)."""

    roster: Roster
    children: list[tuple[int, int, Roster | None]]


def plan_roster(roster: Roster, fanout: int) -> Plan:
    """Split ``roster`` into at most ``fanout`` child subtrees (made once per roster: the head
    keeps it)."""
    addrs, ranks = roster.addrs, roster.ranks
    children = [
        (s, e, Roster(addrs[s + 1 : e], ranks[s + 1 : e]) if e - s > 1 else None)
        for s, e in spans(len(addrs), fanout)
    ]
    return Plan(roster, children)


def expand(plan: Plan, rest: Subtree) -> list[Group]:
    """The child groups of a head whose subtree is ``rest`` (its roster ``plan.roster``)."""
    roster = plan.roster
    groups = []
    for s, e, child in plan.children:
        head = Dest(roster.addrs[s], rest.seq(s), roster.ranks[s])
        groups.append(Group(head, rest.part(s + 1, e, child) if child is not None else ()))
    return groups


# The routing part of a cast frame: the subtree's roster (key and bytes) or None for a leaf,
# its sequence numbers (bytes), bump and patch, the reply port, whether replies gather, and
# where the frame is acknowledged.
Routing = tuple[
    bytes | None, bytes | None, bytes, int, dict[int, int] | None, PortRef | None, bool, Ack | None
]


def routing_part(group: Group, reply: PortRef | None, gather: bool, ack: Ack | None) -> bytes:
    """The routing part of a cast frame to ``group``'s head: the rest of its subtree, where
    replies go, whether they are gathered on the way (a leaf gathers nothing), and where the
    head acknowledges the frame (None: it need not)."""
    rest = group.rest
    if not rest:
        return pickle.dumps((None, None, b"", 0, None, reply, False, ack), protocol=5)
    tree = rest if type(rest) is Subtree else Subtree.of(rest)
    roster = tree.roster
    return pickle.dumps(
        (roster.key, roster.blob, tree.seqs.tobytes(), tree.bump, tree.patch, reply, gather, ack),
        protocol=5,
    )


def read_routing(part: Part) -> Routing:
    """A routing part's fields, checked for their types (a malformed one raises ValueError)."""
    fields = pickle.loads(part)
    if type(fields) is not tuple or len(fields) != 8:
        raise ValueError("a cast frame's routing part is not its 8 fields")
    key, blob, seqs, bump, patch, _, _, _ = fields
    if key is None:
        return fields
    if not (
        type(key) is bytes
        and type(blob) is bytes
        and type(seqs) is bytes
        and type(bump) is int
        and (patch is None or type(patch) is dict)
    ):
        raise ValueError("a cast frame's routing part has fields of the wrong types")
    return fields


def _subtree(roster: Roster, seqs: bytes, bump: int, patch: dict[int, int] | None) -> Subtree:
    numbers = array(_SEQ_CODE)
    numbers.frombytes(seqs)
    if len(numbers) != len(roster.addrs) or len(roster.ranks) != len(roster.addrs):
        raise ValueError("a cast frame's subtree has as many sequence numbers as destinations")
    return Subtree(roster, numbers, bump, patch)


class Plans:
    """A head's plans of the subtrees it was sent, by roster key (a bounded cache: a stream of
    casts to one mesh unpickles and splits its subtree once)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._plans: dict[tuple[bytes, int], Plan] = {}
        self._lock = threading.Lock()

    def groups(self, routing: Routing, fanout: int) -> list[Group]:
        """The child groups of the head a routing part (not a leaf's) came to."""
        key, blob, seqs, bump, patch, _, _, _ = routing
        if key is None or blob is None:
            raise ValueError("a leaf's routing part has no subtree to plan")
        plan = self._plans.get((key, fanout))
        if plan is None:
            roster = Roster.__new__(Roster)
            addrs, ranks = pickle.loads(blob)
            if not (type(addrs) is tuple and type(ranks) is tuple):
                raise ValueError("a cast frame's roster is not two tuples")
            roster.addrs, roster.ranks, roster.blob, roster.key = addrs, ranks, blob, key
            plan = plan_roster(roster, fanout)
            with self._lock:
                if len(self._plans) >= self.LIMIT:
                    del self._plans[next(iter(self._plans))]
                self._plans[(key, fanout)] = plan
        return expand(plan, _subtree(plan.roster, seqs, bump, patch))


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
