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

from regency._runtime.kernel import casting
from regency._runtime.kernel.routing import Roster, Subtree

# Views of one mesh whose numbers are kept by bump at once; the oldest retires past this.
VIEWS_MAX = 8


class _View:
    """The counts of one view's destinations while casts number them by bump."""

    __slots__ = ("addrs", "base", "bump", "fanout", "index", "patch", "ranks", "spans")

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
        # Each subtree: its head's position, its end, its roster and its base numbers (also as
        # bytes, as frames carry them).
        self.spans: list[tuple[int, int, Roster | None, array[int], bytes]] = []
        rosters = [
            Roster(tuple(addrs[s + 1 : e]), tuple(ranks[s + 1 : e])) if e - s > 1 else None
            for s, e in casting.spans(len(addrs), fanout)
        ]
        self._snapshot(rosters)

    def _snapshot(self, rosters: list[Roster | None]) -> None:
        base = self.base
        spans = []
        for (s, e), roster in zip(casting.spans(len(base), self.fanout), rosters, strict=True):
            seqs = array("Q", base[s + 1 : e])
            spans.append((s, e, roster, seqs, seqs.tobytes()))
        self.spans = spans

    def count(self, i: int) -> int:
        """The last number taken for destination ``i``."""
        return self.base[i] + self.bump + self.patch.get(i, 0)

    def rebase(self) -> None:
        """Fold the bump and the patch into the base numbers."""
        bump, patch = self.bump, self.patch
        self.base = [n + bump + patch.get(i, 0) for i, n in enumerate(self.base)]
        self.bump, self.patch = 0, {}
        self._snapshot([roster for _, _, roster, _, _ in self.spans])

    def groups(self) -> list[casting.Group]:
        """The casting tree's subtrees for the next cast (its numbers taken)."""
        self.bump += 1
        bump, patch, base, addrs, ranks = self.bump, self.patch, self.base, self.addrs, self.ranks
        out = []
        # Without NamedTuple's Python-level __new__: this runs once per subtree of every cast.
        new, dest, group = tuple.__new__, casting.Dest, casting.Group
        for s, e, roster, seqs, raw in self.spans:
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
    ) -> list[casting.Group]:
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
            return view.groups()

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
