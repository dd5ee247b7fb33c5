"""A mesh tensor passed to an actor endpoint arrives as the receiving rank's local tensor."""

from __future__ import annotations

import torch

from regency._tensor.table import DEFINED, IDENTITY, TABLE, Poisoned

WAIT_S = 60.0


def local_shard(root: int, ref: int) -> torch.Tensor:
    """Unpickle a mesh tensor in a worker process: the local tensor, once its stream defines it.

    A tensor of another proc mesh (or a process without tensor workers) raises ``ValueError``.
    """
    with DEFINED:
        # The process's tensor worker may still be starting: its identity comes with it.
        DEFINED.wait_for(lambda: "root" in IDENTITY, WAIT_S)
        if IDENTITY.get("root") != root:
            raise ValueError(
                "a mesh tensor was sent to an actor on a different proc mesh than the tensor's; "
                "send it to actors spawned on the tensor's own mesh"
            )
        if not DEFINED.wait_for(lambda: ref in TABLE, WAIT_S):
            raise ValueError(f"mesh tensor ref {ref} was never defined on this worker")
    value = TABLE[ref]
    if isinstance(value, Poisoned):
        raise ValueError(f"the mesh tensor passed here failed to compute:\n{value.text}")
    return value
