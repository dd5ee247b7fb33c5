"""A torchrun-style DDP script (gloo, CPU): five steps of a linear model, as in Monarch's
SPMD example; each rank writes its final parameters to ``argv[1].format(rank)``."""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different data on each rank; DDP keeps the parameters equal
    model = DistributedDataParallel(nn.Linear(10, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        loss = model(torch.randn(4, 10)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.save(model.module.state_dict(), sys.argv[1].format(rank))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
