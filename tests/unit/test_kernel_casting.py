"""The casting tree's planning and its gather relays, as pure functions and objects (issue 16)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import pytest

from regency._runtime.kernel import casting, wire
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.routing import RoutingWriter, Subtree
from regency.shape import Shape, Slice

pytestmark = pytest.mark.timeout(30)


def _dests(ranks: Sequence[int]) -> list[casting.Dest]:
    return [casting.Dest(f"unix:@p{r}", 1, r) for r in ranks]


def _check_plan(dests: list[casting.Dest], fanout: int) -> list[casting.Group]:
    groups = casting.plan(dests, fanout)
    assert 1 <= len(groups) <= fanout
    # Contiguous subtrees, in order, each destination exactly once.
    flat = [d for g in groups for d in (g.head, *g.rest)]
    assert flat == dests
    sizes = [1 + len(g.rest) for g in groups]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert sizes == sorted(sizes, reverse=True)
    if len(dests) <= fanout:
        assert all(not g.rest for g in groups)
    else:
        assert len(groups) == fanout
    return groups


def _depth(dests: list[casting.Dest], fanout: int) -> int:
    """Hops from the sender to the deepest destination, planning each subtree as a head does."""
    groups = casting.plan(dests, fanout)
    return 1 + max((_depth(list(g.rest), fanout) if g.rest else 0) for g in groups)


@pytest.mark.parametrize("fanout", [1, 2, 3, 4, 16])
def test_plan_splits_every_mesh_size_into_near_equal_contiguous_subtrees(fanout: int) -> None:
    for n in range(1, 257):
        _check_plan(_dests(range(n)), fanout)


@pytest.mark.parametrize(
    ("n", "fanout", "depth"),
    # A head takes one destination itself: d levels of f reach T(d) = f * (1 + T(d - 1)).
    [
        (1, 16, 1),
        (16, 16, 1),
        (17, 16, 2),
        (272, 16, 2),
        (273, 16, 3),
        (254, 2, 7),
        (255, 2, 8),
        (8, 1, 8),
    ],
)
def test_tree_depth_is_logarithmic_in_the_fanout(n: int, fanout: int, depth: int) -> None:
    assert _depth(_dests(range(n)), fanout) == depth


def test_plan_of_a_slice_keeps_its_ranks_and_order() -> None:
    mesh = Shape(["host", "gpu"], Slice(0, [16, 16], [16, 1]))
    sliced = mesh.select("gpu", slice(1, 16, 3)).select("host", slice(2, 14))
    ranks = sliced.ranks()
    assert len(ranks) == 12 * 5
    assert ranks[:3] == [33, 36, 39]
    dests = _dests(ranks)
    groups = _check_plan(dests, 8)
    # 60 ranks in 8 subtrees: four of 8, then four of 7.
    assert [g.head.rank for g in groups] == [ranks[i] for i in (0, 8, 16, 24, 32, 39, 46, 53)]


class _Sender:
    """Records what a relay sends and closes (the router's side of a relay)."""

    def __init__(self) -> None:
        self.closed: list[tuple[int, list[str]]] = []
        self.sent: list[tuple[PortRef, int, int, list[Part]]] = []

    def close_port(self, port: int, watch: Sequence[str] = ()) -> None:
        self.closed.append((port, list(watch)))

    def send_port(
        self, ref: PortRef, rank: int, flags: int, parts: Sequence[Part], wait: bool = True
    ) -> None:
        self.sent.append((ref, rank, flags, list(parts)))


def test_relay_sends_its_subtree_replies_up_once_all_came() -> None:
    sender = _Sender()
    up = PortRef("unix:@root", 7)
    relay = casting.GatherRelay(sender, up, expected=3)
    relay.bind(40, ["unix:@a", "unix:@b"])
    relay.deliver(5, 0, [b"five"])
    merged = casting.pack_entries([(6, 0, [b"six"]), (7, wire.FLAG_ERROR, [b"seven", b"x"])])
    relay.deliver(0, wire.FLAG_GATHER, merged)
    assert sender.sent == []
    assert sender.closed == []
    relay.deliver(8, 0, [b"eight"])
    assert sender.closed == [(40, ["unix:@a", "unix:@b"])]
    [(ref, rank, flags, parts)] = sender.sent
    assert (ref, rank, flags) == (up, 0, wire.FLAG_GATHER)
    entries = casting.unpack_entries(rank, flags, parts)
    assert [(r, f, [bytes(p) for p in ps]) for r, f, ps in entries] == [
        (5, 0, [b"five"]),
        (6, 0, [b"six"]),
        (7, wire.FLAG_ERROR, [b"seven", b"x"]),
        (8, 0, [b"eight"]),
    ]


def test_relay_that_loses_a_head_closes_without_sending() -> None:
    sender = _Sender()
    relay = casting.GatherRelay(sender, PortRef("unix:@root", 7), expected=2)
    relay.bind(41, ["unix:@a"])
    relay.deliver(1, 0, [pickle.dumps(1)])
    relay.peer_lost("unix:@a", "crashed")
    assert sender.closed == [(41, ["unix:@a"])]
    assert sender.sent == []


def test_unpack_of_a_plain_reply_is_that_reply() -> None:
    assert casting.unpack_entries(3, wire.FLAG_ERROR, [b"e"]) == [(3, wire.FLAG_ERROR, [b"e"])]


@pytest.mark.parametrize("n", [2, 3, 17, 100, 1000])
def test_routing_bound_holds_for_the_largest_subtree_at_the_largest_numbers(n: int) -> None:
    addrs = [f"tcp://host-{r:04d}.cluster.example.com:{40000 + r}" for r in range(n)]
    # Sequence numbers, ranks and the reply port at their largest take the most bytes.
    dests = [casting.Dest(a, 2**64 - 1, 2**32 - 1) for a in addrs]
    reply = PortRef("unix:@regency-0123456789abcdef-controller-0123456789ab", 2**64 - 1)
    sender = "tcp://controller-0123456789.cluster.example.com:65535"
    bound = casting.routing_bound(addrs, sender) + len(reply.addr.encode())
    for fanout in (1, 2, 16):
        for group in casting.plan(dests, fanout):
            # Asking for an acknowledgement at the largest port and token, from the sender or
            # from the longest address passing it on, with a full patch of large numbers.
            rest = Subtree.of(group.rest)
            if rest:
                rest.patch = {i: 2**63 for i in range(min(len(rest), casting.PATCH_MAX))}
            for acker in (sender, max(addrs, key=len)):
                ack = (acker, 2**64 - 1, 2**64 - 1)
                routing, subtree = RoutingWriter(reply).parts(group._replace(rest=rest), True, ack)
                # The subtree travels as a part of its own: one more entry in the part table.
                assert len(routing) + (8 + len(subtree) if subtree is not None else 0) <= bound
