"""What every hosted actor is and does whichever executor runs it: its state, decoding a
message, replying, failing, telling its owner, the outcome of ``__supervise__``."""

from __future__ import annotations

import contextlib
import enum
import logging
import pickle
import queue
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from regency import _hooks, config
from regency._config_keys import STOP_TIMEOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.base.endpoint_def import EndpointSpec, plain_method
from regency._runtime.actors.base.errors import (
    ActorError,
    SupervisionError,
    failed_text,
    stopped_text,
)
from regency._runtime.actors.base.identity import InstanceBase, new_uid
from regency._runtime.actors.base.mesh_trait import ProcMeshBase
from regency._runtime.actors.base.ports import Port
from regency._runtime.actors.control.control import SpawnActor
from regency._runtime.actors.observe import breakpoints, tracing
from regency._runtime.actors.supervision import supervision
from regency._runtime.actors.supervision.supervision import (
    FailureEvent,
    MeshRestarted,
    UndeliverableMessageEnvelope,
)
from regency._runtime.kernel import codec, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.mailbox import Delivery
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.refs import Part, PortRef
from regency.shape import Extent, Point

if TYPE_CHECKING:
    from regency._runtime.actors.base.future import Future


log = logging.getLogger("regency.actor")

_CACHE_MAX = 4096
_PORT = wire.ENVELOPE_PORT


class ControlKind(enum.Enum):
    """What a :class:`Control` item asks of the actor's thread."""

    STOP = "stop"  # stop after the queued messages (arg: the callback once stopped)
    SUPERVISE = "supervise"  # run __supervise__ (arg: the notice)
    WAKE = "wake"  # only end a wait


STOP = ControlKind.STOP
SUPERVISE = ControlKind.SUPERVISE
WAKE = ControlKind.WAKE


class Control:
    """A mailbox item for the actor itself rather than an endpoint."""

    __slots__ = ("arg", "kind")

    def __init__(self, kind: ControlKind, arg: Any = None) -> None:
        self.kind = kind
        self.arg = arg


class ActorCore(InstanceBase):
    """One hosted actor's state and the steps both executors share (see
    :class:`~regency._runtime.actors.execution.instance.ActorInstance`)."""

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
        self.handled = 0  # messages taken off the mailbox (introspection)
        self._endpoints: dict[str, tuple[Callable[..., Any], EndpointSpec]] = {}
        self._is_async = False
        self._proc_mesh: ProcMeshBase | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Stops of owned meshes begun by a failure; cleanup waits for them.
        self._owned_stopping: list[Future[None]] = []
        # Called just before an endpoint's value is posted back, when sending it cannot block:
        # the executor's ``before_reply`` (the sync one claims the sockets for its thread).
        self._before_reply: Callable[[], None] = _nothing
        self._points: dict[tuple[int, tuple[str, ...], tuple[int, ...]], Point] = {}
        self._envelopes: dict[tuple[bytes, int], tuple[str, str | None, Point, int]] = {}
        # Set when a stop gave up waiting for the actor's thread (see _force_stop).
        self._forced = False
        self._cleanup_started: float | None = None
        self._stop_lock = threading.Lock()
        self._inbox: deque[Any] | None = None
        # Notices for __supervise__, taken before the queued messages.
        self._notices: deque[Any] = deque()

    def stats(self) -> dict[str, object]:
        """What introspection shows of this actor: state, failure, messages handled, queued."""
        state = "failed" if self.failed is not None else "stopped" if self.stopped else "running"
        return {
            "state": state,
            "failure": self.failed,
            "messages_handled": self.handled,
            "mailbox_depth": self.queued(),
        }

    def queued(self) -> int:
        """Messages (and supervision notices) waiting in this actor's mailbox."""
        if self._inbox is None:  # a sync actor: a wake-up in its queue stands for each notice
            return self._queue.qsize()
        return self._queue.qsize() + len(self._inbox) + len(self._notices)

    @property
    def proc_mesh(self) -> ProcMeshBase:
        """The proc mesh this actor was spawned on."""
        assert self._proc_mesh is not None
        return self._proc_mesh

    def _attach(self, sink: Callable[[Any], None]) -> bool:
        """Hand the mailbox to ``sink``, unless a forced stop took it (then False)."""
        with self._stop_lock:
            if self._forced:
                return False
            self.runtime.mailbox(self.mesh_id).attach(sink)
            return True

    def _reject_queued(self, release: bool = True) -> None:
        """Refuse every message still waiting in the actor's queues (``release``: see
        :meth:`_reject`)."""
        inbox = self._inbox
        while inbox:
            try:
                item = inbox.popleft()
            except IndexError:
                break
            self._reject_safely(item, release)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._reject_safely(item, release)

    def _reject_safely(self, item: Any, release: bool = True) -> None:
        try:
            self._reject(item, release)
        except Exception:
            log.exception("actor %s dropped a malformed message", self.name)

    def _status(self, status: str, reason: str | None = None) -> None:
        """Record a change of this actor's status while telemetry is on (Monarch's names)."""
        probe = tracing.probe
        if probe is not None:
            probe.status(self.uid, status, reason)

    def _created(self) -> None:
        """Record this actor in the job's ``actors`` table while telemetry is on."""
        probe = tracing.probe
        if probe is not None:
            full = tracing.actor_full_name(self.proc_id, self.name, self.mesh_id, self.request.rank)
            probe.actor(self.uid, self.mesh_id, self.request.rank, full, str(self))
            probe.status(self.uid, "Created")
            probe.status(self.uid, "Initializing")

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
        self._status("Idle")
        return True

    def _report_init(self, exc: BaseException) -> None:
        self._send_status("".join(traceback.format_exception(exc)))
        self._fail(f"__init__ raised {type(exc).__name__}: {exc}", exc)

    def _send_status(self, error: str | None) -> None:
        with contextlib.suppress(PeerLostError):
            self.runtime.send_port(
                self.request.status, self.request.rank, 0, [pickle.dumps(error, protocol=5)]
            )

    def _serve_failed(self) -> None:
        """After a failure: answer every later message with a ``SupervisionError``."""
        if not self._attach(self._queue.put):
            return
        while True:
            item = self._queue.get()
            if self._forced:
                self._reject_safely(item)
                return
            if type(item) is Control:
                if item.kind is STOP:
                    self.stopped = True
                    self._reject_from_now_on()
                    item.arg()
                    return
                continue
            try:
                self._reject(item)
            except Exception:
                log.exception("actor %s dropped a malformed message", self.name)

    def _supervise_hook(self) -> Callable[..., Any] | None:
        return getattr(type(self.actor), "__supervise__", None)

    def _supervise_outcome(self, notice: Any, handled: Any) -> None:
        if isinstance(notice, MeshRestarted) or notice.restarting or handled:
            return
        event = notice.event
        self._fail(
            f"The actor {self} and all its descendants have failed (its __supervise__ did not "
            f"handle the failure of its mesh {notice.mesh_name}). The child's event was:\n"
            f"{failed_text(event.actor, event.reason)}",
            cause=event,
        )

    def _supervise_raised(self, notice: Any, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))
        if isinstance(notice, MeshRestarted) or notice.restarting:
            log.error("actor %s: __supervise__ raised on a restart notice:\n%s", self, text)
            return
        event = notice.event
        self._fail(
            f"error during handling of supervision: __supervise__ raised "
            f"{type(exc).__name__}: {exc}\nThis error occurred while handling another failure:\n"
            f"{failed_text(event.actor, event.reason)}",
            exc,
            cause=event,
        )

    def _fail(
        self, reason: str, exc: BaseException | None = None, cause: FailureEvent | None = None
    ) -> None:
        """Mark this actor failed, tell its owner, and stop the meshes it owns (not while the
        process ends with its controller: then it is being stopped)."""
        if self.failed is not None or self.stopped or supervision.is_shutting_down():
            return
        self.failed = reason
        self._failure_error = exc if exc is not None else Exception(reason)
        self._status("Stopping")
        self._status("Failed", reason)
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
        with contextlib.suppress(PeerLostError):
            self.runtime.send_port(owner, self.request.rank, 0, [pickle.dumps(event, protocol=5)])

    def undeliverable(self, envelope: UndeliverableMessageEnvelope) -> bool:
        """A message this actor sent cannot be delivered: its handler decides, else it fails."""
        handler = getattr(self.actor, "_handle_undeliverable_message", None)
        if handler is not None and handler(envelope):
            return True
        self._fail(f"a message it sent could not be delivered: {envelope.error_msg()}")
        return False

    def _finish_stop(
        self, done: Callable[[], None], cleanup: Callable[[], None] | None = None
    ) -> None:
        """After the last message: stop owned meshes, run ``cleanup`` (None: the executor has
        cleaned up already), refuse later messages."""
        self._status("Stopping")
        self.stop_owned(f"their owner {self} stopped", config.value(STOP_TIMEOUT))
        if cleanup is not None:
            cleanup()
        self.stopped = True
        self._status("Stopped", self.stop_reason or "stopped")
        self._reject_from_now_on()
        done()

    def _reject_from_now_on(self) -> None:
        """Refuse later messages, and those queued but never run, with a ``SupervisionError``."""
        self.runtime.mailbox(self.mesh_id).attach(self._reject_arriving)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._reject(item)
            except Exception:
                log.exception("actor %s dropped a malformed message", self.name)

    def _cleanup_failed(self, reason: str, exc: BaseException | None) -> None:
        if self.failed is None:
            self._fail(reason, exc)
            return
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        print(f"regency: actor {self}: {reason}\n{detail}", file=sys.stderr, flush=True)

    def _open(self, item: Delivery) -> tuple[str, PortRef | None, Point, Sequence[Part], Any, int]:
        """The method, reply port, point, payload, trace context and sender (its uid while
        telemetry is on there, else 0) of a message."""
        parts, rank, reply_override = item
        head = parts[0]
        (port,) = _PORT.unpack_from(head)
        # The pickle after the port number repeats byte for byte for every call of an endpoint
        # from one sender (wire.ENVELOPE_PORT): decode it once. (A view of a writable buffer
        # cannot be hashed: bytes.)
        key = (bytes(head[_PORT.size :]), rank)
        cached = self._envelopes.get(key)
        trace = None
        if cached is None:
            method, addr, labels, sizes, trace, sender = pickle.loads(key[0])
            if (
                type(method) is not str
                or (port and type(addr) is not str)
                or type(sender) is not int
            ):
                raise ValueError(f"malformed envelope {(method, addr, sender)!r}")
            point_key = (rank, labels, sizes)
            point = self._points.get(point_key)
            if point is None:
                if len(self._points) > _CACHE_MAX:
                    self._points.clear()
                point = self._points[point_key] = Point(rank, Extent(labels, sizes))
            cached = (method, addr, point, sender)
            if trace is None:
                if len(self._envelopes) > _CACHE_MAX:
                    self._envelopes.clear()
                self._envelopes[key] = cached
        method, addr, point, sender = cached
        if reply_override is not None:
            reply: PortRef | None = reply_override
        elif port:
            reply = tuple.__new__(PortRef, (addr, port))  # without NamedTuple's Python call
        else:
            reply = None
        return method, reply, point, parts[1:], trace, sender

    def _reject(self, item: Any, release: bool = True) -> None:
        """Answer a message the actor will never run (it failed or stopped), and ``release``
        what it carried: that unpickles the message, so only a thread that may wait for the
        lock unpickling takes does it (not the I/O thread: :meth:`_reject_arriving`; not a
        forced stop, whose actor thread may be stuck holding it)."""
        if type(item) is Control:
            if item.kind is STOP:
                item.arg()
            return
        method, reply, point, payload, _, _ = self._open(item)
        if release:
            self._release_carried(payload)
        if reply is None:
            return
        if self.failed is not None:
            why = failed_text(str(self), self.failed)
        else:
            why = stopped_text(str(self), self.stop_reason, f"actor mesh {self.name} is stopped")
        text = f"Endpoint call {self.name}.{method}() failed, {why}"
        self._reply_error(reply, point.rank, SupervisionError(text, f"{self.name}.{method}"))

    def _reject_arriving(self, item: Delivery) -> None:
        """The mailbox's sink once the actor has stopped: :meth:`_reject` on the I/O thread,
        which never unpickles a user's message (that may wait for imports), so what such a
        message carried is not released (a call that raced the stop from another sender, or
        down a casting tree: the owner refuses calls once it has asked for the stop)."""
        self._reject(item, release=False)

    @staticmethod
    def _release_carried(payload: Sequence[Part]) -> None:
        """Release what a message that will not run carried (mesh tensors' shards, published
        on this proc for it), or they would stay until the proc ends."""
        carried = codec.carried_in(payload)
        if carried:
            _hooks.tensor.load().discard_arrivals(carried)

    def _prepare(self, item: Delivery) -> tuple[Any, ...] | None:
        """Decode a message; returns None (after replying) when it cannot run."""
        self.handled += 1
        if self.failed is not None:
            self._reject(item)
            return None
        method, reply, point, payload, trace, sender = self._open(item)
        entry = self._endpoints.get(method)
        try:
            if entry is None:
                wire_name, method = method, method.partition("@")[0]  # errors name the method
                entry = plain_method(type(self.actor), wire_name, self._is_async)
            if entry is None:
                raise AttributeError(f"{self.class_name} has no endpoint {method!r}")
            fn, spec = entry
            (args, kwargs), carried = codec.loads_carrying(payload)
            if carried:
                # Mesh tensors among the arguments: the call waits for their shards first.
                fn = _hooks.tensor.load().bind_arrivals(fn, spec.is_async, carried)
        except BaseException as exc:  # a KeyboardInterrupt or SystemExit unpickling it too
            self._release_carried(payload)
            self._on_error(method, reply, point, exc)
            return None
        if spec.explicit_port:
            port: Any = Port(reply, point.rank) if reply is not None else _NullPort()
            args = (port, *args)
        return fn, spec, method, reply, point, args, kwargs, trace, sender

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
        breakpoints.endpoint_finished(error)
        if error is None:
            if reply is not None and not spec.explicit_port:
                self._reply_value(reply, point.rank, result)
        elif isinstance(error, Exception) and not spec.explicit_port:
            self._on_error(method, reply, point, error, spec)
        else:
            # A BaseException, or an explicit-port endpoint that raised instead of replying.
            self._die(method, reply, point, error)

    def _settle_traced(
        self,
        mark: tracing.Handling | None,
        received: tuple[int, int] | None,
        spec: EndpointSpec,
        method: str,
        reply: PortRef | None,
        point: Point,
        result: Any,
        error: BaseException | None,
    ) -> None:
        """:meth:`_settle`, and the message counted (and its spans ended: ``mark``) when
        telemetry is on (``received``: its sender and start, from :meth:`_prepare`)."""
        probe = tracing.probe
        if probe is None:
            self._settle(spec, method, reply, point, result, error)
            return
        if received is not None:
            probe.received(self, method, received[0], received[1], error)
        if mark is None:
            try:
                self._settle(spec, method, reply, point, result, error)
            finally:
                probe.count(self, method, error is not None)
            return
        settling = tracing.now()
        try:
            self._settle(spec, method, reply, point, result, error)
        finally:
            probe.handled(mark, self, method, settling, error)

    def _reply_value(self, reply: PortRef, rank: int, value: Any) -> None:
        """Send ``value``, or the error pickling it raised (a ``SystemExit`` from a
        ``__reduce__`` too: that call fails, the actor serves on)."""
        try:
            parts = codec.dumps(value)
        except BaseException as exc:
            self._reply_error(
                reply,
                rank,
                ActorError(exc, f"Actor call {self.name} returned a value that cannot be pickled."),
            )
            return
        try:
            self.runtime.send_port(reply, rank, 0, parts, before_post=self._before_reply)
        except PeerLostError:
            log.debug("reply to %s dropped: the caller is gone", reply.addr)
        except ValueError as exc:  # frame over the size limit
            self._reply_error(
                reply, rank, ActorError(exc, f"Actor call {self.name} reply too large.")
            )

    def _reply_error(self, reply: PortRef, rank: int, error: BaseException) -> None:
        try:
            self.runtime.send_port(reply, rank, wire.FLAG_ERROR, codec.dumps(error))
        except PeerLostError:
            log.debug("error reply to %s dropped: the caller is gone", reply.addr)

    def _on_error(
        self,
        method: str,
        reply: PortRef | None,
        point: Point,
        exc: BaseException,
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


def _nothing() -> None:
    """No step before a reply (an actor whose executor is not chosen yet)."""


class _NullPort:
    """Stands in for the response port of a message sent without one."""

    def send(self, obj: Any) -> None:
        """Drop the value."""

    def exception(self, exc: BaseException) -> None:
        """Drop the error."""
