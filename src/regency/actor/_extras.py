"""Monarch's smaller ``monarch.actor`` functions.

Transports, ``returns_future``, and the names whose features belong to later issues (they raise
``NotImplementedError`` saying which).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, ParamSpec, TypeVar

from regency import config
from regency._config_keys import ChannelTransport
from regency._runtime import state
from regency._runtime.future import Future
from regency._runtime.pending import Pending

P = ParamSpec("P")
R = TypeVar("R")

_ENABLE_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
_enabled: ChannelTransport | str | None = None
_enabled_lock = threading.Lock()


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
                f"transport type is `{_enabled}`. Attempted to enable transport type `{check}`."
            )
        _enabled = check
    config.configure(default_transport=check)


class _Runner:
    """One daemon thread with an event loop that runs ``returns_future`` bodies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="regency-returns-future", daemon=True
                ).start()
                self._loop = loop
            return self._loop


_runner = _Runner()


def returns_future(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Future[R]]:
    """Turn an ``async def`` into a function returning a :class:`Future`.

    Sync callers use ``.get()``, asyncio callers ``await``.
    The body starts when the function is called, on a shared background event loop, in a
    copy of the caller's context variables (Monarch starts it when first observed, on the
    observer's loop).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Future[R]:
        pending = Pending()
        coro = fn(*args, **kwargs)
        ctx = contextvars.copy_context()

        async def body() -> None:
            try:
                pending.set_result(await coro)
            except BaseException as exc:
                pending.set_exception(exc)

        loop = _runner.loop()
        loop.call_soon_threadsafe(lambda: ctx.run(loop.create_task, body()))
        return Future._from_pending(pending)

    return wrapper


def _later(what: str, issue: str) -> NoReturn:
    raise NotImplementedError(f"{what} is not implemented in regency yet ({issue})")


def attach(addr: str) -> None:
    """Monarch's client bootstrap through a remote gateway: not implemented in regency.

    Regency's workers reach the controller directly, through the TCP gateway it opens when it
    attaches them, so a controller must be reachable from its hosts.
    """
    _later(f"attach({addr!r}): a client reached only through a remote gateway", "issue 18")


def debug_controller() -> NoReturn:
    """Monarch's debugger broker actor: the debugger is issue 13."""
    _later("debug_controller()", "issue 13: a debugger into actors")


def get_meter(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's OpenTelemetry meter: telemetry is issue 14."""
    _later("get_meter()", "issue 14: telemetry")


def span(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's tracing span: telemetry is issue 14."""
    _later("span()", "issue 14: telemetry")


def traced(*args: Any, **kwargs: Any) -> NoReturn:
    """Monarch's tracing decorator: telemetry is issue 14."""
    _later("traced()", "issue 14: telemetry")
