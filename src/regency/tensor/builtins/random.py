"""Seeding the workers' random generators (Monarch's ``monarch.builtins.random``).

Call these inside ``with procs.activate():``; each runs on every worker of the mesh.
"""

from __future__ import annotations

import os

import torch

from regency._tensor.remote import remote


def _no_result(*_: object, **__: object) -> None:
    return None


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


@remote(propagate=lambda: torch.empty(torch.get_rng_state().shape, dtype=torch.uint8))
def get_rng_state_remote() -> torch.Tensor:
    """Each worker's CPU generator state, as a mesh tensor."""
    return torch.get_rng_state()


@remote(propagate=_no_result)
def set_rng_state_remote(new_state: torch.Tensor) -> None:
    """Restore each worker's CPU generator state from a mesh tensor."""
    torch.set_rng_state(new_state)
