"""Mesh tensors next to actors, and a view activated before its parent."""

from __future__ import annotations

import pytest
import torch

import regency
from regency.actor import Actor, ProcMesh, endpoint

pytestmark = pytest.mark.timeout(120)


class Summer(Actor):
    @endpoint
    def total(self, t: torch.Tensor) -> float:
        return float(t.sum())


def test_mesh_tensor_to_an_endpoint_is_refused_clearly(procs: ProcMesh) -> None:
    actors = procs.spawn("summer", Summer)
    with procs.activate():
        t = torch.ones(3)
    with pytest.raises(TypeError, match=r"cannot be pickled.*regency\.inspect"):
        actors.total.call(t)
    assert actors.total.call(regency.inspect(t)).get(timeout=60).item(gpus=1) == 3.0


def test_slice_made_before_its_parent_was_activated(make_procs) -> None:  # type: ignore[no-untyped-def]
    mesh = make_procs(4)
    upper = mesh.slice(gpus=slice(2, 4))  # the mesh has no workers yet
    with upper.activate():
        r = upper.rank_tensor("gpus") + 0
    assert [regency.inspect(r, gpus=i).item() for i in range(2)] == [0, 1]
    with mesh.activate():
        whole = mesh.rank_tensor("gpus") * 1
    assert regency.inspect(whole, gpus=3).item() == 3
