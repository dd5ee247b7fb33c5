"""Mesh tensors passed to actor endpoints arrive as the receiving rank's local tensor; views."""

from __future__ import annotations

import pytest
import torch

import regency
from regency.actor import Actor, ProcMesh, current_rank, endpoint

pytestmark = pytest.mark.timeout(120)


class Summer(Actor):
    @endpoint
    def total(self, t: torch.Tensor) -> tuple[str, int, float]:
        return type(t).__name__, current_rank().rank, float(t.sum())


def test_mesh_tensor_arrives_as_the_local_shard(procs: ProcMesh) -> None:
    actors = procs.spawn("summer", Summer)
    with procs.activate():
        t = torch.ones(3) * (procs.rank_tensor("gpus") + 1)
    got = sorted(actors.total.call(t).get(timeout=60).values())
    assert got == [("Tensor", 0, 3.0), ("Tensor", 1, 6.0)]


def test_other_mesh_tensor_is_a_value_error(procs: ProcMesh, procs4: ProcMesh) -> None:
    actors = procs4.spawn("summer", Summer)
    with procs4.activate():
        regency.inspect(torch.ones(1))  # procs4 has tensor workers
    with procs.activate():
        t = torch.ones(1)
    with pytest.raises(Exception, match="different proc mesh"):
        actors.total.call(t).get(timeout=60)
    assert regency.inspect(t).tolist() == [1.0]


def test_slice_made_before_its_parent_was_activated(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(4)
    upper = mesh.slice(gpus=slice(2, 4))  # the mesh has no workers yet
    with upper.activate():
        r = upper.rank_tensor("gpus") + 0
    assert [regency.inspect(r, gpus=i).item() for i in range(2)] == [0, 1]
    with mesh.activate():
        whole = mesh.rank_tensor("gpus") * 1
    assert regency.inspect(whole, gpus=3).item() == 3
