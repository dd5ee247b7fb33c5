"""Rank tensors, the workers' environment, seeding, and mesh views."""

from __future__ import annotations

import os

import pytest
import torch

import regency
from regency._tensor import engine
from regency.actor import ProcMesh
from regency.tensor.builtins import random as remote_random

pytestmark = pytest.mark.timeout(120)


def env_of() -> dict[str, str]:
    return {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}


def test_rank_tensor_one_dim_and_several(procs4: ProcMesh) -> None:
    gpus = procs4.rank_tensor("gpus")
    both = procs4.rank_tensor(["hosts", "gpus"])  # the flattened rank, as Monarch's
    swapped = procs4.rank_tensor(["gpus", "hosts"])
    every = procs4.rank_tensors()
    assert gpus.shape == ()
    assert gpus.dtype == torch.int64
    assert both.shape == swapped.shape == ()
    assert both.dtype == torch.int64
    assert set(every) == {"hosts", "gpus"}
    for h in range(2):
        for g in range(2):
            assert regency.inspect(gpus, hosts=h, gpus=g).item() == g
            assert regency.inspect(both, hosts=h, gpus=g).item() == 2 * h + g
            assert regency.inspect(swapped, hosts=h, gpus=g).item() == 2 * g + h
            assert regency.inspect(every["hosts"], hosts=h, gpus=g).item() == h
    with procs4.activate():
        scaled = procs4.rank_tensor("gpus") * 10 + 1
    assert regency.inspect(scaled, hosts=1, gpus=1).item() == 11
    with pytest.raises(KeyError, match="'cards'"):
        procs4.rank_tensor(["hosts", "cards"])


def test_inspect_coordinates_are_checked(procs4: ProcMesh) -> None:
    t = procs4.rank_tensor(["hosts", "gpus"])
    assert regency.inspect(t).item() == 0  # no coordinates: 0 on every dimension
    with pytest.raises(ValueError, match="gpus"):
        regency.inspect(t, hosts=1)
    with pytest.raises(KeyError, match="foo"):
        regency.inspect(t, hosts=1, gpus=0, foo=2)


def test_worker_environment(procs4: ProcMesh) -> None:
    with procs4.activate():
        envs = regency.remote(env_of).call().get(timeout=60)
    got = sorted((int(e["RANK"]), e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs.values())
    assert got == [(r, "4", "4") for r in range(4)]
    assert sorted(int(e["LOCAL_RANK"]) for e in envs.values()) == [0, 1, 2, 3]


def test_seeding_is_reproducible(procs: ProcMesh) -> None:
    def draw() -> list[torch.Tensor]:
        with procs.activate():
            remote_random.set_manual_seed_remote(1234)
            a = torch.rand(3)
            remote_random.set_manual_seed_per_rank_remote(1234)
            b = torch.rand(3)
        return [regency.inspect((a, b), gpus=r) for r in range(2)]

    first, second = draw(), draw()
    for r in range(2):
        torch.testing.assert_close(first[r], second[r], rtol=0, atol=0)
    torch.testing.assert_close(first[0][0], first[1][0], rtol=0, atol=0)  # same seed everywhere
    assert not torch.equal(first[0][1], first[1][1])  # seed ^ RANK differs per rank
    torch.manual_seed(1234)
    torch.testing.assert_close(first[1][0], torch.rand(3), rtol=0, atol=0)


def test_views_activate_with_their_own_coordinates(procs4: ProcMesh) -> None:
    row = procs4.slice(hosts=1)  # made before anything ran on it
    with row.activate():
        t = row.rank_tensor("gpus") + 100
    assert t.mesh is row
    # Views and their mesh share one root: its workers and torch.distributed world.
    assert engine.known_root(row) is engine.known_root(procs4) is not None
    assert regency.inspect(t, gpus=1).item() == 101
    with pytest.raises(KeyError):
        regency.fetch_shard(t, hosts=1, gpus=0)
    flat = procs4.flatten("all")
    with flat.activate():
        r = flat.rank_tensor("all")
    assert [regency.inspect(r, all=i).item() for i in range(4)] == [0, 1, 2, 3]
    renamed = procs4.rename(gpus="cards")
    with renamed.activate():
        k = renamed.rank_tensor("cards")
    assert regency.inspect(k, hosts=1, cards=1).item() == 1
    with pytest.raises(TypeError, match="WRONG_MESH"):
        torch.add(t, r)
