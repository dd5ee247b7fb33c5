"""Borrows and the access rules of streams, checked on the controller before anything is sent.

A mesh tensor and its views share a ``Storage`` on the controller, which says how the tensors of
that storage may be used now (``access``: ``r`` read, ``w`` write). ``Stream.borrow`` makes a
tensor of another stream that names the same value on the workers (an alias, not a copy):

- immutable: both sides may read, neither may write (``MUTATING_BORROW``);
- mutable: the borrowing stream may write, the origin may not be used (``BORROWED``).

On the workers the origin's stream defines the alias and signals, the borrowing stream waits for
that signal; ``drop()`` signals from the borrowing stream and the origin's stream waits for it
before its next mutation of the origin (before its next command after a mutable borrow).
"""

from __future__ import annotations

import traceback
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from regency._tensor import commands as c
from regency._tensor.engine import new_ref
from regency._tensor.errors import misuse
from regency._tensor.streams import DEFAULT_NAME, IN_USE, Stream, get_active_stream

if TYPE_CHECKING:
    from regency._tensor.mesh_tensor import MeshTensor


class Storage:
    """The controller's view of one value on the workers, shared by a tensor and its views."""

    __slots__ = ("__weakref__", "access", "aliases", "borrows", "origin", "pending")

    def __init__(self, access: str = "rw", origin: Storage | None = None) -> None:
        self.access = access
        self.aliases: weakref.WeakSet[MeshTensor] = weakref.WeakSet()
        self.borrows: weakref.WeakSet[Borrow] = weakref.WeakSet()
        """The live borrows of this storage by other streams."""
        self.origin = origin
        """The storage this one borrows (``None`` for a value made on its own stream)."""
        self.pending: list[int] = []
        """Drop events of immutable borrows that the next mutation must wait for."""


def storage_of(t: MeshTensor) -> Storage:
    """``t``'s storage (made on first need)."""
    found: Storage | None = t._storage
    if found is None:
        found = t._storage = Storage()
        found.aliases.add(t)
    return found


def _borrow_sites(storage: Storage) -> str:
    sites = [f"\n  borrowed at:\n{b.site}" for b in storage.borrows]
    if storage.origin is not None:
        sites.extend(f"\n  borrowed at:\n{b.site}" for b in storage.origin.borrows)
    return "".join(sites)


def check_access(tensors: Sequence[MeshTensor], mutated: Sequence[MeshTensor]) -> None:
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
        storage = t._storage
        if storage is not None and "r" not in storage.access:
            raise misuse(
                "BORROWED",
                f"{t!r} cannot be used: it is borrowed mutably by another stream until that "
                f"borrow is dropped{_borrow_sites(storage)}",
            )
    for t in mutated:
        storage = t._storage
        if storage is None:
            continue
        if "w" not in storage.access:
            raise misuse(
                "MUTATING_BORROW",
                f"{t!r} would be mutated by this op, but it is read-only while it is borrowed "
                f"(drop the borrow first){_borrow_sites(storage)}",
            )
        for event in storage.pending:
            t._view.send(c.Wait(event))
        storage.pending.clear()


def track_views(sources: Sequence[int | None], inputs: Sequence[MeshTensor], result: Any) -> None:
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


def fetch_stream(tensors: Sequence[MeshTensor]) -> str:
    """The stream whose workers serve a fetch of ``tensors`` (theirs: a fetch is ordered after
    the ops of that stream); raises ``BORROWED`` / ``WRONG_STREAM``."""
    if not IN_USE:
        return DEFAULT_NAME
    stream = tensors[0]._stream
    for t in tensors:
        if t._stream is not stream:
            raise misuse(
                "WRONG_STREAM",
                f"one fetch reads tensors of {stream!r} and {t._stream!r}; fetch them apart",
            )
        storage = t._storage
        if storage is not None and "r" not in storage.access:
            raise misuse(
                "BORROWED",
                f"{t!r} cannot be fetched: it is borrowed mutably by another stream"
                f"{_borrow_sites(storage)}",
            )
    return stream.key


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
    from regency._tensor.mesh_tensor import MeshTensor

    if not isinstance(t, MeshTensor):
        raise misuse("LOCAL_TENSOR", f"only a mesh tensor can be borrowed, not {type(t).__name__}")
    if t._dropped:
        raise misuse("DROPPED", f"{t!r} was dropped and cannot be borrowed")
    origin = storage_of(t)
    if "r" not in origin.access:
        raise misuse(
            "BORROWED",
            f"{t!r} is borrowed mutably by another stream{_borrow_sites(origin)}",
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
