"""Fetching shards to the controller, and turning worker poisons into ``RemoteException``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from regency._tensor import commands as c
from regency._tensor import sites
from regency._tensor.access import fetch_stream
from regency._tensor.engine import View
from regency._tensor.errors import RemoteException, remote_text
from regency._tensor.mesh_tensor import MeshTensor, common_view
from regency._tensor.table import Poisoned
from regency.actor import Future, ValueMesh
from regency.shape import Shape

_seen: set[tuple[int, int, str]] = set()
"""Failures already raised by a fetch: not raised again when ``activate()`` exits."""


def remote_exception(poison: Poisoned) -> RemoteException:
    """The controller-side error for a worker failure."""
    _seen.add((poison.site, poison.rank, poison.text))
    site = sites.describe(poison.site)
    return RemoteException(remote_text(poison, site), poison.rank, site)


def unseen(poison: Poisoned) -> bool:
    """Whether no fetch raised ``poison`` yet."""
    return (poison.site, poison.rank, poison.text) not in _seen


def rank_at(shape: Shape, shard: Mapping[str, int] | None, coords: Mapping[str, int]) -> int:
    """The root rank of the shard at ``coords`` (all 0 when none are given)."""
    point = {**(shard or {}), **coords}
    labels = list(shape.labels)
    for dim in point:
        if dim not in labels:
            raise KeyError(f"unknown mesh dimension {dim!r}; the mesh has {labels}")
    if point:
        missing = [d for d in labels if d not in point]
        if missing:
            raise ValueError(f"a shard needs a coordinate on every dimension; missing {missing}")
    else:
        point = dict.fromkeys(labels, 0)
    return shape.slice(**point).ranks()[0]


class _LocalFuture(Future[Any]):
    """A future whose value is unpickled with interception off, so a fetch made inside
    ``activate()`` gives local tensors (their unpickling makes tensors)."""

    __slots__ = ()

    def _outcome(self) -> Any:
        with _disable_current_modes():
            return super()._outcome()


def mapped(inner: Future[Any], transform: Callable[[Any], Any] | None = None) -> Future[Any]:
    """``inner`` as local values, with ``transform`` applied to its value (errors pass through)."""
    first = inner._transform
    both = first
    if transform is not None:
        both = transform if first is None else (lambda v: transform(first(v)))
    return _LocalFuture._from_pending(inner._pending, both)


def fetch_shard(obj: Any, shard: Mapping[str, int] | None = None, **coords: int) -> Future[Any]:
    """Copy one shard of every mesh tensor in the pytree ``obj`` to the controller.

    Non-tensor leaves pass through. No coordinates means 0 on every dimension; a missing
    dimension raises ``ValueError``, an unknown one ``KeyError``. A failed value raises
    ``regency.RemoteException`` from the future.
    """
    leaves, spec = pytree.tree_flatten(obj)
    tensors = [x for x in leaves if isinstance(x, MeshTensor)]
    if not tensors:
        return Future._resolved(obj)
    view = common_view(tensors, None)
    for t in tensors:
        if t.dropped:
            raise TypeError(f"DROPPED: {t!r} was dropped and cannot be fetched")
    stream = fetch_stream(tensors)
    rank = rank_at(view.shape, shard, coords)
    view.root.flush_all()
    refs = [c.Ref(t._ref) for t in tensors]
    # Every proc of the mesh answers: a value is only delivered once it is correct on every
    # rank (Monarch's), so a failure on any rank fails the fetch of every rank's shard.
    inner = view.root.workers_of(view.shape, stream).fetch.call(refs, rank)
    mine = view.shape.ranks().index(rank)

    def unpack(replies: ValueMesh[tuple[bool, Any]]) -> Any:
        value: Any = None
        failures = []
        for point, (ok, got) in replies.items():
            if not ok:
                failures.append((point.rank != mine, got))  # the fetched rank's own first
            elif got is not None:
                value = got
        if failures:
            raise remote_exception(min(failures, key=lambda failure: failure[0])[1])
        it = iter(value)
        return pytree.tree_unflatten(
            [next(it) if isinstance(x, MeshTensor) else x for x in leaves], spec
        )

    return mapped(inner, unpack)


def inspect(obj: Any, shard: Mapping[str, int] | None = None, **coords: int) -> Any:
    """``fetch_shard(obj, shard, **coords).result()``: local values of one shard."""
    return fetch_shard(obj, shard, **coords).result()


def check_errors(view: View) -> None:
    """Raise the first failure reported by ``view``'s root that no fetch has raised (at
    ``activate()`` exit; a failure still in flight then is raised at the next exit)."""
    for poison in view.root.arrived_errors():
        if unseen(poison):
            raise remote_exception(poison)
