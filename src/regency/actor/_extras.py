"""Monarch's smaller ``monarch.actor`` functions.

Transports, ``returns_future``, the debugger's broker, and ``attach`` (which raises
``NotImplementedError`` saying why). ``span``, ``traced`` and ``get_meter`` are
:mod:`regency.observe.telemetry`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from regency import config
from regency._config_keys import ChannelTransport
from regency._runtime.actors.base.future import Future
from regency._runtime.kernel import state
from regency._runtime.kernel.pending import Pending

P = ParamSpec("P")
R = TypeVar("R")

_ENABLE_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
# How Monarch's errors name each transport (its Rust ``Display``).
_MONARCH_NAMES = {
    ChannelTransport.TcpWithLocalhost: "tcp(Localhost)",
    ChannelTransport.TcpWithHostname: "tcp(Hostname)",
    ChannelTransport.MetaTlsWithHostname: "metatls(Hostname)",
    ChannelTransport.MetaTlsWithIpV6: "metatls(IpV6)",
    ChannelTransport.MetaQuicWithHostname: "metaquic(Hostname)",
    ChannelTransport.MetaQuicWithIpV6: "metaquic(IpV6)",
    ChannelTransport.Quic: "quic",
    ChannelTransport.Tls: "tls",
    ChannelTransport.Local: "local",
    ChannelTransport.Unix: "unix",
}
_enabled: ChannelTransport | str | None = None
_enabled_lock = threading.Lock()


def _monarch_name(transport: ChannelTransport | str) -> str:
    """``unix``, ``tcp(Hostname)``, or an address as ``tcp:127.0.0.1:0``, as Monarch names them."""
    if isinstance(transport, ChannelTransport):
        return _MONARCH_NAMES[transport]
    return transport.replace("://", ":", 1)


def enable_transport(transport: ChannelTransport | str) -> None:
    """Choose Monarch's channel transport; call it before anything else of the actor API.

    Takes a :class:`ChannelTransport`, a shortcut (``"tcp"``, ``"ipc"``, ``"metatls"``,
    ``"metatls-hostname"``, ``"tls"``) or an explicit address such as ``"tcp://127.0.0.1:0"``,
    and records it as ``default_transport``. Once the runtime has started, enabling the same
    one again is a no-op and any other raises ``RuntimeError``, as does enabling a second,
    different one. Regency itself picks the transport per peer (unix sockets on one machine,
    TCP across machines, authenticated either way), so the choice changes nothing else.
    """
    global _enabled
    if isinstance(transport, str):
        transport = _ENABLE_SHORTCUTS.get(transport, transport)
    check = config._coerce("default_transport", transport)
    with _enabled_lock:
        if state.existing() is not None:
            if _enabled == check:
                return
            raise RuntimeError(
                "`enable_transport()` must be called before any other calls in the monarch API. "
                "If it isn't called, we will implicitly call "
                "`monarch.enable_transport(ChannelTransport.Unix)` on the first monarch call."
            )
        if _enabled is not None and _enabled != check:
            raise RuntimeError(
                "Only one transport type may be enabled at one time. Currently enabled "
                f"transport type is `{_monarch_name(_enabled)}`. Attempted to enable transport "
                f"type `{_monarch_name(check)}`."
            )
        _enabled = check
    config.configure(default_transport=check)


class _BodyFuture(Future[R]):
    """The future of a ``returns_future`` call: the body runs when first observed."""

    __slots__ = ("_body", "_context", "_lock")

    _body: Coroutine[Any, Any, R] | None
    _context: contextvars.Context
    _lock: threading.Lock

    @classmethod
    def _of(cls, body: Coroutine[Any, Any, R]) -> _BodyFuture[R]:
        fut: _BodyFuture[R] = cls._from_pending(Pending())  # type: ignore[assignment]
        fut._body = body
        fut._context = contextvars.copy_context()
        fut._lock = threading.Lock()
        return fut

    def _take(self) -> Coroutine[Any, Any, R] | None:
        with self._lock:
            body, self._body = self._body, None
        return body

    async def _run(self, body: Coroutine[Any, Any, R]) -> None:
        try:
            self._pending.set_result(await body)
        except BaseException as exc:
            self._pending.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    def _run_here(self, body: Coroutine[Any, Any, R], timeout: float | None) -> None:
        loop = asyncio.new_event_loop()
        try:
            task = self._context.run(loop.create_task, self._run(body))
            done, _ = loop.run_until_complete(asyncio.wait([task], timeout=timeout))
            if not done:
                self._pending.set_exception(
                    TimeoutError("returns_future operation did not finish in time")
                )
                task.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
        finally:
            loop.close()

    def get(self, timeout: float | None = None) -> R:
        """Block like :meth:`Future.get`, first running the body if nothing started it.

        The body runs on this thread (on a helper thread inside a running loop); a timeout
        cancels a body this call started.
        """
        body = self._take()
        if body is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                self._run_here(body, timeout)
            else:
                threading.Thread(
                    target=self._run_here, args=(body, None), name="returns_future"
                ).start()
        return super().get(timeout)

    def as_asyncio(self) -> asyncio.Future[R]:
        """Start the body as a task on the running loop if nothing has started it."""
        loop = asyncio.get_running_loop()
        body = self._take()
        if body is not None:
            _TASKS.add(task := self._context.run(loop.create_task, self._run(body)))
            task.add_done_callback(_TASKS.discard)
        return super().as_asyncio()

    def __del__(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:
            body.close()


_TASKS: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references to tasks


def returns_future(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Future[R]]:
    """Turn an ``async def`` into a function returning a :class:`Future`.

    Sync callers use ``.get()``, asyncio callers ``await``. As in Monarch, the body runs when
    the future is first observed, in a copy of the caller's context variables: ``await`` runs
    it on the awaiting loop, ``get()`` on the calling thread's own loop (a timeout cancels it),
    or on a helper thread when called inside a running loop. A future never observed never
    runs its body.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Future[R]:
        return _BodyFuture._of(fn(*args, **kwargs))

    return wrapper


def attach(addr: str) -> None:
    """Monarch's client bootstrap through a remote gateway: not implemented in regency.

    Regency's workers reach the controller directly, through the TCP gateway it opens when it
    attaches them, so a controller must be reachable from its hosts.
    """
    raise NotImplementedError(
        f"attach({addr!r}): a client reached only through a remote gateway is not implemented "
        "in regency"
    )


def debug_controller() -> Any:
    """The job's debugger broker (Monarch's ``DebugController``), spawned on first use.

    It is an actor mesh of one in the controller's process. Its ``list`` endpoint gives the
    ranks paused in ``breakpoint()``; ``regency debug`` attaches to them
    (``docs/observability.md``).
    """
    from regency.observe.pdb_session import debug_controller as controller

    return controller()
