"""Fault-tolerant DDP training: a torchrun script, and a controller that keeps it running.

The same file is two programs:

* **the training script** (``--train``): plain ``torch.distributed`` — ``init_process_group
  ("gloo")``, ``DistributedDataParallel``, a ``DistributedSampler``, a checkpoint written by
  rank 0 every ``--ckpt-every`` steps and resumed from on start. It runs unchanged under
  ``torchrun --nproc-per-node 2 examples/ddp_train.py --train`` or
  ``regency run --nproc-per-node 2 examples/ddp_train.py --train``.
* **the controller** (no ``--train``): spawns the procs, runs the script on every rank through
  ``SPMDActor.main`` under a ``one_for_all`` restart policy, and when a rank dies (``--kill-at
  STEP`` SIGKILLs rank 1 once the checkpoint reaches STEP) reruns the whole gang from the last
  checkpoint. The final parameters are bit-identical to an uninterrupted run.

    python examples/ddp_train.py --nproc 2 --kill-at 20      # prints the recovery timeline
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# -- the training script ---------------------------------------------------------------------


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
    )


def _dataset(samples: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 16, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(samples, 1, generator=g)).tanh()
    return torch.utils.data.TensorDataset(x, y)


def _save_atomically(obj: Any, path: Path) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> None:
    """One rank of DDP training, configured by torchrun's environment variables."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = _dataset(args.samples)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    steps_per_epoch = len(loader)
    total = args.epochs * steps_per_epoch

    ckpt = Path(args.checkpoint) if args.checkpoint else None
    step = 0
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        if rank == 0:
            print(f"resuming from {ckpt} at step {step}", flush=True)
    loss_fn = torch.nn.MSELoss()
    first = True
    while step < total:
        epoch, skip = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if first and args.first_step_file and rank == 0:
                Path(args.first_step_file).write_text(f"{time.time()!r}\n")
            first = False
            if args.step_delay:
                time.sleep(args.step_delay)
            if ckpt is not None and step % args.ckpt_every == 0:
                if rank == 0:
                    _save_atomically(
                        {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step},
                        ckpt,
                    )
                    Path(f"{ckpt}.step").write_text(f"{step}\n")
                dist.barrier()
            if step >= total:
                break
    if rank == 0:
        print(f"trained {total} steps, last loss {loss.item():.6f}", flush=True)
        if args.out:
            _save_atomically(model.module.state_dict(), Path(args.out))
    dist.destroy_process_group()


def script_args(args: argparse.Namespace) -> list[str]:
    """The ``--train`` command line that reproduces ``args``' training settings."""
    argv = [__file__, "--train"]
    for name in ("epochs", "samples", "batch", "ckpt_every", "threads", "pg_timeout"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for name in ("checkpoint", "out", "step_delay", "first_step_file"):
        if getattr(args, name):
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return argv


# -- the controller -----------------------------------------------------------------------------


def run_fault_tolerant(
    args: argparse.Namespace, kill_at: int | None = None, log: Any = print
) -> dict[str, float]:
    """Train on ``args.nproc`` procs, restarting the gang from its checkpoint when a rank dies.

    With ``kill_at``, rank 1 is SIGKILLed once the checkpoint has reached that step. Returns
    the timeline when a kill happened, in seconds since the kill: ``detected`` (the controller
    got the ``SupervisionError``), ``restarted`` (the policy's new procs and actors are up),
    ``resumed`` (``main`` sent again), ``training`` (rank 0 finished its first step after the
    restart) and ``stopped`` (all procs, the survivors' old ones included, stopped at the end:
    seconds the stop took).
    """
    import threading

    from regency.actor import (
        Actor,
        ActorError,
        RestartPolicy,
        SupervisionError,
        endpoint,
        this_host,
    )
    from regency.spmd import SPMDActor

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    procs = this_host().spawn_procs(per_host={"gpus": args.nproc})
    spmd = procs.spawn(
        "ddp", SPMDActor, restart=RestartPolicy("one_for_all", max_restarts=3, within_s=600)
    )
    timeline: dict[str, float] = {}
    killed: list[float] = []
    killed_wall: list[float] = []
    if kill_at is not None and not args.first_step_file:
        args.first_step_file = f"{args.checkpoint}.first"
    if kill_at is not None:
        pids = procs.spawn("pid", Pid)
        victim = pids.slice(gpus=1).pid.call_one().get()
        pids.stop().get()  # its rank 1 dies too: that is no failure of this helper mesh
        step_file = Path(f"{args.checkpoint}.step")

        def killer() -> None:
            while True:
                try:
                    if int(step_file.read_text() or 0) >= kill_at:
                        break
                except (OSError, ValueError):
                    pass
                time.sleep(0.005)
            killed.append(time.monotonic())
            killed_wall.append(time.time())
            os.kill(victim, signal.SIGKILL)
            log(f"[t=0.000] SIGKILL rank 1 (pid {victim}) after checkpoint step >= {kill_at}")

        threading.Thread(target=killer, daemon=True).start()
    restarts = 0
    argv = script_args(args)
    try:
        while True:
            host, port = spmd.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
            if restarts:
                timeline.setdefault("resumed", time.monotonic() - killed[0])
                log(f"[t={timeline['resumed']:.3f}] gang restarted: main() on every rank again")
            failure: SupervisionError | None = None
            errors: list[ActorError] = []
            for future in spmd.main.stream(host, port, argv):
                try:
                    future.get(timeout=args.timeout)
                except SupervisionError as exc:
                    failure = exc
                    break
                except ActorError as exc:  # a survivor's collective failed with its peer
                    errors.append(exc)
            if failure is None:
                if errors:
                    raise errors[0]
                if killed_wall:
                    first = float(Path(args.first_step_file).read_text())
                    timeline["training"] = first - killed_wall[0]
                    log(f"[t={timeline['training']:.3f}] rank 0 finished its first step again")
                return timeline
            restarts += 1
            if killed:
                timeline.setdefault("detected", time.monotonic() - killed[0])
                log(f"[t={timeline['detected']:.3f}] supervision: {str(failure).splitlines()[0]}")
            spmd.restarted(restarts).get(timeout=120)
            if killed:
                timeline.setdefault("restarted", time.monotonic() - killed[0])
                log(
                    f"[t={timeline['restarted']:.3f}] one_for_all: {args.nproc} new procs, "
                    "SPMDActor constructed"
                )
    finally:
        began = time.monotonic()
        procs.stop().get(timeout=60)
        if killed:
            timeline["stopped"] = time.monotonic() - began


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of both programs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="be the training script (one rank)")
    parser.add_argument("--nproc", type=int, default=2, help="controller: procs to train on")
    parser.add_argument("--kill-at", type=int, default=None, help="controller: kill rank 1 then")
    parser.add_argument("--timeout", type=float, default=300.0, help="controller: per run")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--pg-timeout", type=float, default=60.0, help="gloo timeout, seconds")
    parser.add_argument("--checkpoint", default="", help="checkpoint file (resumed from)")
    parser.add_argument("--out", default="", help="rank 0 saves the final parameters here")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--first-step-file", default="", help="rank 0 writes time.time() here")
    return parser.parse_args(argv)


def main() -> None:
    """Train (``--train``), or control a fault-tolerant run and print its timeline."""
    args = parse()
    if args.train:
        train(args)
        return
    # New procs (the restarted gang's too) fork with torch already imported.
    from regency.spmd import TORCH_PRELOAD

    os.environ.setdefault("REGENCY_ZYGOTE_PRELOAD", TORCH_PRELOAD)
    with tempfile.TemporaryDirectory() as tmp:
        args.checkpoint = args.checkpoint or str(Path(tmp) / "ckpt.pt")
        args.out = args.out or str(Path(tmp) / "final.pt")
        if args.kill_at is not None and not args.step_delay:
            args.step_delay = 0.01
        run_fault_tolerant(args, kill_at=args.kill_at)
        import torch

        params = torch.load(args.out, weights_only=True)
        print("final parameter checksum", sum(float(p.double().sum()) for p in params.values()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
