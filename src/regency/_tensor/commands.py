"""The commands the controller sends to tensor workers, batched in order.

Every command names the refs it reads (``Ref`` leaves inside its arguments) and the refs it
defines (``outs``) or mutates (``mutates``), so a worker that fails one can poison exactly the
values that depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)


def _pickled_by_fields(cls: _C) -> _C:
    """Pickle as ``(cls, field values)``: a slots dataclass's own state methods walk
    ``dataclasses.fields()`` per object, most of a batch's encode and decode time."""
    names = tuple(f.name for f in fields(cls))

    def by_fields(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return cls, tuple([getattr(self, name) for name in names])

    cls.__reduce__ = by_fields  # type: ignore[method-assign,assignment]
    return cls


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Ref:
    """A mesh tensor in a command's arguments: the worker substitutes its local tensor."""

    id: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class GroupRef:
    """A process group in a remote function's arguments: the worker passes its real
    ``torch.distributed`` group (the one of ``groups`` it is a member of)."""

    groups: tuple[tuple[int, ...], ...]


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class CallOp:
    """Run one aten operator (by its qualified name, e.g. ``aten::add.Tensor``)."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outs: tuple[int, ...]
    mutates: tuple[int, ...]
    site: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class CallFunction:
    """Run a remote function; ``outs`` name its tensor results in pytree order."""

    fn: Any  # a FunctionRef (import path or cloudpickled callable)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outs: tuple[int, ...]
    mutates: tuple[int, ...]
    site: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class RankTensor:
    """Define ``out`` as this worker's rank over some dimensions of the view it is sent to (a
    scalar: its coordinates along them, flattened in the order named)."""

    ranks: dict[int, int]  # world rank -> its rank over the dimensions
    out: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Delete:
    """Forget refs the controller no longer holds."""

    refs: tuple[int, ...]


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class InitWorld:
    """Join the root mesh's ``torch.distributed`` world (idempotent)."""

    host: str
    port: int
    world_size: int
    backend: str


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Reduce:
    """A collective over ``group`` (world ranks of this worker's group) on ``src``."""

    src: int
    out: int
    reduction: str
    scatter: bool
    inplace: bool
    groups: tuple[tuple[int, ...], ...]
    site: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Move:
    """``to_mesh``: each ``(source, destination)`` pair of ranks in ``pairs`` copies the
    source's ``src`` into the destination's ``out`` (a contiguous tensor of ``size``, ``dtype``
    on ``device``), point to point; a pair of one rank copies locally.

    Within one proc mesh the ranks are world ranks and ``link`` is ``None``. Between two proc
    meshes they are ranks of the ``link`` group spanning both, in which this worker's rank is
    ``offset`` plus its world rank.
    """

    src: int
    out: int
    pairs: tuple[tuple[int, int], ...]
    size: tuple[int, ...]
    dtype: Any  # torch.dtype (this module does not import torch)
    device: Any  # torch.device
    site: int
    link: Link | None = None
    offset: int = 0


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class Link:
    """A process group spanning two proc meshes, ``sizes`` procs each: their ranks meet in the
    store at ``host:port`` under ``name``, the first mesh's world ranks first."""

    host: str
    port: int
    sizes: tuple[int, int]
    name: str


@dataclass(frozen=True, slots=True)
class Alias:
    """Define ``out`` as the very value of ``src`` (a borrow: shared, not copied)."""

    src: int
    out: int


@dataclass(frozen=True, slots=True)
class Signal:
    """Mark point ``event`` of this stream as reached (another stream may wait for it)."""

    event: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Block this stream until another stream of the same process signals ``event``."""

    event: int


@dataclass(frozen=True, slots=True)
class Handover:
    """Move the value of ``src`` to ``out`` (another stream's from now on: ``src`` is forgotten)
    and signal ``event``, which that stream waits for before its first use of ``out``."""

    src: int
    out: int
    event: int


@dataclass(frozen=True, slots=True)
class Publish:
    """Hand a copy of each ``(ref, slot)`` shard to the actor call that names ``slot`` (see
    ``handoff``); ``sites`` describes controller call sites the workers did not know yet."""

    pairs: tuple[tuple[int, int], ...]
    site: int
    sites: dict[int, str]


@dataclass(frozen=True, slots=True)
class Collect:
    """Define ``outs`` as the tensor results an ``rref`` endpoint deposits in ``slot`` (which
    must have the ``metas``: shape and dtype each; ``None``: results are not kept), waiting
    for them."""

    slot: int
    outs: tuple[int, ...]
    metas: tuple[tuple[tuple[int, ...], Any], ...] | None
    site: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class CreatePipe:
    """Start the pipe ``out``: ``fn(pipe, *args, **kwargs)`` on a thread of each worker
    process, ``coords`` (world rank -> its coordinates) and ``sizes`` describing the mesh to it,
    at most ``max_messages`` values waiting in each direction."""

    out: int
    fn: Any  # a FunctionRef
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    max_messages: int
    coords: dict[int, dict[str, int]]
    sizes: dict[str, int]


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class PipeRecv:
    """Define ``outs`` as the tensors of the next value the pipe ``pipe`` yields (waiting)."""

    pipe: int
    outs: tuple[int, ...]
    site: int


@_pickled_by_fields
@dataclass(frozen=True, slots=True)
class PipeSend:
    """Give the pipe ``pipe`` a copy of ``value`` (its ``Ref`` leaves resolved)."""

    pipe: int
    value: Any
    site: int


Command = (
    CallOp
    | CallFunction
    | RankTensor
    | Delete
    | InitWorld
    | Reduce
    | Move
    | Alias
    | Signal
    | Wait
    | Handover
    | Publish
    | Collect
    | CreatePipe
    | PipeRecv
    | PipeSend
)


def may_name(cmd: Command, refs: set[int]) -> bool:
    """Whether ``cmd`` may read or define any of ``refs`` (``True`` for any command but an
    aten op, a remote function or a reduction, whose refs are all in their fields)."""
    if isinstance(cmd, Reduce):
        return cmd.src in refs or cmd.out in refs
    if isinstance(cmd, (CallOp, CallFunction)):
        if refs.intersection(cmd.outs) or refs.intersection(cmd.mutates):
            return True
        return _names_ref((cmd.args, cmd.kwargs), refs)
    return True


def _names_ref(obj: Any, refs: set[int]) -> bool:
    if isinstance(obj, Ref):
        return obj.id in refs
    if isinstance(obj, (tuple, list)):
        return any(_names_ref(x, refs) for x in obj)
    if isinstance(obj, dict):
        return any(_names_ref(x, refs) for x in obj.values())
    return False
