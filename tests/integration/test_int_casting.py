"""The casting tree (monarch-api.md §2.4, §2.5): with ``cast_fanout=2`` a cast to 8 procs goes
through a 3-level tree; results, rank order and per-sender FIFO must be as with direct sends."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from regency import config
from regency.actor import (
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Future,
    ProcMesh,
    context,
    current_rank,
    endpoint,
    send,
    this_host,
)

pytestmark = pytest.mark.timeout(60)

T = 30.0
N = 8


class Node(Actor):
    def __init__(self) -> None:
        self.rank = context().actor_instance.rank["gpus"]
        self.count = 0
        self.log: list[int] = []

    @endpoint
    def rank_of(self) -> int:
        return self.rank

    @endpoint
    def where(self) -> tuple[int, dict[str, int]]:
        return self.rank, dict(current_rank())

    @endpoint
    def fanout(self) -> Any:
        return config.get("cast_fanout")

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.count += by
        return self.count

    @endpoint
    def value(self) -> int:
        return self.count

    @endpoint
    def apply(self, op: int) -> int:
        self.log.append(op)
        return op

    @endpoint
    def history(self) -> list[int]:
        return self.log

    @endpoint
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} fails in the tree")
        return self.rank

    @endpoint
    def blob(self, size: int) -> bytes:
        return bytes([self.rank]) * size

    @endpoint
    def cast_from_here(self, mesh: ActorMesh[Node]) -> tuple[list[int], list[int]]:
        """Cast through the tree from inside an actor (this proc's fanout is inherited)."""
        ranks = list(mesh.rank_of.call().get(timeout=T).values())
        mesh.incr.broadcast(10)
        values = list(mesh.value.call().get(timeout=T).values())
        return ranks, values


@pytest.fixture(scope="module")
def procs8() -> Iterator[ProcMesh]:
    saved = config.get_runtime_config()
    config.configure(cast_fanout=2)
    procs = this_host().spawn_procs(per_host={"gpus": N})
    try:
        assert procs.initialized.get(timeout=60) is True
        yield procs
    finally:
        try:
            procs.stop().get(timeout=T)
        finally:
            config.clear_runtime_config()
            config.configure(**saved)


@pytest.fixture
def nodes(procs8: ProcMesh) -> Iterator[ActorMesh[Node]]:
    assert config.get("cast_fanout") == 2
    mesh = procs8.spawn("nodes", Node)
    yield mesh
    mesh.stop().get(timeout=T)


def test_procs_inherit_the_fanout(nodes: ActorMesh[Node]) -> None:
    assert list(nodes.fanout.call().get(timeout=T).values()) == [2] * N


def test_call_through_the_tree_returns_every_rank_in_order(nodes: ActorMesh[Node]) -> None:
    vm = nodes.where.call().get(timeout=T)
    assert vm.sizes == {"gpus": N}
    for i, (point, (rank, message_rank)) in enumerate(vm):
        assert point.rank == i
        assert rank == i
        assert message_rank == dict(point) == {"gpus": i}
    odd = nodes.slice(gpus=slice(1, 8, 2)).rank_of.call().get(timeout=T)
    assert list(odd.values()) == [1, 3, 5, 7]
    part = nodes.slice(gpus=slice(2, 7)).where.call().get(timeout=T)
    assert [r for r, _ in part.values()] == [2, 3, 4, 5, 6]
    assert [m["gpus"] for _, m in part.values()] == [0, 1, 2, 3, 4]


def test_stream_and_choose_through_the_tree(nodes: ActorMesh[Node]) -> None:
    futures = list(nodes.rank_of.stream())
    assert len(futures) == N
    assert sorted(f.get(timeout=T) for f in futures) == list(range(N))
    assert 0 <= nodes.rank_of.choose().get(timeout=T) < N


def test_broadcast_then_call_is_fifo_through_the_tree(nodes: ActorMesh[Node]) -> None:
    for i in range(1, 31):
        nodes.incr.broadcast()
        assert list(nodes.value.call().get(timeout=T).values()) == [i] * N


def test_direct_sends_and_tree_casts_keep_per_sender_order(nodes: ActorMesh[Node]) -> None:
    rng = random.Random(20240611)
    expected: list[list[int]] = [[] for _ in range(N)]
    futures: list[Future[Any]] = []
    for op in range(200):
        kind = rng.random()
        if kind < 0.35:  # whole mesh, through the tree
            nodes.apply.broadcast(op)
            targets = list(range(N))
        elif kind < 0.65:  # one actor, direct
            k = rng.randrange(N)
            futures.append(nodes.slice(gpus=k).apply.call_one(op))
            targets = [k]
        elif kind < 0.8:  # one actor, fire-and-forget
            k = rng.randrange(N)
            nodes.slice(gpus=k).apply.broadcast(op)
            targets = [k]
        else:  # a sub-mesh of 3+ actors, also through the tree, with replies
            start = rng.randrange(N - 3)
            stop = rng.randrange(start + 3, N + 1)
            futures.append(nodes.slice(gpus=slice(start, stop)).apply.call(op))
            targets = list(range(start, stop))
        for t in targets:
            expected[t].append(op)
    for fut in futures:
        fut.get(timeout=T)
    assert list(nodes.history.call().get(timeout=T).values()) == expected


def test_interleaved_increments_give_exact_totals(nodes: ActorMesh[Node]) -> None:
    rng = random.Random(7)
    expected = [0] * N
    pending: list[Future[Any]] = []
    for _ in range(200):
        if rng.random() < 0.5:
            nodes.incr.broadcast(1)
            expected = [e + 1 for e in expected]
        else:
            k = rng.randrange(N)
            pending.append(nodes.slice(gpus=k).incr.call_one(100))
            expected[k] += 100
    assert list(nodes.value.call().get(timeout=T).values()) == expected
    for fut in pending:
        fut.get(timeout=T)


def test_an_actor_casts_through_the_tree(procs8: ProcMesh, nodes: ActorMesh[Node]) -> None:
    # A separate mesh casts (a sync actor casting to its own mesh would wait on itself).
    caster = procs8.slice(gpus=slice(5, 6)).spawn("caster", Node)
    try:
        ranks, values = caster.cast_from_here.call_one(nodes).get(timeout=T)
        assert ranks == list(range(N))
        assert values == [10] * N
    finally:
        caster.stop().get(timeout=T)


def test_an_error_deep_in_the_tree_fails_the_call(nodes: ActorMesh[Node]) -> None:
    with pytest.raises(ActorError, match="rank 6 fails in the tree"):
        nodes.fail_on.call(6).get(timeout=T)
    assert list(nodes.fail_on.call(-1).get(timeout=T).values()) == list(range(N))


def test_large_replies_merge_up_the_tree(nodes: ActorMesh[Node]) -> None:
    size = 300 * 1024  # above the out-of-band threshold: each reply carries a buffer part
    blobs = list(nodes.blob.call(size).get(timeout=T).values())
    assert [len(b) for b in blobs] == [size] * N
    assert [b == bytes([r]) * size for r, b in enumerate(blobs)] == [True] * N


def test_send_to_a_port_through_the_tree(nodes: ActorMesh[Node]) -> None:
    port, receiver = Channel[int].open_ranked()
    send(nodes.rank_of, (), {}, port=port)
    # Every rank replies on its own message, stamped with its rank.
    first = [receiver.recv().get(timeout=T) for _ in range(N)]
    assert sorted(first) == [(r, r) for r in range(N)]
