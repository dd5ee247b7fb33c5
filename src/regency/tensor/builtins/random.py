"""Seeding the workers' random generators (Monarch's ``monarch.builtins.random``).

Call these inside ``with procs.activate():``; each runs on every worker of the mesh, in order
with the ops around it, so ``torch.rand`` after a seed draws the same numbers every time.
"""

from __future__ import annotations

import os

import torch

from regency._tensor.remote import remote

_CUDA_STATE_BYTES = 16
"""A CUDA generator's state: its seed and offset (what ``torch.cuda.get_rng_state`` returns)."""


def _no_result(*_: object, **__: object) -> None:
    return None


def _cpu_state_like() -> torch.Tensor:
    return torch.empty(torch.get_rng_state().shape, dtype=torch.uint8)


@remote(propagate=_no_result)
def set_manual_seed_remote(seed: int, process_idx: int = 0) -> None:
    """``torch.manual_seed(seed ^ process_idx)`` on every worker.

    As in Monarch: the same seed everywhere unless ``process_idx`` differs.
    """
    torch.manual_seed(seed ^ process_idx)


@remote(propagate=_no_result)
def set_manual_seed_per_rank_remote(seed: int) -> None:
    """Seed each worker with ``seed ^ RANK``: reproducible across runs, different per rank."""
    torch.manual_seed(seed ^ int(os.environ["RANK"]))


@remote(propagate=_cpu_state_like)
def get_rng_state_remote() -> torch.Tensor:
    """Each worker's CPU generator state, as a mesh tensor."""
    return torch.get_rng_state()


@remote(propagate=_no_result)
def set_rng_state_remote(new_state: torch.Tensor) -> None:
    """Restore each worker's CPU generator state from a mesh tensor."""
    torch.set_rng_state(new_state)


@remote(propagate=_no_result)
def seed_remote() -> None:
    """``torch.seed()`` on every worker: a fresh non-deterministic seed for each.

    Monarch's runs ``torch.seed()`` on the controller too (its propagation); this one does not
    touch the controller's generator.
    """
    torch.seed()


@remote(propagate=_no_result)
def random_seed_remote() -> None:
    """``torch.random.seed()`` on every worker (the same function as `seed_remote`)."""
    torch.random.seed()


@remote(propagate=_no_result)
def manual_seed_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed(seed)``: the current CUDA device's generator on every worker."""
    torch.cuda.manual_seed(seed)


@remote(propagate=_no_result)
def manual_seed_all_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed_all(seed)``: every CUDA device's generator on every worker."""
    torch.cuda.manual_seed_all(seed)


@remote(propagate=lambda: [torch.empty(_CUDA_STATE_BYTES, dtype=torch.uint8)])
def get_rng_state_all_cuda_remote() -> list[torch.Tensor]:
    """Every visible CUDA device's generator state on each worker, as a list of mesh tensors.

    As in Monarch, the controller expects one device per worker (one GPU per proc, the usual
    layout).
    """
    return torch.cuda.get_rng_state_all()


@remote(propagate=_no_result)
def set_rng_state_all_cuda_remote(states: list[torch.Tensor]) -> None:
    """Restore every visible CUDA device's generator (`get_rng_state_all_cuda_remote`'s)."""
    torch.cuda.set_rng_state_all(states)
