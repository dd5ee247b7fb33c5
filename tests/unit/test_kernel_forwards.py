"""A cast whose subtree head dies before passing it on, over the in-memory loopback.

Each destination took the sender's next sequence number; a subtree left without one message
would hold back every later message from that sender. The process that sent the frame to the
dead head keeps the message until the head acknowledges that its subtree has it, and otherwise
sends it straight to the rest of that subtree: every surviving actor gets every message, once,
in order.
"""

from __future__ import annotations

import contextlib
import pickle
import random
from collections.abc import Callable
from typing import Any

import pytest

from regency import config
from regency._runtime.kernel import casting, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.forwards import ACK_DELAY, ACK_EVERY
from regency._runtime.kernel.loopback import Loopback
from regency._runtime.kernel.router import FrameRouter
from regency._runtime.kernel.seqs import SeqBook

pytestmark = pytest.mark.timeout(60)

MESH = 9
SENDER = 5


def _mesh(n: int) -> tuple[Loopback, FrameRouter, list[str], dict[str, FrameRouter]]:
    net = Loopback()
    root = net.router("unix:@root")
    addrs = [f"unix:@p{r}" for r in range(n)]
    return net, root, addrs, {a: net.router(a) for a in addrs}


def _actors(routers: dict[str, FrameRouter]) -> dict[str, list[Any]]:
    got: dict[str, list[Any]] = {}
    for addr, router in routers.items():
        seen = got[addr] = []
        router.mailbox(MESH).attach(
            lambda delivery, seen=seen: seen.append(pickle.loads(delivery[0][0]))
        )
    return got


def _cast(root: FrameRouter, addrs: list[str], seq: int, value: Any, fanout: int) -> None:
    dests = [casting.Dest(a, seq, r) for r, a in enumerate(addrs)]
    root.casts.send(casting.plan(dests, fanout), MESH, SENDER, None, False, [pickle.dumps(value)])


def _settle(net: Loopback) -> None:
    """Deliver everything, acknowledgements included (they wait ``ACK_DELAY`` to leave)."""
    while net.pump() or net.timers.advance(ACK_DELAY):
        pass


def _kept(routers: list[FrameRouter]) -> int:
    return sum(r.casts.forwards.kept() for r in routers)


def test_a_head_that_dies_before_passing_a_cast_on_leaves_no_gap_in_its_subtree() -> None:
    net, root, addrs, procs = _mesh(6)
    got = _actors(procs)
    with config.configured(cast_fanout=2):
        # p0 heads p1 and p2, p3 heads p4 and p5.
        _cast(root, addrs, 1, "first", 2)
        assert net.step()  # p0 has the frame and queued it for p1 and p2 ...
        net.kill(addrs[0], "killed")  # ... and dies before those frames left
        _settle(net)
        live = addrs[1:]
        _cast(root, live, 2, "second", 2)
        _settle(net)
    for addr in live:
        assert got[addr] == ["first", "second"], addr
    assert _kept([root, *(procs[a] for a in live)]) == 0


def test_a_subtree_acknowledged_once_is_not_sent_twice() -> None:
    net, root, addrs, procs = _mesh(6)
    got = _actors(procs)
    with config.configured(cast_fanout=2):
        _cast(root, addrs, 1, "first", 2)
        _settle(net)
        assert _kept([root, *procs.values()]) == 0
        net.kill(addrs[0], "killed")
        _settle(net)
        _cast(root, addrs[1:], 2, "second", 2)
        _settle(net)
    for addr in addrs[1:]:
        assert got[addr] == ["first", "second"], addr
    actor_frames = [s for s in net.sent if s.frame.kind == wire.KIND_ACTOR]
    assert actor_frames == []  # nothing needed sending again


def test_a_head_and_its_own_head_dying_together_leave_no_gap() -> None:
    # fanout 2 over 14 procs: p0 heads p1..p6, and p1 heads p2..p3 below it.
    net, root, addrs, procs = _mesh(14)
    got = _actors(procs)
    with config.configured(cast_fanout=2):
        _cast(root, addrs, 1, "first", 2)
        # Deliver until p1 has its frame, then kill p1 and p0 before p1 passed it on.
        while not any(s.dst == addrs[1] for s in net.sent):
            assert net.step()
        net.kill(addrs[1], "killed")
        net.kill(addrs[0], "killed too")
        _settle(net)
        live = addrs[2:]
        _cast(root, live, 2, "second", 2)
        _settle(net)
    for addr in live:
        assert got[addr] == ["first", "second"], addr
    assert _kept([root, *(procs[a] for a in live)]) == 0


def test_acknowledgements_are_cumulative_and_leave_together() -> None:
    net, root, addrs, procs = _mesh(8)
    got = _actors(procs)
    with config.configured(cast_fanout=2):
        for seq in range(1, 11):
            _cast(root, addrs, seq, seq, 2)
        net.pump()
        assert _kept([root]) == 20  # two heads, ten casts
        _settle(net)
    assert _kept([root, *procs.values()]) == 0
    acks_to_root = [s for s in net.sent if s.dst == "unix:@root" and s.frame.kind == wire.KIND_PORT]
    assert len(acks_to_root) == 2  # one per head for all ten casts
    assert all(got[a] == list(range(1, 11)) for a in addrs)


# Sends message ``seq`` (1, 2, ...) from the root to every proc of ``addrs`` not in ``dead``.
CastFn = Callable[[FrameRouter, list[str], set[str], int], None]


def _random_kills_during_a_stream(seed: int, cast: CastFn) -> None:
    """Twelve casts over a tree three levels deep (15 procs, fan-out 2); one or two procs die at
    a random moment each time. Every survivor gets every message, once, in order; nothing stays
    kept."""
    rng = random.Random(seed)
    net, root, addrs, procs = _mesh(15)
    got = _actors(procs)
    dead: set[str] = set()
    with config.configured(cast_fanout=2):
        for seq in range(1, 13):
            cast(root, addrs, dead, seq)
            for _ in range(rng.randrange(6)):
                if not net.step():
                    break
            if rng.random() < 0.25 and len(dead) < 4:
                victim = rng.choice([a for a in addrs if a not in dead])
                dead.add(victim)
                net.kill(victim, "killed")
            if rng.random() < 0.5:
                net.timers.advance(ACK_DELAY)
        _settle(net)
    for addr in addrs:
        if addr not in dead:
            assert got[addr] == list(range(1, 13)), (addr, sorted(dead))
    assert _kept([root, *(procs[a] for a in addrs if a not in dead)]) == 0


@pytest.mark.parametrize("seed", range(100))
def test_heads_killed_at_random_points_of_a_broadcast_stream(seed: int) -> None:
    """Casts planned one by one, to the procs still alive."""

    def cast(root: FrameRouter, addrs: list[str], dead: set[str], seq: int) -> None:
        # Sequence numbers per destination: each live one has had every message so far.
        dests = [casting.Dest(a, seq, r) for r, a in enumerate(addrs) if a not in dead]
        root.casts.send(casting.plan(dests, 2), MESH, SENDER, None, False, [pickle.dumps(seq)])

    _random_kills_during_a_stream(seed, cast)


def _view_cast(root: FrameRouter, book: SeqBook, addrs: list[str], value: Any, fanout: int) -> None:
    """A cast to the whole of ``addrs`` numbered by ``book`` (one view: the sender's fast path
    builds its frames from the view's shape)."""
    groups = book.cast(MESH, addrs, list(range(len(addrs))), fanout)
    root.casts.send(groups, MESH, SENDER, None, False, [pickle.dumps(value)])


@pytest.mark.parametrize("seed", range(100))
def test_heads_killed_at_random_points_of_a_stream_of_casts_to_one_view(seed: int) -> None:
    """Casts numbered by a sender's book for one view (the dead included, as a mesh's view is):
    kept once per cast in a stream of its heads."""
    book = SeqBook()

    def cast(root: FrameRouter, addrs: list[str], dead: set[str], seq: int) -> None:
        with contextlib.suppress(PeerLostError):
            _view_cast(root, book, addrs, seq, 2)

    _random_kills_during_a_stream(seed, cast)


def test_a_stream_of_casts_is_acknowledged_every_ack_every_casts_without_the_timer() -> None:
    net, root, addrs, procs = _mesh(6)
    got = _actors(procs)
    book = SeqBook()
    with config.configured(cast_fanout=2):
        for seq in range(ACK_EVERY):
            _view_cast(root, book, addrs, seq, 2)
        net.pump()  # no timer runs: only the count sends acknowledgements
        assert _kept([root, *procs.values()]) == 0
    acks_to_root = [s for s in net.sent if s.dst == "unix:@root" and s.frame.kind == wire.KIND_PORT]
    assert len(acks_to_root) == 2  # one per head
    assert all(got[a] == list(range(ACK_EVERY)) for a in addrs)


def test_a_head_whose_link_fails_as_the_cast_is_posted_is_gone_around() -> None:
    """The sender's link to a head fails when the cast's frames are posted (the process is not
    known lost yet): the head's subtree gets the cast straight from the sender, and the
    sender's caller hears which head was lost."""
    net, root, addrs, procs = _mesh(6)
    got = _actors(procs)
    book = SeqBook()
    with config.configured(cast_fanout=2):
        _view_cast(root, book, addrs, "first", 2)
        _settle(net)
        net.link(root.address).mark_lost(addrs[0], "link failed")  # p0 heads p1 and p2
        for value in ("second", "third"):  # the second time, p0 is lost to the stream already
            with pytest.raises(PeerLostError, match="link failed"):
                _view_cast(root, book, addrs, value, 2)
        _settle(net)
    assert got[addrs[0]] == ["first"]
    for addr in addrs[1:]:
        assert got[addr] == ["first", "second", "third"], addr
    assert _kept([root]) == 0


def test_a_cast_begun_while_its_head_is_being_found_lost_reaches_the_subtree() -> None:
    """The I/O thread handles a head's loss (it is resending what the head left undelivered)
    when the sender begins its next cast, whose frame to the head is lost with it: that cast
    is sent to the head's subtree as well."""
    net, root, addrs, procs = _mesh(6)
    got = _actors(procs)
    book = SeqBook()
    forwards = root.casts.forwards
    resend = forwards._resend
    began: list[str] = []

    def resend_while_the_sender_casts(*args: Any) -> None:
        if not began:
            began.append("second")
            _view_cast(root, book, addrs, "second", 2)
        resend(*args)

    with config.configured(cast_fanout=2):
        _view_cast(root, book, addrs, "first", 2)
        net.pump()  # delivered, not acknowledged yet
        net.silence(addrs[0])  # p0 (heading p1 and p2) dies; frames to it vanish
        forwards._resend = resend_while_the_sender_casts  # type: ignore[method-assign]
        forwards.peer_lost(addrs[0], "killed")  # before the router has a record of the loss
        net.kill(addrs[0], "killed")
        _settle(net)
    assert began == ["second"]
    for addr in addrs[1:]:
        assert got[addr] == ["first", "second"], addr
    assert _kept([root]) == 0
