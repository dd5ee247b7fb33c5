"""Borrows: a mesh tensor lent to another stream (``Stream.borrow``), and their return.

``Stream.borrow`` makes a tensor of another stream that names the same value on the workers (an
alias, not a copy):

- immutable: both sides may read, neither may write (``MUTATING_BORROW``);
- mutable: the borrowing stream may write, the origin may not be used (``BORROWED``).

On the workers the origin's stream defines the alias and signals, the borrowing stream waits for
that signal; ``drop()`` signals from the borrowing stream and the origin's stream waits for it
before its next mutation of the origin (before its next command after a mutable borrow). The
rules themselves are :mod:`regency._tensor.access`.
"""

from __future__ import annotations

import traceback
import warnings
from typing import Any

from regency._tensor import commands as c
from regency._tensor.access import Storage, borrow_sites, storage_of
from regency._tensor.engine import new_ref
from regency._tensor.errors import misuse
from regency._tensor.mesh_tensor import MeshTensor
from regency._tensor.streams import BORROW, Stream


class Borrow:
    """A tensor lent to another stream (``Stream.borrow``); ``drop()`` returns it.

    Usable as a context manager (dropped at the block's end). A borrow garbage-collected before
    ``drop()`` warns and drops itself there.
    """

    def __init__(self, origin: Storage, lent: Storage, source: MeshTensor, to: Stream) -> None:
        self._origin = origin
        self._lent = lent
        self._view = source._view
        self._from = source._stream
        self._to = to
        self._mutable = "w" in lent.access
        self._dropped = False
        self.site = "".join(traceback.format_stack(limit=8)[:-2])
        """Where the borrow was made (named by ``BORROWED`` / ``MUTATING_BORROW`` errors)."""

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    @property
    def dropped(self) -> bool:
        """Whether ``drop()`` ran."""
        return self._dropped

    def drop(self) -> None:
        """End the borrow: the borrowed tensor and every view of it made on the borrowing
        stream become dropped (a later use raises ``DROPPED``), the origin is usable again."""
        if self._dropped:
            return
        self._dropped = True
        for alias in list(self._lent.aliases):
            alias.drop()
        root, shape = self._view.root, self._view.shape
        event = new_ref()
        root.append(shape, c.Signal(event), self._to.key)
        origin = self._origin
        origin.borrows.discard(self)
        if self._mutable:
            root.append(shape, c.Wait(event), self._from.key)
        else:
            origin.pending.append(event)
        if not origin.borrows:
            origin.access = "rw" if origin.origin is None else _lent_access(origin)

    def __del__(self) -> None:
        if not self._dropped:
            warnings.warn(
                "a borrow was garbage-collected before borrow.drop(): dropping it now, which "
                f"makes {self._from!r} wait for {self._to!r} here. Borrowed at:\n{self.site}",
                ResourceWarning,
                stacklevel=2,
            )
            self.drop()

    def __repr__(self) -> str:
        kind = "mutable " if self._mutable else ""
        return f"<{kind}Borrow {self._from!r} -> {self._to!r}{' dropped' if self._dropped else ''}>"


def _lent_access(storage: Storage) -> str:
    """The access a borrowed storage has again once its own borrows are dropped."""
    lender = storage.origin
    return "rw" if lender is not None and "w" not in lender.access else "r"


def borrow(stream: Stream, t: Any, mutable: bool) -> tuple[MeshTensor, Borrow]:
    """``Stream.borrow``: see there."""
    if not isinstance(t, MeshTensor):
        raise misuse("LOCAL_TENSOR", f"only a mesh tensor can be borrowed, not {type(t).__name__}")
    if t._dropped:
        raise misuse("DROPPED", f"{t!r} was dropped and cannot be borrowed")
    origin = storage_of(t)
    if "r" not in origin.access:
        raise misuse(
            "BORROWED",
            f"{t!r} is borrowed mutably by another stream{borrow_sites(origin)}",
        )
    if mutable and "w" not in origin.access:
        raise RuntimeError(
            "Cannot borrow this tensor mutably because it (or a view) is already borrowed "
            "non-mutably, or is itself an immutable borrow."
        )
    view = t._view
    root, shape = view.root, view.shape
    out, event = new_ref(), new_ref()
    root.append(shape, c.Alias(t._ref, out), t._stream.key)
    root.append(shape, c.Signal(event), t._stream.key)
    root.append(shape, c.Wait(event), stream.key)
    lent = Storage("rw" if mutable else "r", origin)
    origin.access = "" if mutable else "r"
    r = MeshTensor._make(t._meta, out, view, stream)
    r._storage = lent
    lent.aliases.add(r)
    made = Borrow(origin, lent, t, stream)
    origin.borrows.add(made)
    return r, made


BORROW.append(borrow)
