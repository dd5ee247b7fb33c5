"""A plain torchrun script: all-reduce the ranks; ``fail`` makes rank 1 exit with status 3."""

import os
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: sum {t.item():g}", flush=True)
print(f"local rank {os.environ['LOCAL_RANK']} on stderr", file=sys.stderr, flush=True)
if sys.argv[1:] == ["fail"] and dist.get_rank() == 1:
    sys.exit(3)
dist.barrier()
dist.destroy_process_group()
