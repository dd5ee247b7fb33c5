"""``Tensor.reduce`` on the controller: the groups, the output metadata, the lazy world setup.

The group partition and output sizes come from :mod:`regency._tensor.groups`, the worker-side
collectives from :mod:`regency._tensor.collectives`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.engine import Root, View, new_ref
from regency._tensor.meta import TensorMeta
from regency._tensor.streams import get_active_stream


def _dims(dims: str | Sequence[str]) -> tuple[str, ...]:
    return (dims,) if isinstance(dims, str) else tuple(dims)


def ensure_world(root: Root, device: torch.device, stream: str | None = None) -> None:
    """Set up the root mesh's ``torch.distributed`` world once: a store on rank 0, then every
    worker joins (gloo on CPU, NCCL on CUDA). Each stream's workers (``stream``, by default the
    active one) are sent the (idempotent) setup before their first collective, so none runs one
    before its process joined."""
    if stream is None:
        stream = get_active_stream().key
    if stream in root.world_streams:
        return
    if root.world is None:
        root.flush_all()
        root.world = root.worker_at(0).open_store.call_one().get()
    root.world_streams.add(stream)
    host, port = root.world
    backend = "nccl" if device.type == "cuda" else "gloo"
    root.append(root.everyone, c.InitWorld(host, port, root.size, backend), stream)


def group_ref(view: View, dims: str | Sequence[str], device: torch.device) -> c.GroupRef:
    """The process groups of ``view`` along ``dims``, as a remote function argument."""
    from regency._tensor.groups import reduce_groups

    ensure_world(view.root, device)
    return c.GroupRef(tuple(reduce_groups(view.shape, _dims(dims))))


def plan_reduce(
    view: View,
    src: int,
    size: torch.Size,
    dtype: torch.dtype,
    device: torch.device,
    spec: tuple[str | Sequence[str], str, bool, Any],
    inplace: bool,
) -> tuple[TensorMeta, int, View]:
    """Issue a reduce of ref ``src`` (on ``view``) with ``spec`` = (dims, reduction, scatter,
    mesh); the output's metadata, ref (``src`` when ``inplace``) and view."""
    from regency._tensor.groups import (
        REDUCTIONS,
        reduce_groups,
        reduce_output_size,
    )

    dims, reduction, scatter, mesh = spec
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    if mesh is not None:
        other = View(mesh)
        if other.root is not view.root:
            raise TypeError(f"WRONG_MESH: reduce over {mesh!r}, but the tensor lives elsewhere")
        view = other
    names = _dims(dims)
    for dim in names:
        if dim not in view.shape.labels:
            raise KeyError(f"unknown mesh dimension {dim!r}; the mesh has {view.shape.labels}")
    groups = tuple(reduce_groups(view.shape, names))
    out_size = reduce_output_size(reduction, scatter, size, len(groups[0]))
    if inplace and out_size != size:
        raise ValueError(f"reduce_ cannot change the shape ({tuple(size)} -> {tuple(out_size)})")
    ensure_world(view.root, device)
    out = src if inplace else new_ref()
    view.send(c.Reduce(src, out, reduction, scatter, inplace, groups, sites.capture()))
    return TensorMeta.contiguous(tuple(out_size), dtype, device), out, view
