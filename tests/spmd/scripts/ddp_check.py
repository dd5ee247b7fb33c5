"""A torchrun script: DDP on a tiny MLP, fixed data; every rank saves its final parameters.

ddp_check.py OUT_DIR STEPS BATCH
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out, steps, batch = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
x = torch.randn(steps, world * batch, 8, generator=g)
y = torch.randn(steps, world * batch, 1, generator=g)
for step in range(steps):
    mine = slice(rank * batch, (rank + 1) * batch)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x[step, mine]), y[step, mine]).backward()
    opt.step()
torch.save(model.state_dict(), out / f"rank{rank}.pt")
dist.destroy_process_group()
