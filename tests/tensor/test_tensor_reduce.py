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


def page_faults() -> int:
    """This process's minor page faults so far (run on a worker)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def faults_by_rank() -> list[int]:
    """``page_faults()`` of both workers of the active 2-proc mesh."""
    fetch = regency.call_on_shard_and_fetch
    return [fetch(page_faults, shard={"gpus": g}).result() for g in (0, 1)]


def test_a_reduce_loop_puts_each_output_in_the_memory_of_the_last(procs: ProcMesh) -> None:
    """``y = x.reduce(...)`` in a loop: each 8 MiB output lands in the memory the one before
    left, so a worker faults in no fresh pages step after step. With torch's own (aligned)
    allocation, glibc before 2.38 could not reuse the freed block for the next output: the heap
    grew by one output a step for several steps, each page faulted in (2048 faults a step here)."""
    pages = 8 * (1 << 20) // 4096
    with procs.activate():
        x = torch.ones(2 * (1 << 20)) * (procs.rank_tensor("gpus") + 1)
        for _ in range(2):
            y = x.reduce("gpus", "sum")
        regency.inspect(y[:1])
        before = faults_by_rank()
        for _ in range(12):
            y = x.reduce("gpus", "sum")
        last = regency.inspect(y[-1:])
        after = faults_by_rank()
    assert last.tolist() == [3.0]
    # Two outputs may take turns (gloo's thread can hold the last one a moment after it is
    # dropped), so up to one more output's pages may be new; torch's allocation took 3-4.
    faults = [b - a for a, b in zip(before, after)]
    assert max(faults) < 2 * pages, f"{faults} page faults in 12 reductions of {pages} pages"


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
