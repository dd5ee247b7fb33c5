"""One system's tensor-engine figures, printed as one JSON object (run by ``tensor_bench.py``).

Runs under regency's venv (``--system regency``), Monarch's (``--system monarch``: torchmonarch
0.7.0's tensor engine) or either for the plain ``torch.distributed`` baseline (``--system
torch``). The same controller code drives both engines, so the figures compare like with like:

* ``chain``: seconds per op to *issue* ``ops`` chained small ops on 2 procs (controller side,
  no fetch inside the timed loop), and the seconds of the one fetch that follows.
* ``mlp``: seconds per forward + backward + SGD step of a small MLP driven from the controller
  on 2 procs (no gradient sync), timed over ``steps`` steps closed by one fetch of the loss.
* ``reduce``: seconds per all-reduce (``sum``) of a 16 MiB float32 tensor over 4 procs
  (regency only: Monarch's CPU build cannot run collectives), timed over ``reps`` reductions
  closed by one small fetch; ``torch`` times the same all_reduce with gloo in 4 processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

REDUCE_MIB = 16


def _engine(system: str) -> tuple[Any, Any]:
    """The engine's top-level module (``inspect``) and its ``this_host``."""
    if system == "monarch":
        import monarch
        from monarch.actor import this_host

        return monarch, this_host
    import regency
    from regency.actor import this_host

    return regency, this_host


def chain(system: str, ops: int) -> dict[str, float]:
    import torch

    engine, this_host = _engine(system)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        x = torch.zeros(16)
        for _ in range(50):  # warm caches (propagation, dispatch) before timing
            x = x + 1
        engine.inspect(x)
        began = time.perf_counter()
        for _ in range(ops):
            x = x + 1
        issued = time.perf_counter()
        engine.inspect(x)
        fetched = time.perf_counter()
    procs.stop().get()
    return {"chain_op_s": (issued - began) / ops, "chain_fetch_s": fetched - issued}


def mlp(system: str, steps: int) -> dict[str, float]:
    import torch
    from torch import nn

    engine, this_host = _engine(system)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data, target = torch.rand(32, 64), torch.rand(32, 10)

        def step() -> Any:
            optimizer.zero_grad()
            loss = ((model(data) - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            return loss

        for _ in range(3):
            loss = step()
        engine.inspect(loss)
        began = time.perf_counter()
        for _ in range(steps):
            loss = step()
        engine.inspect(loss)
        done = time.perf_counter()
    procs.stop().get()
    return {"mlp_step_s": (done - began) / steps}


def reduce_regency(reps: int) -> dict[str, float]:
    import torch

    engine, this_host = _engine("regency")
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    numel = REDUCE_MIB * (1 << 20) // 4
    with procs.activate():
        x = torch.ones(numel)
        engine.inspect(x.reduce("gpus", "sum")[:1])  # world and group set up, outside the timing
        began = time.perf_counter()
        for _ in range(reps):
            y = x.reduce("gpus", "sum")
        engine.inspect(y[:1])
        done = time.perf_counter()
    procs.stop().get()
    return {"reduce_s": (done - began) / reps}


def _torch_worker(rank: int, port: int, reps: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    x = torch.ones(REDUCE_MIB * (1 << 20) // 4)
    dist.all_reduce(x)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    elapsed = time.perf_counter() - began
    if rank == 0:
        out.put(elapsed / reps)
    dist.destroy_process_group()


def reduce_torch(reps: int) -> dict[str, float]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_torch_worker, args=(port, reps, out), nprocs=4, start_method="spawn")
    return {"reduce_s": float(out.get())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=("regency", "monarch", "torch"), required=True)
    parser.add_argument("--figure", choices=("chain", "mlp", "reduce"), required=True)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.figure == "chain":
        result = chain(args.system, args.ops)
    elif args.figure == "mlp":
        result = mlp(args.system, args.steps)
    elif args.system == "torch":
        result = reduce_torch(args.reps)
    elif args.system == "regency":
        result = reduce_regency(args.reps)
    else:
        sys.exit("Monarch's CPU build has no collectives: --figure reduce runs regency and torch")
    print(json.dumps({"system": args.system, "figure": args.figure, **result}), flush=True)


if __name__ == "__main__":
    main()
