"""A send to several actors when one of them is lost midway, over the in-memory loopback.

Each destination of a multi-target send has taken the sender's next sequence number for it. A
destination left without its message would hold back every later message from that sender in
its mailbox, forever. So the router sends to every destination it can reach, direct or down the
casting tree (around a lost subtree head), and only then reports the ones it lost.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import pytest

from regency import config
from regency._runtime.kernel import bulk, casting
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.loopback import Loopback
from regency._runtime.kernel.router import FrameRouter
from regency._transport import frames

pytestmark = pytest.mark.timeout(30)

MESH = 9  # the mailbox id of the test's actor mesh
SENDER = 5  # the sending actor's uid


def _mesh(n: int) -> tuple[Loopback, FrameRouter, dict[str, FrameRouter]]:
    net = Loopback()
    root = net.router("unix:@root")
    procs = {f"unix:@p{r}": net.router(f"unix:@p{r}") for r in range(n)}
    return net, root, procs


def _actors(routers: dict[str, FrameRouter]) -> dict[str, list[Any]]:
    """Attach a sink to each router's mailbox of MESH that records each message's body."""
    got: dict[str, list[Any]] = {}
    for addr, router in routers.items():
        seen = got[addr] = []
        router.mailbox(MESH).attach(
            lambda delivery, seen=seen: seen.append(pickle.loads(delivery[0][0]))
        )
    return got


def _encoder(value: Any, size: int = 0) -> frames.Encoder:
    """A message whose body is ``value``, padded by an out-of-band part of ``size`` bytes."""
    parts = [pickle.dumps(value)]
    if size:
        parts.append(b"\0" * size)
    return frames.Encoder(parts, 1 << 30)


# Small messages are coalesced (posted), mid-sized ones sent one by one, large ones framed apart.
SIZES = [0, 64 * 1024, bulk.BULK_MIN]


@pytest.mark.parametrize("size", SIZES, ids=["posted", "sent", "large"])
@pytest.mark.parametrize("lost", [0, 1, 3])
def test_a_direct_send_reaches_every_live_target_before_it_reports_the_lost_one(
    size: int, lost: int
) -> None:
    net, root, procs = _mesh(4)
    got = _actors(procs)
    addrs = list(procs)
    net.kill(addrs[lost], "crashed")
    targets = [(addr, 1, rank) for rank, addr in enumerate(addrs)]
    with pytest.raises(PeerLostError, match=f"{addrs[lost]}.*crashed"):
        root.send_actor(targets, MESH, SENDER, _encoder("first", size))
    # The next message from the same sender is not held back behind a missing first one.
    live = [(addr, 2, rank) for addr, _, rank in targets if addr != addrs[lost]]
    root.send_actor(live, MESH, SENDER, _encoder("second", size))
    net.pump()
    for addr in addrs:
        assert got[addr] == ([] if addr == addrs[lost] else ["first", "second"]), addr


def test_a_direct_send_names_every_lost_target() -> None:
    net, root, procs = _mesh(4)
    got = _actors(procs)
    addrs = list(procs)
    net.kill(addrs[0], "crashed")
    net.kill(addrs[2], "killed")
    with pytest.raises(PeerLostError) as info:
        root.send_actor([(a, 1, r) for r, a in enumerate(addrs)], MESH, SENDER, _encoder("x"))
    assert f"{addrs[0]} is gone: crashed" in str(info.value)
    assert f"{addrs[2]} is gone: killed" in str(info.value)
    net.pump()
    assert [got[a] for a in addrs] == [[], ["x"], [], ["x"]]


def _tree(addrs: Sequence[str], seq: int) -> list[casting.Group]:
    return casting.plan([casting.Dest(a, seq, r) for r, a in enumerate(addrs)], 2)


def test_a_cast_goes_around_a_lost_subtree_head_and_on_to_the_other_subtrees() -> None:
    net, root, procs = _mesh(6)
    got = _actors(procs)
    addrs = list(procs)
    # Two subtrees of three: p0 heads p1 and p2, p3 heads p4 and p5.
    net.kill(addrs[0], "crashed")
    with config.configured(cast_fanout=2):
        with pytest.raises(PeerLostError, match=f"{addrs[0]}.*crashed"):
            root.casts.send(_tree(addrs, 1), MESH, SENDER, None, False, [pickle.dumps("first")])
        live = [a for a in addrs if a != addrs[0]]
        root.send_actor([(a, 2, r) for r, a in enumerate(live)], MESH, SENDER, _encoder("second"))
        net.pump()
    assert [got[a] for a in addrs] == [[]] + [["first", "second"]] * 5


def test_a_cast_posts_its_frames_to_every_head_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One post for all the heads: the transport judges a post a burst or not as a whole, and
    posts one after another would hold every head but the first until a later flush."""
    net, root, procs = _mesh(6)
    got = _actors(procs)
    addrs = list(procs)
    posted: list[list[str]] = []
    post = root._link.post
    monkeypatch.setattr(
        root._link, "post", lambda frames: (posted.append([f[0] for f in frames]), post(frames))
    )
    with config.configured(cast_fanout=2):
        groups = _tree(addrs, 1)
        root.casts.send(groups, MESH, SENDER, None, False, [pickle.dumps("hi")])
    assert posted == [[g.head.addr for g in groups]]
    assert len(groups) > 1
    net.pump()
    assert [got[a] for a in addrs] == [["hi"]] * 6


def test_a_head_found_lost_by_the_post_is_gone_around() -> None:
    """The router does not know yet that p0 is gone (only its link does): the post names it,
    and the rest of its subtree still gets the message."""
    net, root, procs = _mesh(6)
    got = _actors(procs)
    addrs = list(procs)
    net.kill(addrs[0], "crashed")
    root.losses.forget_end(addrs[0])
    with config.configured(cast_fanout=2):
        with pytest.raises(PeerLostError, match=f"{addrs[0]}.*crashed"):
            root.casts.send(_tree(addrs, 1), MESH, SENDER, None, False, [pickle.dumps("first")])
        net.pump()
    assert [got[a] for a in addrs] == [[]] + [["first"]] * 5


def test_a_cast_goes_around_lost_heads_one_after_another() -> None:
    net, root, procs = _mesh(4)
    got = _actors(procs)
    addrs = list(procs)
    net.kill(addrs[0], "crashed")
    net.kill(addrs[1], "crashed too")
    group = casting.Group(
        casting.Dest(addrs[0], 1, 0), tuple(casting.Dest(a, 1, r) for r, a in enumerate(addrs))[1:]
    )
    with config.configured(cast_fanout=2), pytest.raises(PeerLostError) as info:
        root.casts.send([group], MESH, SENDER, None, False, [pickle.dumps("hi")])
    assert "crashed" in str(info.value)
    assert "crashed too" in str(info.value)
    net.pump()
    assert [got[a] for a in addrs] == [[], [], ["hi"], ["hi"]]


def test_a_proc_forwarding_a_cast_goes_around_a_lost_subtree_head() -> None:
    net, root, procs = _mesh(4)
    got = _actors(procs)
    addrs = list(procs)
    # p0 heads the whole mesh and plans p1 (with p2 under it) and p3 as its subtrees.
    net.kill(addrs[1], "crashed")
    with config.configured(cast_fanout=2):
        whole = casting.Group(
            casting.Dest(addrs[0], 1, 0),
            tuple(casting.Dest(a, 1, r) for r, a in enumerate(addrs))[1:],
        )
        root.casts.send([whole], MESH, SENDER, None, False, [pickle.dumps("first")])
        net.pump()
        live = [(a, 2, r) for r, a in enumerate(addrs) if a != addrs[1]]
        root.send_actor(live, MESH, SENDER, _encoder("second"))
        net.pump()
    assert got[addrs[1]] == []
    for addr in (addrs[0], addrs[2], addrs[3]):
        assert got[addr] == ["first", "second"], addr


def test_a_gather_around_a_lost_head_still_merges_the_live_replies_into_one() -> None:
    net, root, procs = _mesh(3)
    addrs = list(procs)
    for addr, router in procs.items():

        def answer(delivery: Any, router: FrameRouter = router) -> None:
            _, rank, reply = delivery
            router.send_port(reply, rank, 0, [pickle.dumps(rank)], wait=False)

        router.mailbox(MESH).attach(answer)
    replies: list[tuple[int, int]] = []

    class Inbox:
        def deliver(self, rank: int, flags: int, parts: Sequence[Any]) -> None:
            replies.extend(
                (r, pickle.loads(ps[0])) for r, _, ps in casting.unpack_entries(rank, flags, parts)
            )

        def peer_lost(self, addr: str, reason: str) -> None:
            pass

    port = root.open_port(Inbox())
    net.kill(addrs[0], "crashed")
    group = casting.Group(
        casting.Dest(addrs[0], 1, 0), (casting.Dest(addrs[1], 1, 1), casting.Dest(addrs[2], 1, 2))
    )
    with config.configured(cast_fanout=2), pytest.raises(PeerLostError):
        root.casts.send([group], MESH, SENDER, port, True, [pickle.dumps("hi")])
    net.pump()
    # The subtree's new head relays its own and p2's replies up as one gathered message.
    assert sorted(replies) == [(1, 1), (2, 2)]
