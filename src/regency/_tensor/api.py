"""What proc meshes, actor calls and the public module call: activation, rank tensors,
process groups, mesh tensors in actor calls and spawns (``before_actor_send``,
``bind_arrivals``, ``discard_arrivals``, ``settle_arrivals``, ``actor_rref``, from
:mod:`regency._tensor.actor_calls` and :mod:`regency._tensor.handoff`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch._C import _len_torch_dispatch_stack
from torch.utils._python_dispatch import _disable_current_modes

from regency._lowlevel import guard_loads
from regency._tensor import commands as c
from regency._tensor.actor_calls import actor_rref, before_actor_send
from regency._tensor.engine import View, active_view, new_ref, pushed
from regency._tensor.fetching import check_errors
from regency._tensor.handoff import bind_arrivals, discard_arrivals, settle_arrivals
from regency._tensor.mesh_tensor import Interceptor, MeshSliceTensor, MeshTensor
from regency._tensor.meta import TensorMeta
from regency._tensor.process_group import RemoteProcessGroup
from regency.shape import Point

if TYPE_CHECKING:
    from regency._tensor.streams import Stream

_NOTHING = nullcontext()


def _local_unpickling() -> AbstractContextManager[Any]:
    """Interception off while a message is unpickled, so its tensors are rebuilt as local
    tensors also inside ``activate()`` (an actor's reply read there, as Monarch's); nothing to
    do (0.6 us, not 20) where no mode is on, as in every proc."""
    return _disable_current_modes() if _len_torch_dispatch_stack() else _NOTHING


guard_loads(_local_unpickling)

__all__ = [
    "activate",
    "actor_rref",
    "before_actor_send",
    "bind_arrivals",
    "discard_arrivals",
    "get_active_mesh",
    "no_mesh",
    "process_group",
    "rank_tensor",
    "rank_tensors",
    "reduce",
    "reduce_",
    "settle_arrivals",
    "slice_mesh",
    "to_mesh",
]


@contextmanager
def activate(mesh: Any) -> Iterator[Any]:
    """``with mesh.activate():`` every torch op in the block runs on ``mesh``'s workers.

    At exit the pending commands are sent, and a failure on the workers that no fetch raised is
    raised here as ``RemoteException``.
    """
    view = View(mesh)
    failed = False
    try:
        with pushed(view), Interceptor(view):
            yield mesh
    except BaseException:
        failed = True
        raise
    finally:
        view.root.flush()
        if not failed:
            check_errors(view)


class _NoMesh:
    """``with no_mesh.activate():`` runs torch locally inside an active mesh's block."""

    @contextmanager
    def activate(self) -> Iterator[None]:
        """Suspend the active mesh for the block: torch runs locally and no mesh is active."""
        with pushed(None), _disable_current_modes():
            yield

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()


def get_active_mesh() -> Any:
    """The proc mesh of the innermost ``activate()`` block; ``ValueError`` when none is active
    (also inside ``no_mesh.activate()``), as Monarch's."""
    view = active_view()
    if view is None:
        raise ValueError("no device mesh is active")
    return view.mesh


def rank_tensor(mesh: Any, dims: str | Sequence[str]) -> MeshTensor:
    """A mesh tensor whose shard on each proc is its rank over ``dims`` (an int64 scalar): its
    coordinate along one dimension, or for a list its coordinates flattened in the order named
    (``2*h + g`` for ``["hosts", "gpus"]`` on a 2x2 mesh), as Monarch's."""
    view = View(mesh)
    names = [dims] if isinstance(dims, str) else list(dims)
    extent = view.shape.extent
    for dim in names:
        if dim not in extent:
            raise KeyError(f"unknown mesh dimension {dim!r}; the mesh has {list(extent)}")
    ranks = {}
    for i, base in enumerate(view.shape.ranks()):
        point, flat = Point(i, extent), 0
        for dim in names:
            flat = flat * extent[dim] + point[dim]
        ranks[base] = flat
    out = new_ref()
    view.send(c.RankTensor(ranks, out))
    return MeshTensor._make(TensorMeta((), (), torch.int64, torch.device("cpu")), out, view)


def rank_tensors(mesh: Any) -> dict[str, MeshTensor]:
    """``{dim: rank_tensor(dim)}`` for every dimension of ``mesh``."""
    return {dim: rank_tensor(mesh, dim) for dim in mesh._shape.labels}


def process_group(mesh: Any, dims: str | Sequence[str]) -> RemoteProcessGroup:
    """The process group of ``mesh`` along ``dims``."""
    return RemoteProcessGroup(mesh, [dims] if isinstance(dims, str) else dims)


def reduce(
    tree: Any, dims: str | Sequence[str], reduction: str = "sum", scatter: bool = False
) -> Any:
    """``t.reduce(...)`` on every mesh tensor of the pytree ``tree``."""
    return pytree.tree_map_only(
        MeshTensor,
        lambda t: t.reduce(list(dims) if not isinstance(dims, str) else dims, reduction, scatter),
        tree,
    )


def reduce_(
    tree: Any, dims: str | Sequence[str], reduction: str = "sum", scatter: bool = False
) -> Any:
    """``t.reduce_(...)`` on every mesh tensor of the pytree ``tree``."""
    return pytree.tree_map_only(
        MeshTensor,
        lambda t: t.reduce_(list(dims) if not isinstance(dims, str) else dims, reduction, scatter),
        tree,
    )


def to_mesh(tree: Any, mesh: Any, stream: Stream | None = None) -> Any:
    """``t.to_mesh(mesh, stream)`` on every mesh tensor (or ``slice_mesh`` result) of the
    pytree ``tree``."""
    return pytree.tree_map_only(
        (MeshTensor, MeshSliceTensor), lambda t: t.to_mesh(mesh, stream), tree
    )


def slice_mesh(tree: Any, **dims: int | slice) -> Any:
    """``t.slice_mesh(**dims)`` on every mesh tensor of the pytree ``tree``."""
    return pytree.tree_map_only(MeshTensor, lambda t: t.slice_mesh(**dims), tree)
