"""Regency's tensor engine: Monarch's distributed tensors, driven from the controller.

Inside ``with procs.activate():`` every torch op runs on the mesh's processes, one shard per
process; the controller holds mesh tensors whose shapes are known locally::

    import torch, regency
    from regency.actor import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        x = torch.rand(3, 4)
        y = (x @ torch.ones(4, 5)).relu()   # shape (3, 5), no round trip
    print(regency.inspect(y, gpus=1))       # rank 1's shard, a local torch.Tensor

The names here are also re-exported from :mod:`regency` (loaded on first use).
"""

from __future__ import annotations

from regency._tensor.api import (
    get_active_mesh,
    no_mesh,
    reduce,
    reduce_,
    slice_mesh,
    to_mesh,
)
from regency._tensor.borrows import Borrow
from regency._tensor.engine import coalescing
from regency._tensor.errors import DataDependentError, RemoteException
from regency._tensor.fetching import fetch_shard, inspect
from regency._tensor.gradients import grad_function, grad_generator
from regency._tensor.mesh_tensor import MeshTensor as Tensor
from regency._tensor.opaque import OpaqueObject, OpaqueRef, opaque_method
from regency._tensor.pipes import Pipe, create_pipe, remote_generator
from regency._tensor.process_group import RemoteProcessGroup
from regency._tensor.remote import Remote, call_on_shard_and_fetch, remote
from regency._tensor.show import show
from regency._tensor.streams import Stream, get_active_stream

__all__ = [
    "Borrow",
    "DataDependentError",
    "OpaqueObject",
    "OpaqueRef",
    "Pipe",
    "Remote",
    "RemoteException",
    "RemoteProcessGroup",
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "coalescing",
    "create_pipe",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "opaque_method",
    "reduce",
    "reduce_",
    "remote",
    "remote_generator",
    "show",
    "slice_mesh",
    "to_mesh",
]
