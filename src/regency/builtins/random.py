"""Monarch's ``monarch.builtins.random`` path: see :mod:`regency.tensor.builtins.random`."""

from __future__ import annotations

from regency.tensor.builtins.random import (
    get_rng_state_all_cuda_remote,
    get_rng_state_remote,
    manual_seed_all_cuda_remote,
    manual_seed_cuda_remote,
    random_seed_remote,
    seed_remote,
    set_manual_seed_per_rank_remote,
    set_manual_seed_remote,
    set_rng_state_all_cuda_remote,
    set_rng_state_remote,
)

__all__ = [
    "get_rng_state_all_cuda_remote",
    "get_rng_state_remote",
    "manual_seed_all_cuda_remote",
    "manual_seed_cuda_remote",
    "random_seed_remote",
    "seed_remote",
    "set_manual_seed_per_rank_remote",
    "set_manual_seed_remote",
    "set_rng_state_all_cuda_remote",
    "set_rng_state_remote",
]
