"""A sender's sequence numbers: one count per destination actor, taken per cast in one step.

Every message from a sender to an actor takes the next number of the count for that actor
(``(address, mesh)``), and the actor's mailbox delivers that sender's messages in their
numbers' order, whichever way each came (straight, or down the casting tree).

A cast to a view of a mesh takes a number for each of its destinations. Taken one by one that
costs the sender per destination. Instead, the first cast to a view (a list of addresses)
snapshots their counts as the view's *base* and splits it as the casting tree does; each later
cast to the same view only adds one to the view's ``bump``, and the numbers of destination
``i`` is ``base[i] + bump``. A message sent straight to one of them meanwhile counts in the
view's ``patch`` (its extra messages by position), which the casts carry along until the
patch grows past :data:`~.casting.PATCH_MAX` and the view rebases. A cast to another view that
shares destinations folds the first view's counts back (*retires* it) before it snapshots.
So a stream of casts to one view costs its sender per frame (a subtree head's number and
its subtree's description, both from the snapshot), whatever the view's size.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from typing import overload

from regency._runtime.kernel import casting
from regency._runtime.kernel.routing import Roster, Subtree, subtree_body
from regency._transport.names import NAMED_PART_MAX, Named

# Views of one mesh whose numbers are kept by bump at once; the oldest retires past this.
VIEWS_MAX = 8

# One subtree of a view: its head's position, its end, its roster (None: the head is a leaf),
# its base numbers, those as bytes, and the frame's subtree part made of both without its
# acknowledger (None: a leaf).
Span = tuple[int, int, Roster | None, "array[int]", bytes, bytes | None]
# A subtree part as a view's casts send it: in full, and by name unless it is too large.
SubtreePart = tuple[bytes, Named | None]


class Shape:
    """A view's subtrees as one snapshot of its base numbers: what every cast to the view
    shares until the view rebases."""

    __slots__ = (
        "_parts",
        "addrs",
        "base",
        "heads",
        "ranks",
        "spans",
        "starts",
        "subtree_heads",
        "subtree_max",
    )

    def __init__(
        self, addrs: Sequence[str], ranks: Sequence[int], base: list[int], spans: list[Span]
    ) -> None:
        self.addrs = addrs
        self.ranks = ranks
        self.base = base
        self.spans = spans
        self.starts = [s for s, *_ in spans]  # each subtree's head, by position
        self.heads = frozenset(addrs[s] for s in self.starts)
        # The heads that pass a cast on: a cast's frames to them are acknowledged.
        self.subtree_heads = tuple(addrs[s] for s, _, roster, *_ in spans if roster is not None)
        self.subtree_max = max((len(span[5]) for span in spans if span[5] is not None), default=0)
        self._parts: tuple[bytes, list[SubtreePart | None]] | None = None

    def subtree_parts(self, home: bytes) -> list[SubtreePart | None]:
        """Each subtree's part as the casts to this view send it, beginning with ``home``
        (the acknowledger, as :func:`~.routing.home_part` writes it); None for a leaf. Made
        once per view: a sender's acknowledger does not change."""
        made = self._parts
        if made is not None and made[0] == home:
            return made[1]
        parts: list[SubtreePart | None] = []
        for *_, body in self.spans:
            if body is None:
                parts.append(None)
                continue
            part = home + body
            parts.append((part, Named.of(part) if len(part) <= NAMED_PART_MAX else None))
        self._parts = (home, parts)
        return parts

    def groups(self, bump: int, patch: dict[int, int] | None) -> list[casting.Group]:
        """The casting tree's subtrees at ``bump`` (and ``patch``)."""
        base, addrs, ranks = self.base, self.addrs, self.ranks
        out = []
        # Without NamedTuple's Python-level __new__: this runs once per subtree of every cast.
        new, dest, group = tuple.__new__, casting.Dest, casting.Group
        for s, e, roster, seqs, raw, _ in self.spans:
            extra = patch.get(s, 0) if patch else 0
            head = new(dest, (addrs[s], base[s] + bump + extra, ranks[s]))
            if roster is None:
                out.append(new(group, (head, ())))
                continue
            sub = None
            if patch:
                sub = {i - s - 1: extra for i, extra in patch.items() if s < i < e} or None
            out.append(new(group, (head, Subtree(roster, seqs, bump, sub, raw))))
        return out


class ViewCast(Sequence[casting.Group]):
    """One cast to a view whose numbers need no patch: the view's shape and the cast's bump.

    A sequence of the cast's groups, made only when read (a lost head's subtree sent to
    directly): the cast path sends its frames from the shape itself.
    """

    __slots__ = ("_groups", "bump", "shape")

    def __init__(self, shape: Shape, bump: int) -> None:
        self.shape = shape
        self.bump = bump
        self._groups: list[casting.Group] | None = None

    def groups(self) -> list[casting.Group]:
        """The cast's groups (made once)."""
        groups = self._groups
        if groups is None:
            groups = self._groups = self.shape.groups(self.bump, None)
        return groups

    def __len__(self) -> int:
        return len(self.shape.spans)

    @overload
    def __getitem__(self, index: int) -> casting.Group: ...

    @overload
    def __getitem__(self, index: slice) -> list[casting.Group]: ...

    def __getitem__(self, index: int | slice) -> casting.Group | list[casting.Group]:
        return self.groups()[index]


class _View:
    """The counts of one view's destinations while casts number them by bump."""

    __slots__ = ("addrs", "base", "bump", "fanout", "index", "patch", "ranks", "rosters", "shape")

    def __init__(
        self,
        addrs: Sequence[str],
        ranks: Sequence[int],
        fanout: int,
        index: dict[str, int],
        base: list[int],
    ) -> None:
        self.addrs = addrs
        self.ranks = ranks
        self.fanout = fanout
        self.index = index
        self.base = base
        self.bump = 0
        self.patch: dict[int, int] = {}
        self.rosters = [
            Roster(tuple(addrs[s + 1 : e]), tuple(ranks[s + 1 : e])) if e - s > 1 else None
            for s, e in casting.spans(len(addrs), fanout)
        ]
        self.shape = self._snapshot()

    def _snapshot(self) -> Shape:
        base = self.base
        spans: list[Span] = []
        for (s, e), roster in zip(casting.spans(len(base), self.fanout), self.rosters, strict=True):
            seqs = array("Q", base[s + 1 : e])
            raw = seqs.tobytes()
            body = subtree_body(roster, raw) if roster is not None else None
            spans.append((s, e, roster, seqs, raw, body))
        return Shape(self.addrs, self.ranks, base, spans)

    def count(self, i: int) -> int:
        """The last number taken for destination ``i``."""
        return self.base[i] + self.bump + self.patch.get(i, 0)

    def rebase(self) -> None:
        """Fold the bump and the patch into the base numbers."""
        bump, patch = self.bump, self.patch
        self.base = [n + bump + patch.get(i, 0) for i, n in enumerate(self.base)]
        self.bump, self.patch = 0, {}
        self.shape = self._snapshot()

    def cast(self) -> ViewCast | list[casting.Group]:
        """The casting tree's subtrees for the next cast (its numbers taken)."""
        self.bump += 1
        if self.patch:
            return self.shape.groups(self.bump, self.patch)
        return ViewCast(self.shape, self.bump)


class _Mesh:
    """A sender's counts for the actors of one mesh."""

    __slots__ = ("counts", "owner", "views")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # last number taken, for addresses no view holds
        self.owner: dict[str, _View] = {}  # the view that holds an address's count
        self.views: dict[int, _View] = {}  # by id() of its address list (kept alive by it)


class SeqBook:
    """The sequence numbers one sender (an actor instance) takes for its messages."""

    __slots__ = ("_lock", "_meshes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meshes: dict[int, _Mesh] = {}

    def next(self, addr: str, mesh_id: int) -> int:
        """The next number for a message to the actor of mesh ``mesh_id`` at ``addr``."""
        with self._lock:
            mesh = self._meshes.get(mesh_id)
            if mesh is None:
                mesh = self._meshes[mesh_id] = _Mesh()
            view = mesh.owner.get(addr) if mesh.owner else None
            if view is None:
                count = mesh.counts.get(addr, 0) + 1
                mesh.counts[addr] = count
                return count
            i = view.index[addr]
            view.patch[i] = view.patch.get(i, 0) + 1
            return view.count(i)

    def cast(
        self, mesh_id: int, addrs: Sequence[str], ranks: Sequence[int], fanout: int
    ) -> ViewCast | list[casting.Group]:
        """The casting tree's subtrees for one message to the actors of mesh ``mesh_id`` at
        ``addrs`` (ranks ``ranks``), each destination's next number taken.

        ``addrs`` should be the same list object for every cast to one view (a mesh view's
        cached route): then a cast costs per subtree, not per destination.
        """
        with self._lock:
            mesh = self._meshes.get(mesh_id)
            if mesh is None:
                mesh = self._meshes[mesh_id] = _Mesh()
            view = mesh.views.get(id(addrs))
            if view is None or view.addrs is not addrs or view.ranks is not ranks:
                view = self._start(mesh, addrs, ranks, fanout)
            elif view.fanout != fanout:
                self._retire(mesh, view)
                view = self._start(mesh, addrs, ranks, fanout)
            elif len(view.patch) > casting.PATCH_MAX:
                view.rebase()
            if view is None:  # an address twice: numbered one by one
                dests = []
                for addr, rank in zip(addrs, ranks, strict=True):
                    count = mesh.counts.get(addr, 0) + 1
                    mesh.counts[addr] = count
                    dests.append(casting.Dest(addr, count, rank))
                return casting.plan(dests, fanout)
            return view.cast()

    def _start(
        self, mesh: _Mesh, addrs: Sequence[str], ranks: Sequence[int], fanout: int
    ) -> _View | None:
        """Snapshot the counts of a view's destinations (None: it names an address twice)."""
        index = {addr: i for i, addr in enumerate(addrs)}
        if len(index) != len(addrs):
            for addr in addrs:
                other = mesh.owner.get(addr)
                if other is not None:
                    self._retire(mesh, other)
            return None
        for addr in addrs:
            other = mesh.owner.get(addr)
            if other is not None:
                self._retire(mesh, other)
        if len(mesh.views) >= VIEWS_MAX:
            self._retire(mesh, next(iter(mesh.views.values())))
        counts = mesh.counts
        view = _View(addrs, ranks, fanout, index, [counts.pop(addr, 0) for addr in addrs])
        owner = mesh.owner
        for addr in addrs:
            owner[addr] = view
        mesh.views[id(addrs)] = view
        return view

    def _retire(self, mesh: _Mesh, view: _View) -> None:
        """Hand a view's counts back to its mesh's per-address counts."""
        del mesh.views[id(view.addrs)]
        owner, counts = mesh.owner, mesh.counts
        for i, addr in enumerate(view.addrs):
            counts[addr] = view.count(i)
            del owner[addr]
