"""Controller state: one ``Root`` per proc mesh (its workers and command buffer) and the views
of it that tensors live on.

Commands are appended to the root's buffer and sent as one fire-and-forget broadcast when a
fetch is issued, ``activate()`` exits, the buffer is full, or the target view changes.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from regency._lowlevel import PortRef
from regency._tensor import commands as c
from regency._tensor.streams import DEFAULT_NAME, get_active_stream
from regency._tensor.table import Poisoned
from regency._tensor.worker import TensorWorker
from regency.actor import Channel
from regency.shape import Shape, Slice

if TYPE_CHECKING:
    from regency.actor import ActorMesh, ProcMesh

FLUSH_AT = 256
"""Buffered commands that trigger a send (unless inside ``coalescing()``)."""
BIG_DELETE = 1 << 18
"""Elements from which a freed tensor's delete joins the batch being built at once, so the
workers reuse its memory for the next commands instead of faulting in fresh pages (a 16 MiB
``reduce`` in a loop took ~3x longer with every output's memory new)."""

_next_ref = itertools.count(1)
_roots: dict[int, Root] = {}
_coalescing: list[bool] = []


def new_ref() -> int:
    """A fresh ref id (unique across every root of this controller)."""
    return next(_next_ref)


class Root:
    """The tensor workers of one proc mesh (one per proc) and its pending commands."""

    def __init__(self, mesh: ProcMesh) -> None:
        procs = mesh._procs
        self.procs = procs
        self.size = len(procs)
        self.everyone = Shape(["ranks"], Slice(0, [self.size], [1]))
        """The shape of every proc of this mesh, by world rank."""
        whole = mesh._new_with_shape(self.everyone)
        per_host: dict[str, int] = defaultdict(int)
        for info in procs:
            per_host[info.agent] += 1
        envs = {
            rank: {
                "RANK": str(rank),
                "LOCAL_RANK": str(info.local_rank),
                "WORLD_SIZE": str(self.size),
                "LOCAL_WORLD_SIZE": str(per_host[info.agent]),
            }
            for rank, info in enumerate(procs)
        }
        # Workers push each failure that starts with them; activate() exit raises unfetched ones.
        port, self._errors = Channel[Poisoned].open()
        self._next_error = self._errors.recv()
        # Each process's first worker tells its handoff port (for rref failures).
        handoffs, self._handoffs = Channel[tuple[int, PortRef]].open()
        self._handoff_ports: dict[int, PortRef] = {}
        self.workers = cast(
            "ActorMesh[TensorWorker]",
            whole.spawn("tensor_worker", TensorWorker, envs, port, handoffs),
        )
        # Another stream's workers are spawned on its first command.
        self._spawn_args = (whole, envs, port, handoffs)
        self._streams: dict[str, ActorMesh[TensorWorker]] = {DEFAULT_NAME: self.workers}
        self._views: dict[tuple[Shape, str], ActorMesh[TensorWorker]] = {}
        self.buffer: list[c.Command] = []
        self.buffer_shape: Shape | None = None
        self.buffer_stream = DEFAULT_NAME
        self.deletes: dict[tuple[Shape, str], list[int]] = defaultdict(list)
        self.flushes = 0
        self.world: tuple[str, int] | None = None
        self.world_streams: set[str] = set()
        """Streams whose workers were sent the world setup (each joins it before reducing)."""

    def arrived_errors(self) -> list[Poisoned]:
        """Failures the workers reported so far (without waiting for more)."""
        found = []
        while self._next_error.done():
            found.append(self._next_error.get())
            self._next_error = self._errors.recv()
        return found

    def handoff_port(self, rank: int) -> PortRef:
        """The handoff port of the process of root rank ``rank`` (``handoff.HandoffPort``).

        The first call waits until the default stream's workers have started (each announced
        its port before its start was reported); a proc that died raises its
        ``SupervisionError``.
        """
        if not self._handoff_ports:
            self.workers.initialized.get()
            while len(self._handoff_ports) < self.size:
                announced, ref = self._handoffs.recv().get(timeout=60.0)
                self._handoff_ports[announced] = ref
        return self._handoff_ports[rank]

    def stream_workers(self, stream: str) -> ActorMesh[TensorWorker]:
        """The worker actors (one per proc) of ``stream``, spawned on first use."""
        workers = self._streams.get(stream)
        if workers is None:
            whole, envs, port, handoffs = self._spawn_args
            workers = cast(
                "ActorMesh[TensorWorker]",
                whole.spawn(f"tensor_worker_{stream}", TensorWorker, envs, port, handoffs, stream),
            )
            self._streams[stream] = workers
        return workers

    def workers_of(self, shape: Shape, stream: str = DEFAULT_NAME) -> ActorMesh[TensorWorker]:
        """The worker actors of ``stream`` on the procs in ``shape`` (a view of this root)."""
        view = self._views.get((shape, stream))
        if view is None:
            view = self.stream_workers(stream)._new_with_shape(shape)
            self._views[(shape, stream)] = view
        return view

    def worker_at(self, rank: int, stream: str = DEFAULT_NAME) -> ActorMesh[TensorWorker]:
        """The worker actor of ``stream`` on root rank ``rank``."""
        return self.workers_of(Shape([], Slice(rank, [], [])), stream)

    def append(self, shape: Shape, cmd: c.Command, stream: str = DEFAULT_NAME) -> None:
        """Queue ``cmd`` for ``stream`` on the procs of ``shape``."""
        if self.buffer and (self.buffer_shape != shape or self.buffer_stream != stream):
            self.flush()
        self.buffer.append(cmd)
        self.buffer_shape = shape
        self.buffer_stream = stream
        if len(self.buffer) >= FLUSH_AT and not _coalescing:
            self.flush()

    def dropped(
        self, shape: Shape, ref: int, stream: str = DEFAULT_NAME, big: bool = False
    ) -> None:
        """A mesh tensor was freed: delete it with the next batch to its procs' ``stream``; a
        ``big`` one (with the deletes pending there) in the batch being built, if it goes there.

        Such a delete goes before the batch's last command when that command does not name
        the freed refs: in ``y = f(x)`` in a loop, the old ``y`` is freed just after the
        command making the new one, and deleting it first lets the worker put the new value
        in the old one's memory instead of faulting in fresh pages (a 16 MiB ``reduce`` loop).
        """
        key = (shape, stream)
        pending = self.deletes[key]
        pending.append(ref)
        if big and shape == self.buffer_shape and stream == self.buffer_stream:
            del self.deletes[key]
            delete = c.Delete(tuple(pending))
            if self.buffer and not c.may_name(self.buffer[-1], set(pending)):
                self.buffer.insert(len(self.buffer) - 1, delete)
            else:
                self.buffer.append(delete)

    def flush(self) -> None:
        """Send the buffered commands (with the deletes for the same procs) as one message."""
        shape = self.buffer_shape
        if shape is None:
            return
        stream = self.buffer_stream
        self.buffer_shape = None  # first: a delete made while swapping goes to self.deletes
        batch = self.buffer
        self.buffer = []
        deletes = self.deletes.pop((shape, stream), None)
        if deletes:
            batch.append(c.Delete(tuple(deletes)))
        self.flushes += 1
        self.workers_of(shape, stream).execute.broadcast(batch)

    def flush_all(self) -> None:
        """Send everything pending, deletes for any view included."""
        self.flush()
        for shape, stream in list(self.deletes):
            refs = self.deletes.pop((shape, stream), None)
            if refs:
                self.flushes += 1
                self.workers_of(shape, stream).execute.broadcast([c.Delete(tuple(refs))])


def root_of(mesh: ProcMesh) -> Root:
    """The ``Root`` of ``mesh`` (or of the mesh it is a view of), spawning workers once."""
    key = id(mesh._procs)
    root = _roots.get(key)
    if root is None:
        root = Root(mesh)
        _roots[key] = root
    return root


def known_root(mesh: ProcMesh) -> Root | None:
    """The ``Root`` of ``mesh`` if it was ever activated."""
    return _roots.get(id(mesh._procs))


class View:
    """A proc mesh (or a view of one) that mesh tensors live on."""

    __slots__ = ("mesh", "root", "shape")

    def __init__(self, mesh: ProcMesh) -> None:
        self.mesh = mesh
        self.root = root_of(mesh)
        self.shape: Shape = mesh._shape

    def same(self, other: View) -> bool:
        """Whether two views cover the same procs in the same layout."""
        return self is other or (self.root is other.root and self.shape == other.shape)

    def send(self, cmd: c.Command) -> None:
        """Queue ``cmd`` for this view's procs, on the active stream."""
        self.root.append(self.shape, cmd, get_active_stream().key)


_active: list[View | None] = []


def active_view() -> View | None:
    """The innermost active mesh view, if any (``None`` also inside ``no_mesh.activate()``)."""
    return _active[-1] if _active else None


@contextmanager
def pushed(view: View | None) -> Iterator[View | None]:
    """Make ``view`` the active mesh for the block (``None``: no mesh, local torch)."""
    _active.append(view)
    try:
        yield view
    finally:
        _active.pop()


@contextmanager
def coalescing() -> Iterator[None]:
    """Group the commands of the block into one message per proc (no size-triggered sends)."""
    _coalescing.append(True)
    try:
        yield
    finally:
        _coalescing.pop()
        for root in list(_roots.values()):
            root.flush()
