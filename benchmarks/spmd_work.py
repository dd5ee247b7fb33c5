"""The DDP workload every SPMD benchmark runs: the same MLP, data, seeds and thread count.

Imported by the torch.multiprocessing baseline's workers, by the regency actors (procs inherit
the controller's ``sys.path``) and run as a torchrun script (``spmd_work.py --first-step FILE``:
initialize, take one step, write ``time.time()`` to FILE from rank 0).
"""

from __future__ import annotations

import sys
import time
from typing import Any

WIDTH = 256
BATCH = 64
THREADS = 1


class Trainer:
    """One rank's DDP model, optimizer and fixed batch; ``step()`` is one training step."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(THREADS)
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.ReLU(),
            torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.ReLU(),
            torch.nn.Linear(WIDTH, 1),
        )
        self.model = DistributedDataParallel(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1 + rank)
        self.x = torch.randn(BATCH, WIDTH, generator=g)
        self.y = torch.randn(BATCH, 1, generator=g)
        self.loss_fn = torch.nn.MSELoss()

    def step(self) -> float:
        """One forward, backward (with DDP's all-reduce) and optimizer step; the loss."""
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def timed(self, warmup: int, steps: int) -> float:
        """Mean seconds per step over ``steps`` steps after ``warmup``, from a barrier to the
        end of the last step (whose all-reduce waited for every rank); the closing barrier is
        not timed, so short trials are not charged for it."""
        import torch.distributed as dist

        for _ in range(warmup):
            self.step()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(steps):
            self.step()
        took = time.perf_counter() - began
        dist.barrier()
        return took / steps

    def close(self) -> None:
        """Destroy the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def mp_worker(rank: int, world: int, port: int, commands: Any, out: Any) -> None:
    """``torch.multiprocessing`` target: the baseline's rank, serving timing requests.

    Each ``(warmup, steps)`` from ``commands[rank]`` runs ``Trainer.timed``; rank 0 puts the
    result on ``out``. ``None`` ends the worker.
    """
    import os

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    trainer = Trainer()
    out.put(("ready", rank))
    while True:
        command = commands[rank].get()
        if command is None:
            break
        per_step = trainer.timed(*command)
        if rank == 0:
            out.put(per_step)
    trainer.close()


def first_step(path: str) -> None:
    """The torchrun script: initialize, one step, rank 0 writes the wall-clock time."""
    import torch.distributed as dist

    trainer = Trainer()
    trainer.step()
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            f.write(f"{time.time()!r}\n")
    trainer.close()


if __name__ == "__main__":
    first_step(sys.argv[sys.argv.index("--first-step") + 1])
