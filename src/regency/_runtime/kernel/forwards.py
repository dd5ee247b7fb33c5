"""Acknowledged forwarding down the casting tree: a subtree whose head dies before it passed a
cast on still gets the message.

Every destination of a cast took the sender's next sequence number, and a mailbox holds a
sender's later messages until the earlier ones came: a subtree left without one message would
hold back everything that sender sends it afterwards, forever. So a process that sends a cast
frame to a node that must pass it on keeps the message until that node acknowledges it, and if
the node is lost first, sends the message itself, straight to every destination of that node's
subtree. A destination that had it already drops the copy (its mailbox has seen that sequence
number), so each destination gets it once, in order.

Which frames are kept: the sender of a cast keeps those to subtree heads (its frames to leaves
left it; if it dies, nothing it sent matters). A process passing a cast on keeps every frame it
sends: a child acknowledges at once when it is a leaf, and a head once every child it sent the
frame to has acknowledged. An acknowledgement thus says that the whole subtree below has the
message: a head that dies after acknowledging left nothing undelivered behind it, and if a head
and one of its own heads die together, the process above them sends to the whole subtree.

Acknowledgements are cumulative per parent (a node acknowledges its parent's frames in the
order they came, naming itself and the last token) and leave at most once per
:data:`ACK_DELAY` for each parent, as a small port message to the parent's :class:`Forwards`
port, or at once when :data:`ACK_EVERY` casts or :data:`ACK_BYTES` bytes from one parent wait
for one: a stream of casts costs a few acknowledgements a second, not one per cast, however
slowly each cast travels. Casts to at most ``cast_fanout`` destinations (no subtree heads) keep
nothing and cost nothing.

The sender of a cast keeps it once, not once per frame: its frames to the subtree heads share
one token, and the casts to the same heads form a *stream* that remembers the last token each
head acknowledged; a cast is done when every head's acknowledgement reached it. So keeping a
cast costs its sender the same whatever the number of heads (a process passing casts on keeps
each frame, as it must hear from each child in turn).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Protocol

from regency._runtime.kernel import casting
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.losses import Losses
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.seam import Timers
from regency._transport import frames

log = logging.getLogger("regency.proc")

# How long acknowledgements wait to be sent together. Only what a sender keeps depends on it (a
# stream's last moments of messages), never when anything is delivered. Long enough that a
# stream of casts is acknowledged a few times a second, whatever each cast's wall time.
ACK_DELAY = 0.25
# Casts, and bytes of them, from one parent that are acknowledged at once rather than on the
# timer: they bound what a sender keeps in a fast stream or of large messages.
ACK_EVERY = 256
ACK_BYTES = 16 * 1024 * 1024
# A lost head's place in a stream: past every token (it owes nothing any more).
_LOST = 1 << 62


# Where a node acknowledges a cast frame: its parent's address and port, and the frame's token.
Ack = casting.Ack


class ForwardHost(Protocol):
    """What acknowledged forwarding needs of its process's router (``FrameRouter``)."""

    address: str
    frame_limit: int

    def open_port(self, handler: PortHandler, watch: Sequence[str] = ()) -> PortRef:
        """Register a port."""

    def send_port(
        self, ref: PortRef, rank: int, flags: int, parts: Sequence[Part], wait: bool = True
    ) -> None:
        """Send a value to a port (anywhere)."""

    def send_actor(
        self,
        targets: Sequence[tuple[str, int, int]],
        mesh_id: int,
        sender: int,
        encoder: frames.Encoder,
    ) -> None:
        """Send one actor message directly to each ``(addr, seq, rank)``."""


class Cast:
    """One cast message this process sent or passed on, while some child still owes an
    acknowledgement for it."""

    __slots__ = ("done", "mesh_id", "nbytes", "owed", "parts", "sender", "upstream")

    def __init__(
        self, mesh_id: int, sender: int, parts: list[Part], upstream: Ack | None, nbytes: int = 0
    ) -> None:
        self.mesh_id = mesh_id
        self.sender = sender
        self.parts = parts
        self.upstream = upstream
        self.nbytes = nbytes  # the message's size, when it came from upstream
        # Children that owe an acknowledgement, plus one while frames are still being sent.
        self.owed = 1
        self.done = False


class _Stream:
    """The casts this process sent, as their sender, to one tuple of subtree heads: each cast
    kept once until every head acknowledged a token at least its own."""

    __slots__ = ("acked", "casts", "children")

    def __init__(self, children: tuple[str, ...]) -> None:
        self.children = children
        self.acked = dict.fromkeys(children, 0)  # the last token each head acknowledged
        # (token, cast, its groups: where each head's subtree is, for a resend)
        self.casts: deque[tuple[int, Cast, Iterable[casting.Group]]] = deque()


# A frame sent to a child and not acknowledged yet: the child, the cast, the rest of its subtree.
_Kept = tuple[str, Cast, Sequence[casting.Dest]]


class Forwards:
    """The cast frames this process sent to nodes that pass them on, until acknowledged; a port
    handler for the acknowledgements that come back and for the loss of a child."""

    def __init__(self, router: ForwardHost, losses: Losses, timers: Timers) -> None:
        self._router = router
        self._losses = losses
        self._timers = timers
        self._lock = threading.Lock()
        self._port = -1  # opened on first use
        self._tokens = itertools.count(1)
        self._kept: dict[int, _Kept] = {}
        self._by_child: dict[str, deque[int]] = {}
        # The casts this process sent as their sender, by the heads they went to.
        self._streams: dict[tuple[str, ...], _Stream] = {}
        self._child_streams: dict[str, list[_Stream]] = {}
        # The children that owe acknowledgements: Losses tells this port of their loss.
        self.watching: set[str] = set()
        # Casts from each parent (by address) in the order they came; acknowledged from the
        # front. Each process acknowledges to one port (its parent's Forwards).
        self._from_parent: dict[str, deque[tuple[int, Cast]]] = {}
        # parent -> [its port, last token, casts and bytes acknowledged since the last send]
        self._acks_due: dict[str, list[int]] = {}

    def kept(self) -> int:
        """How many frames wait for an acknowledgement (for tests and statistics)."""
        with self._lock:
            streams = {id(s): s for s in self._streams.values()}
            for lists in self._child_streams.values():
                streams.update((id(s), s) for s in lists)  # streams that only drain
            streamed = sum(
                sum(1 for last in stream.acked.values() if last < token)
                for stream in streams.values()
                for token, _, _ in stream.casts
            )
            return len(self._kept) + streamed

    # -- sending -------------------------------------------------------------------------------

    def port(self) -> int:
        """The port acknowledgements come to (opened on first use)."""
        port = self._port
        if port < 0:
            port = self._port = self._router.open_port(self).port
        return port

    def begin(
        self,
        mesh_id: int,
        sender: int,
        parts: list[Part],
        upstream: Ack | None,
        children: Sequence[tuple[str, Sequence[casting.Dest]]],
    ) -> tuple[Cast, dict[str, Ack]]:
        """A cast this process is about to send frames of (``upstream``: where it came from),
        kept until each of ``children`` (a child's address, the rest of its subtree) answers;
        the acknowledgement each child's frame asks for."""
        nbytes = sum(map(len, parts)) if upstream is not None else 0
        cast = Cast(mesh_id, sender, parts, upstream, nbytes)
        port = self.port()
        address = self._router.address
        acks: dict[str, Ack] = {}
        with self._lock:
            if upstream is not None:
                queue = self._from_parent.get(upstream[0])
                if queue is None:
                    queue = self._from_parent[upstream[0]] = deque()
                queue.append((upstream[2], cast))
            for child, rest in children:
                acks[child] = (address, port, self._keep_locked(cast, child, rest))
        return cast, acks

    def begin_stream(
        self,
        mesh_id: int,
        sender: int,
        parts: list[Part],
        heads: tuple[str, ...],
        groups: Iterable[casting.Group],
    ) -> tuple[Cast, Ack]:
        """A cast this process sends as its sender, whose frames to ``heads`` (subtree heads,
        each in ``groups``) pass it on: kept once until every head acknowledged it; the
        acknowledgement every head's frame asks for."""
        cast = Cast(mesh_id, sender, parts, None)
        cast.owed = 2  # the frames being sent, and the stream's heads
        port = self.port()
        with self._lock:
            token = next(self._tokens)
            stream = self._streams.get(heads)
            if stream is None:
                stream = self._open_stream_locked(heads)
            stream.casts.append((token, cast, groups))
        return cast, (self._router.address, port, token)

    def _open_stream_locked(self, heads: tuple[str, ...]) -> _Stream:
        stream = self._streams[heads] = _Stream(heads)
        for child in heads:
            streams = self._child_streams.get(child)
            if streams is None:
                self._child_streams[child] = [stream]
                self.watching.add(child)
            else:
                streams.append(stream)
        return stream

    def _drain_locked(self, stream: _Stream) -> list[Cast]:
        """Settle the stream's casts every head has acknowledged; forget it once it is empty."""
        floor = min(stream.acked.values())
        casts = stream.casts
        finished: list[Cast] = []
        while casts and casts[0][0] <= floor:
            finished.extend(self._settle(casts.popleft()[1]))
        if not casts:
            self._detach_locked(stream)
            for child in stream.children:
                streams = self._child_streams.get(child)
                if streams is None or stream not in streams:
                    continue  # lost, or forgotten already
                streams.remove(stream)
                if not streams:
                    del self._child_streams[child]
                    if child not in self._by_child:
                        self.watching.discard(child)
        return finished

    def _detach_locked(self, stream: _Stream) -> None:
        """Later casts to the stream's heads start a new stream (this one only drains)."""
        if self._streams.get(stream.children) is stream:
            del self._streams[stream.children]

    def arrived(self, upstream: Ack, nbytes: int = 0) -> None:
        """A leaf has the cast frame of ``upstream`` (``nbytes`` long): it owes its parent only
        the acknowledgement, which may go at once unless an earlier cast from the parent is
        still being passed on (acknowledgements keep the order the parent sent in)."""
        parent, port, token = upstream
        with self._lock:
            queue = self._from_parent.get(parent)
            if queue:
                done = Cast(0, 0, [], upstream, nbytes)
                done.owed, done.done = 0, True
                queue.append((token, done))
                return
            schedule, now = self._due_locked(parent, port, token, 1, nbytes)
        self._acknowledge(schedule, now)

    def keep(self, cast: Cast, child: str, rest: Sequence[casting.Dest]) -> Ack:
        """Keep ``cast`` (begun already) until one more ``child`` answers as well."""
        with self._lock:
            token = self._keep_locked(cast, child, rest)
        return (self._router.address, self._port, token)

    def _keep_locked(self, cast: Cast, child: str, rest: Sequence[casting.Dest]) -> int:
        token = next(self._tokens)
        self._kept[token] = (child, cast, rest)
        waiting = self._by_child.get(child)
        if waiting is None:
            waiting = self._by_child[child] = deque()
            self.watching.add(child)
        waiting.append(token)
        cast.owed += 1
        return token

    def unkeep(self, ack: Ack) -> None:
        """The frame of ``ack`` never left (its child was found lost): forget it. (A stream's
        frame stays kept: the child's loss sends it to the subtree.)"""
        token = ack[2]
        with self._lock:
            kept = self._kept.pop(token, None)
            if kept is None:
                return
            child, cast, _ = kept
            waiting = self._by_child.get(child)
            if waiting is not None:
                waiting.remove(token)
                if not waiting:
                    del self._by_child[child]
                    if child not in self._child_streams:
                        self.watching.discard(child)
            finished = self._settle(cast)
        self._finish(finished)

    def sent(self, cast: Cast) -> None:
        """Every frame of ``cast`` is sent (or the child lost): it is done once acknowledged."""
        with self._lock:
            finished = self._settle(cast)
        self._finish(finished)
        # A child lost while its frame was being kept is told of here: Losses recorded the end
        # before it looked at ``watching``, which may have been before the child was added.
        dead = self._losses.dead
        if dead:
            with self._lock:
                lost = [child for child in self.watching if child in dead]
            for child in lost:
                self.peer_lost(child, dead[child])

    # -- the port: acknowledgements and losses -------------------------------------------------

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """An acknowledgement: the child has passed on every frame up to this token."""
        try:
            ack = pickle.loads(parts[0])
        except Exception as exc:
            log.warning("dropping an undecodable cast acknowledgement: %s", exc)
            return
        if not (
            type(ack) is tuple and len(ack) == 2 and type(ack[0]) is int and type(ack[1]) is str
        ):
            log.warning("dropping a malformed cast acknowledgement: %r", ack)
            return
        token, child = ack
        finished: list[Cast] = []
        with self._lock:
            waiting = self._by_child.get(child)
            if waiting:
                while waiting and waiting[0] <= token:
                    finished.extend(self._settle(self._kept.pop(waiting.popleft())[1]))
                if not waiting:
                    del self._by_child[child]
                    if child not in self._child_streams:
                        self.watching.discard(child)
            for stream in tuple(self._child_streams.get(child, ())):
                if token > stream.acked[child]:
                    stream.acked[child] = token
                    finished.extend(self._drain_locked(stream))
        self._finish(finished)

    def peer_lost(self, addr: str, reason: str) -> None:
        """A child that owed acknowledgements is gone: send each of its frames' messages
        straight to the rest of its subtree."""
        with self._lock:
            waiting = self._by_child.pop(addr, None)
            self.watching.discard(addr)
            lost = [self._kept.pop(token) for token in waiting or ()]
            generic = len(lost)
            streams = self._child_streams.pop(addr, [])
            # What the streams sent this child and it did not acknowledge: its subtree's
            # destinations in each cast (the casts stay kept until resent). A cast begun from
            # now on goes in a new stream, which watches the child again: should its frame go
            # to the child still, ``sent`` finds the child lost and it is resent too.
            for stream in streams:
                self._detach_locked(stream)
                last = stream.acked[addr]
                for token, cast, groups in stream.casts:
                    if token > last:
                        rest = next((g.rest for g in groups if g.head.addr == addr), ())
                        lost.append((addr, cast, rest))
        finished: list[Cast] = []
        for child, cast, rest in lost:
            if rest:
                self._resend(child, cast, rest, reason)
        with self._lock:
            for _, cast, _ in lost[:generic]:
                finished.extend(self._settle(cast))
            for stream in streams:
                stream.acked[addr] = _LOST
                finished.extend(self._drain_locked(stream))
        self._finish(finished)

    def _resend(self, child: str, cast: Cast, rest: Sequence[casting.Dest], reason: str) -> None:
        targets = [(dest.addr, dest.seq, dest.rank) for dest in rest]
        log.info(
            "cast head %s was lost (%s) before its subtree acknowledged: sending to its %d "
            "destinations directly",
            child,
            reason,
            len(targets),
        )
        try:
            self._router.send_actor(
                targets,
                cast.mesh_id,
                cast.sender,
                frames.Encoder(cast.parts, self._router.frame_limit),
            )
        except PeerLostError as exc:
            log.info("some destinations of the lost cast head are gone too: %s", exc)

    # -- acknowledging upstream ----------------------------------------------------------------

    def _settle(self, cast: Cast) -> list[Cast]:
        """One debt of ``cast`` paid (under the lock); the casts now done, in order."""
        cast.owed -= 1
        if cast.owed:
            return []
        cast.done = True
        cast.parts = []
        return [cast]

    def _finish(self, casts: list[Cast]) -> None:
        """Acknowledge to their parents the casts now done, in the order each parent sent them."""
        schedule = now = False
        with self._lock:
            for cast in casts:
                upstream = cast.upstream
                if upstream is None:
                    continue
                parent = upstream[0]
                queue = self._from_parent.get(parent)
                last, count, nbytes = None, 0, 0
                while queue and queue[0][1].done:
                    last, done = queue.popleft()
                    count += 1
                    nbytes += done.nbytes
                if queue is not None and not queue:
                    del self._from_parent[parent]
                if last is not None:
                    first, full = self._due_locked(parent, upstream[1], last, count, nbytes)
                    schedule, now = schedule or first, now or full
        self._acknowledge(schedule, now)

    def _due_locked(
        self, parent: str, port: int, token: int, casts: int, nbytes: int
    ) -> tuple[bool, bool]:
        """Note that ``parent``'s casts up to ``token`` are done here (``casts`` more of them,
        ``nbytes`` long): whether the timer must be set, and whether to acknowledge at once."""
        due = self._acks_due.get(parent)
        first = not self._acks_due
        if due is None:
            due = self._acks_due[parent] = [port, token, casts, nbytes]
        else:
            due[0], due[1] = port, token
            due[2] += casts
            due[3] += nbytes
        return first, due[2] >= ACK_EVERY or due[3] >= ACK_BYTES

    def _acknowledge(self, schedule: bool, now: bool) -> None:
        if now:
            self._send_acks()
        elif schedule:
            self._timers.call_later(ACK_DELAY, self._send_acks)

    def _send_acks(self) -> None:
        with self._lock:
            due, self._acks_due = self._acks_due, {}
        address = self._router.address
        for parent, (port, token, _, _) in due.items():
            # A parent that is gone no longer needs to hear: what it kept no longer matters.
            with contextlib.suppress(PeerLostError):
                self._router.send_port(
                    PortRef(parent, port), 0, 0, [pickle.dumps((token, address), protocol=5)]
                )
