"""Hosting actors: each actor gets its own thread (and, for async actors, its own event loop),
handles one message at a time, and replies to the ports its messages name."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import queue
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from regency._runtime import codec, context, wire
from regency._runtime.endpoint_def import EndpointSpec, endpoints_of
from regency._runtime.errors import ActorError, SupervisionError
from regency._runtime.identity import InstanceBase, new_uid
from regency._runtime.mailbox import Delivery
from regency._runtime.proc import Part, PortRef, ProcRuntime
from regency._runtime.waiting import thread_eventfd, wait_until, waker
from regency._transport.transport import PeerUnreachableError
from regency.shape import Extent, Point

if TYPE_CHECKING:
    from regency._runtime.meshes import ProcMesh

log = logging.getLogger("regency.actor")

_STOP: Any = object()
_CACHE_MAX = 4096


class ClientInstance(InstanceBase):
    """The instance behind code that runs outside any actor: ``<root>`` in the controller."""

    def __init__(self, runtime: ProcRuntime, is_root: bool) -> None:
        super().__init__()
        self.uid = 1 if is_root else new_uid()
        self.name = "client" if is_root else f"client[{runtime.address}]"
        self.class_name = "RootClientActor"
        self.rank = context.empty_point()
        self.creator = None
        self.proc_id = runtime.address
        self.is_root = is_root

    @property
    def proc_mesh(self) -> ProcMesh:
        """The singleton proc mesh of this process."""
        return self.proc

    def __str__(self) -> str:
        return "<root>" if self.is_root else f"<client {self.proc_id}>"


@dataclass(frozen=True, slots=True)
class SpawnActor:
    """A request to a proc: create one actor of a mesh there."""

    mesh_id: int
    name: str
    rank: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    creator: str
    payload: bytes  # cloudpickled (cls, args, kwargs, proc_mesh)
    status: PortRef  # receives (rank, error-text-or-None) once __init__ has run
    owner: PortRef | None  # supervision reports for this mesh go here


class ActorInstance(InstanceBase):
    """One hosted actor: its mailbox sink, its thread, its endpoints."""

    def __init__(self, runtime: ProcRuntime, request: SpawnActor) -> None:
        super().__init__()
        self.runtime = runtime
        self.request = request
        self.uid = new_uid()
        self.mesh_id = request.mesh_id
        self.name = request.name
        self.class_name = "?"
        self.rank = Point(request.rank, Extent(request.labels, request.sizes))
        self.creator = request.creator
        self.proc_id = runtime.address
        self.actor: Any = None
        self.failed: str | None = None
        self.stopped = False
        self.stop_reason = ""
        self._endpoints: dict[str, tuple[Callable[..., Any], EndpointSpec]] = {}
        self._proc_mesh: ProcMesh | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake: Callable[[], None] | None = None
        self._points: dict[tuple[int, tuple[str, ...], tuple[int, ...]], Point] = {}
        self._envelopes: dict[tuple[Any, int], tuple[str, Point]] = {}
        self._thread = threading.Thread(
            target=self._main, name=f"regency-actor-{request.name}", daemon=True
        )

    # -- identity ------------------------------------------------------------------------------

    @property
    def proc_mesh(self) -> ProcMesh:
        """The proc mesh this actor was spawned on."""
        assert self._proc_mesh is not None
        return self._proc_mesh

    def __str__(self) -> str:
        return f"{self.creator}.<{self.class_name} {self.name}{self.rank}>"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the actor's thread; its constructor runs there before any message."""
        self._thread.start()

    def stop(self, done: Callable[[], None], reason: str = "stopped by client") -> None:
        """Finish queued messages, then stop; ``done`` runs on the actor thread at the end."""
        self.stop_reason = reason
        self.runtime.mailbox(self.mesh_id).post(0, 0, (_STOP, done))

    def _main(self) -> None:
        try:
            cls, args, kwargs, proc_mesh = codec.loads([self.request.payload])
            self._proc_mesh = proc_mesh
            self.class_name = f"{cls.__module__}.{cls.__qualname__}"
            for name, prop in endpoints_of(cls).items():
                self._endpoints[name] = (prop.method, prop.spec)
            is_async = any(spec.is_async for _, spec in self._endpoints.values())
        except BaseException as exc:
            self._report_init(exc)
            self._serve_failed()
            return
        if not is_async:
            self.runtime.mailbox(self.mesh_id).attach(self._post_sync)
            self._serve_sync(cls, args, kwargs)
            return
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            constructed = loop.run_until_complete(self._serve_async(cls, args, kwargs))
        finally:
            loop.close()
        if not constructed:
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
        text = "".join(traceback.format_exception(exc))
        self.failed = f"{type(exc).__name__}: {exc}"
        self._send_status(text)
        self._report_failure(f"the actor's __init__ raised {type(exc).__name__}: {exc}\n{text}")

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
            try:
                item = q.get_nowait()
            except queue.Empty:
                idle()
                item = q.get()
            if type(item) is tuple and item and item[0] is _STOP:
                self._finish_stop(item[1])
                return
            try:
                handle(item)
            except Exception:
                # Only a malformed message gets here (endpoint errors are handled inside).
                log.exception("actor %s dropped a malformed message", self.name)
            # Drop the message now, not when the next one arrives: its parts may map shared
            # memory that the sender is waiting to reuse.
            item = None

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
        self.runtime.mailbox(self.mesh_id).attach(self._queue.put)
        while True:
            item = self._queue.get()
            if type(item) is tuple and item and item[0] is _STOP:
                self._finish_stop(item[1])
                return
            try:
                self._reject(item)
            except Exception:
                log.exception("actor %s dropped a malformed message", self.name)

    async def _serve_async(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if not self._construct(cls, args, kwargs):
            return False
        loop = asyncio.get_running_loop()
        inbox: deque[Any] = deque()
        wake = asyncio.Event()
        scheduled = [False]

        def post(item: Any) -> None:
            inbox.append(item)
            if not scheduled[0]:
                scheduled[0] = True
                loop.call_soon_threadsafe(wake.set)

        self.runtime.mailbox(self.mesh_id).attach(post)
        tasks: set[asyncio.Task[Any]] = set()
        while True:
            while inbox:
                item = inbox.popleft()
                if type(item) is tuple and item and item[0] is _STOP:
                    for task in tasks:
                        task.cancel()
                    self._finish_stop(item[1])
                    return True
                try:
                    await self._handle_async(item, tasks)
                except Exception:
                    log.exception("actor %s dropped a malformed message", self.name)
                item = None
            scheduled[0] = False
            if inbox:
                continue
            self.runtime.flush()
            wake.clear()
            if inbox:
                continue
            await wake.wait()

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

    def _reject(self, item: Delivery) -> None:
        """Answer a message the actor will never run (it failed or stopped)."""
        if type(item) is tuple and item and item[0] is _STOP:
            item[1]()
            return
        method, reply, point, _ = self._open(item)
        if reply is None:
            return
        if self.failed is not None:
            text = (
                f"Endpoint call {self.name}.{method}() failed, The actor {self} and all its "
                f"descendants have failed: {self.failed}"
            )
        else:
            text = (
                f"Endpoint call {self.name}.{method}() failed, actor mesh {self.name} is "
                f"stopped: {self.stop_reason}"
            )
        self._reply_error(reply, point.rank, SupervisionError(text, f"{self.name}.{method}"))

    def _finish_stop(self, done: Callable[[], None]) -> None:
        """After the last message: answer later ones with an error, then report done."""
        self.stopped = True
        self.runtime.mailbox(self.mesh_id).attach(self._reject)
        done()

    def _prepare(self, item: Delivery) -> tuple[Any, ...] | None:
        """Decode a message; returns None (after replying) when it cannot run."""
        if self.failed is not None:
            self._reject(item)
            return None
        method, reply, point, payload = self._open(item)
        entry = self._endpoints.get(method)
        try:
            if entry is None:
                raise AttributeError(f"{self.class_name} has no endpoint {method!r}")
            args, kwargs = codec.loads(payload)
        except Exception as exc:
            self._on_error(method, reply, point, exc)
            return None
        fn, spec = entry
        if spec.explicit_port:
            from regency._runtime.ports import Port

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

    async def _handle_async(self, item: Delivery, tasks: set[asyncio.Task[Any]]) -> None:
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
            task.add_done_callback(tasks.discard)
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
                self._reply_value(reply, point.rank, result)
        elif isinstance(error, Exception):
            self._on_error(method, None if spec.explicit_port else reply, point, error, spec)
        else:
            self._die(method, reply, point, error)

    # -- replies and failures ------------------------------------------------------------------

    def _reply_value(self, reply: PortRef, rank: int, value: Any) -> None:
        try:
            parts = codec.dumps(value)
        except Exception as exc:
            self._reply_error(
                reply,
                rank,
                ActorError(exc, f"Actor call {self.name} returned a value that cannot be pickled."),
            )
            return
        try:
            self.runtime.send_port(reply, rank, 0, parts)
        except PeerUnreachableError:
            log.debug("reply to %s dropped: the caller is gone", reply.addr)
        except ValueError as exc:  # frame over the size limit
            self._reply_error(
                reply, rank, ActorError(exc, f"Actor call {self.name} reply too large.")
            )

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
        # Nobody to report to (broadcast, send without a port, explicit port): the actor dies.
        text = "".join(traceback.format_exception(exc))
        self.failed = f"{type(exc).__name__}: {exc}"
        self._report_failure(
            f"endpoint {method} raised {type(exc).__name__}: {exc} with no reply path\n{text}"
        )

    def _die(self, method: str, reply: PortRef | None, point: Point, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        text = "".join(traceback.format_exception(exc))
        self._report_failure(f"endpoint {method} raised {type(exc).__name__}: {exc}\n{text}")
        if reply is not None:
            self._reply_error(
                reply,
                point.rank,
                SupervisionError(
                    f"Endpoint call {self.name}.{method}() failed, The actor {self} and all its "
                    f"descendants have failed: {self.failed}",
                    f"{self.name}.{method}",
                ),
            )

    def _report_failure(self, reason: str) -> None:
        from regency._runtime.supervision import report_failure

        report_failure(self, reason)


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
