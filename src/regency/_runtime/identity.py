"""Identity and sending state shared by every actor instance, including the root client."""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING

from regency.shape import Point

if TYPE_CHECKING:
    from regency._runtime.meshes import ProcMesh


def new_uid() -> int:
    """A random non-zero 64-bit id."""
    return int.from_bytes(os.urandom(8), "little") | 1


class InstanceBase:
    """An actor instance as seen by the code it runs: ``context().actor_instance``.

    Attributes follow Monarch: ``actor_id``, ``proc_id``, ``rank`` (spawn position),
    ``proc_mesh``, ``proc``, ``name``, ``class_name`` and ``creator``. ``str(instance)`` is its
    qualified chain, e.g. ``<root>.<mod.Trainer trainer{'gpus': 0/8}>``.
    """

    uid: int
    name: str
    class_name: str
    rank: Point
    creator: str | None
    proc_id: str

    def __init__(self) -> None:
        self._seqs: dict[tuple[str, int], itertools.count[int]] = {}

    def next_seq(self, addr: str, mesh_id: int) -> int:
        """The next sequence number for a message from this instance to one actor."""
        key = (addr, mesh_id)
        counter = self._seqs.get(key)
        if counter is None:
            counter = self._seqs.setdefault(key, itertools.count(1))
        return next(counter)

    @property
    def actor_id(self) -> str:
        """A unique, printable id: ``name[rank]@proc``."""
        return f"{self.name}{self.rank}@{self.proc_id}"

    @property
    def proc_mesh(self) -> ProcMesh:
        """The proc mesh this actor was spawned on."""
        raise NotImplementedError

    @property
    def proc(self) -> ProcMesh:
        """The singleton proc mesh of the process this actor runs in."""
        from regency._runtime.meshes import this_proc_mesh

        return this_proc_mesh()

    def __repr__(self) -> str:
        return str(self)
