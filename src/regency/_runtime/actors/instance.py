"""Hosting actors: each actor gets its own thread (and, for async actors, its own event loop),
handles one message at a time, and replies to the ports its messages name."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import pickle
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from regency import config
from regency._runtime.actors import context
from regency._runtime.actors.endpoint_def import (
    EndpointSpec,
    actor_is_async,
    endpoints_of,
    plain_method,
)
from regency._runtime.actors.errors import ActorError, SupervisionError, failed_text, stopped_text
from regency._runtime.actors.identity import (
    ActorId,
    CreatorInstance,
    InstanceBase,
    new_uid,
    wait_stopped,
    wait_stopped_async,
)
from regency._runtime.actors.mesh_trait import ProcMeshBase
from regency._runtime.actors.ports import Port
from regency._runtime.actors.supervision import (
    FailureEvent,
    MeshFailure,
    MeshRestarted,
    UndeliverableMessageEnvelope,
    run_fault_hook,
)
from regency._runtime.kernel import codec, wire
from regency._runtime.kernel.mailbox import Delivery
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.router import ProcRuntime
from regency._runtime.kernel.service import Service
from regency._runtime.kernel.waiting import thread_eventfd, wait_until, waker
from regency._transport.transport import PeerUnreachableError
from regency.shape import Extent, Point

if TYPE_CHECKING:
    from regency._runtime.actors.future import Future

log = logging.getLogger("regency.actor")

_CACHE_MAX = 4096
_UNSET: Any = object()
_FORCE_MARGIN = 0.5  # extra seconds a running __cleanup__ gets before a stop goes on without it
_STOP = "stop"
_SUPERVISE = "supervise"
_WAKE = "wake"


class ClientInstance(InstanceBase):
    """The instance behind code that runs outside any actor: ``<root>`` in the controller."""

    def __init__(self, runtime: ProcRuntime, is_root: bool) -> None:
        super().__init__()
        self.uid = 1 if is_root else new_uid()
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


class _Control:
    """A mailbox item for the actor itself rather than an endpoint."""

    __slots__ = ("arg", "kind")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind = kind
        self.arg = arg


@dataclass(frozen=True, slots=True)
class SpawnActor:
    """A request to a proc: create one actor of a mesh there."""

    mesh_id: int
    name: str
    rank: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    creator: CreatorInstance
    class_name: str  # module.qualname, so errors name the class even if unpickling it fails
    payload: bytes  # cloudpickled (cls, args, kwargs, proc_mesh)
    status: PortRef  # receives (rank, error-text-or-None) once __init__ has run
    owner: PortRef | None  # supervision reports for this mesh go here


class ActorInstance(InstanceBase):
    """One hosted actor: its mailbox sink, its thread, its endpoints, its fate."""

    def __init__(self, runtime: ProcRuntime, request: SpawnActor) -> None:
        super().__init__()
        self.runtime = runtime
        self.request = request
        self.uid = new_uid()
        self.mesh_id = request.mesh_id
        self.name = request.name
        self.class_name: str | None = request.class_name
        self.rank = Point(request.rank, Extent(request.labels, request.sizes))
        self.creator = request.creator
        self.proc_id = runtime.address
        self.actor: Any = None
        self.failed: str | None = None
        self._failure_error: BaseException | None = None
        self.stopped = False
        self.stop_reason = ""
        self._endpoints: dict[str, tuple[Callable[..., Any], EndpointSpec]] = {}
        self._is_async = False
        self._proc_mesh: ProcMeshBase | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Stops of owned meshes begun by a failure; cleanup waits for them.
        self._owned_stopping: list[Future[None]] = []
        self._wake: Callable[[], None] | None = None
        self._points: dict[tuple[int, tuple[str, ...], tuple[int, ...]], Point] = {}
        self._envelopes: dict[tuple[Any, int], tuple[str, Point]] = {}
        # Set when a stop gave up waiting for the actor's thread (see _force_stop).
        self._forced = False
        self._cleanup_started: float | None = None
        self._stop_lock = threading.Lock()
        self._inbox: deque[Any] | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"regency-actor-{request.name}", daemon=True
        )

    # -- identity ------------------------------------------------------------------------------

    @property
    def proc_mesh(self) -> ProcMeshBase:
        """The proc mesh this actor was spawned on."""
        assert self._proc_mesh is not None
        return self._proc_mesh

    # -- lifecycle (public: ``context().actor_instance``) --------------------------------------

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

    # -- lifecycle (runtime) -------------------------------------------------------------------

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
        self.runtime.mailbox(self.mesh_id).post(0, 0, _Control(_STOP, once))
        grace = config.get_seconds("cleanup_timeout")
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
            self.runtime.mailbox(self.mesh_id).attach(self._reject)
        print(
            f"regency: actor {self} was still busy {grace:g} s (cleanup_timeout) after it was "
            "asked to stop; it is stopped without waiting for it",
            file=sys.stderr,
            flush=True,
        )
        # Wait (bounded) for what it owns, so that a returned stop means its descendants are
        # stopped too, as when the actor's thread stops them itself.
        self.stop_owned(f"their owner {self} stopped", grace)
        self._reject_queued()
        # Unblock the thread if it waits for a message, so that it can end.
        self._queue.put(_Control(_WAKE))
        once()

    def _reject_queued(self) -> None:
        """Refuse every message still waiting in the actor's queues."""
        inbox = self._inbox
        while inbox:
            try:
                item = inbox.popleft()
            except IndexError:
                break
            self._reject_safely(item)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._reject_safely(item)

    def _reject_safely(self, item: Any) -> None:
        try:
            self._reject(item)
        except Exception:
            log.exception("actor %s dropped a malformed message", self.name)

    def _attach(self, sink: Callable[[Any], None]) -> bool:
        """Hand the mailbox to ``sink``, unless a forced stop took it (then False)."""
        with self._stop_lock:
            if self._forced:
                return False
            self.runtime.mailbox(self.mesh_id).attach(sink)
            return True

    def _end_forced(self) -> None:
        """The thread of a force-stopped actor got free: clean up late, then end."""
        self._cleanup_sync(self._failure_error if self.failed is not None else None)

    def supervise(self, notice: Any) -> None:
        """Queue a notice about an owned mesh; ``__supervise__`` runs between messages."""
        self.runtime.mailbox(self.mesh_id).post(0, 0, _Control(_SUPERVISE, notice))

    def _poke(self) -> None:
        if threading.current_thread() is not self._thread:
            self.runtime.mailbox(self.mesh_id).post(0, 0, _Control(_WAKE))

    def _main(self) -> None:
        try:
            cls, args, kwargs, proc_mesh = codec.loads([self.request.payload])
            self._proc_mesh = proc_mesh
            for name, prop in endpoints_of(cls).items():
                self._endpoints[name] = (prop.method, prop.spec)
            is_async = actor_is_async(cls)
            self._is_async = is_async
        except BaseException as exc:
            self._report_init(exc)
            self._serve_failed()
            return
        if not is_async:
            self._attach(self._post_sync)
            self._serve_sync(cls, args, kwargs)
            return
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve_async(cls, args, kwargs))
        finally:
            loop.close()
        if not self.stopped:
            self._serve_failed()

    def _construct(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        token = context.set_current(context.Context(self, self.rank))
        try:
            self.actor = cls(*args, **kwargs)
        except BaseException as exc:
            self._report_init(exc)
            return False
        finally:
            context.CURRENT.reset(token)
        self._send_status(None)
        return True

    def _report_init(self, exc: BaseException) -> None:
        self._send_status("".join(traceback.format_exception(exc)))
        self._fail(f"__init__ raised {type(exc).__name__}: {exc}", exc)

    def _send_status(self, error: str | None) -> None:
        with contextlib.suppress(PeerUnreachableError):
            self.runtime.send_port(
                self.request.status, self.request.rank, 0, [pickle.dumps(error, protocol=5)]
            )

    def _serve_sync(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._construct(cls, args, kwargs):
            self._serve_failed()
            return
        q = self._queue
        handle = self._handle_sync
        idle = self._idle_until
        while True:
            if self._forced:
                self._end_forced()
                return
            try:
                item = q.get_nowait()
            except queue.Empty:
                idle()
                item = q.get()
            if self._forced:
                self._reject_safely(item)
                continue
            if type(item) is _Control:
                if item.kind is _STOP:
                    self._finish_stop(item.arg)
                    return
                if item.kind is _SUPERVISE:
                    self._supervise_sync(item.arg)
            else:
                try:
                    handle(item)
                except Exception:
                    # Only a malformed message gets here (endpoint errors are handled inside).
                    log.exception("actor %s dropped a malformed message", self.name)
            # Drop the message now, not when the next one arrives: its parts may map shared
            # memory that the sender is waiting to reuse.
            item = None
            if self.failed is not None:
                wait_stopped(self._owned_stopping, config.get_seconds("stop_timeout"))
                self._cleanup_sync()
                self._serve_failed()
                return

    def _post_sync(self, item: Any) -> None:
        self._queue.put(item)
        if self._wake is not None:
            self._wake()

    def _idle_until(self) -> None:
        """Wait for the next message reading the sockets on this thread (one wake-up, not two)."""
        fd = thread_eventfd()
        self._wake = waker(fd)
        try:
            wait_until(lambda: not self._queue.empty(), fd, None)
        finally:
            self._wake = None

    def _serve_failed(self) -> None:
        """After a failure: answer every later message with a ``SupervisionError``."""
        if not self._attach(self._queue.put):
            return
        while True:
            item = self._queue.get()
            if self._forced:
                self._reject_safely(item)
                return
            if type(item) is _Control:
                if item.kind is _STOP:
                    self.stopped = True
                    self._reject_from_now_on()
                    item.arg()
                    return
                continue
            try:
                self._reject(item)
            except Exception:
                log.exception("actor %s dropped a malformed message", self.name)

    async def _serve_async(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._construct(cls, args, kwargs):
            return
        loop = asyncio.get_running_loop()
        inbox: deque[Any] = deque()
        wake = asyncio.Event()
        scheduled = [False]

        def post(item: Any) -> None:
            inbox.append(item)
            if not scheduled[0]:
                scheduled[0] = True
                loop.call_soon_threadsafe(wake.set)

        self._inbox = inbox
        tasks: set[asyncio.Task[Any]] = set()
        if not self._attach(post):
            await self._end_forced_async(tasks)
            return
        while self.failed is None and not self._forced:
            while inbox and self.failed is None:
                item = inbox.popleft()
                if self._forced:
                    self._reject_safely(item)
                    break
                if type(item) is _Control:
                    if item.kind is _STOP:
                        await self._cancel_tasks(tasks)
                        await wait_stopped_async(
                            self.stop_owned(f"their owner {self} stopped", None),
                            config.get_seconds("stop_timeout"),
                        )
                        await self._cleanup_async(None)
                        self._requeue(inbox)
                        self._finish_stop(item.arg, cleaned=True)
                        return
                    if item.kind is _SUPERVISE:
                        await self._supervise_async(item.arg)
                    continue
                try:
                    await self._handle_async(item, tasks, post)
                except Exception:
                    log.exception("actor %s dropped a malformed message", self.name)
                item = None
            if self.failed is not None or self._forced:
                break
            scheduled[0] = False
            if inbox:
                continue
            self.runtime.flush()
            wake.clear()
            if inbox:
                continue
            await wake.wait()
        if self._forced:
            await self._end_forced_async(tasks)
            return
        await self._cancel_tasks(tasks)
        await wait_stopped_async(self._owned_stopping, config.get_seconds("stop_timeout"))
        await self._cleanup_async(self._failure_error)
        # Hand what is still queued to the failed actor's loop, in order.
        self._requeue(inbox)

    def _requeue(self, inbox: deque[Any]) -> None:
        """Move the async loop's leftover messages to the thread queue, keeping their order."""
        if not self._attach(self._queue.put):
            self._reject_queued()
            return
        while inbox:
            self._queue.put(inbox.popleft())

    async def _end_forced_async(self, tasks: set[asyncio.Task[Any]]) -> None:
        """:meth:`_end_forced` for an async actor."""
        await self._cancel_tasks(tasks)
        self._reject_queued()
        await self._cleanup_async(self._failure_error if self.failed is not None else None)

    @staticmethod
    async def _cancel_tasks(tasks: set[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- supervision ---------------------------------------------------------------------------

    def _supervise_hook(self) -> Callable[..., Any] | None:
        return getattr(type(self.actor), "__supervise__", None)

    def _supervise_sync(self, notice: Any) -> None:
        hook = self._supervise_hook()
        token = context.set_current(context.Context(self, self.rank))
        try:
            handled = hook(self.actor, notice) if hook is not None else False
        except BaseException as exc:
            self._supervise_raised(notice, exc)
            return
        finally:
            context.CURRENT.reset(token)
        self._supervise_outcome(notice, handled)

    async def _supervise_async(self, notice: Any) -> None:
        hook = self._supervise_hook()
        context.set_current(context.Context(self, self.rank))
        try:
            handled = hook(self.actor, notice) if hook is not None else False
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as exc:
            self._supervise_raised(notice, exc)
            return
        self._supervise_outcome(notice, handled)

    def _supervise_outcome(self, notice: Any, handled: Any) -> None:
        if isinstance(notice, MeshRestarted) or notice.restarting or handled:
            return
        self._fail(
            f"The actor {self} and all its descendants have failed (its __supervise__ did not "
            f"handle the failure of its mesh {notice.mesh_name})",
            cause=notice.event,
        )

    def _supervise_raised(self, notice: Any, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))
        if isinstance(notice, MeshRestarted) or notice.restarting:
            log.error("actor %s: __supervise__ raised on a restart notice:\n%s", self, text)
            return
        self._fail(
            f"error during handling of supervision: __supervise__ raised "
            f"{type(exc).__name__}: {exc}",
            exc,
            cause=notice.event,
        )

    def _fail(
        self, reason: str, exc: BaseException | None = None, cause: FailureEvent | None = None
    ) -> None:
        """Mark this actor failed, tell its owner, and stop the meshes it owns."""
        if self.failed is not None or self.stopped:
            return
        self.failed = reason
        self._failure_error = exc if exc is not None else Exception(reason)
        event = FailureEvent(
            self.mesh_id, self.request.rank, str(self), reason, cause, "failed", self.proc_id
        )
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        print(f"regency: actor {self} failed: {reason}\n{detail}", file=sys.stderr, flush=True)
        self._tell_owner(event)
        self._owned_stopping = self.stop_owned(f"their owner {self} failed", None)

    def _report_stopped(self) -> None:
        self._tell_owner(
            FailureEvent(
                self.mesh_id,
                self.request.rank,
                str(self),
                self.stop_reason,
                None,
                "stopped",
                self.proc_id,
            )
        )

    def _tell_owner(self, event: FailureEvent) -> None:
        owner = self.request.owner
        if owner is None:
            return
        with contextlib.suppress(PeerUnreachableError):
            self.runtime.send_port(owner, self.request.rank, 0, [pickle.dumps(event, protocol=5)])

    def undeliverable(self, envelope: UndeliverableMessageEnvelope) -> bool:
        """A message this actor sent cannot be delivered: its handler decides, else it fails."""
        handler = getattr(self.actor, "_handle_undeliverable_message", None)
        if handler is not None and handler(envelope):
            return True
        self._fail(f"a message it sent could not be delivered: {envelope.error_msg()}")
        return False

    # -- stopping and cleanup ------------------------------------------------------------------

    def _finish_stop(self, done: Callable[[], None], cleaned: bool = False) -> None:
        """After the last message: stop owned meshes, clean up, refuse later messages."""
        self.stop_owned(f"their owner {self} stopped", config.get_seconds("stop_timeout"))
        if not cleaned:
            self._cleanup_sync(None)
        self.stopped = True
        self._reject_from_now_on()
        done()

    def _reject_from_now_on(self) -> None:
        """Refuse later messages, and those queued but never run, with a ``SupervisionError``."""
        self.runtime.mailbox(self.mesh_id).attach(self._reject)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._reject(item)
            except Exception:
                log.exception("actor %s dropped a malformed message", self.name)

    def _cleanup_sync(self, exc: BaseException | None = _UNSET) -> None:
        if exc is _UNSET:
            exc = self._failure_error
        hook = getattr(type(self.actor), "__cleanup__", None) if self.actor is not None else None
        if hook is None:
            return
        timeout = config.get_seconds("cleanup_timeout")
        started = self._cleanup_started = time.monotonic()
        token = context.set_current(context.Context(self, self.rank))
        try:
            hook(self.actor, exc)
        except BaseException as error:
            self._cleanup_failed(f"__cleanup__ raised {type(error).__name__}: {error}", error)
        finally:
            context.CURRENT.reset(token)
        if time.monotonic() - started > timeout:
            self._cleanup_failed(f"__cleanup__ took longer than {timeout:g} s", None)

    async def _cleanup_async(self, exc: BaseException | None) -> None:
        hook = getattr(type(self.actor), "__cleanup__", None) if self.actor is not None else None
        if hook is None:
            return
        timeout = config.get_seconds("cleanup_timeout")
        self._cleanup_started = time.monotonic()
        context.set_current(context.Context(self, self.rank))
        try:
            # A sync hook is allowed on an actor whose only async parts are hooks.
            outcome = hook(self.actor, exc)
            if inspect.isawaitable(outcome):
                await asyncio.wait_for(outcome, timeout)
        except asyncio.TimeoutError:
            self._cleanup_failed(f"__cleanup__ took longer than {timeout:g} s", None)
        except BaseException as error:
            self._cleanup_failed(f"__cleanup__ raised {type(error).__name__}: {error}", error)

    def _cleanup_failed(self, reason: str, exc: BaseException | None) -> None:
        if self.failed is None:
            self._fail(reason, exc)
            return
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        print(f"regency: actor {self}: {reason}\n{detail}", file=sys.stderr, flush=True)

    # -- messages ------------------------------------------------------------------------------

    def _open(self, item: Delivery) -> tuple[str, PortRef | None, Point, Sequence[Part]]:
        parts, rank, reply_override = item
        envelope = bytes(parts[0])  # small; and a view of a writable buffer cannot be hashed
        # Envelopes without a reply port (broadcasts) repeat byte for byte: decode them once.
        cached = self._envelopes.get((envelope, rank))
        if cached is not None and reply_override is None:
            return cached[0], None, cached[1], parts[1:]
        method, port, labels, sizes = pickle.loads(envelope)
        if reply_override is not None:
            reply: PortRef | None = reply_override
        else:
            reply = PortRef(*port) if port is not None else None
        key = (rank, labels, sizes)
        point = self._points.get(key)
        if point is None:
            if len(self._points) > _CACHE_MAX:
                self._points.clear()
            point = self._points[key] = Point(rank, Extent(labels, sizes))
        if port is None and reply_override is None:
            if len(self._envelopes) > _CACHE_MAX:
                self._envelopes.clear()
            self._envelopes[(envelope, rank)] = (method, point)
        return method, reply, point, parts[1:]

    def _reject(self, item: Any) -> None:
        """Answer a message the actor will never run (it failed or stopped)."""
        if type(item) is _Control:
            if item.kind is _STOP:
                item.arg()
            return
        method, reply, point, _ = self._open(item)
        if reply is None:
            return
        if self.failed is not None:
            why = failed_text(str(self), self.failed)
        else:
            why = stopped_text(str(self), self.stop_reason, f"actor mesh {self.name} is stopped")
        text = f"Endpoint call {self.name}.{method}() failed, {why}"
        self._reply_error(reply, point.rank, SupervisionError(text, f"{self.name}.{method}"))

    def _prepare(self, item: Delivery) -> tuple[Any, ...] | None:
        """Decode a message; returns None (after replying) when it cannot run."""
        if self.failed is not None:
            self._reject(item)
            return None
        method, reply, point, payload = self._open(item)
        entry = self._endpoints.get(method)
        try:
            if entry is None:
                wire_name, method = method, method.partition("@")[0]  # errors name the method
                entry = plain_method(type(self.actor), wire_name, self._is_async)
            if entry is None:
                raise AttributeError(f"{self.class_name} has no endpoint {method!r}")
            args, kwargs = codec.loads(payload)
        except Exception as exc:
            self._on_error(method, reply, point, exc)
            return None
        except BaseException as exc:  # SystemExit from a __reduce__: as if the endpoint raised it
            self._die(method, reply, point, exc)
            return None
        fn, spec = entry
        if spec.explicit_port:
            port: Any = Port(reply, point.rank) if reply is not None else _NullPort()
            args = (port, *args)
        return fn, spec, method, reply, point, args, kwargs

    def _handle_sync(self, item: Delivery) -> None:
        prepared = self._prepare(item)
        if prepared is None:
            return
        fn, spec, method, reply, point, args, kwargs = prepared
        token = context.set_current(context.Context(self, point))
        try:
            result = fn(self.actor, *args, **kwargs)
        except BaseException as exc:
            self._settle(spec, method, reply, point, None, exc)
            return
        finally:
            context.CURRENT.reset(token)
        self._settle(spec, method, reply, point, result, None)

    async def _handle_async(
        self, item: Delivery, tasks: set[asyncio.Task[Any]], post: Callable[[Any], None]
    ) -> None:
        prepared = self._prepare(item)
        if prepared is None:
            return
        fn, spec, method, reply, point, args, kwargs = prepared
        context.set_current(context.Context(self, point))
        if spec.concurrent:
            task = asyncio.ensure_future(
                self._run_async(fn, spec, method, reply, point, args, kwargs)
            )
            tasks.add(task)

            def finished(task: asyncio.Task[Any]) -> None:
                tasks.discard(task)
                if self.failed is not None:
                    post(_Control(_WAKE))  # let the loop see the failure

            task.add_done_callback(finished)
            return
        await self._run_async(fn, spec, method, reply, point, args, kwargs)

    async def _run_async(
        self,
        fn: Callable[..., Any],
        spec: EndpointSpec,
        method: str,
        reply: PortRef | None,
        point: Point,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            result = await fn(self.actor, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._settle(spec, method, reply, point, None, exc)
            return
        self._settle(spec, method, reply, point, result, None)

    def _settle(
        self,
        spec: EndpointSpec,
        method: str,
        reply: PortRef | None,
        point: Point,
        result: Any,
        error: BaseException | None,
    ) -> None:
        """Reply with an endpoint's outcome, or fail the actor when nobody can be told."""
        if error is None:
            if reply is not None and not spec.explicit_port:
                fatal = self._reply_value(reply, point.rank, result)
                if fatal is not None:  # pickling the value raised a BaseException
                    self._die(method, reply, point, fatal)
        elif isinstance(error, Exception) and not spec.explicit_port:
            self._on_error(method, reply, point, error, spec)
        else:
            # A BaseException, or an explicit-port endpoint that raised instead of replying.
            self._die(method, reply, point, error)

    # -- replies and failures ------------------------------------------------------------------

    def _reply_value(self, reply: PortRef, rank: int, value: Any) -> BaseException | None:
        """Send ``value``; return a ``BaseException`` pickling it raised (the caller fails the
        actor with it, as if the endpoint had raised it)."""
        try:
            parts = codec.dumps(value)
        except Exception as exc:
            self._reply_error(
                reply,
                rank,
                ActorError(exc, f"Actor call {self.name} returned a value that cannot be pickled."),
            )
            return None
        except BaseException as exc:
            return exc
        try:
            self.runtime.send_port(reply, rank, 0, parts)
        except PeerUnreachableError:
            log.debug("reply to %s dropped: the caller is gone", reply.addr)
        except ValueError as exc:  # frame over the size limit
            self._reply_error(
                reply, rank, ActorError(exc, f"Actor call {self.name} reply too large.")
            )
        return None

    def _reply_error(self, reply: PortRef, rank: int, error: BaseException) -> None:
        try:
            self.runtime.send_port(reply, rank, wire.FLAG_ERROR, codec.dumps(error))
        except PeerUnreachableError:
            log.debug("error reply to %s dropped: the caller is gone", reply.addr)

    def _on_error(
        self,
        method: str,
        reply: PortRef | None,
        point: Point,
        exc: Exception,
        spec: EndpointSpec | None = None,
    ) -> None:
        if reply is not None:
            self._reply_error(
                reply, point.rank, ActorError(exc, f"Actor call {self.name}.{method} failed.")
            )
            return
        # Nobody to report to (broadcast, send without a port): the actor dies.
        self._fail(f"endpoint {method} raised {type(exc).__name__}: {exc} with no reply path", exc)

    def _die(self, method: str, reply: PortRef | None, point: Point, exc: BaseException) -> None:
        self._fail(f"endpoint {method} raised {type(exc).__name__}: {exc}", exc)
        if reply is not None:
            self._reply_error(
                reply,
                point.rank,
                SupervisionError(
                    f"Endpoint call {self.name}.{method}() failed, "
                    f"{failed_text(str(self), self.failed or '')}",
                    f"{self.name}.{method}",
                ),
            )


class _NullPort:
    """Stands in for the response port of a message sent without one."""

    def send(self, obj: Any) -> None:
        """Drop the value."""

    def exception(self, exc: BaseException) -> None:
        """Drop the error."""


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
