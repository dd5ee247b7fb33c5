"""A sender's sequence numbers taken per cast in one step (``kernel/seqs.py``), and the compact
subtrees the casting tree sends (``routing.py``).

The numbers must be exactly those of one count per destination actor, whatever mix of direct
sends and casts to overlapping views takes them; and a stream of casts to one view must cost
the sender per subtree, not per destination.
"""

from __future__ import annotations

import pickle
import random
import struct
import zlib
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from regency import config
from regency._runtime.kernel import casting
from regency._runtime.kernel.loopback import Loopback
from regency._runtime.kernel.refs import PortRef
from regency._runtime.kernel.router import FrameRouter
from regency._runtime.kernel.routing import Plans, Roster, RoutingWriter, Subtree, read_routing
from regency._runtime.kernel.seqs import SeqBook
from regency._transport import frames

pytestmark = pytest.mark.timeout(60)

MESH = 9
SENDER = 5


def _flat(groups: list[casting.Group]) -> list[casting.Dest]:
    return [d for g in groups for d in (g.head, *g.rest)]


def _counted(counts: dict[str, int], addrs: list[str], ranks: list[int]) -> list[casting.Dest]:
    """The destinations with the numbers one count per address gives them (taken)."""
    out = []
    for addr, rank in zip(addrs, ranks, strict=True):
        counts[addr] = counts.get(addr, 0) + 1
        out.append(casting.Dest(addr, counts[addr], rank))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_numbers_match_one_count_per_actor_under_any_mix_of_sends_and_casts(seed: int) -> None:
    rng = random.Random(seed)
    addrs = [f"unix:@p{r}" for r in range(60)]
    # Views as a mesh's routes are: fixed lists, reused for every cast; overlapping slices,
    # one naming an address twice, and more views than the book keeps at once.
    views: list[tuple[list[str], list[int]]] = [(addrs, list(range(60)))]
    for _ in range(12):
        start = rng.randrange(0, 50)
        picked = list(range(start, rng.randrange(start + 1, 61), rng.choice((1, 1, 2, 3))))
        views.append(([addrs[r] for r in picked], picked))
    views.append(([addrs[0], addrs[1], addrs[0]], [0, 1, 0]))
    book, counts = SeqBook(), {}
    for _ in range(600):
        roll = rng.random()
        if roll < 0.45:
            addr = rng.choice(addrs)
            counts[addr] = counts.get(addr, 0) + 1
            assert book.next(addr, MESH) == counts[addr]
        else:
            view_addrs, view_ranks = rng.choice(views)
            fanout = rng.choice((2, 3, 16)) if roll > 0.95 else 3
            groups = book.cast(MESH, view_addrs, view_ranks, fanout)
            expected = _counted(counts, view_addrs, view_ranks)
            assert _flat(groups) == expected
            assert [g.head for g in groups] == [g.head for g in casting.plan(expected, fanout)]
    # Another mesh's counts are its own.
    assert book.next(addrs[0], MESH + 1) == 1


def test_a_stream_of_casts_to_one_view_costs_per_subtree_not_per_destination() -> None:
    addrs = [f"unix:@p{r}" for r in range(4096)]
    ranks = list(range(4096))
    book = SeqBook()
    first = book.cast(MESH, addrs, ranks, 16)
    book.next(addrs[7], MESH)  # a direct send in between: carried as a patch
    second = book.cast(MESH, addrs, ranks, 16)
    assert len(second) == 16
    for before, after in zip(first, second, strict=True):
        # The same roster and base numbers, not rebuilt: only the bump differs.
        assert isinstance(after.rest, Subtree)
        assert isinstance(before.rest, Subtree)
        assert after.rest.roster is before.rest.roster
        assert after.rest.seqs is before.rest.seqs
        assert after.rest.bump == before.rest.bump + 1
    assert second[0].rest[6].seq == 3  # addrs[7]: two casts and the direct send
    assert second[0].rest[5].seq == 2


def test_a_patch_past_its_limit_rebases_the_view() -> None:
    addrs = [f"unix:@p{r}" for r in range(100)]
    ranks = list(range(100))
    book, counts = SeqBook(), {}
    book.cast(MESH, addrs, ranks, 4)
    _counted(counts, addrs, ranks)
    for addr in addrs[: casting.PATCH_MAX + 5]:
        counts[addr] += 1
        assert book.next(addr, MESH) == counts[addr]
    groups = book.cast(MESH, addrs, ranks, 4)
    assert _flat(groups) == _counted(counts, addrs, ranks)
    assert all(not g.rest or not getattr(g.rest, "patch", None) for g in groups)


def test_a_head_plans_a_roster_once_and_expands_the_numbers_it_is_sent() -> None:
    dests = [casting.Dest(f"unix:@p{r}", 10 + r, r) for r in range(40)]
    rest = Subtree.of(dests)
    rest.bump, rest.patch = 3, {5: 2}
    reply = PortRef("unix:@root", 17)
    part = _frame(
        RoutingWriter(reply).parts(casting.Group(dests[0], rest), True, ("unix:@up", 4, 99))
    )
    routing = read_routing(part)
    assert (routing.reply, routing.gather, routing.ack) == (reply, True, ("unix:@up", 4, 99))
    plans = Plans()
    groups = plans.groups(routing, 4)
    expected = [d._replace(seq=d.seq + 3 + (2 if i == 5 else 0)) for i, d in enumerate(dests)]
    assert _flat(groups) == expected
    assert [g.head for g in groups] == [g.head for g in casting.plan(expected, 4)]
    again = plans.groups(read_routing(part), 4)
    assert [g.rest.roster for g in again if isinstance(g.rest, Subtree)] == [
        g.rest.roster for g in groups if isinstance(g.rest, Subtree)
    ]


def test_a_leaf_routing_part_names_no_subtree() -> None:
    part = _frame(
        RoutingWriter(None).parts(casting.Group(casting.Dest("unix:@a", 1, 0), ()), True, None)
    )
    assert len(part) == 1
    routing = read_routing([*part, b"message"])
    assert routing.key is None
    assert routing.parts == 1
    assert (routing.reply, routing.gather, routing.ack) == (None, False, None)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda parts: [parts[0][:5], parts[1]], "too short"),
        (lambda parts: [parts[0][:30], parts[1]], "not as long as its header says"),
        (lambda parts: [parts[0] + b"x", parts[1]], "not as long as its header says"),
        (lambda parts: parts[:1], "no subtree part"),
        (lambda parts: [parts[0], parts[1][:-3]], "truncated roster"),
        (lambda parts: [parts[0], parts[1][:-8]], "not as many sequence numbers"),
    ],
)
def test_a_malformed_routing_part_is_refused_with_what_is_wrong(
    cut: Callable[[list[bytes]], list[bytes]], message: str
) -> None:
    dests = [casting.Dest(f"unix:@p{r}", 1, r) for r in range(5)]
    parts = _frame(
        RoutingWriter(None).parts(casting.Group(dests[0], tuple(dests[1:])), False, None)
    )
    with pytest.raises(ValueError, match=message):
        Plans().groups(read_routing(cut(parts)), 2)


def test_a_subtree_part_says_where_its_head_acknowledges() -> None:
    dests = [casting.Dest(f"unix:@p{r}", 1, r) for r in range(5)]
    group = casting.Group(dests[0], tuple(dests[1:]))
    writer = RoutingWriter(None)
    routing, subtree = writer.parts(group, False, ("tcp://10.0.0.1:7/regency-x-controller", 9, 3))
    assert subtree is not None
    assert read_routing([routing, subtree]).ack == ("tcp://10.0.0.1:7/regency-x-controller", 9, 3)
    # A frame asking for an acknowledgement whose subtree part names no acknowledger.
    _, unacked = writer.parts(group, False, None)
    assert unacked is not None
    with pytest.raises(ValueError, match="acknowledgement to nowhere"):
        read_routing([routing, unacked])


def test_a_roster_travels_compressed_and_one_that_inflates_past_its_places_is_refused() -> None:
    addrs = tuple(f"tcp://10.200.0.{i}:40000/regency-9af6ed6a-anon-{i:012x}" for i in range(15))
    roster = Roster(addrs, tuple(range(15)))
    assert len(roster.wire) < len(pickle.dumps((addrs, tuple(range(15))), protocol=5)) / 2
    dests = [casting.Dest(a, 1, r) for r, a in enumerate(addrs)]
    group = casting.Group(dests[0], Subtree.of(dests[1:]))
    assert [g.head.addr for g in Plans().groups(read_routing(_part(group)), 4)] == [
        addrs[i] for i in (1, 5, 9, 12)
    ]
    # A frame whose two places' roster inflates to 10 MB: refused before it is all inflated.
    bomb = zlib.compress(b"\0" * 10_000_000, 9)
    forged = Roster.__new__(Roster)
    forged.addrs, forged.ranks, forged.key = addrs[:2], (0, 1), b"k" * 16
    forged.wire = forged.key + struct.pack("<I", len(bomb)) + bomb
    tree = Subtree(forged, array("Q", [1, 1]), 0, None)
    part = _part(casting.Group(dests[0], tree))
    with pytest.raises(ValueError, match="larger than its places allow"):
        Plans().groups(read_routing(part), 4)


def _part(group: casting.Group) -> list[bytes]:
    return _frame(RoutingWriter(None).parts(group, False, None))


def _frame(parts: tuple[bytes, bytes | None]) -> list[bytes]:
    """A cast frame's routing and subtree parts, as the frame carries them."""
    routing, subtree = parts
    return [routing] if subtree is None else [routing, subtree]


def test_casts_and_direct_sends_reach_every_actor_in_order_down_the_tree() -> None:
    """Over the in-memory loopback: a sender's casts, numbered by bump, and its direct sends
    in between arrive at every actor once and in the order sent."""
    net = Loopback()
    root = net.router("unix:@root")
    addrs = [f"unix:@p{r}" for r in range(40)]
    ranks = list(range(40))
    procs: dict[str, FrameRouter] = {a: net.router(a) for a in addrs}
    got: dict[str, list[Any]] = {}
    for addr, router in procs.items():
        seen = got[addr] = []
        router.mailbox(MESH).attach(
            lambda delivery, seen=seen: seen.append(pickle.loads(delivery[0][0]))
        )
    book = SeqBook()
    rng = random.Random(1)
    sent: dict[str, list[Any]] = {a: [] for a in addrs}
    with config.configured(cast_fanout=3):
        for index in range(30):
            if index % 3 == 2:
                addr = rng.choice(addrs)
                target = (addr, book.next(addr, MESH), addrs.index(addr))
                encoder = frames.Encoder([pickle.dumps(("direct", index))], 1 << 20)
                root.send_actor([target], MESH, SENDER, encoder)
                sent[addr].append(("direct", index))
            else:
                groups = book.cast(MESH, addrs, ranks, 3)
                root.casts.send(groups, MESH, SENDER, None, False, [pickle.dumps(("cast", index))])
                for addr in addrs:
                    sent[addr].append(("cast", index))
            # Deliver some of what is in flight: later messages overtake earlier ones.
            for _ in range(rng.randrange(3)):
                net.step()
        while net.pump() or net.timers.advance(0.05):
            pass
    assert got == sent


def test_a_stream_of_casts_sends_each_head_its_subtree_part_once() -> None:
    """A view's subtree parts travel by name: the first cast's frame to each head defines it,
    the later ones name it; a head reached afresh (a new connection) is sent it again."""
    net = Loopback()
    root = net.router("unix:@root")
    addrs = [f"unix:@p{r}" for r in range(12)]
    got: dict[str, list[Any]] = {}
    for addr in addrs:
        seen = got[addr] = []
        net.router(addr).mailbox(MESH).attach(
            lambda delivery, seen=seen: seen.append(pickle.loads(delivery[0][0]))
        )
    book = SeqBook()
    ranks = list(range(12))  # the same lists for every cast, as a mesh's route keeps them
    heads = [addrs[0], addrs[4], addrs[8]]

    def cast(index: int) -> None:
        groups = book.cast(MESH, addrs, ranks, 3)
        root.casts.send(groups, MESH, SENDER, None, False, [pickle.dumps(index)])
        while net.pump() or net.timers.advance(0.05):
            pass

    with config.configured(cast_fanout=3):
        for index in range(5):
            cast(index)
        link = net.link(root.address)
        assert {head: len(link._names[head]) for head in heads} == dict.fromkeys(heads, 1)
        casts = [s for s in net.sent if s.dst in heads and s.src == root.address]
        parts = {bytes(s.frame.parts[1]) for s in casts if s.dst == heads[1]}
        assert len(parts) == 1, "every cast's frame to a head came back with the same part"
        link.forget_lost(heads[1])
        cast(5)
        assert len(link._names[heads[1]]) == 1
    assert got == {addr: list(range(6)) for addr in addrs}


def test_a_sender_that_heads_a_subtree_itself_forwards_it_from_the_roster() -> None:
    """The sender's own process heads one subtree (a mesh with an actor in the controller's
    process): it plans that subtree from its roster like any head, and every actor, its own
    included, gets every cast once and in order."""
    net = Loopback()
    root = net.router("unix:@root")
    addrs = [f"unix:@p{r}" for r in range(30)]
    addrs[10] = root.address  # the head of the second subtree at fan-out 3
    procs = {a: net.router(a) for a in addrs if a != root.address}
    procs[root.address] = root
    got: dict[str, list[Any]] = {}
    for addr, router in procs.items():
        seen = got[addr] = []
        router.mailbox(MESH).attach(
            lambda delivery, seen=seen: seen.append(pickle.loads(delivery[0][0]))
        )
    book = SeqBook()
    with config.configured(cast_fanout=3):
        for index in range(5):
            groups = book.cast(MESH, addrs, list(range(30)), 3)
            assert any(g.head.addr == root.address and g.rest for g in groups)
            root.casts.send(groups, MESH, SENDER, None, False, [pickle.dumps(index)])
        while net.pump() or net.timers.advance(0.05):
            pass
    assert got == {a: list(range(5)) for a in addrs}
