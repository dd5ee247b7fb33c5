"""Real DDP through SPMDActor.main: all ranks end equal, and equal to one process training
on the mean of the ranks' losses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from regency.actor import ProcMesh, this_host  # noqa: E402
from regency.spmd import SPMDActor  # noqa: E402
from regency.spmd._settle import wait_for_native_threads_to_settle  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ddp_check.py")
STEPS, BATCH = 5, 4


@pytest.fixture(scope="module")
def spmd() -> Iterator[SPMDActor]:
    """Four procs; the 2-proc test runs on a slice of them (torch is imported once per proc)."""
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        yield procs.spawn("ddp", SPMDActor)
    finally:
        procs.stop().get(timeout=60)


def single_process(world: int) -> dict[str, torch.Tensor]:
    """The same model and data in one process; the loss is the mean of the ranks' losses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, world * BATCH, 8, generator=g)
    y = torch.randn(STEPS, world * BATCH, 1, generator=g)
    for step in range(STEPS):
        opt.zero_grad()
        losses = [
            torch.nn.functional.mse_loss(
                model(x[step, r * BATCH : (r + 1) * BATCH]), y[step, r * BATCH : (r + 1) * BATCH]
            )
            for r in range(world)
        ]
        (sum(losses) / world).backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_ranks_agree_and_match_one_process(spmd: SPMDActor, world: int, tmp_path: Path) -> None:
    mesh = spmd if world == 4 else spmd.slice(gpus=slice(0, world))
    host, port = mesh.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
    done = mesh.main.call(host, port, [SCRIPT, str(tmp_path), str(STEPS), str(BATCH)])
    assert list(done.get(timeout=240).values()) == [True] * world
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for other in ranks[1:]:
        assert other.keys() == ranks[0].keys()
        for name in ranks[0]:
            assert torch.equal(other[name], ranks[0][name]), name  # bit-identical across ranks
    expected = single_process(world)
    for name, value in expected.items():
        torch.testing.assert_close(ranks[0][name], value, rtol=1e-5, atol=1e-6)
    # Training changed the parameters (the comparison is not vacuous).
    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    assert not torch.equal(init.state_dict()["0.weight"], ranks[0]["0.weight"])


def test_back_to_back_ddp_runs_free_their_groups_without_deadlock(
    spmd: SPMDActor, tmp_path: Path
) -> None:
    """torch 2.13's gloo could deadlock when a finished script's DDP module was freed: the
    group's destructor joined a worker that waited for the GIL. One run in a few hung on 2 cores;
    the proc now waits for torch's native threads to settle before freeing the script's objects."""
    for run in range(10):
        out = tmp_path / str(run)
        out.mkdir()
        host, port = spmd.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        done = spmd.main.call(host, port, [SCRIPT, str(out), "2", str(BATCH)])
        assert list(done.get(timeout=60).values()) == [True] * 4, f"run {run}"


def test_gloo_threads_settle_after_a_ddp_step_and_destroy() -> None:
    import torch.distributed as dist

    from regency.spmd._env import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        ddp(torch.randn(3, 2)).sum().backward()
    finally:
        dist.destroy_process_group()
    start = time.monotonic()
    assert wait_for_native_threads_to_settle(timeout=5)
    assert time.monotonic() - start < 2  # gloo's epoll loop wakes on a timer: not a GIL wait
    del ddp, store
