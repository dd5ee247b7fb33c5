"""The router's cast path: a message to many actors goes once to the head of each casting
subtree, and each head forwards it down its own subtree before delivering it to its actor.

The tree itself (how destinations split into subtrees, how replies gather on the way back) is
:mod:`regency._runtime.kernel.casting`; this module sends and forwards its frames.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from regency._runtime.kernel import bulk, casting, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.forwards import Ack, Cast, Forwards
from regency._runtime.kernel.losses import Losses
from regency._runtime.kernel.parts import own_copies, postable
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.routing import Plans, RoutingWriter, home_part, read_routing
from regency._runtime.kernel.seam import FrameTransport
from regency._runtime.kernel.seqs import ViewCast
from regency._transport import frames
from regency._transport.names import FLAG_NAMED, NAME_BYTES, Named
from regency._transport.transport import PeerUnreachableError

log = logging.getLogger("regency.proc")

# Puts a message in a local actor's mailbox: (mesh_id, sender, seq, rank, parts, reply).
Deliver = Callable[[int, int, int, int, Sequence[Part], PortRef | None], None]
# The parts of a frame to an address, and its flags (large parts moved to shared memory).
FrameParts = Callable[[str, Sequence[Part]], tuple[list[Part], int]]


class CastHost(casting.PortSender, Protocol):
    """What the cast path needs of its process's router (implemented by ``FrameRouter``)."""

    address: str

    def open_port(self, handler: PortHandler, watch: Sequence[str] = ()) -> PortRef:
        """Register a port; ``watch`` lists processes whose loss fails it."""


class CastPath:
    """Sends the cast frames of one process, and forwards those it receives down the tree."""

    def __init__(
        self,
        router: CastHost,
        link: FrameTransport,
        losses: Losses,
        deliver: Deliver,
        frame_parts: FrameParts,
        frame_limit: int,
        forwards: Forwards,
    ) -> None:
        self._router = router
        self._link = link
        self._losses = losses
        self._deliver = deliver
        self._frame_parts = frame_parts
        self._frame_limit = frame_limit
        # The frames sent to nodes that pass them on, until they acknowledge them.
        self.forwards = forwards
        # How this process splits the subtrees it heads, by roster.
        self._plans = Plans()
        # Where this process's frames to subtree heads are acknowledged, as they carry it.
        self._home: bytes | None = None

    def send(
        self,
        groups: Sequence[casting.Group],
        mesh_id: int,
        sender: int,
        reply: PortRef | None,
        gather: bool,
        parts: list[Part],
        wait: bool = True,
        upstream: Ack | None = None,
    ) -> None:
        """Send a message to the head of each casting subtree in ``groups``, in order; each
        head forwards it further. A subtree headed by this process goes last.

        The frames to nodes that pass the message on are kept until acknowledged
        (:mod:`.forwards`): to subtree heads when this process is the sender; to every child when
        it passes on a cast that came from ``upstream``.

        The small frames to the heads go in one post: judged one burst or none together, so
        that no head waits for a later flush behind the first. A head that cannot be reached
        is gone around: the next destination of its subtree heads the rest of it. Every
        destination took the sender's next sequence number, and one left without its message
        would hold back every later message from that sender (see ``FrameRouter.send_actor``).
        Then :class:`PeerLostError` names the lost heads.
        """
        if (
            type(groups) is ViewCast
            and upstream is None
            and self._send_view(groups, mesh_id, sender, reply, gather, parts)
        ):
            return
        lost: list[str] = []
        here: list[casting.Group] = []
        cast, acks = self._keeping(groups, mesh_id, sender, parts, upstream)
        # What every frame of the cast shares is made once: the message's part table, the
        # routing part's reply port and acknowledger.
        message = frames.Encoder(parts, self._frame_limit)
        writer = RoutingWriter(reply)
        todo = list(groups)
        while todo:
            posts: list[tuple[str, list[Part], int]] = []
            posted: dict[str, tuple[casting.Group, Ack | None]] = {}
            around: list[casting.Group] = []
            address = self._router.address
            for group in todo:
                addr = group.head.addr
                if addr == address:
                    here.append(group)
                    continue
                ack = acks.pop(addr, None)
                if ack is None and cast is not None and (group.rest or upstream is not None):
                    # A group formed around a lost head.
                    ack = self.forwards.keep(cast, addr, group.rest)
                try:
                    frame = self._frame_to_head(
                        group, mesh_id, sender, writer.parts(group, gather, ack), message, wait
                    )
                except (PeerUnreachableError, PeerLostError) as exc:
                    if ack is not None:
                        self.forwards.unkeep(ack)
                    lost.append(str(exc))
                    around.extend(_without_head(group))
                    continue
                if frame is not None:
                    posts.append(frame)
                    posted[frame[0]] = (group, ack)
            if posts:
                try:
                    self._link.post(posts)
                except PeerUnreachableError as exc:
                    lost.append(str(exc))
                    for addr in exc.peers:
                        group, ack = posted[addr]
                        if ack is not None:
                            self.forwards.unkeep(ack)
                        around.extend(_without_head(group))
            todo = around
        if cast is not None:
            self.forwards.sent(cast)
        for group in here:
            self._to_own_actor(
                group, mesh_id, sender, reply, writer.parts(group, gather, None), parts
            )
        if lost:
            raise PeerLostError("; ".join(lost))

    def _send_view(
        self,
        cast: ViewCast,
        mesh_id: int,
        sender: int,
        reply: PortRef | None,
        gather: bool,
        parts: list[Part],
    ) -> bool:
        """Send a cast to a view as its sender, each frame made from the view's shape (its
        subtrees' parts made once, and sent by name): what :meth:`send` does, at a cost per
        frame close to a direct send's. False, having sent nothing, when it does not apply: a
        head is this process or known lost, or a frame would not be small enough to post."""
        shape = cast.shape
        here = self._router.address
        dead = self._losses.dead
        if here in shape.heads or (dead and any(map(dead.__contains__, shape.heads))):
            return False
        forwards = self.forwards
        message = frames.Encoder(parts, self._frame_limit)
        writer = RoutingWriter(reply)
        home = self._home
        if home is None:
            home = self._home = home_part((here, forwards.port()))
        # The largest frame: a subtree's, sent in full (a leaf's routing part is shorter).
        largest = message.size + 16 + len(writer.subtree_routing(gather, 0, 0))
        largest += len(home) + shape.subtree_max
        if largest >= bulk.BULK_MIN or not postable(len(parts), largest):
            return False
        kept, ack = forwards.begin_stream(
            mesh_id, sender, own_copies(parts), shape.subtree_heads, cast
        )
        routing = writer.subtree_routing(gather, cast.bump, ack[2])
        leaf = None
        base, addrs, ranks, bump = shape.base, shape.addrs, shape.ranks, cast.bump
        frame_after, limit, kind = message.frame_after, self._frame_limit, wire.KIND_CAST
        posts: list[tuple[str, list[Part], int]] = []
        names: list[Named | None] = []
        # The frames naming their subtree part differ only in rank, number and name.
        by_name = frames.SecondPart(
            message, routing, NAME_BYTES, limit, kind, mesh_id, sender, FLAG_NAMED
        )
        named_frame, named_size = by_name.frame, by_name.size
        for s, subtree in zip(shape.starts, shape.subtree_parts(home), strict=True):
            seq = base[s] + bump
            named = None
            if subtree is None:
                if leaf is None:
                    leaf = writer.leaf_part()
                buffers, size = frame_after(leaf, limit, kind, mesh_id, ranks[s], sender, seq)
            elif subtree[1] is not None:
                # The subtree part by name: it crosses each connection once per view.
                named = subtree[1]
                buffers, size = named_frame(ranks[s], seq, named.name), named_size
            else:
                buffers, size = frame_after(
                    routing, limit, kind, mesh_id, ranks[s], sender, seq, subtree[0]
                )
            posts.append((addrs[s], buffers, size))
            names.append(named)
        try:
            self._link.post(posts, names)
        except PeerUnreachableError as exc:
            # Each lost head's subtree gets this cast (and any earlier one it did not
            # acknowledge) straight from here, as when a head is lost later.
            for addr in exc.peers:
                forwards.peer_lost(addr, str(exc))
            forwards.sent(kept)
            raise PeerLostError(str(exc)) from exc
        forwards.sent(kept)
        return True

    def _keeping(
        self,
        groups: Sequence[casting.Group],
        mesh_id: int,
        sender: int,
        parts: list[Part],
        upstream: Ack | None,
    ) -> tuple[Cast | None, dict[str, Ack]]:
        """The record that keeps this message until the nodes passing it on acknowledge it, and
        the acknowledgement each such node's frame asks for, by its address (no record when no
        frame needs one: a sender's cast to leaves only)."""
        here = self._router.address
        if upstream is None:
            # As the sender: kept once for all its heads (heads known lost are gone around).
            dead = self._losses.dead
            heads = tuple(
                group.head.addr
                for group in groups
                if group.rest and group.head.addr != here and group.head.addr not in dead
            )
            if not heads:
                return None, {}
            # The sender's buffers may change once the send returns: keep copies.
            cast, ack = self.forwards.begin_stream(
                mesh_id, sender, own_copies(parts), heads, groups
            )
            return cast, dict.fromkeys(heads, ack)
        children = [(group.head.addr, group.rest) for group in groups if group.head.addr != here]
        return self.forwards.begin(mesh_id, sender, parts, upstream, children)

    def _frame_to_head(
        self,
        group: casting.Group,
        mesh_id: int,
        sender: int,
        routing: tuple[bytes, bytes | None],
        message: frames.Encoder,
        wait: bool,
    ) -> tuple[str, list[Part], int] | None:
        """The small frame (the routing and subtree parts ``routing``, then ``message``'s
        parts) to post to the head of ``group`` (another process), or None once a large one is
        sent."""
        head = group.head
        self._losses.check_alive(head.addr)
        parts = message.parts
        first, subtree = routing
        extra = 8 + len(first) + (8 + len(subtree) if subtree is not None else 0)
        if message.size + extra < bulk.BULK_MIN:
            buffers, size = message.frame_after(
                first,
                self._frame_limit,
                wire.KIND_CAST,
                mesh_id,
                head.rank,
                sender,
                head.seq,
                subtree,
            )
        else:
            lead = [first] if subtree is None else [first, subtree]
            framed, flags = self._frame_parts(head.addr, [*lead, *parts])
            encoder = frames.Encoder(framed, self._frame_limit)
            size = encoder.size
            buffers = encoder.frame(
                wire.KIND_CAST, mesh_id, flags=flags, rank=head.rank, sender=sender, seq=head.seq
            )
        if postable(len(parts), size):
            # Coalesced in a burst of casts like direct sends are (each frame alone would wake
            # its head).
            return head.addr, buffers, size
        self._link.send(head.addr, buffers, wait)
        return None

    def _to_own_actor(
        self,
        group: casting.Group,
        mesh_id: int,
        sender: int,
        reply: PortRef | None,
        routing: tuple[bytes, bytes | None],
        parts: list[Part],
    ) -> None:
        """A subtree headed by this process (``routing``: its routing and subtree parts):
        forward down it, then deliver to our actor."""
        head = group.head
        if not group.rest:
            self._deliver(mesh_id, sender, head.seq, head.rank, own_copies(parts), reply)
            return
        first, subtree = routing
        lead: list[Part] = [first] if subtree is None else [first, subtree]
        self.received(mesh_id, sender, head.seq, head.rank, [*lead, *own_copies(parts)])

    def received(
        self,
        mesh_id: int,
        sender: int,
        seq: int,
        rank: int,
        frame_parts: Sequence[Part],
    ) -> None:
        """A cast for this process's actor of mesh ``mesh_id`` (the frame's parts: routing,
        subtree if any, then the message's): forward it down the subtree the routing lists,
        then deliver it here."""
        routing = read_routing(frame_parts)  # ValueError: the frame is dropped
        parts = frame_parts[routing.parts :]
        # Most procs are leaves of the tree: they need not read the fan-out.
        groups = self._plans.groups(routing, casting.fanout()) if routing.key is not None else []
        reply, gather, ack = routing.reply, routing.gather, routing.ack
        if ack is not None and not groups:
            # A leaf below a node that passed the cast on.
            self.forwards.arrived(ack, sum(map(len, parts)))
        local_reply = reply
        if gather and groups:
            heads = [g.head.addr for g in groups]
            acc = casting.GatherRelay(self._router, reply, expected=1 + len(groups))
            local_reply = self._router.open_port(acc, watch=heads)
            acc.bind(local_reply.port, heads)
        # Down the tree first, then to our own actor: waking it could take this thread's CPU
        # before the subtrees, whose ranks would then all start late, had their message.
        if groups:
            try:
                self.send(groups, mesh_id, sender, local_reply, gather, list(parts), False, ack)
            except PeerLostError as exc:
                log.warning("cast could not reach some subtree heads: %s", exc)
        self._deliver(mesh_id, sender, seq, rank, parts, local_reply)


def _without_head(group: casting.Group) -> list[casting.Group]:
    """The subtree of a lost head, headed by its next destination (none if it was a leaf)."""
    rest = group.rest
    return [casting.Group(rest[0], rest[1:])] if rest else []
