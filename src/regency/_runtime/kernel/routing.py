"""What a cast frame tells its head: the routing part, and the compact subtree it describes.

A frame to a subtree head carries, before the message's own parts, one *routing part*:

- a fixed header: flags (replies gather here; the frame is acknowledged; a subtree follows),
  the subtree's ``bump``, the acknowledgement's token, and the lengths that follow;
- a pickle made once per cast: the reply port, and where a leaf acknowledges the frame;
- the subtree's patch, pickled, when it has one;

and for a head (not a leaf) a *subtree part* after it: where the head acknowledges the frame
(its sender's address and port), its subtree's :class:`Roster` as bytes made once (a digest,
then the pickled addresses and ranks) and the sender's base sequence numbers for it, one
array. A stream of casts to one view sends the same subtree part to a head again and again:
the sender's frames name it (:mod:`regency._transport.names`), so it crosses each connection
once.

Destination ``i`` of the subtree has the number ``seqs[i] + bump`` (plus ``patch[i]``). A head
splits a roster into its children's once and keeps that plan (:class:`Plans`, by digest): a
stream of casts to one view costs the sender and every head per frame, not per destination.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import threading
import zlib
from array import array
from collections.abc import Sequence
from typing import NamedTuple, overload

from regency._runtime.kernel import casting
from regency._runtime.kernel.casting import Ack, Dest, Group
from regency._runtime.kernel.refs import Part, PortRef

# A subtree's sequence numbers travel as one array of unsigned 64-bit integers.
_SEQ_CODE = "Q"
_SEQ_BYTES = 8
# flags, bump, acknowledgement token, length of the per-cast pickle, length of the patch
_HEADER = struct.Struct("<BQQII")
_GATHER, _ACKED, _SUBTREE = 1, 2, 4
_KEY_BYTES = 16
# At most this many bytes of a roster's pickle per destination (an address and a rank).
_ROSTER_BYTES_PER_PLACE = 4096
_BLOB_LEN = struct.Struct("<I")
# A subtree part's acknowledger: its port and the length of its address (0: none), then that.
_HOME = struct.Struct("<QH")


class Roster:
    """The addresses and ranks of a run of destinations, pickled once, with a digest of that
    pickle (``key``): what a frame tells a head of its subtree, and the key it keeps the
    subtree's plan under."""

    __slots__ = ("addrs", "key", "ranks", "wire")

    def __init__(self, addrs: tuple[str, ...], ranks: tuple[int, ...]) -> None:
        self.addrs = addrs
        self.ranks = ranks
        # Compressed: a subtree's addresses share most of their bytes (host prefix, job id),
        # and every frame to its head carries them (encrypted, between hosts).
        blob = zlib.compress(pickle.dumps((addrs, ranks), protocol=5), 1)
        self.key = hashlib.blake2b(blob, digest_size=_KEY_BYTES).digest()
        self.wire = self.key + _BLOB_LEN.pack(len(blob)) + blob

    @classmethod
    def known(cls, addrs: tuple[str, ...], ranks: tuple[int, ...], key: bytes) -> Roster:
        """A roster received under ``key`` (kept to plan by, never sent on)."""
        roster = cls.__new__(cls)
        roster.addrs, roster.ranks, roster.key, roster.wire = addrs, ranks, key, b""
        return roster


class Subtree(Sequence[Dest]):
    """The destinations of a subtree below its head: a roster, and the sequence numbers the
    sender took for them: ``seqs[i] + bump``, plus ``patch[i]`` where it lists ``i``.

    A sequence of :class:`~.casting.Dest`, made one by one only when read (a lost head's
    subtree sent to directly): sending it costs a frame, whatever its size.
    """

    __slots__ = ("bump", "patch", "raw", "roster", "seqs")

    def __init__(
        self,
        roster: Roster,
        seqs: array[int],
        bump: int,
        patch: dict[int, int] | None,
        raw: bytes | None = None,
    ) -> None:
        self.roster = roster
        self.seqs = seqs
        self.bump = bump
        self.patch = patch
        self.raw = raw  # ``seqs`` as bytes, when made already

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


def subtree_body(roster: Roster, raw: bytes) -> bytes:
    """A subtree part without its acknowledger: the subtree's roster, then their numbers
    (``raw``; for a view, its base numbers: made once and shared by every cast to it)."""
    return roster.wire + raw


def home_part(home: tuple[str, int] | None) -> bytes:
    """What begins a subtree part: where its head acknowledges the frame (None: nowhere)."""
    if home is None:
        return _HOME.pack(0, 0)
    addr = home[0].encode()
    return _HOME.pack(home[1], len(addr)) + addr


class RoutingWriter:
    """Makes the routing parts of one cast's frames (what they share is pickled once)."""

    __slots__ = ("_common", "_reply")

    def __init__(self, reply: PortRef | None) -> None:
        self._reply = reply
        self._common: dict[tuple[str, int] | None, bytes] = {}

    def _common_for(self, ack: Ack | None) -> bytes:
        home = None if ack is None else (ack[0], ack[1])
        common = self._common.get(home)
        if common is None:
            common = self._common[home] = pickle.dumps((self._reply, home), protocol=5)
        return common

    def leaf_part(self) -> bytes:
        """The routing part of a frame to a leaf that need not acknowledge it."""
        common = self._common_for(None)
        return _HEADER.pack(0, 0, 0, len(common), 0) + common

    def subtree_routing(self, gather: bool, bump: int, token: int) -> bytes:
        """The routing part of a frame to the head of a subtree with no patch, before its
        subtree part (``bump``: the cast's; ``token``: the acknowledgement's)."""
        common = self._common_for(None)
        flags = _ACKED | _SUBTREE | (_GATHER if gather else 0)
        return _HEADER.pack(flags, bump, token, len(common), 0) + common

    def parts(self, group: Group, gather: bool, ack: Ack | None) -> tuple[bytes, bytes | None]:
        """The routing part of the frame to ``group``'s head, and its subtree part (None for a
        leaf): replies go to the reply port, gathered on the way when ``gather`` (a leaf
        gathers nothing); ``ack``: where the head acknowledges the frame (None: it need not)."""
        flags, token = 0, 0
        if ack is not None:
            flags, token = _ACKED, ack[2]
        tree = group.rest
        if type(tree) is not Subtree:
            if not tree:
                common = self._common_for(ack)
                return _HEADER.pack(flags, 0, token, len(common), 0) + common, None
            tree = Subtree.of(tree)
        raw = tree.raw
        if raw is None:
            raw = tree.seqs.tobytes()
        flags |= _SUBTREE | (_GATHER if gather else 0)
        common = self._common_for(None)
        patch = pickle.dumps(tree.patch, protocol=5) if tree.patch else b""
        head = _HEADER.pack(flags, tree.bump, token, len(common), len(patch))
        home = home_part(None if ack is None else (ack[0], ack[1]))
        return b"".join((head, common, patch)), home + subtree_body(tree.roster, raw)


class Routing(NamedTuple):
    """A cast frame's routing: where replies go, whether they gather at the head, where the
    head acknowledges, its subtree (``key`` None: the head is a leaf), and how many of the
    frame's parts it took (the message's parts follow)."""

    reply: PortRef | None
    gather: bool
    ack: Ack | None
    key: bytes | None
    blob: memoryview
    seqs: memoryview
    bump: int
    patch: dict[int, int] | None
    parts: int


def read_routing(parts: Sequence[Part]) -> Routing:
    """The routing of a cast frame of these parts (its routing part, and its subtree part when
    it has a subtree); a malformed one raises :class:`ValueError` saying why."""
    if not parts:
        raise ValueError("a cast frame has no routing part")
    view = memoryview(parts[0])
    try:
        flags, bump, token, common_len, patch_len = _HEADER.unpack_from(view)
    except struct.error as exc:
        raise ValueError(f"a cast frame's routing part is too short ({len(view)} bytes)") from exc
    at = _HEADER.size
    end = at + common_len + patch_len
    if end != len(view):
        raise ValueError("a cast frame's routing part is not as long as its header says")
    common = pickle.loads(view[at : at + common_len])
    if not (type(common) is tuple and len(common) == 2):
        raise ValueError("a cast frame's routing part does not name its reply and acknowledger")
    reply, home = common
    patch = pickle.loads(view[at + common_len : end]) if patch_len else None
    if patch is not None and type(patch) is not dict:
        raise ValueError("a cast frame's routing part has a malformed patch")
    empty = view[0:0]
    if not flags & _SUBTREE:
        return Routing(reply, False, _ack(flags, home, token), None, empty, empty, 0, None, 1)
    if len(parts) < 2:
        raise ValueError("a cast frame to a subtree's head has no subtree part")
    view = memoryview(parts[1])
    try:
        port, addr_len = _HOME.unpack_from(view)
        at = _HOME.size + addr_len
        (blob_len,) = _BLOB_LEN.unpack_from(view, at + _KEY_BYTES)
    except struct.error as exc:
        raise ValueError("a cast frame's subtree part has a truncated roster") from exc
    home = (bytes(view[_HOME.size : at]).decode(), port) if addr_len else None
    key = bytes(view[at : at + _KEY_BYTES])
    at += _KEY_BYTES + _BLOB_LEN.size
    blob, seqs = view[at : at + blob_len], view[at + blob_len :]
    if len(blob) != blob_len or len(seqs) % _SEQ_BYTES:
        raise ValueError("a cast frame's subtree part has a truncated roster")
    ack = _ack(flags, home, token)
    return Routing(reply, bool(flags & _GATHER), ack, key, blob, seqs, bump, patch, 2)


def _ack(flags: int, home: object, token: int) -> Ack | None:
    """Where a frame with these routing flags is acknowledged (``home``: the acknowledger's
    address and port), if anywhere; :class:`ValueError` if it asks to be and names nowhere."""
    if not flags & _ACKED:
        return None
    if not (type(home) is tuple and len(home) == 2):
        raise ValueError("a cast frame's routing part asks for an acknowledgement to nowhere")
    return (home[0], home[1], token)


class Plan(NamedTuple):
    """How a head splits the subtree of one roster: the roster, each child subtree's span of
    it and its roster (``None`` for a leaf)."""

    roster: Roster
    children: list[tuple[int, int, Roster | None]]


class Plans:
    """A head's plans of the subtrees it was sent, by roster key and fan-out (a bounded
    cache: a stream of casts to one view unpickles and splits its subtree once)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._plans: dict[tuple[bytes, int], Plan] = {}
        self._lock = threading.Lock()

    def groups(self, routing: Routing, fanout: int) -> list[Group]:
        """The child groups of the head a routing part (not a leaf's) came to."""
        key = routing.key
        if key is None:
            raise ValueError("a leaf's routing part has no subtree to plan")
        plan = self._plans.get((key, fanout))
        if plan is None:
            plan = self._plan(key, routing.blob, fanout, len(routing.seqs) // _SEQ_BYTES)
        roster = plan.roster
        numbers = array(_SEQ_CODE)
        numbers.frombytes(routing.seqs)
        if len(numbers) != len(roster.addrs):
            raise ValueError("a cast frame's subtree has not as many sequence numbers as places")
        rest = Subtree(roster, numbers, routing.bump, routing.patch)
        groups = []
        for s, e, child in plan.children:
            head = Dest(roster.addrs[s], rest.seq(s), roster.ranks[s])
            groups.append(Group(head, rest.part(s + 1, e, child) if child is not None else ()))
        return groups

    def _plan(self, key: bytes, blob: memoryview, fanout: int, places: int) -> Plan:
        # A roster of ``places`` destinations; its pickle cannot be larger than this bound (a
        # malformed frame must not make a head inflate without end).
        bound = _ROSTER_BYTES_PER_PLACE * (places + 1)
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(blob, bound)
        except zlib.error as exc:
            raise ValueError(f"a cast frame's roster does not decompress: {exc}") from exc
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("a cast frame's roster is larger than its places allow, or cut short")
        addrs, ranks = pickle.loads(raw)
        if not (type(addrs) is tuple and type(ranks) is tuple and len(addrs) == len(ranks)):
            raise ValueError("a cast frame's roster is not its addresses and ranks")
        children = [
            (s, e, Roster(addrs[s + 1 : e], ranks[s + 1 : e]) if e - s > 1 else None)
            for s, e in casting.spans(len(addrs), fanout)
        ]
        plan = Plan(Roster.known(addrs, ranks, key), children)
        with self._lock:
            if len(self._plans) >= self.LIMIT:
                del self._plans[next(iter(self._plans))]
            self._plans[(key, fanout)] = plan
        return plan
