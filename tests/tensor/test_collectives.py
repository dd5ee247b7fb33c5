"""The workers' collectives on 4 real procs: every reduction's exact result on every rank, in
place and not, scattered and not, on gloo (CPU) and, where 4 GPUs exist, NCCL (CUDA); sub
groups of mesh views made by their members only, two at once; send/recv for ``to_mesh``.

A test actor calls `regency._tensor.collectives` on tensors it makes itself from its rank;
the controller computes the expected values with plain torch ops on the same inputs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from regency._tensor import collectives
from regency._tensor.collectives import (
    WorldGroups,
    recv_from,
    reduce,
    reduce_,
    send_recv,
    send_to,
)
from regency._tensor.groups import REDUCTIONS, reduce_groups, reduce_output_size
from regency.actor import Actor, ActorError, ActorMesh, ProcMesh, current_rank, endpoint, this_host
from regency.shape import Extent, Shape

pytestmark = pytest.mark.timeout(120)

T = 60.0
N = 4
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# One world serves both devices where NCCL can run: gloo for CPU tensors, NCCL for CUDA ones.
BACKEND = "cpu:gloo,cuda:nccl" if GPUS >= N else "gloo"
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            GPUS < N,
            reason=f"NCCL needs one CUDA device per rank: {N} procs, {GPUS} device(s) here",
        ),
    ),
]
BITWISE = ("band", "bor", "bxor")
ELEMENTWISE = [r for r in REDUCTIONS if r != "stack"]

# One per worker process, shared by every actor there, as the tensor engine's worker keeps it.
WORLD = WorldGroups()


def local_input(rank: int, dtype: torch.dtype, shape: Sequence[int] = (N, 3)) -> torch.Tensor:
    """Rank ``rank``'s input: small integers from -3 to 3 (exact in every dtype), by rank."""
    base = torch.arange(int(torch.Size(shape).numel())).reshape(*shape)
    return ((base * (rank + 1) + 2 * rank) % 7 - 3).to(dtype)


def dtypes_for(reduction: str) -> list[torch.dtype]:
    return [torch.int64, torch.int32] if reduction in BITWISE else [torch.int64, torch.float32]


def expected(
    reduction: str,
    scatter: bool,
    ranks: Sequence[int],
    me: int,
    dtype: torch.dtype,
    shape: Sequence[int] = (N, 3),
) -> torch.Tensor:
    """What group rank ``me`` of the group ``ranks`` gets, computed here with torch ops."""
    inputs = [local_input(r, dtype, shape) for r in ranks]
    stacked = torch.stack(inputs)
    n = len(ranks)
    if reduction == "stack":
        return stacked[:, me] if scatter else stacked
    if reduction == "sum":
        full = stacked.sum(0, dtype=dtype)
    elif reduction == "avg":
        total = stacked.sum(0, dtype=dtype)
        full = total / n if dtype.is_floating_point else torch.div(total, n, rounding_mode="trunc")
    elif reduction == "product":
        full = stacked.prod(0, dtype=dtype)
    elif reduction == "min":
        full = stacked.amin(0)
    elif reduction == "max":
        full = stacked.amax(0)
    else:
        op = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
        full = functools.reduce(op[reduction], inputs)
    return full[me] if scatter else full


class Coll(Actor):
    """Runs one collective per call on this proc's own input tensor."""

    def __init__(self) -> None:
        self.rank = current_rank()["gpus"]

    @endpoint
    def open_store(self) -> tuple[str, int]:
        return WorldGroups.open_store()

    @endpoint
    def init_world(self, host: str, port: int, backend: str) -> int:
        if "nccl" in backend:
            torch.cuda.set_device(self.rank)
        WORLD.init_world(host, port, self.rank, N, backend)
        WORLD.init_world(host, port, self.rank, N, backend)  # idempotent
        return int(dist.get_rank())

    @endpoint
    def run(
        self,
        ranks: list[int],
        reduction: str,
        scatter: bool,
        dtype: torch.dtype,
        device: str = "cpu",
        inplace: bool = False,
        tag: str = "",
        composed: bool = False,
    ) -> dict[str, Any]:
        """Reduce this rank's input over the group ``ranks``; report the result and aliasing.

        ``composed`` hides the backend's own reduction ops, so the reduction takes the path
        that NCCL takes for the ops it lacks (bitwise ones), here on gloo.
        """
        t = local_input(self.rank, dtype).to(device)
        before = t.clone()
        group = WORLD.group(ranks, tag)
        hide = mock.patch.dict(collectives._NATIVE, clear=True)
        with hide if composed else contextlib.nullcontext():
            out = (reduce_ if inplace else reduce)(t, reduction, group, scatter)
        return {
            "out": out.cpu(),
            "is_input": out is t,
            "input_unchanged": bool(torch.equal(t, before)),
            "device": out.device.type,
            "group_rank": group.rank(),
            "group_size": group.size(),
        }

    @endpoint
    def run_large(self, reduction: str, dtype: torch.dtype, numel: int) -> dict[str, Any]:
        """A not-in-place reduction over the world of a tensor big enough to be copied and
        reduced in pieces; the result, and whether the input kept its value."""
        t = local_input(self.rank, dtype, (numel,))
        before = t.clone()
        out = reduce(t, reduction, WORLD.group(range(N)))
        return {"out": out, "is_input": out is t, "input_unchanged": torch.equal(t, before)}

    @endpoint
    def run_in_my_group(
        self, groups: list[tuple[int, ...]], reduction: str, scatter: bool, dtype: torch.dtype
    ) -> tuple[tuple[int, ...], torch.Tensor]:
        """Reduce over the one of ``groups`` that holds this rank (a mesh dim's reduction), on an
        input with a leading dim of the group's size."""
        (mine,) = [g for g in groups if self.rank in g]
        t = local_input(self.rank, dtype, (len(mine), 3))
        out = reduce(t, reduction, WORLD.group(mine), scatter)
        return mine, out

    @endpoint
    def reduce_strided(self, ranks: list[int], reduction: str) -> torch.Tensor:
        """Reduce a non-contiguous view in place; return the whole base tensor."""
        base = local_input(self.rank, torch.float32, (3, 2 * N))
        view = base[:, ::2].t()  # (N, 3), strided
        reduce_(view, reduction, WORLD.group(ranks), False)
        return base

    @endpoint
    def send(self, dst: int, ranks: list[int]) -> None:
        send_to(local_input(self.rank, torch.float32).t(), dst, WORLD.group(ranks))

    @endpoint
    def recv(self, src: int, ranks: list[int]) -> torch.Tensor:
        into = torch.zeros(N, 3).t()  # non-contiguous landing tensor
        out = recv_from(into, src, WORLD.group(ranks))
        assert out is into
        return into

    @endpoint
    def shift(self, numel: int) -> torch.Tensor:
        """Send a tensor of this rank's number to the next rank, receive the previous one's."""
        into = torch.empty(numel)
        world = WORLD.group(range(N))
        out = send_recv(
            torch.full((numel,), float(self.rank)),
            (self.rank + 1) % N,
            into,
            (self.rank - 1) % N,
            world,
        )
        assert out is into
        return into

    @endpoint
    def misuse(self, case: str) -> None:
        """Calls that fail before any communication, so one rank can make them alone."""
        world = WORLD.group(range(N))
        if case == "scatter_size":
            reduce(torch.zeros(3, 2), "sum", world, True)
        elif case == "stack_in_place":
            reduce_(torch.zeros(N, 2), "stack", world, False)
        elif case == "scatter_in_place":
            reduce_(torch.zeros(N, 2), "sum", world, True)
        elif case == "band_float":
            reduce(torch.zeros(2), "band", world, False)
        elif case == "unknown":
            reduce(torch.zeros(2), "mean", world, False)
        elif case == "not_member":
            WORLD.group([r for r in range(N) if r != self.rank])


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    procs = this_host().spawn_procs(per_host={"gpus": N})
    try:
        assert procs.initialized.get(timeout=T) is True
        yield procs
    finally:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=30.0)


@pytest.fixture(scope="module")
def coll(procs: ProcMesh) -> ActorMesh[Coll]:
    actors = procs.spawn("coll", Coll)
    host, port = actors.slice(gpus=0).open_store.call_one().get(timeout=T)
    ranks = actors.init_world.call(host, port, BACKEND).get(timeout=T)
    assert [r for _, r in ranks.items()] == list(range(N))
    return actors


def by_rank(results: Any) -> dict[int, Any]:
    return {point["gpus"]: value for point, value in results.items()}


@pytest.mark.parametrize(
    ("reduction", "dtype"),
    [
        ("sum", torch.float32),
        ("avg", torch.float32),
        ("max", torch.int64),
        ("bor", torch.int64),
        ("sum", torch.bfloat16),
    ],
)
def test_a_large_reduction_copied_in_pieces_is_exact(
    coll: ActorMesh[Coll], reduction: str, dtype: torch.dtype
) -> None:
    """Over 2 MiB the input is copied and reduced in pieces that overlap (2 unequal ones
    here), its output in memory from numpy (viewed as the dtype, also one numpy lacks); every
    element must still be right, and the input untouched."""
    numel = 3 * (1 << 20) // dtype.itemsize + 5
    assert numel * dtype.itemsize // collectives._OVERLAP_MIN_BYTES == 3
    out = by_rank(coll.run_large.call(reduction, dtype, numel).get(timeout=T))
    want = expected(reduction, False, list(range(N)), 0, dtype, (numel,))
    for rank in range(N):
        assert not out[rank]["is_input"]
        assert out[rank]["input_unchanged"]
        assert torch.equal(out[rank]["out"], want)


def test_world_sum_and_stack_of_ranks(coll: ActorMesh[Coll]) -> None:
    """Hand-checked values: row 0 of rank r's input is ((0, 1, 2) * (r + 1) + 2r) mod 7 - 3."""
    rows = [[-3, -2, -1], [-1, 1, 3], [1, -3, 0], [3, 0, -3]]
    assert [local_input(r, torch.int64)[0].tolist() for r in range(N)] == rows
    out = by_rank(coll.run.call(list(range(N)), "sum", False, torch.int64).get(timeout=T))
    for rank in range(N):
        assert out[rank]["out"][0].tolist() == [0, -4, -1]
    out = by_rank(coll.run.call(list(range(N)), "stack", False, torch.int64).get(timeout=T))
    assert out[2]["out"][:, 0, 0].tolist() == [-3, -1, 1, 3]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scatter", [False, True], ids=["all", "scatter"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_every_reduction_on_every_rank(
    coll: ActorMesh[Coll], reduction: str, scatter: bool, device: str
) -> None:
    world = list(range(N))
    for dtype in dtypes_for(reduction):
        out = by_rank(coll.run.call(world, reduction, scatter, dtype, device).get(timeout=T))
        for rank in range(N):
            got = out[rank]
            want = expected(reduction, scatter, world, rank, dtype)
            size = reduce_output_size(reduction, scatter, local_input(0, dtype).shape, N)
            assert got["out"].shape == size == want.shape
            assert got["out"].dtype == dtype
            assert torch.equal(got["out"], want), (reduction, scatter, dtype, rank)
            assert got["device"] == device
            assert not got["is_input"]
            assert got["input_unchanged"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("reduction", "scatter"), [(r, False) for r in ELEMENTWISE] + [("stack", True)]
)
def test_in_place(coll: ActorMesh[Coll], reduction: str, scatter: bool, device: str) -> None:
    world = list(range(N))
    for dtype in dtypes_for(reduction):
        out = by_rank(
            coll.run.call(world, reduction, scatter, dtype, device, inplace=True).get(timeout=T)
        )
        for rank in range(N):
            assert out[rank]["is_input"]
            assert torch.equal(out[rank]["out"], expected(reduction, scatter, world, rank, dtype))


@pytest.mark.parametrize(
    ("scatter", "inplace"), [(False, False), (True, False), (False, True)]
)  # a reduce-scatter changes the shape, so it has no in-place form
@pytest.mark.parametrize("reduction", BITWISE)
def test_bitwise_composed_from_gather_as_on_nccl(
    coll: ActorMesh[Coll], reduction: str, scatter: bool, inplace: bool
) -> None:
    world = list(range(N))
    calls = coll.run.call(world, reduction, scatter, torch.int64, inplace=inplace, composed=True)
    for rank, got in by_rank(calls.get(timeout=T)).items():
        assert got["is_input"] is inplace
        assert torch.equal(got["out"], expected(reduction, scatter, world, rank, torch.int64))


def test_in_place_on_a_strided_view_writes_through(coll: ActorMesh[Coll]) -> None:
    out = by_rank(coll.reduce_strided.call(list(range(N)), "max").get(timeout=T))
    inputs = [local_input(r, torch.float32, (3, 2 * N)) for r in range(N)]
    reduced = torch.stack([x[:, ::2] for x in inputs]).amax(0)
    for rank in range(N):
        want = inputs[rank].clone()
        want[:, ::2] = reduced  # the columns outside the view stay this rank's own
        assert torch.equal(out[rank], want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_reversed_group_orders_stack_by_group_rank(coll: ActorMesh[Coll], device: str) -> None:
    ranks = [3, 2, 1, 0]
    out = by_rank(coll.run.call(ranks, "stack", False, torch.int64, device).get(timeout=T))
    for rank in range(N):
        assert out[rank]["group_rank"] == ranks.index(rank)
        assert torch.equal(out[rank]["out"], expected("stack", False, ranks, 0, torch.int64))


@pytest.mark.parametrize("dim", ["gpus", "hosts"])
@pytest.mark.parametrize("reduction", ["sum", "stack", "bxor"])
def test_2x2_mesh_reduces_over_one_dim(coll: ActorMesh[Coll], dim: str, reduction: str) -> None:
    """The 4 procs seen as {hosts: 2, gpus: 2}: two groups reduce at the same time."""
    groups = reduce_groups(Shape.from_extent(Extent(["hosts", "gpus"], [2, 2])), dim)
    assert groups == ([(0, 1), (2, 3)] if dim == "gpus" else [(0, 2), (1, 3)])
    for scatter in (False, True):
        got = by_rank(
            coll.run_in_my_group.call(groups, reduction, scatter, torch.int64).get(timeout=T)
        )
        for rank in range(N):
            group, out = got[rank]
            assert rank in group
            want = expected(reduction, scatter, group, group.index(rank), torch.int64, (2, 3))
            assert torch.equal(out, want)


def test_groups_of_two_actors_on_the_same_procs_run_at_once(
    procs: ProcMesh, coll: ActorMesh[Coll]
) -> None:
    """Two actor threads per proc make and use crossing groups concurrently: a proc making
    one group does not hold up the other thread's, so no cycle of waiting ranks forms."""
    other = procs.spawn("coll2", Coll)
    try:
        extent = Shape.from_extent(Extent(["hosts", "gpus"], [2, 2]))
        by_gpus, by_hosts = reduce_groups(extent, "gpus"), reduce_groups(extent, "hosts")
        first = coll.run_in_my_group.call(by_gpus, "sum", False, torch.float32)
        second = other.run_in_my_group.call(by_hosts, "sum", False, torch.float32)
        for groups, fut in ((by_gpus, first), (by_hosts, second)):
            for rank, (group, out) in by_rank(fut.get(timeout=T)).items():
                assert group == next(g for g in groups if rank in g)
                want = expected("sum", False, group, 0, torch.float32, (2, 3))
                assert torch.equal(out, want)
    finally:
        other.stop().get(timeout=T)


def test_group_of_a_slice_is_made_by_its_members_only(coll: ActorMesh[Coll]) -> None:
    """Only gpus 1 and 3 hear of the group; ranks 0 and 2 go on with the world meanwhile."""
    view = Shape.from_extent(Extent(["gpus"], [N])).slice(gpus=slice(1, N, 2))
    (group,) = reduce_groups(view, "gpus")
    assert group == (1, 3)
    members = coll.slice(gpus=slice(1, N, 2))
    for reduction in ("stack", "sum", "min"):
        out = by_rank(members.run.call(list(group), reduction, False, torch.int64).get(timeout=T))
        assert sorted(out) == [0, 1]  # the slice's own coordinates
        for slot, rank in enumerate(group):
            assert out[slot]["group_size"] == 2
            assert torch.equal(
                out[slot]["out"], expected(reduction, False, group, slot, torch.int64)
            )
    out = by_rank(coll.run.call(list(range(N)), "max", False, torch.int64).get(timeout=T))
    assert torch.equal(out[0]["out"], expected("max", False, range(N), 0, torch.int64))


def test_group_of_one_rank(coll: ActorMesh[Coll]) -> None:
    alone = coll.slice(gpus=2)
    got = alone.run.call_one([2], "stack", False, torch.int64).get(timeout=T)
    assert torch.equal(got["out"], local_input(2, torch.int64).unsqueeze(0))
    got = alone.run.call_one([2], "avg", False, torch.float32).get(timeout=T)
    assert torch.equal(got["out"], local_input(2, torch.float32))


def test_tagged_group_is_a_second_group_of_the_same_ranks(coll: ActorMesh[Coll]) -> None:
    out = by_rank(coll.run.call([0, 1, 2, 3], "sum", True, torch.int64, tag="s1").get(timeout=T))
    for rank in range(N):
        assert torch.equal(out[rank]["out"], expected("sum", True, range(N), rank, torch.int64))


def test_send_recv_between_two_ranks(coll: ActorMesh[Coll]) -> None:
    sent = coll.slice(gpus=1).send.call_one(3, [1, 3])
    received = coll.slice(gpus=3).recv.call_one(1, [1, 3])
    assert sent.get(timeout=T) is None
    assert torch.equal(received.get(timeout=T), local_input(1, torch.float32).t())


def test_a_ring_shift_sends_and_receives_at_once(coll: ActorMesh[Coll]) -> None:
    """Every rank sends 4 MiB to the next and receives from the previous in one step."""
    got = by_rank(coll.shift.call(1 << 20).get(timeout=T))
    for rank in range(N):
        assert torch.equal(got[rank], torch.full((1 << 20,), float((rank - 1) % N)))


@pytest.mark.parametrize(
    ("case", "error", "text"),
    [
        ("scatter_size", ValueError, "must be 4"),
        ("stack_in_place", ValueError, "cannot run in place"),
        ("scatter_in_place", ValueError, "cannot run in place"),
        ("band_float", TypeError, "band needs an integer or bool tensor"),
        ("unknown", ValueError, "'mean' not supported"),
        ("not_member", ValueError, "is not a member"),
    ],
)
def test_bad_calls_raise_before_communicating(
    coll: ActorMesh[Coll], case: str, error: type[Exception], text: str
) -> None:
    with pytest.raises(ActorError, match=text) as caught:
        coll.slice(gpus=0).misuse.call_one(case).get(timeout=T)
    assert error.__name__ in str(caught.value)
    # The world still works: nothing was left half sent.
    out = by_rank(coll.run.call(list(range(N)), "sum", False, torch.int64).get(timeout=T))
    assert torch.equal(out[0]["out"], expected("sum", False, range(N), 0, torch.int64))
