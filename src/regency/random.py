"""Random generator states of the workers as mesh tensors (Monarch's ``monarch.random``).

``get_state()`` captures each worker's generators, ``set_state(state)`` restores them,
``new_state(seed)`` makes the state a seed gives without disturbing the current one, and
``make_deterministic()`` switches the workers to deterministic algorithms::

    with procs.activate():
        dropout_state = regency.random.new_state(procs.rank_tensor("gpus") + 7)
        saved = regency.random.get_state()
        regency.random.set_state(dropout_state)
        mask = torch.rand(4) > 0.5                # drawn from the per-rank seeded state
        regency.random.set_state(saved)
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from regency._tensor.remote import remote

__all__ = ["State", "get_state", "make_deterministic", "new_state", "set_state"]

_CUDA_STATE_BYTES = 16
"""A CUDA generator's state: its seed and offset (what ``torch.cuda.get_rng_state`` returns)."""


class State(NamedTuple):
    """The workers' generator states, as mesh tensors.

    ``cpu`` is the CPU generator's, ``cuda`` the current CUDA device's (zeros on a worker
    without CUDA).
    """

    cpu: torch.Tensor
    cuda: torch.Tensor


def _state_like() -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(torch.get_rng_state().shape, dtype=torch.uint8),
        torch.empty(_CUDA_STATE_BYTES, dtype=torch.uint8),
    )


@remote(propagate=_state_like)
def _get_state() -> tuple[torch.Tensor, torch.Tensor]:
    cuda = (
        torch.cuda.get_rng_state()
        if torch.cuda.is_available()
        else torch.zeros(_CUDA_STATE_BYTES, dtype=torch.uint8)
    )
    return torch.get_rng_state(), cuda


@remote(propagate=lambda cpu, cuda: None)
def _set_state(cpu: torch.Tensor, cuda: torch.Tensor) -> None:
    torch.set_rng_state(cpu)
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


@remote(propagate=lambda seed: None)
def _manual_seed(seed: torch.Tensor | int) -> None:
    torch.manual_seed(int(seed))


@remote(propagate=lambda: None)
def make_deterministic() -> None:
    """Switch every worker to deterministic algorithms.

    ``torch.use_deterministic_algorithms(True)``, cuDNN deterministic without benchmarking, and
    the cuBLAS workspace setting they need.
    """
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def set_state(state: State | tuple[torch.Tensor, torch.Tensor]) -> None:
    """Restore each worker's generators from a `State` (the CUDA part where it has CUDA)."""
    cpu, cuda = state
    _set_state(cpu, cuda)


def get_state() -> State:
    """Each worker's current generator states, as mesh tensors."""
    cpu, cuda = _get_state()
    return State(cpu, cuda)


def new_state(seed: torch.Tensor | int) -> State:
    """The states ``torch.manual_seed(seed)`` gives each worker; their own are left as they were.

    ``seed`` is an integer mesh tensor (e.g. from ``rank_tensor``) or a Python int.
    """
    orig = get_state()
    _manual_seed(seed)
    mine = get_state()
    set_state(orig)
    return mine
