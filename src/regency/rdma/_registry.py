"""The registrations of a process: what it exposes, and token slots that say what is live.

Every registration gets a random 64-bit token, written to a *token slot*: an 8-byte word at a
fixed address in this process. A peer on the same host reads that word with cross-memory attach
before and after a transfer and compares it with the token in its handle, so it learns that a
buffer was dropped without this process doing anything. Dropping zeroes the slot. The slots live
in blocks that are never freed, so a slot's address stays valid for the life of the process.

Dropped memory is not released at once: it waits out a short grace period in quarantine, so a
one-sided write that checked the token just before the drop cannot land in memory that was
already handed to someone else. Resources attached to a registration (its registration with an
RDMA NIC) are closed by the drop itself, before it returns.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import threading
import time
from typing import Any

from regency.rdma._memory import Region
from regency.rdma._pool import Closeable

DROP_GRACE_S = 2.0
_SLOTS_PER_BLOCK = 512
_SlotBlock = ctypes.c_uint64 * _SLOTS_PER_BLOCK


class Registration:
    """One registered region in its owner's process."""

    __slots__ = ("attachments", "buffer_id", "cuda_ipc", "owner", "region", "slot", "token")

    def __init__(self, buffer_id: int, token: int, slot: int, region: Region, owner: str) -> None:
        self.buffer_id = buffer_id
        self.token = token
        self.slot = slot
        """Address of this registration's token slot."""
        self.region = region
        self.owner = owner
        self.cuda_ipc: Any = None
        """CUDA IPC rebuild information, made the first time the handle is pickled."""
        self.attachments: dict[str, Closeable] = {}
        """Resources made for this registration on first use, closed when it is dropped."""


class _Quarantine:
    """Holds dropped memory for :data:`DROP_GRACE_S` seconds, then lets it go."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def hold(self, keep: Any) -> None:
        """Keep ``keep`` referenced for the grace period."""
        with self._cond:
            item = (time.monotonic() + DROP_GRACE_S, next(self._order), keep)
            heapq.heappush(self._heap, item)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="regency-rdma-quarantine", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                while not self._heap:
                    self._cond.wait()
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)


class Registry:
    """The registrations of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, Registration] = {}
        self._blocks: list[Any] = []
        self._free_slots: list[int] = []
        self._quarantine = _Quarantine()

    def _take_slot(self) -> int:
        if not self._free_slots:
            block = _SlotBlock()
            self._blocks.append(block)
            base = ctypes.addressof(block)
            self._free_slots.extend(base + 8 * i for i in reversed(range(_SLOTS_PER_BLOCK)))
        return self._free_slots.pop()

    def register(self, region: Region, owner: str) -> Registration:
        """Register ``region`` (held strongly until :meth:`drop`)."""
        token = int.from_bytes(os.urandom(8), "little") | 1
        with self._lock:
            buffer_id = int.from_bytes(os.urandom(8), "little") >> 1
            while buffer_id in self._entries or buffer_id == 0:
                buffer_id = int.from_bytes(os.urandom(8), "little") >> 1
            slot = self._take_slot()
            ctypes.c_uint64.from_address(slot).value = token
            entry = Registration(buffer_id, token, slot, region, owner)
            self._entries[buffer_id] = entry
        return entry

    def lookup(self, buffer_id: int, token: int) -> Registration | None:
        """The live registration with this id and token, or ``None``."""
        entry = self._entries.get(buffer_id)
        if entry is None or entry.token != token:
            return None
        return entry

    def attach(
        self, buffer_id: int, token: int, name: str, resource: Closeable
    ) -> Closeable | None:
        """Attach ``resource`` to a live registration, to be closed when it is dropped.

        Returns what is attached under ``name`` now: ``resource``, or one attached earlier (the
        caller then closes its own), or ``None`` if the registration is not live any more (the
        caller closes ``resource``).
        """
        with self._lock:
            entry = self.lookup(buffer_id, token)
            if entry is None:
                return None
            return entry.attachments.setdefault(name, resource)

    def drop(self, buffer_id: int, token: int) -> bool:
        """Drop a registration; returns whether it was live.

        Its attachments are closed before this returns (an error closing one is raised after
        the others were closed).
        """
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None or entry.token != token:
                return False
            del self._entries[buffer_id]
            ctypes.c_uint64.from_address(entry.slot).value = 0
            self._free_slots.append(entry.slot)
            attached = list(entry.attachments.values())
            entry.attachments.clear()
        self._quarantine.hold((entry.region, entry.cuda_ipc))
        failure: BaseException | None = None
        for resource in attached:
            try:
                resource.close()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return True

    def __len__(self) -> int:
        return len(self._entries)


_registry = Registry()


def registry() -> Registry:
    """The registry of this process."""
    return _registry


def _after_fork_in_child() -> None:
    # A forked child owns none of its parent's registrations.
    global _registry
    _registry = Registry()


os.register_at_fork(after_in_child=_after_fork_in_child)
