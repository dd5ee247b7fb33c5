"""The executor of an async actor: its own event loop on the actor's thread, where endpoints,
``__supervise__`` and ``__cleanup__`` are awaited (concurrent endpoints as tasks).

``__supervise__`` runs in a task of its own beside the message loop (as in Monarch): at any await
of an endpoint, or between messages, and before the next queued message starts. When its verdict
fails the actor, the endpoint in flight is cancelled and its caller gets the failure at once."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from regency import config
from regency._config_keys import CLEANUP_TIMEOUT, STOP_TIMEOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.base.endpoint_def import EndpointSpec
from regency._runtime.actors.base.identity import wait_stopped_async
from regency._runtime.actors.execution.instance_core import (
    STOP,
    SUPERVISE,
    WAKE,
    ActorCore,
    Control,
)
from regency._runtime.actors.observe import tracing
from regency._runtime.kernel.mailbox import Delivery
from regency._runtime.kernel.refs import PortRef
from regency.shape import Point

log = logging.getLogger("regency.actor")


class AsyncExecutor:
    """Runs an async actor in an event loop on its thread: the strategy its :class:`ActorCore`
    holds."""

    is_async = True

    def __init__(self, core: ActorCore) -> None:
        self.core = core

    def serve(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Construct the actor and run its messages in a new event loop on this thread until it
        stops or fails (then answer later messages with the failure)."""
        loop = new_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(cls, args, kwargs))
        finally:
            loop.close()
        if not self.core.stopped:
            self.core._serve_failed()

    def before_reply(self) -> None:
        """Nothing: the actor's loop, not its thread, waits for messages."""

    async def _serve(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        core = self.core
        if not core._construct(cls, args, kwargs):
            return
        loop = asyncio.get_running_loop()
        inbox: deque[Any] = deque()
        wake = asyncio.Event()
        scheduled = [False]
        main = asyncio.current_task()
        in_endpoint = [False]

        def failed_by_notice() -> None:
            # The owner fails at once: cut the endpoint in flight short (its caller gets the
            # failure, see _run_async), or wake the loop to see the failure.
            if in_endpoint[0] and main is not None:
                main.cancel()
            else:
                wake.set()

        notices = _Notices(self, loop, failed_by_notice)

        def post(item: Any) -> None:
            if type(item) is Control and item.kind is SUPERVISE:
                notices.post(item.arg)
                return
            inbox.append(item)
            if not scheduled[0]:
                scheduled[0] = True
                loop.call_soon_threadsafe(wake.set)

        core._inbox = inbox
        tasks: set[asyncio.Task[Any]] = set()
        if not core._attach(post):
            await notices.close()
            await self._end_forced_async(tasks)
            return
        while core.failed is None and not core._forced:
            while inbox and core.failed is None:
                if notices.waiting():
                    await notices.start_waiting()
                    continue
                item = inbox.popleft()
                if core._forced:
                    core._reject_safely(item)
                    break
                if type(item) is Control:
                    if item.kind is STOP:
                        await notices.close()
                        await self._cancel_tasks(tasks)
                        await wait_stopped_async(
                            core.stop_owned(f"their owner {self} stopped", None),
                            config.value(STOP_TIMEOUT),
                        )
                        await self._cleanup_async(None)
                        self._requeue(inbox)
                        core._finish_stop(item.arg)
                        return
                    continue
                in_endpoint[0] = True
                try:
                    await self._handle_async(item, tasks, post)
                except asyncio.CancelledError:
                    if core.failed is None:
                        raise
                    _uncancel(main)  # failed_by_notice's cancel, now taken
                except Exception:
                    log.exception("actor %s dropped a malformed message", core.name)
                finally:
                    in_endpoint[0] = False
                item = None
            if core.failed is not None or core._forced:
                break
            scheduled[0] = False
            if inbox:
                continue
            core.runtime.flush()
            wake.clear()
            if inbox:
                continue
            await wake.wait()
        await notices.close()
        if core._forced:
            await self._end_forced_async(tasks)
            return
        await self._cancel_tasks(tasks)
        await wait_stopped_async(core._owned_stopping, config.value(STOP_TIMEOUT))
        await self._cleanup_async(core._failure_error)
        # Hand what is still queued to the failed actor's loop, in order.
        self._requeue(inbox)

    def _requeue(self, inbox: deque[Any]) -> None:
        """Move the async loop's leftover messages to the thread queue, keeping their order."""
        if not self.core._attach(self.core._queue.put):
            self.core._reject_queued()
            return
        while inbox:
            self.core._queue.put(inbox.popleft())

    async def _end_forced_async(self, tasks: set[asyncio.Task[Any]]) -> None:
        """:meth:`_end_forced` for an async actor."""
        await self._cancel_tasks(tasks)
        self.core._reject_queued()
        await self._cleanup_async(
            self.core._failure_error if self.core.failed is not None else None
        )

    @staticmethod
    async def _cancel_tasks(tasks: set[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise_async(self, notice: Any, notices: _Notices) -> None:
        hook = self.core._supervise_hook()
        context.set_current(context.Context(self.core, self.core.rank))
        try:
            handled = hook(self.core.actor, notice) if hook is not None else False
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as exc:
            if notices.closing and isinstance(exc, asyncio.CancelledError):
                raise  # the actor stops or failed: no verdict
            self.core._supervise_raised(notice, exc)
            return
        self.core._supervise_outcome(notice, handled)

    async def _cleanup_async(self, exc: BaseException | None) -> None:
        hook = (
            getattr(type(self.core.actor), "__cleanup__", None)
            if self.core.actor is not None
            else None
        )
        if hook is None:
            return
        timeout = config.seconds(CLEANUP_TIMEOUT)
        self.core._cleanup_started = time.monotonic()
        context.set_current(context.Context(self.core, self.core.rank))
        try:
            # A sync hook is allowed on an actor whose only async parts are hooks.
            outcome = hook(self.core.actor, exc)
            if inspect.isawaitable(outcome):
                await asyncio.wait_for(outcome, timeout)
        except asyncio.TimeoutError:
            self.core._cleanup_failed(f"__cleanup__ took longer than {timeout:g} s", None)
        except BaseException as error:
            self.core._cleanup_failed(f"__cleanup__ raised {type(error).__name__}: {error}", error)

    async def _handle_async(
        self, item: Delivery, tasks: set[asyncio.Task[Any]], post: Callable[[Any], None]
    ) -> None:
        prepared = self.core._prepare(item)
        if prepared is None:
            return
        fn, spec, method, reply, point, args, kwargs, trace, sender = prepared
        context.set_current(context.Context(self.core, point))
        if spec.concurrent:
            task = asyncio.ensure_future(
                self._run_async(fn, spec, method, reply, point, args, kwargs, trace, sender)
            )
            tasks.add(task)

            def finished(task: asyncio.Task[Any]) -> None:
                tasks.discard(task)
                if self.core.failed is not None:
                    post(Control(WAKE))  # let the loop see the failure

            task.add_done_callback(finished)
            return
        await self._run_async(fn, spec, method, reply, point, args, kwargs, trace, sender)

    async def _run_async(
        self,
        fn: Callable[..., Any],
        spec: EndpointSpec,
        method: str,
        reply: PortRef | None,
        point: Point,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        trace: Any = None,
        sender: int = 0,
    ) -> None:
        probe = tracing.probe
        if probe is None:
            mark = received = None
        else:  # its spans (if traced), and its sender and start for the messages table
            mark = None if trace is None else probe.handling(trace, self.core.queued())
            received = (sender, tracing.now())
        try:
            result = await fn(self.core.actor, *args, **kwargs)
        except asyncio.CancelledError as exc:
            if mark is not None:
                tracing.Probe.abandon(mark)
            if self.core.failed is not None and reply is not None:
                self.core._die(method, reply, point, exc)  # the actor failed under the call
            raise
        except BaseException as exc:
            self.core._settle_traced(mark, received, spec, method, reply, point, None, exc)
            return
        self.core._settle_traced(mark, received, spec, method, reply, point, result, None)


class _Notices:
    """The task that runs an async actor's ``__supervise__`` for each notice, one at a time, on
    the actor's loop beside its messages."""

    def __init__(
        self,
        executor: AsyncExecutor,
        loop: asyncio.AbstractEventLoop,
        failed: Callable[[], None],
    ) -> None:
        self._executor = executor
        self._core = executor.core
        self._loop = loop
        self._failed = failed  # called when a verdict failed the actor
        self._queue = executor.core._notices
        self._running = False
        self.closing = False
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run())

    def post(self, notice: Any) -> None:
        """Queue a notice (from any thread)."""
        self._queue.append(notice)
        self._loop.call_soon_threadsafe(self._wake.set)

    def waiting(self) -> bool:
        """Whether a notice waits while no ``__supervise__`` runs."""
        return bool(self._queue) and not self._running

    async def start_waiting(self) -> None:
        """Let the waiting notices start before the next message, as Monarch does: each
        ``__supervise__`` runs to its end, or to an await (then messages go on beside it)."""
        while self.waiting() and self._core.failed is None:
            self._wake.set()
            await asyncio.sleep(0)

    async def close(self) -> None:
        """Handle no more notices; a ``__supervise__`` still awaiting is cancelled, without a
        verdict (the actor stops or failed)."""
        self.closing = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        core = self._core
        while core.failed is None:
            while self._queue:
                self._running = True
                try:
                    await self._executor._supervise_async(self._queue.popleft(), self)
                finally:
                    self._running = False
                if core.failed is not None:
                    self._failed()
                    return
            self._wake.clear()
            if not self._queue:
                await self._wake.wait()


def _uncancel(task: asyncio.Task[Any] | None) -> None:
    """Take back a cancellation the task caught (Python 3.11+ counts them)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
