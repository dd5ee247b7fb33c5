"""``Tensor.reduce`` end to end (gloo on CPU), through the workers' collectives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import regency
from regency.actor import ProcMesh

# The procs (spawned later, by the fixtures) inherit this path and import the example by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import tensor_mlp

pytestmark = pytest.mark.timeout(180)


def test_sum_avg_stack_over_one_dim(procs4: ProcMesh) -> None:
    with procs4.activate():
        g = procs4.rank_tensor("gpus").float() + 1  # 1, 2 along gpus
        total = g.reduce("gpus", "sum")
        mean = g.reduce("gpus", "avg")
        stacked = g.reduce("gpus", "stack")
        everything = g.reduce(["hosts", "gpus"], "sum")
    assert stacked.shape == (2,)
    for h in range(2):
        for r in range(2):
            assert regency.inspect(total, hosts=h, gpus=r).item() == 3.0
            assert regency.inspect(mean, hosts=h, gpus=r).item() == 1.5
            assert regency.inspect(stacked, hosts=h, gpus=r).tolist() == [1.0, 2.0]
            assert regency.inspect(everything, hosts=h, gpus=r).item() == 6.0


def test_reduce_in_place_and_scatter(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(4) * (procs.rank_tensor("gpus") + 1)
        same = t.reduce_("gpus", "max")
        # Monarch's scatter: a leading dim of the group's size, each rank gets one row's sum.
        rows = torch.arange(6.0).reshape(2, 3) * (procs.rank_tensor("gpus") + 1)
        parts = rows.reduce("gpus", "sum", scatter=True)
    assert same is t
    assert parts.shape == (3,)
    assert regency.inspect(t, gpus=0).tolist() == [2.0] * 4
    assert regency.inspect(parts, gpus=0).tolist() == [0.0, 3.0, 6.0]
    assert regency.inspect(parts, gpus=1).tolist() == [9.0, 12.0, 15.0]


def all_reduce_with(t: torch.Tensor, group: object) -> torch.Tensor:
    out = t.clone()
    torch.distributed.all_reduce(out, group=group)  # type: ignore[arg-type]
    return out


def test_process_group_in_a_remote_function(procs: ProcMesh) -> None:
    fn = regency.remote(all_reduce_with, propagate=lambda t, g: t.clone())
    with procs.activate():
        summed = fn(procs.rank_tensor("gpus").float() + 1, procs.process_group("gpus"))
    assert regency.inspect(summed, gpus=1).item() == 3.0


def test_data_parallel_mlp_matches_one_process(procs: ProcMesh) -> None:
    losses, params = tensor_mlp.train(procs, steps=3)
    local_losses, local_params = tensor_mlp.train_locally(procs.size("gpus"), steps=3)
    for rank_params in params:
        for got, want in zip(rank_params, local_params, strict=True):
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(local_losses))
