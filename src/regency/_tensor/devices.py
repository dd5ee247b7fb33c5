"""The GPUs a tensor worker's process sees: ``CUDA_VISIBLE_DEVICES``, set per proc when the
process's first tensor worker starts (issue 15 part 5).

The procs of a host share its GPUs out by local rank: with as many GPUs as procs (Monarch's
case, where a proc's ``CUDA_VISIBLE_DEVICES`` is its ``gpus`` coordinate) each proc gets one;
with a multiple of that, each gets an equal block; with fewer, procs share them round robin.
A proc that was started with ``CUDA_VISIBLE_DEVICES`` set shares out those devices instead.
"""

from __future__ import annotations

import warnings
from collections.abc import MutableMapping

import torch

VAR = "CUDA_VISIBLE_DEVICES"


def visible_devices(
    inherited: str | None, count: int, local_rank: int, local_world_size: int
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` for the proc of ``local_rank`` among ``local_world_size``
    procs of a host: ``None`` when it sees no GPU (leave the variable alone).

    ``inherited`` is the variable the proc started with (``None``: unset, every device of the
    host), ``count`` the number of devices the proc sees with it (CUDA stops at the first
    entry that names no device, so only the first ``count`` entries count).
    """
    if count <= 0:
        return None
    if inherited is None:
        devices = [str(i) for i in range(count)]
    else:
        devices = [d.strip() for d in inherited.split(",") if d.strip()][:count]
        if not devices:
            return None
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is not below the host's {local_world_size}")
    if len(devices) >= local_world_size and len(devices) % local_world_size == 0:
        per_proc = len(devices) // local_world_size
        return ",".join(devices[local_rank * per_proc : (local_rank + 1) * per_proc])
    return devices[local_rank % len(devices)]


_assigned: list[bool] = []


def assign_device(env: MutableMapping[str, str]) -> str | None:
    """Set this process's ``CUDA_VISIBLE_DEVICES`` in ``env`` from its ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE``, once per process (later calls do nothing); the value set, or ``None``
    (no GPU, or CUDA already initialized here, when a new value would not take effect: a
    warning says so)."""
    if _assigned:
        return None
    _assigned.append(True)
    count = torch.cuda.device_count()  # NVML: initializes no CUDA context
    chosen = visible_devices(
        env.get(VAR), count, int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    )
    if chosen is None or chosen == env.get(VAR):
        return None
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        warnings.warn(
            f"CUDA was initialized in this proc before its tensor worker started, so its "
            f"{VAR} cannot be narrowed to {chosen!r}: it sees {count} devices",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    env[VAR] = chosen
    return chosen
