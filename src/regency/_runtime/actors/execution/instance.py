"""Hosting actors: each actor gets its own thread (and, for async actors, its own event loop),
handles one message at a time, and replies to the ports its messages name."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from regency import _hooks, config
from regency._config_keys import CLEANUP_TIMEOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.base.endpoint_def import actor_is_async, endpoints_of
from regency._runtime.actors.base.identity import ActorId, InstanceBase, new_uid
from regency._runtime.actors.base.mesh_trait import ProcMeshBase
from regency._runtime.actors.control.control import SpawnActor
from regency._runtime.actors.execution.async_executor import AsyncExecutor
from regency._runtime.actors.execution.instance_core import (
    STOP,
    SUPERVISE,
    WAKE,
    ActorCore,
    Control,
)
from regency._runtime.actors.execution.sync_executor import SyncExecutor
from regency._runtime.actors.supervision.supervision import MeshFailure, run_fault_hook
from regency._runtime.kernel import codec
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.service import Service

_FORCE_MARGIN = 0.5  # extra seconds a running __cleanup__ gets before a stop goes on without it


class ClientInstance(InstanceBase):
    """The instance behind code that runs outside any actor: ``<root>`` in the controller."""

    def __init__(self, runtime: ProcRuntime, is_root: bool) -> None:
        super().__init__()
        # Unique even for the root: the controllers of several processes (the ranks of one
        # torchrun job) may message the same actor, whose mailbox orders messages per sender.
        self.uid = new_uid()
        self.name = "root" if is_root else f"client[{runtime.address}]"
        self.class_name = None
        self.rank = context.empty_point()
        self.creator = None
        self.proc_id = runtime.address
        self.is_root = is_root

    @property
    def proc_mesh(self) -> ProcMeshBase:
        """The singleton proc mesh of this process."""
        return self.proc

    @property
    def actor_id(self) -> ActorId:
        """A unique, printable id; the root's names the client (its ``name`` is ``root``), as
        Monarch's does."""
        if not self.is_root:
            return super().actor_id
        return ActorId("client", self.uid, self.rank, self.proc_id, True)

    def supervise(self, notice: Any) -> None:
        """Failures of meshes spawned outside any actor: the root's go to the fault hook."""
        if not isinstance(notice, MeshFailure) or notice.restarting:
            return
        if self.is_root:
            root_notices().post(notice)
            return
        print(
            f"regency: unhandled failure in {self}: {notice.report()}", file=sys.stderr, flush=True
        )

    def stop(self, reason: str | None = None) -> None:
        """The client is not an actor: end it with ``shutdown_context()`` instead."""
        raise RuntimeError(f"{self} is not an actor and cannot stop itself; use shutdown_context()")

    kill = abort = stop


_root_service: Service | None = None
_root_lock = threading.Lock()


def root_notices() -> Service:
    """The controller's thread that runs ``unhandled_fault_hook`` for failures reaching the root."""
    global _root_service
    with _root_lock:
        if _root_service is None:
            _root_service = Service("regency-fault-hook", run_fault_hook)
        return _root_service


class _Once:
    """A callback that runs at most once, whichever of its callers gets there first."""

    __slots__ = ("_fn", "_lock", "called")

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn
        self._lock = threading.Lock()
        self.called = False

    def __call__(self) -> None:
        with self._lock:
            if self.called:
                return
            self.called = True
        self._fn()


class ActorInstance(ActorCore):
    """One hosted actor: its mailbox sink, its thread, its fate; the executor it holds, sync or
    async, runs it (see :mod:`.sync_executor`, :mod:`.async_executor`, the shared steps in
    :mod:`.instance_core`)."""

    def __init__(self, runtime: ProcRuntime, request: SpawnActor) -> None:
        super().__init__(runtime, request)
        self._thread = threading.Thread(
            target=self._main, name=f"regency-actor-{request.name}", daemon=True
        )

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor gracefully after the current message (not a failure).

        Queued messages still run, owned meshes stop, then ``__cleanup__(None)``; the owner
        sees the rank as stopped, not failed.
        """
        self.request_stop(self._report_stopped, reason or "stopped by the actor itself")

    def kill(self, reason: str | None = None) -> None:
        """End this actor as failed: its owner gets a ``MeshFailure``."""
        self._fail(f"killed: {reason or 'no reason provided'}")
        self._poke()

    def abort(self, reason: str | None = None) -> None:
        """End this actor as failed with ``reason``: its owner gets a ``MeshFailure``."""
        self._fail(f"aborted: {reason or 'no reason provided'}")
        self._poke()

    def start(self) -> None:
        """Start the actor's thread; its constructor runs there before any message."""
        self._thread.start()

    def request_stop(self, done: Callable[[], None], reason: str = "stopped by client") -> None:
        """Finish queued messages, then stop; ``done`` runs once the actor has stopped.

        An actor whose thread is still busy (in ``__init__`` or a handler) after
        ``cleanup_timeout`` seconds is stopped without it, as Monarch does.
        """
        self.stop_reason = reason
        once = _Once(done)
        self.runtime.mailbox(self.mesh_id).post(0, 0, Control(STOP, once))
        grace = config.seconds(CLEANUP_TIMEOUT)
        self.runtime.loop.call_later(grace, lambda: self._stop_overdue(once, grace))

    def _stop_overdue(self, once: _Once, grace: float) -> None:
        # On the I/O thread: the forced stop sends replies, which must not wait here.
        if once.called:
            return
        started = self._cleanup_started
        if started is not None:
            # A running __cleanup__ gets its own cleanup_timeout (an async one enforces it
            # itself: the margin lets it).
            left = started + grace + _FORCE_MARGIN - time.monotonic()
            if left > 0:
                self.runtime.loop.call_later(left, lambda: self._force_later(once, grace))
                return
        self._force_later(once, grace)

    def _force_later(self, once: _Once, grace: float) -> None:
        if not once.called:
            threading.Thread(
                target=self._force_stop,
                args=(once, grace),
                name=f"regency-force-stop-{self.name}",
                daemon=True,
            ).start()

    def _force_stop(self, once: _Once, grace: float) -> None:
        """Stop without the actor's thread: refuse its messages, stop what it owns, say done.

        The thread, if it ever returns, runs ``__cleanup__`` and ends (see ``_end_forced``).
        """
        if once.called:
            return
        if self._cleanup_started is not None:
            self._fail(f"__cleanup__ took longer than {grace:g} s")
        with self._stop_lock:
            if once.called or self._forced:
                return
            self._forced = True
            self.stopped = True
            self.runtime.mailbox(self.mesh_id).attach(self._reject_arriving)
        print(
            f"regency: actor {self} was still busy {grace:g} s (cleanup_timeout) after it was "
            "asked to stop; it is stopped without waiting for it",
            file=sys.stderr,
            flush=True,
        )
        # Wait (bounded) for what it owns, so that a returned stop means its descendants are
        # stopped too, as when the actor's thread stops them itself.
        self.stop_owned(f"their owner {self} stopped", grace)
        self._reject_queued(release=False)  # the actor's thread may hold the unpickling lock
        # Unblock the thread if it waits for a message, so that it can end.
        self._queue.put(Control(WAKE))
        once()

    def supervise(self, notice: Any) -> None:
        """Queue a notice about an owned mesh for ``__supervise__`` (which runs while an async
        endpoint awaits, or before the next queued message: see the executors)."""
        self.runtime.mailbox(self.mesh_id).post(0, 0, Control(SUPERVISE, notice))

    def _poke(self) -> None:
        if threading.current_thread() is not self._thread:
            self.runtime.mailbox(self.mesh_id).post(0, 0, Control(WAKE))

    def _main(self) -> None:
        self._created()
        try:
            (cls, args, kwargs, proc_mesh), carried = codec.loads_carrying([self.request.payload])
            if carried:  # mesh tensor arguments: wait for this rank's shards (after unpickling)
                _hooks.tensor.load().settle_arrivals(carried)
            self._proc_mesh = proc_mesh
            for name, prop in endpoints_of(cls).items():
                self._endpoints[name] = (prop.method, prop.spec)
            self._is_async = actor_is_async(cls)
        except BaseException as exc:
            self._report_init(exc)
            self._serve_failed()
            return
        executor = AsyncExecutor(self) if self._is_async else SyncExecutor(self)
        self._before_reply = executor.before_reply
        executor.serve(cls, args, kwargs)
