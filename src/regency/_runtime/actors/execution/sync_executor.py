"""The executor of a sync actor: its messages, ``__supervise__`` and ``__cleanup__`` run one at
a time on the actor's thread, which reads the sockets itself while it waits. As in Monarch, a
notice for ``__supervise__`` runs once the message in hand is done, before the queued ones.

An actor with nothing queued becomes its process's inline reader just before its reply leaves,
not after: the reply wakes the caller, which on a busy machine often runs on this very CPU at
once and sends the next message before this thread is scheduled again. Had the thread not
claimed the sockets yet, the I/O thread would be woken to read that message and hand it over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from regency import config
from regency._config_keys import CLEANUP_TIMEOUT, STOP_TIMEOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.base.identity import wait_stopped
from regency._runtime.actors.execution.instance_core import (
    STOP,
    SUPERVISE,
    WAKE,
    ActorCore,
    Control,
)
from regency._runtime.actors.observe import tracing
from regency._runtime.kernel.mailbox import Delivery
from regency._runtime.kernel.waiting import poll_then_wait, thread_waker
from regency._transport.io_loop import Turn

log = logging.getLogger("regency.actor")

# An idle actor polls this long before it sleeps, while its messages come within it (a caller
# in a call_one loop sends the next call tens of µs after the reply): the next message then
# neither wakes it nor pays for waking its CPU (costly on VMs). Messages further apart (a mesh
# of many procs per core, a training step per call) turn the polling off until one comes
# quickly again, so an idle mesh spends nothing (tests/integration/test_int_wakeups.py).
IDLE_SPIN_SECONDS = 100e-6

_UNSET: Any = object()


class SyncExecutor:
    """Runs a sync actor on its thread: the strategy its :class:`ActorCore` holds."""

    is_async = False

    def __init__(self, core: ActorCore) -> None:
        self.core = core
        # The inline reader's turn this thread claimed before its last reply (see the module).
        self._turn: Turn | None = None
        # Whether the last message came within IDLE_SPIN_SECONDS of the thread going idle.
        self._quick = True
        # Wakes the thread while it waits for a message reading the sockets itself.
        self._wake: Callable[[], None] | None = None

    def serve(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Construct the actor and run its messages on this thread until it stops or fails."""
        self.core._attach(self._post_sync)
        self._serve(cls, args, kwargs)

    def _serve(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        core = self.core
        if not core._construct(cls, args, kwargs):
            core._serve_failed()
            return
        q = core._queue
        notices = core._notices
        handle = self._handle_sync
        idle = self._idle_until
        while True:
            if core._forced:
                self._release_turn()
                self._end_forced()
                return
            if notices:
                # A notice runs before the queued messages, as in Monarch (its wake-up stays
                # queued).
                self._release_turn()
                item: Any = Control(SUPERVISE, notices.popleft())
            else:
                # No exception per message: a forced stop that empties the queue from another
                # thread also puts a wake-up in it, so get() cannot block for good.
                if q.empty():
                    idle()
                else:
                    self._release_turn()
                item = q.get()
            if core._forced:
                core._reject_safely(item)
                continue
            if type(item) is Control:
                if item.kind is STOP:
                    core._finish_stop(item.arg, lambda: self._cleanup_sync(None))
                    return
                if item.kind is SUPERVISE:
                    self._supervise_sync(item.arg)
            else:
                try:
                    handle(item)
                except Exception:
                    # Only a malformed message gets here (endpoint errors are handled inside).
                    log.exception("actor %s dropped a malformed message", core.name)
            # Drop the message now, not when the next one arrives: its parts may map shared
            # memory that the sender is waiting to reuse.
            item = None
            if core.failed is not None:
                self._release_turn()
                wait_stopped(core._owned_stopping, config.value(STOP_TIMEOUT))
                self._cleanup_sync()
                core._serve_failed()
                return

    def _post_sync(self, item: Any) -> None:
        if type(item) is Control and item.kind is SUPERVISE:
            self.core._notices.append(item.arg)
            item = Control(WAKE)  # only ends a wait: the loop takes notices first
        self.core._queue.put(item)
        if self._wake is not None:
            self._wake()

    def _idle_until(self) -> None:
        """Wait for the next message reading the sockets on this thread (one wake-up, not two)."""
        me = thread_waker()
        self._wake = me.wake
        turn, self._turn = self._turn, None
        try:
            # When reading inline is not possible, the queue's get() blocks instead.
            _, self._quick = poll_then_wait(
                self.core.runtime,
                self._has_queued,
                me.fd,
                None,
                IDLE_SPIN_SECONDS,
                self._quick,
                turn,
            )
        finally:
            self._wake = None

    def _has_queued(self) -> bool:
        return not self.core._queue.empty()

    def before_reply(self) -> None:
        """Claim the sockets for this thread just before an endpoint's value is posted back."""
        # Only before a reply that cannot block (the router calls this only then): a thread
        # that claimed the sockets and then waited for a peer to take its bytes would not read
        # what that peer sends meanwhile.
        if self._turn is None and self.core._queue.empty():
            self._turn = self.core.runtime.loop.claim(thread_waker().fd)

    def _release_turn(self) -> None:
        """Give back a claimed turn: the thread has other work before it waits."""
        turn, self._turn = self._turn, None
        if turn is not None:
            self.core.runtime.loop.release(turn)

    def _end_forced(self) -> None:
        """The thread of a force-stopped actor got free: clean up late, then end."""
        self._cleanup_sync(self.core._failure_error if self.core.failed is not None else None)

    def _supervise_sync(self, notice: Any) -> None:
        hook = self.core._supervise_hook()
        token = context.set_current(context.Context(self.core, self.core.rank))
        try:
            handled = hook(self.core.actor, notice) if hook is not None else False
        except BaseException as exc:
            self.core._supervise_raised(notice, exc)
            return
        finally:
            context.CURRENT.reset(token)
        self.core._supervise_outcome(notice, handled)

    def _cleanup_sync(self, exc: BaseException | None = _UNSET) -> None:
        if exc is _UNSET:
            exc = self.core._failure_error
        hook = (
            getattr(type(self.core.actor), "__cleanup__", None)
            if self.core.actor is not None
            else None
        )
        if hook is None:
            return
        timeout = config.seconds(CLEANUP_TIMEOUT)
        started = self.core._cleanup_started = time.monotonic()
        token = context.set_current(context.Context(self.core, self.core.rank))
        try:
            hook(self.core.actor, exc)
        except BaseException as error:
            self.core._cleanup_failed(f"__cleanup__ raised {type(error).__name__}: {error}", error)
        finally:
            context.CURRENT.reset(token)
        if time.monotonic() - started > timeout:
            self.core._cleanup_failed(f"__cleanup__ took longer than {timeout:g} s", None)

    def _handle_sync(self, item: Delivery) -> None:
        core = self.core
        prepared = core._prepare(item)
        if prepared is None:
            return
        fn, spec, method, reply, point, args, kwargs, trace, sender = prepared
        probe = tracing.probe
        if probe is None:
            mark = received = None
        else:  # its spans (if traced), and its sender and start for the messages table
            mark = None if trace is None else probe.handling(trace, core.queued())
            received = (sender, tracing.now())
        token = context.CURRENT.set(context.Context(core, point))
        try:
            result = fn(core.actor, *args, **kwargs)
        except BaseException as exc:
            core._settle_traced(mark, received, spec, method, reply, point, None, exc)
            return
        finally:
            context.CURRENT.reset(token)
        if probe is None:
            core._settle(spec, method, reply, point, result, None)
        else:
            core._settle_traced(mark, received, spec, method, reply, point, result, None)
