"""``Tensor.to_mesh`` and ``slice_mesh`` on 4 procs (gloo on CPU): exact values after the move,
a pipeline across two slices, broadcasts, shifts, moves between two proc meshes, errors
before anything is sent, poisoning."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import regency
from regency._tensor import engine
from regency.actor import ProcMesh
from regency.mesh_controller import RemoteException

pytestmark = pytest.mark.timeout(120)


def shard_value(rank: int) -> torch.Tensor:
    """What world rank ``rank`` holds in these tests (exact in float32)."""
    return torch.arange(12.0).reshape(3, 4) * (rank + 1) + 0.25 * rank


def by_rank(procs: ProcMesh) -> torch.Tensor:
    """A mesh tensor on ``procs`` (hosts=2, gpus=2) whose shard on world rank ``r`` is
    ``shard_value(r)``."""
    with procs.activate():
        rank = (procs.rank_tensor("hosts") * 2 + procs.rank_tensor("gpus")).float()
        return torch.arange(12.0).reshape(3, 4) * (rank + 1) + 0.25 * rank


def test_between_two_slices_values_arrive_exactly(procs4: ProcMesh) -> None:
    h0, h1 = procs4.slice(hosts=0), procs4.slice(hosts=1)
    t = by_rank(procs4).slice_mesh(hosts=0).to_mesh(h0)  # world ranks 0, 1; no data moved
    moved = t.to_mesh(h1)  # to world ranks 2, 3
    assert moved.mesh is h1
    assert moved.shape == (3, 4)
    for g in range(2):
        assert torch.equal(regency.inspect(moved, gpus=g), shard_value(g))
        assert torch.equal(regency.inspect(t, gpus=g), shard_value(g))
    with h1.activate():
        used = (moved * 2 + 1).reduce("gpus", "sum")  # further ops on the destination
    want = (shard_value(0) * 2 + 1) + (shard_value(1) * 2 + 1)
    assert torch.equal(regency.inspect(used, gpus=1), want)


def test_slice_mesh_then_to_mesh_matches_dims_by_name(procs4: ProcMesh) -> None:
    t = by_rank(procs4)
    column = procs4.slice(gpus=1)  # world ranks 1, 3 along hosts
    moved = t.slice_mesh(gpus=0).to_mesh(column)  # from world ranks 0, 2
    for h in range(2):
        assert torch.equal(regency.inspect(moved, hosts=h), shard_value(2 * h))
    # A renamed view whose dims come in the other order: hosts=h, gpus=g gets (h, g) still.
    swapped = procs4.rename(hosts="h", gpus="g").rename(h="hosts", g="gpus")
    back = t.to_mesh(swapped)
    for h in range(2):
        for g in range(2):
            assert torch.equal(regency.inspect(back, hosts=h, gpus=g), shard_value(2 * h + g))


def test_pipeline_across_two_slices(procs4: ProcMesh) -> None:
    """Monarch's tour: each pipeline stage lives on one slice; activations move between them."""
    pipeline = procs4.rename(hosts="pp")
    meshes = [pipeline.slice(pp=i) for i in range(2)]
    stages = []
    for stage_mesh in meshes:
        with stage_mesh.activate():
            stages.append(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
    with meshes[0].activate():
        batch = torch.rand(5, 4)
    with torch.no_grad():
        x = batch
        for stage_mesh, stage in zip(meshes, stages, strict=True):
            x = x.to_mesh(stage_mesh)
            with stage_mesh.activate():
                x = stage(x)
    assert x.mesh is meshes[1]
    for g in range(2):
        expected = regency.inspect(batch, gpus=g)
        for stage in stages:
            local = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            params = {k: regency.inspect(v, gpus=g) for k, v in stage.state_dict().items()}
            local.load_state_dict(params)
            with torch.no_grad():
                expected = local(expected)
        torch.testing.assert_close(regency.inspect(x, gpus=g), expected, rtol=0, atol=0)


def test_broadcast_to_a_dim_the_source_lacks(procs4: ProcMesh) -> None:
    row = procs4.slice(hosts=1)  # world ranks 2, 3
    with row.activate():
        x = row.rank_tensor("gpus") * 10 + torch.arange(3)
    everywhere = x.to_mesh(procs4)  # rank 2 also keeps its own copy; rank 3 too
    for h in range(2):
        for g in range(2):
            assert regency.inspect(everywhere, hosts=h, gpus=g).tolist() == [
                10 * g + i for i in range(3)
            ]
    one = procs4.slice(hosts=1, gpus=0)
    with one.activate():
        y = torch.full((2,), 7, dtype=torch.int64)
    with procs4.activate():
        stacked = y.to_mesh(procs4).reduce("hosts", "stack").reduce("gpus", "stack")
    assert torch.equal(regency.inspect(stacked), torch.full((2, 2, 2), 7))


def test_a_shift_where_ranks_send_and_receive(procs4: ProcMesh) -> None:
    flat = procs4.flatten("r")
    with flat.activate():
        rank = flat.rank_tensor("r").float()
        t = torch.arange(12.0).reshape(3, 4) * (rank + 1) + 0.25 * rank
    lower, upper = flat.slice(r=slice(0, 3)), flat.slice(r=slice(1, 4))
    shifted = t.slice_mesh(r=slice(0, 3)).to_mesh(upper)  # ranks 1, 2 send and receive
    for i in range(3):
        assert torch.equal(regency.inspect(shifted, r=i), shard_value(i))
    assert regency.inspect(t.slice_mesh(r=slice(1, 4)).to_mesh(lower), r=0)[0, 1] == 2.25


def test_a_large_shard_arrives_exactly(procs4: ProcMesh) -> None:
    """A 4 MiB shard (received into memory from numpy, as large outputs are) moved one rank
    up, and copied where source and destination are the same rank."""
    flat = procs4.flatten("r")
    with flat.activate():
        t = torch.arange(float(1 << 20)) + flat.rank_tensor("r") * 0.5
    shifted = t.slice_mesh(r=slice(0, 3)).to_mesh(flat.slice(r=slice(1, 4)))
    same = t.to_mesh(flat)
    with flat.activate():
        t.add_(1)  # the copies keep the values from before
    for i in range(3):
        assert torch.equal(regency.inspect(shifted, r=i), torch.arange(float(1 << 20)) + i * 0.5)
    assert torch.equal(regency.inspect(same, r=3), torch.arange(float(1 << 20)) + 1.5)


def test_to_its_own_mesh_is_a_copy(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.zeros(2, 3).t()  # a non-contiguous source: the copy is contiguous
    copy = t.to_mesh(procs)
    with procs.activate():
        t.add_(1)
    assert copy.is_contiguous()
    assert copy.shape == (3, 2)
    assert torch.equal(regency.inspect(copy, gpus=1), torch.zeros(3, 2))
    assert torch.equal(regency.inspect(t, gpus=1), torch.ones(3, 2))


def test_pytree_forms(procs4: ProcMesh) -> None:
    h0 = procs4.slice(hosts=0)
    with procs4.activate():
        hosts = procs4.rank_tensor("hosts")
        tree = {"a": hosts + torch.zeros(1), "b": [hosts + torch.ones(1)], "n": 3}
    sliced = regency.slice_mesh(tree, hosts=1)
    assert sliced["n"] == 3
    moved = regency.to_mesh(sliced, h0)
    with h0.activate():
        regency.reduce_(moved, "gpus", "sum")
    assert regency.inspect(moved["a"], gpus=0).tolist() == [2.0]
    assert regency.inspect(moved["b"][0], gpus=1).tolist() == [4.0]
    assert regency.to_mesh({"x": tree["a"]}, procs4)["x"].mesh is procs4


def test_bad_moves_raise_before_anything_is_sent(procs4: ProcMesh, procs: ProcMesh) -> None:
    t = by_rank(procs4)
    h0 = procs4.slice(hosts=0)
    x = t.slice_mesh(hosts=0).to_mesh(h0)
    with procs4.activate():
        weight = torch.zeros(2, requires_grad=True)
    gone = t.to_mesh(procs4)
    gone.drop()
    root = engine.known_root(procs4)
    assert root is not None
    root.flush_all()
    sent = root.flushes
    with pytest.raises(ValueError, match=r"does not have the dimensions \['gpus'\]"):
        x.to_mesh(procs4.slice(gpus=0))
    with pytest.raises(ValueError, match="dimension 'gpus' has size 1 in the destination"):
        x.to_mesh(procs4.slice(hosts=1, gpus=slice(0, 1)))
    with pytest.raises(ValueError, match=r"does not have the dimensions \['hosts'\]"):
        t.to_mesh(h0)
    with pytest.raises(ValueError, match=r"does not have the dimensions \['hosts'\]"):
        t.slice_mesh(gpus=1).to_mesh(h0)
    with pytest.raises(ValueError, match=r"does not have the dimensions \['hosts'\]"):
        t.to_mesh(procs)  # another proc mesh: checked the same way
    with pytest.raises(TypeError, match="needs a proc mesh"):
        x.to_mesh("h0")
    with pytest.raises(TypeError, match="REQUIRES_GRAD"):
        weight.to_mesh(procs4)
    with pytest.raises(TypeError, match="DROPPED"):
        gone.to_mesh(procs4)
    assert root.flushes == sent
    assert root.buffer == []
    with torch.no_grad():
        assert weight.to_mesh(procs4).shape == (2,)


def explode_on_one(t: torch.Tensor) -> torch.Tensor:
    if t.item() == 1:
        raise ValueError("boom before the move")
    return t.clone()


# Fails on the procs at gpus=1 only, so each test sees exactly one failure (and fetches it).
failing = regency.remote(explode_on_one, propagate=lambda t: t.clone())


def test_a_poisoned_shard_poisons_its_destination(procs4: ProcMesh) -> None:
    h0, h1 = procs4.slice(hosts=0), procs4.slice(hosts=1)
    with h0.activate():
        bad = failing(h0.rank_tensor("gpus"))
        moved = bad.to_mesh(h1)
        with pytest.raises(RemoteException, match="world rank 1 had failed to compute"):
            regency.inspect(moved, gpus=1)
        with pytest.raises(RemoteException, match="boom before the move"):
            regency.inspect(bad, gpus=1)
    with pytest.raises(RemoteException, match="world rank 1 had failed"):
        regency.inspect(moved, gpus=0)  # a value is delivered only when good on every rank
    # Nothing was left half sent: the next move between the same procs works.
    with h0.activate():
        good = torch.full((3,), 5.0)
    assert regency.inspect(good.to_mesh(h1), gpus=1).tolist() == [5.0] * 3


@regency.remote(propagate=lambda t, path: t.clone())
def once_flagged(t: torch.Tensor, path: str) -> torch.Tensor:
    """A copy of ``t``, made once ``path`` exists (its stream is busy until then)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return t.clone()


def test_on_another_stream(procs4: ProcMesh, procs: ProcMesh, tmp_path: Path) -> None:
    side = regency.Stream("side")
    h0, h1 = procs4.slice(hosts=0), procs4.slice(hosts=1)
    with side.activate(), h0.activate():
        x = h0.rank_tensor("gpus") + 40
    moved = x.to_mesh(h1)  # on x's stream, whichever stream is active
    assert moved.stream is side
    with side.activate():
        assert regency.inspect(moved, gpus=1).item() == 41
        flag = tmp_path / "go"
        late = once_flagged(x, str(flag))  # side is busy until the flag: "main" must wait
    main = regency.get_active_stream()
    onto = late.to_mesh(h1, stream=main)
    assert onto.stream is main
    assert onto.mesh is h1
    with h1.activate():
        doubled = onto * 2  # on "main", as a tensor made there
    flag.touch()  # every op above was issued while side's copy was not made yet
    assert regency.inspect(doubled, gpus=1).item() == 82
    third = regency.Stream("third")
    there = late.to_mesh(procs.rename(gpus="gpus"), stream=third)  # another proc mesh too
    with third.activate():
        assert regency.inspect(there + 1, gpus=0).item() == 41
    with pytest.raises(TypeError, match="WRONG_STREAM"):
        torch.add(onto, moved)  # main's and side's tensors on one mesh


def test_between_two_proc_meshes(procs4: ProcMesh, procs: ProcMesh) -> None:
    """Two separately spawned proc meshes (two worlds) of the same shape: over a link group."""
    h1 = procs4.slice(hosts=1)  # world ranks 2, 3 of procs4
    there = by_rank(procs4).slice_mesh(hosts=1).to_mesh(procs)
    assert there.mesh is procs
    for g in range(2):
        assert torch.equal(regency.inspect(there, gpus=g), shard_value(2 + g))
    with procs.activate():
        summed = (there + 1).reduce("gpus", "sum")  # procs' own world, after the link
    back = summed.to_mesh(h1)  # the same link, the other way
    for g in range(2):
        assert torch.equal(regency.inspect(back, gpus=g), shard_value(2) + shard_value(3) + 2)
    with procs.activate():
        bad = failing(procs.rank_tensor("gpus"))
        poisoned = bad.to_mesh(procs4.slice(hosts=0))
        with pytest.raises(RemoteException, match="world rank 1 of the other proc mesh"):
            regency.inspect(poisoned, gpus=1)
        with pytest.raises(RemoteException, match="boom before the move"):
            regency.inspect(bad, gpus=1)
    with pytest.raises(RemoteException, match="world rank 1 of the other proc mesh"):
        regency.inspect(poisoned, gpus=0)
