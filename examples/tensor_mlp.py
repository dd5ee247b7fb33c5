"""A data-parallel MLP driven from the controller with regency's tensor engine.

Each proc holds one slice of the batch; gradients are averaged over the ``gpus`` dimension with
``reduce(..., "avg")`` (gloo on CPU), so every rank ends with the same parameters, and the loss
equals one process training on the whole batch. Run: ``python examples/tensor_mlp.py``.
"""

from __future__ import annotations

import torch
from torch import nn

import regency
from regency.actor import ProcMesh, this_host
from regency.tensor.builtins import random as remote_random

BATCH, FEATURES, HIDDEN = 16, 8, 32


def full_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The whole data set, the same on the controller and on every worker."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def make_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


@regency.remote(
    propagate=lambda rank, world: (
        torch.empty(BATCH // world, FEATURES),
        torch.empty(BATCH // world, 1),
    )
)
def shard_of_batch(rank: torch.Tensor, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the batch (runs on the workers)."""
    x, y = full_batch()
    per = BATCH // world
    start = int(rank) * per
    return x[start : start + per], y[start : start + per]


def train(procs: ProcMesh, steps: int) -> tuple[list[float], list[list[torch.Tensor]]]:
    """Train on ``procs``; the loss per step and every rank's final parameters."""
    world = procs.size("gpus")
    with procs.activate():
        remote_random.set_manual_seed_remote(1)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = shard_of_batch(procs.rank_tensor("gpus"), world)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                p.grad.reduce_("gpus", "avg")
            opt.step()
            losses.append(loss.detach().reduce("gpus", "avg"))
    fetched = regency.inspect(losses)
    params = [regency.inspect(list(model.parameters()), gpus=r) for r in range(world)]
    return [float(v) for v in fetched], params


def train_locally(world: int, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """The same training in one process on the whole batch (the reference)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = full_batch()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    losses, params = train(procs, steps=5)
    local_losses, _ = train_locally(2, steps=5)
    print("losses (mesh):  ", [round(v, 6) for v in losses])
    print("losses (local): ", [round(v, 6) for v in local_losses])
    same = all(torch.equal(a, b) for a, b in zip(params[0], params[1], strict=True))
    print("identical parameters on every rank:", same)
    procs.stop().get(timeout=30)


if __name__ == "__main__":
    main()
