"""The access rules of streams and borrows, checked on the controller before anything is sent.

A mesh tensor and its views share a ``Storage``, which says how the tensors of that storage may
be used now (``access``: ``r`` read, ``w`` write); :mod:`regency._tensor.borrows` changes it.
Every op checks: its tensors are on the active stream (``WRONG_STREAM``), readable
(``BORROWED``), and writable where it mutates them (``MUTATING_BORROW``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from regency._tensor import commands as c
from regency._tensor.errors import misuse
from regency._tensor.streams import DEFAULT_NAME, IN_USE, Stream, get_active_stream

if TYPE_CHECKING:
    from regency._tensor.engine import View


class Guarded(Protocol):
    """What the rules read of a mesh tensor (``MeshTensor``, which this module sits below)."""

    _stream: Stream
    _storage: Storage | None
    _view: View

    def drop(self) -> None:
        """Free the tensor on the workers; later uses raise ``DROPPED``."""


class Lent(Protocol):
    """What the rules read of a live borrow."""

    site: str


class Storage:
    """The controller's view of one value on the workers, shared by a tensor and its views."""

    __slots__ = ("__weakref__", "access", "aliases", "borrows", "origin", "pending")

    def __init__(self, access: str = "rw", origin: Storage | None = None) -> None:
        self.access = access
        self.aliases: weakref.WeakSet[Guarded] = weakref.WeakSet()
        self.borrows: weakref.WeakSet[Lent] = weakref.WeakSet()
        """The live borrows of this storage by other streams."""
        self.origin = origin
        """The storage this one borrows (``None`` for a value made on its own stream)."""
        self.pending: list[int] = []
        """Drop events of immutable borrows that the next mutation must wait for."""


def storage_of(t: Guarded) -> Storage:
    """``t``'s storage (made on first need)."""
    found: Storage | None = t._storage
    if found is None:
        found = t._storage = Storage()
        found.aliases.add(t)
    return found


def borrow_sites(storage: Storage) -> str:
    """Where the live borrows of ``storage`` (and of what it borrows) were made, for errors."""
    sites = [f"\n  borrowed at:\n{b.site}" for b in storage.borrows]
    if storage.origin is not None:
        sites.extend(f"\n  borrowed at:\n{b.site}" for b in storage.origin.borrows)
    return "".join(sites)


def check_access(tensors: Sequence[Guarded], mutated: Sequence[Guarded]) -> None:
    """Raise ``TypeError`` (``WRONG_STREAM``, ``BORROWED``, ``MUTATING_BORROW``) for an op on
    the active stream that reads ``tensors`` and writes ``mutated``; then queue the waits the
    mutations need (for borrows dropped since)."""
    if not IN_USE:
        return
    stream = get_active_stream()
    for t in tensors:
        if t._stream is not stream:
            raise misuse(
                "WRONG_STREAM",
                f"{t!r} is on {t._stream!r}, but the active stream is {stream!r}; activate its "
                "stream with `with stream.activate():`, or move it to this one with "
                "stream.borrow(t)",
            )
        check_readable(t)
    for t in mutated:
        storage = t._storage
        if storage is None:
            continue
        if "w" not in storage.access:
            raise misuse(
                "MUTATING_BORROW",
                f"{t!r} would be mutated by this op, but it is read-only while it is borrowed "
                f"(drop the borrow first){borrow_sites(storage)}",
            )
        for event in storage.pending:
            t._view.send(c.Wait(event))
        storage.pending.clear()


def check_readable(t: Guarded) -> None:
    """Raise ``TypeError`` (``BORROWED``) if ``t`` may not be read now (on any stream)."""
    storage = t._storage
    if storage is not None and "r" not in storage.access:
        raise misuse(
            "BORROWED",
            f"{t!r} cannot be used: it is borrowed mutably by another stream until that "
            f"borrow is dropped{borrow_sites(storage)}",
        )


def track_views(sources: Sequence[int | None], inputs: Sequence[Guarded], result: Any) -> None:
    """Outputs that are views of inputs (``sources[i]``: the input position of output ``i``)
    share that input's storage (tracked on every stream, so a view made before a borrow obeys
    it)."""
    if not any(x is not None for x in sources):
        return
    outputs = result if isinstance(result, tuple) else (result,)
    for out, source in zip(outputs, sources, strict=False):
        if source is not None and out is not inputs[source]:
            storage = storage_of(inputs[source])
            out._storage = storage
            storage.aliases.add(out)


_view_schemas: dict[Any, tuple[str | None, ...]] = {}


def view_sources(op: Any, names: Sequence[str | None]) -> tuple[int | None, ...]:
    """Per result of ``op``: the position (in the flattened tensor inputs named ``names``) of
    the input it is a view of, from the schema's read-only alias annotations."""
    returned = _view_schemas.get(op)
    if returned is None:
        schema = op._schema
        sets = {
            frozenset(a.alias_info.before_set): a.name
            for a in schema.arguments
            if a.alias_info and not a.alias_info.is_write
        }
        returned = tuple(
            sets.get(frozenset(r.alias_info.before_set))
            if r.alias_info and not r.alias_info.is_write
            else None
            for r in schema.returns
        )
        _view_schemas[op] = returned
    if not any(returned):
        return ()
    return tuple(names.index(n) if n is not None and n in names else None for n in returned)


def fetch_stream(tensors: Sequence[Guarded]) -> str:
    """The stream whose workers serve a fetch of ``tensors``: the active one, which they must be
    on (``WRONG_STREAM``, as Monarch's; a fetch is ordered after the ops of that stream); a
    tensor borrowed mutably raises ``BORROWED``."""
    if not IN_USE:
        return DEFAULT_NAME
    stream = get_active_stream()
    for t in tensors:
        if t._stream is not stream:
            raise misuse(
                "WRONG_STREAM",
                f"{t!r} is on {t._stream!r}, but the active stream is {stream!r}; fetch it "
                "inside `with stream.activate():` of its stream",
            )
        storage = t._storage
        if storage is not None and "r" not in storage.access:
            raise misuse(
                "BORROWED",
                f"{t!r} cannot be fetched: it is borrowed mutably by another stream"
                f"{borrow_sites(storage)}",
            )
    return stream.key
