"""Regency's hello world: a mesh of trainers on 8 local processes.

Run with ``make demo``. It spawns 8 procs, a ``Trainer`` on each, calls and broadcasts to them,
slices the mesh, has two meshes ping-pong each other, and exits with no process left behind.
"""

from __future__ import annotations

import os

from regency.actor import Actor, ActorMesh, context, current_rank, endpoint, this_host


class Trainer(Actor):
    """Pretends to train: its loss depends on its rank and the step."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.rank = context().actor_instance.rank["gpus"]
        self.steps = 0

    @endpoint
    def train(self, step: int) -> float:
        self.steps += 1
        return round(1.0 / (1 + step + self.rank) * self.lr, 4)

    @endpoint
    def set_lr(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    def where(self) -> str:
        return f"rank {self.rank} in pid {os.getpid()} (message rank {dict(current_rank())})"


class Player(Actor):
    """Plays ping-pong with the actor of the same rank in another mesh."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.partner: ActorMesh[Player] | None = None

    @endpoint
    def meet(self, others: ActorMesh[Player]) -> None:
        self.partner = others.slice(**current_rank())

    @endpoint
    def serve(self) -> str:
        assert self.partner is not None
        return f"{self.name} -> {self.partner.hit.call_one(self.name).get()}"

    @endpoint
    def hit(self, sender: str) -> str:
        return f"{self.name} (hit by {sender} at {dict(current_rank())})"


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)

    losses = trainers.train.call(step=0).get()
    print("losses after step 0:", losses)

    trainers.set_lr.broadcast(1.0)  # fire-and-forget, ordered before the next call
    print("rank 3 after set_lr:", trainers.slice(gpus=3).train.call_one(step=1).get())

    first_half = trainers.slice(gpus=slice(0, 4))
    for point, where in first_half.where.call().get():
        print(f"  {point}: {where}")

    pings = procs.spawn("ping", Player, "ping")
    pongs = procs.spawn("pong", Player, "pong")
    pings.meet.call(pongs).get()
    pongs.meet.call(pings).get()
    for rally in pings.slice(gpus=slice(0, 2)).serve.call().get().values():
        print("  ping-pong:", rally)

    procs.stop().get()
    print("done: all 8 procs stopped")


if __name__ == "__main__":
    main()
