"""``Tensor.reduce`` on the controller: the groups, the output metadata, the lazy world setup.

The group partition and output sizes come from :mod:`regency._tensor.groups`, the worker-side
collectives from :mod:`regency._tensor.collectives`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.engine import Root, View, new_ref
from regency._tensor.meta import TensorMeta
from regency.shape import Shape, Slice

if TYPE_CHECKING:
    from regency._tensor.mesh_tensor import MeshTensor


def _dims(dims: str | Sequence[str]) -> tuple[str, ...]:
    return (dims,) if isinstance(dims, str) else tuple(dims)


def ensure_world(root: Root, device: torch.device) -> None:
    """Set up the root mesh's ``torch.distributed`` world once: a store on rank 0, then every
    worker joins (gloo on CPU, NCCL on CUDA)."""
    if root.world is not None:
        return
    root.flush_all()
    host, port = root.worker_at(0).open_store.call_one().get()
    root.world = (host, port)
    backend = "nccl" if device.type == "cuda" else "gloo"
    whole = Shape(["ranks"], Slice(0, [root.size], [1]))
    root.append(whole, c.InitWorld(host, port, root.size, backend))


def group_ref(view: View, dims: str | Sequence[str], device: torch.device) -> c.GroupRef:
    """The process groups of ``view`` along ``dims``, as a remote function argument."""
    from regency._tensor.groups import reduce_groups

    ensure_world(view.root, device)
    return c.GroupRef(tuple(reduce_groups(view.shape, _dims(dims))))


def reduce_tensor(
    t: MeshTensor,
    dims: str | Sequence[str],
    reduction: str,
    scatter: bool,
    mesh: Any,
    inplace: bool,
) -> MeshTensor:
    """Issue a reduce of ``t`` over ``dims`` of its mesh (or of ``mesh``, a view of the same
    root); returns the result tensor (``t`` itself when ``inplace``)."""
    from regency._tensor.groups import REDUCTIONS, reduce_groups, reduce_output_size
    from regency._tensor.mesh_tensor import MeshTensor, common_view

    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
    view = common_view([t], None)
    if mesh is not None:
        other = View(mesh)
        if other.root is not view.root:
            raise TypeError(f"WRONG_MESH: reduce over {mesh!r}, but {t!r} lives elsewhere")
        view = other
    names = _dims(dims)
    for dim in names:
        if dim not in view.shape.labels:
            raise KeyError(f"unknown mesh dimension {dim!r}; the mesh has {view.shape.labels}")
    groups = tuple(reduce_groups(view.shape, names))
    size = reduce_output_size(reduction, scatter, t.shape, len(groups[0]))
    if inplace and size != t.shape:
        raise ValueError(f"reduce_ cannot change the shape ({tuple(t.shape)} -> {tuple(size)})")
    ensure_world(view.root, t.device)
    out = t._ref if inplace else new_ref()  # noqa: SLF001
    view.send(
        c.Reduce(t._ref, out, reduction, scatter, inplace, groups, sites.capture())  # noqa: SLF001
    )
    if inplace:
        return t
    stride = torch.empty(size, device="meta").stride()
    meta = TensorMeta(tuple(size), tuple(stride), t.dtype, t.device)
    return MeshTensor._make(meta, out, view)  # noqa: SLF001
