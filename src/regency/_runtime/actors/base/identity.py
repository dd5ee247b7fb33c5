"""Identity and sending state shared by every actor instance, including the root client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from regency import _hooks
from regency._runtime.actors.base.mesh_trait import ProcMeshBase
from regency._runtime.kernel.seqs import SeqBook
from regency.shape import Point

if TYPE_CHECKING:
    from regency._runtime.actors.base.future import Future

log = logging.getLogger("regency.supervision")


class Stoppable(Protocol):
    """An owned mesh: the owner can stop it."""

    def stop(self, reason: str = ...) -> Future[None]:
        """Stop the mesh."""
        ...


def new_uid() -> int:
    """A random non-zero 64-bit id."""
    return int.from_bytes(os.urandom(8), "little") | 1


def segment(class_name: str | None, name: str, rank: Point) -> str:
    """One link of a qualified name, as Monarch prints it: ``<mod.Cls name{'gpus': 0/8}>``.

    The class is left out when there is none (the root), the rank when it has no dimensions.
    """
    prefix = "" if class_name is None else f"{class_name} "
    return f"<{prefix}{name}{rank if len(rank) else ''}>"


def qualified_name(instance: InstanceBase | CreatorInstance) -> str:
    """The chain from the root to ``instance``: ``<root>.<mod.Trainer trainer{'gpus': 0/8}>``."""
    links: list[str] = []
    at: InstanceBase | CreatorInstance | None = instance
    while at is not None:
        links.append(segment(at.class_name, at.name, at.rank))
        at = at.creator
    return ".".join(reversed(links))


class ActorId(str):
    """An actor's printable, unique id (``current_actor_name()``), with the attributes of
    Monarch's ``ActorAddr``: ``actor_name`` (= ``label``), ``uid``, ``addr`` (= ``proc_id``, the
    address of its process) and ``is_root``."""

    actor_name: str
    uid: str
    addr: str
    is_root: bool

    def __new__(cls, actor_name: str, uid: int, rank: Point, addr: str, is_root: bool) -> ActorId:
        uid_text = f"{actor_name}<{uid:x}>"
        self = super().__new__(cls, f"{uid_text}{rank if len(rank) else ''}@{addr}")
        self.actor_name = actor_name
        self.uid = uid_text
        self.addr = addr
        self.is_root = is_root
        return self

    @property
    def label(self) -> str:
        """The actor's name, without its unique suffix."""
        return self.actor_name

    @property
    def proc_id(self) -> str:
        """The address of the actor's process."""
        return self.addr


@dataclass(frozen=True)
class CreatorInstance:
    """Who spawned an actor (``context().actor_instance.creator``): a picklable snapshot of the
    spawning instance's identity, with its own ``creator`` up to the root (``None`` above it)."""

    rank: Point
    proc_mesh: ProcMeshBase
    proc: ProcMeshBase
    name: str
    class_name: str | None
    creator: CreatorInstance | None

    def __repr__(self) -> str:
        return qualified_name(self)

    __str__ = __repr__


class InstanceBase:
    """An actor instance as seen by the code it runs: ``context().actor_instance``.

    Attributes follow Monarch: ``actor_id``, ``proc_id``, ``rank`` (spawn position),
    ``proc_mesh``, ``proc``, ``name``, ``class_name`` (``None`` for the root) and ``creator``
    (a :class:`CreatorInstance`; ``None`` for the root). ``str(instance)`` is its qualified
    chain, e.g. ``<root>.<mod.Trainer trainer{'gpus': 0/8}>``.
    """

    uid: int
    name: str
    class_name: str | None
    rank: Point
    creator: CreatorInstance | None
    proc_id: str

    def __init__(self) -> None:
        # The sequence numbers of this instance's messages, by destination actor.
        self.seqs = SeqBook()
        # Meshes this instance spawned (it owns them): stopped when it stops or fails.
        self.owned: list[Stoppable] = []

    def adopt(self, mesh: Stoppable) -> None:
        """Record that this instance owns ``mesh``."""
        self.owned.append(mesh)

    @property
    def children(self) -> list[Stoppable]:
        """The meshes this instance spawned and has not stopped, oldest first (a new list).

        Its proc meshes and actor meshes: what Monarch keeps as the private ``_children``. A
        mesh leaves the list once stopped (by its ``stop()``, or by its actors' owner stopping
        them), so a test clean-up can stop every proc mesh left over::

            for child in context().actor_instance.children:
                if isinstance(child, ProcMesh):
                    child.stop().get()
        """
        return list(self.owned)

    def disown(self, mesh: Stoppable) -> None:
        """Forget an owned mesh once it is stopped."""
        with contextlib.suppress(ValueError):
            self.owned.remove(mesh)

    def stop_owned(self, reason: str, timeout: float | None) -> list[Future[None]]:
        """Stop every owned mesh, newest first; wait up to ``timeout`` s (``None``: don't wait).

        Returns the stops' futures, so a caller that did not wait can wait later.
        """
        owned, self.owned = self.owned, []
        futures = []
        for mesh in reversed(owned):
            try:
                futures.append(mesh.stop(reason))
            except Exception as exc:  # one mesh failing to stop must not keep the others up
                log.warning("stopping %r failed: %s", mesh, exc)
        if timeout is not None:
            wait_stopped(futures, timeout)
        return futures

    def supervise(self, notice: Any) -> None:
        """Take a ``MeshFailure`` or ``MeshRestarted`` about a mesh this instance owns."""
        raise NotImplementedError

    def next_seq(self, addr: str, mesh_id: int) -> int:
        """The next sequence number for a message from this instance to one actor."""
        return self.seqs.next(addr, mesh_id)

    @property
    def actor_id(self) -> ActorId:
        """A unique, printable id, ``name<uid>{rank}@proc``, with Monarch's attributes."""
        return ActorId(self.name, self.uid, self.rank, self.proc_id, False)

    @property
    def proc_mesh(self) -> ProcMeshBase:
        """The proc mesh this actor was spawned on."""
        raise NotImplementedError

    @property
    def proc(self) -> ProcMeshBase:
        """The singleton proc mesh of the process this actor runs in."""
        mesh = _hooks.proc_mesh.load()()  # the meshes are above this module
        assert isinstance(mesh, ProcMeshBase)
        return mesh

    def as_creator(self) -> CreatorInstance:
        """This instance's identity, to hand to the actors it spawns."""
        return CreatorInstance(
            self.rank, self.proc_mesh, self.proc, self.name, self.class_name, self.creator
        )

    def __repr__(self) -> str:
        return qualified_name(self)

    __str__ = __repr__


def wait_stopped(futures: list[Future[None]], timeout: float) -> None:
    """Wait up to ``timeout`` s in all for mesh stops; their errors are not the waiter's."""
    deadline = time.monotonic() + timeout
    for future in futures:
        with contextlib.suppress(Exception):
            future.get(timeout=max(0.0, deadline - time.monotonic()))


async def wait_stopped_async(futures: list[Future[None]], timeout: float) -> None:
    """:func:`wait_stopped` for an actor's event loop."""
    if futures:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(f.as_asyncio() for f in futures), return_exceptions=True),
                timeout,
            )
