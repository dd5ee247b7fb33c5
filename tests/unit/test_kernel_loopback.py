"""Routers over the in-memory loopback: real frames, one process, no sockets (issue 16 part 8).

Ordering per sender, the casting tree's fan-out as the routers forward it, gather relays merging
replies per hop, and lost peers failing their watchers, all in milliseconds.
"""

from __future__ import annotations

import math
import pickle
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from regency import config
from regency._runtime.kernel import casting, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.loopback import Loopback
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.router import FrameRouter
from regency._transport import frames

pytestmark = pytest.mark.timeout(30)

MESH = 9  # the mailbox id of the test's actor mesh
SENDER = 5  # the sending actor's uid


class Inbox:
    """A port handler that keeps every reply it gets, unpacked."""

    def __init__(self) -> None:
        self.messages = 0
        self.entries: list[tuple[int, int, list[bytes]]] = []
        self.lost: list[tuple[str, str]] = []

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        self.messages += 1
        for r, f, ps in casting.unpack_entries(rank, flags, parts):
            self.entries.append((r, f, [bytes(p) for p in ps]))

    def peer_lost(self, addr: str, reason: str) -> None:
        self.lost.append((addr, reason))


def _actors(routers: dict[str, FrameRouter], reply: bool = False) -> dict[str, list[Any]]:
    """Attach a sink to each router's mailbox of MESH: it records ``(rank, body)`` and, with
    ``reply``, answers each message with its rank to the reply port it came with."""
    got: dict[str, list[Any]] = {}
    for addr, router in routers.items():
        seen = got[addr] = []

        def sink(delivery: Any, router: FrameRouter = router, seen: list[Any] = seen) -> None:
            parts, rank, reply_to = delivery
            seen.append((rank, pickle.loads(parts[0])))
            if reply and reply_to is not None:
                router.send_port(reply_to, rank, 0, [pickle.dumps(rank)], wait=False)

        router.mailbox(MESH).attach(sink)
    return got


def _mesh(n: int) -> tuple[Loopback, FrameRouter, dict[str, FrameRouter]]:
    net = Loopback()
    root = net.router("unix:@root")
    procs = {f"unix:@p{r}": net.router(f"unix:@p{r}") for r in range(n)}
    return net, root, procs


def _body(value: Any) -> frames.Encoder:
    return frames.Encoder([pickle.dumps(value)], 1 << 20)


def test_direct_messages_arrive_in_each_senders_order() -> None:
    net = Loopback()
    a, c, b = net.router("unix:@a"), net.router("unix:@c"), net.router("unix:@b")
    got = _actors({"unix:@b": b})["unix:@b"]
    for seq in range(1, 51):
        a.send_actor([("unix:@b", seq, 0)], MESH, 1, _body(("a", seq)))
        c.send_actor([("unix:@b", seq, 0)], MESH, 2, _body(("c", seq)))
    assert got == []  # nothing moves until the loopback delivers
    assert net.pump() == 100
    assert [s for _, (who, s) in got if who == "a"] == list(range(1, 51))
    assert [s for _, (who, s) in got if who == "c"] == list(range(1, 51))


def test_direct_message_overtaking_a_cast_waits_for_it() -> None:
    net = Loopback()
    a, b, c = (net.router(f"unix:@{x}") for x in "abc")
    got = _actors({"unix:@b": b, "unix:@c": c})
    # Message 1 reaches c through b (the head of its subtree), message 2 goes to c directly.
    tree = casting.Group(casting.Dest("unix:@b", 1, 0), (casting.Dest("unix:@c", 1, 1),))
    a.casts.send([tree], MESH, SENDER, None, False, [pickle.dumps("first")])
    a.send_actor([("unix:@c", 2, 1)], MESH, SENDER, _body("second"))
    net.pump()
    arrivals = [(s.src, s.frame.seq) for s in net.sent if s.dst == "unix:@c"]
    assert arrivals == [("unix:@a", 2), ("unix:@b", 1)]  # the overtaking did happen
    assert got["unix:@c"] == [(1, "first"), (1, "second")]
    assert got["unix:@b"] == [(0, "first")]


def _queued_when_delivered(net: Loopback, router: FrameRouter) -> list[int]:
    """Attach a sink to ``router``'s mailbox of MESH that records how many frames were queued
    on the loopback (sent, not yet delivered) each time a message reached its actor."""
    queued: list[int] = []
    router.mailbox(MESH).attach(lambda _: queued.append(net.in_flight))
    return queued


def test_a_cast_head_forwards_before_its_own_actor_gets_the_message() -> None:
    net, root, procs = _mesh(3)
    head = procs["unix:@p0"]
    _actors({a: r for a, r in procs.items() if r is not head})
    queued = _queued_when_delivered(net, head)
    tree = casting.Group(
        casting.Dest("unix:@p0", 1, 0),
        (casting.Dest("unix:@p1", 1, 1), casting.Dest("unix:@p2", 1, 2)),
    )
    with config.configured(cast_fanout=2):
        root.casts.send([tree], MESH, SENDER, None, False, [pickle.dumps("hi")])
        assert net.step()  # the cast frame reaches the head
    # Both subtrees' frames had left when the head's actor got the message.
    assert queued == [2]


def test_a_senders_own_actor_gets_a_direct_message_after_the_others() -> None:
    net, root, procs = _mesh(2)
    _actors(procs)
    queued = _queued_when_delivered(net, root)
    targets = [(root.address, 1, 0), ("unix:@p0", 1, 1), ("unix:@p1", 1, 2)]
    root.send_actor(targets, MESH, SENDER, _body("hi"))
    assert queued == [2]
    assert net.pump() == 2


def _cast(root: FrameRouter, procs: Sequence[str], fanout: int, reply: PortRef | None) -> None:
    dests = [casting.Dest(addr, 1, rank) for rank, addr in enumerate(procs)]
    groups = casting.plan(dests, fanout)
    root.casts.send(groups, MESH, SENDER, reply, reply is not None, [pickle.dumps("hi")])


@pytest.mark.parametrize("n", [1, 2, 5, 16, 17, 64, 200, 256])
@pytest.mark.parametrize("fanout", [2, 4, 16])
def test_cast_reaches_every_rank_once_through_a_bounded_tree(n: int, fanout: int) -> None:
    net, root, procs = _mesh(n)
    got = _actors(procs)
    with config.configured(cast_fanout=fanout):
        _cast(root, list(procs), fanout, None)
        net.pump()
    assert [got[f"unix:@p{r}"] for r in range(n)] == [[(r, "hi")] for r in range(n)]
    casts = [s for s in net.sent if s.frame.kind == wire.KIND_CAST]
    assert len(casts) == n  # one frame per destination, none twice
    assert max(Counter(s.src for s in casts).values()) <= fanout
    parent = {s.dst: s.src for s in casts}
    depth = 0
    for addr in procs:
        node, hops = addr, 1
        while parent[node] != "unix:@root":
            node, hops = parent[node], hops + 1
        depth = max(depth, hops)
    assert depth <= max(1, math.ceil(math.log(n, fanout)))


@pytest.mark.parametrize("n", [1, 3, 16, 17, 100, 256])
def test_gathered_replies_merge_per_hop(n: int) -> None:
    fanout = 4
    net, root, procs = _mesh(n)
    _actors(procs, reply=True)
    inbox = Inbox()
    reply = root.open_port(inbox)
    with config.configured(cast_fanout=fanout):
        _cast(root, list(procs), fanout, reply)
        net.pump()
    assert sorted(r for r, _, _ in inbox.entries) == list(range(n))
    assert all(pickle.loads(ps[0]) == r for r, _, ps in inbox.entries)
    # The root hears once per subtree it sent to, whatever the mesh's size.
    assert inbox.messages == min(n, fanout)
    ports = [s for s in net.sent if s.frame.kind == wire.KIND_PORT]
    assert Counter(s.src for s in ports) == Counter({addr: 1 for addr in procs})
    # Every relay closed its port once it had sent up.
    assert not [r for r in procs.values() for p in range(16, 32) if _is_relay(r, p)]


def test_a_lost_peer_fails_its_watchers_and_refuses_sends() -> None:
    net = Loopback()
    a, _ = net.router("unix:@a"), net.router("unix:@b")
    inbox = Inbox()
    port = a.open_port(inbox, watch=["unix:@b"])
    a.send_port(PortRef("unix:@b", 16), 0, 0, [b"x"], wait=False)
    net.kill("unix:@b", "crashed")
    assert net.in_flight == 0  # what was on its way there is gone with it
    assert inbox.lost == [("unix:@b", "crashed")]
    assert a.losses.dead == {"unix:@b": "crashed"}
    # The router translates the transport's error at the kernel's edge.
    with pytest.raises(PeerLostError, match="crashed"):
        a.send_port(PortRef("unix:@b", 16), 0, 0, [b"x"])
    with pytest.raises(PeerLostError, match="crashed"):
        a.send_actor([("unix:@b", 1, 0)], MESH, SENDER, _body("late"))
    # A port opened later that watches the dead peer hears of it at once.
    late = Inbox()
    a.open_port(late, watch=["unix:@b"])
    assert late.lost == [("unix:@b", "crashed")]
    a.close_port(port.port, ["unix:@b"])


def _is_relay(router: FrameRouter, port: int) -> bool:
    """Whether ``port`` of ``router`` is open and gathers replies (not the cast acknowledgements'
    port every forwarding process keeps)."""
    return isinstance(router.port_handler(port), casting.GatherRelay)


def test_a_relay_whose_subtree_head_dies_closes_its_port() -> None:
    net, root, procs = _mesh(3)
    _actors(procs)  # nobody replies
    inbox = Inbox()
    reply = root.open_port(inbox)
    # p0 heads a subtree of p1 and p2 and opens a relay watching them.
    tree = casting.Group(
        casting.Dest("unix:@p0", 1, 0),
        (casting.Dest("unix:@p1", 1, 1), casting.Dest("unix:@p2", 1, 2)),
    )
    with config.configured(cast_fanout=2):
        root.casts.send([tree], MESH, SENDER, reply, True, [pickle.dumps("hi")])
        net.pump()
    head = procs["unix:@p0"]
    relays = [p for p in range(16, 32) if _is_relay(head, p)]
    assert len(relays) == 1
    net.kill("unix:@p2", "crashed")
    assert head.port_handler(relays[0]) is None
    assert inbox.messages == 0


def test_an_exit_report_grace_runs_on_the_loopbacks_clock() -> None:
    net = Loopback()
    a, _ = net.router("unix:@a"), net.router("unix:@b")
    a.losses.add_child("unix:@b")  # a child: its lost connection waits for the host agent's report
    net.kill("unix:@b", "connection reset")
    assert "unix:@b" not in a.losses.dead
    net.timers.advance(0.5)
    assert "unix:@b" not in a.losses.dead
    net.timers.advance(1.0)
    assert a.losses.dead == {"unix:@b": "connection reset"}


def test_a_frame_that_comes_while_a_router_is_being_made_waits_until_it_is_whole() -> None:
    """A proc's zygote hands it a connection the controller already writes on: a frame can be
    read before the router's constructor is done. It waits, then is delivered."""
    net = Loopback()
    sender = net.router("unix:@sender")
    entered = threading.Event()
    readers: list[threading.Thread] = []
    failures: list[BaseException] = []

    def read() -> None:
        entered.set()
        try:
            net.step()
        except BaseException as exc:
            failures.append(exc)

    def frame_arrives_now() -> None:
        encoder = frames.Encoder([pickle.dumps("early")], 1 << 20)
        sender.send_actor([("unix:@new", 1, 0)], 3, 5, encoder)
        reader = threading.Thread(target=read)
        reader.start()
        readers.append(reader)
        assert entered.wait(10)

    router = net.router("unix:@new", connected=frame_arrives_now)
    readers[0].join(10)
    assert not readers[0].is_alive()
    got: list[Any] = []
    router.mailbox(3).attach(lambda delivery: got.append(pickle.loads(delivery[0][0])))
    assert failures == []
    assert got == ["early"]
