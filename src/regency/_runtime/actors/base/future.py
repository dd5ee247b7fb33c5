"""``Future``: the result of a remote operation, usable from sync code and from asyncio."""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.waiting import wait_pending

R = TypeVar("R")
_UNSET: Any = object()


class Future(Generic[R]):
    """The eventual value of a remote call.

    ``get(timeout)`` blocks the calling thread; ``await future`` suspends a coroutine. The
    outcome is cached: every ``get`` or ``await`` sees the same value or raises the same
    exception. A timeout never cancels the remote work, and a later ``get`` still sees the result.
    Futures are made by regency, not constructed directly.
    """

    __slots__ = ("_pending", "_transform", "_value")
    _pending: Pending
    _transform: Callable[[Any], Any] | None
    _value: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Future cannot be constructed directly; regency operations return one")

    @classmethod
    def _from_pending(
        cls, pending: Pending, transform: Callable[[Any], Any] | None = None
    ) -> Future[Any]:
        fut: Future[Any] = object.__new__(cls)
        fut._pending = pending
        fut._transform = transform
        fut._value = _UNSET
        return fut

    @classmethod
    def _resolved(cls, value: Any) -> Future[Any]:
        pending = Pending()
        pending.set_result(value)
        return cls._from_pending(pending)

    @classmethod
    def _failed(cls, error: BaseException) -> Future[Any]:
        pending = Pending()
        pending.set_exception(error)
        return cls._from_pending(pending)

    def _outcome(self) -> R:
        if self._value is not _UNSET:
            return self._value  # type: ignore[no-any-return]
        value = self._pending.outcome()
        if self._transform is not None:
            value = self._transform(value)  # may raise; the pending outcome stays cached
        self._value = value
        return value  # type: ignore[no-any-return]

    def get(self, timeout: float | None = None) -> R:
        """Block until the value is known and return it (or raise the remote error).

        ``timeout`` (seconds) raises ``TimeoutError`` without cancelling anything.
        """
        if timeout is not None and (not math.isfinite(timeout) or timeout < 0):
            raise ValueError(
                f"invalid timeout {timeout}: expected a non-negative, finite number of seconds"
            )
        # As in Monarch, the warning does not depend on whether the reply has arrived yet (a
        # race); only a value already read is returned silently. (The low-level lookup returns
        # None where get_running_loop raises: no exception per call.)
        if self._value is _UNSET and asyncio._get_running_loop() is not None:
            warnings.warn(
                "Future.get() called from within an active event loop blocks the loop; "
                "use 'await' instead",
                UserWarning,
                stacklevel=2,
            )
        if self._value is _UNSET and not wait_pending(self._pending, timeout):
            raise TimeoutError(f"no result within {timeout} s (the remote work goes on)")
        return self._outcome()

    def _wait_quietly(self, timeout: float) -> BaseException | None:
        """Block until done and return the error (``None`` on success), without ``get``'s
        warning inside an event loop: for regency's own calls that block by contract."""
        if not wait_pending(self._pending, timeout):
            return TimeoutError(f"no result within {timeout} s (the remote work goes on)")
        try:
            self._outcome()
        except Exception as exc:
            return exc
        return None

    def result(self, timeout: float | None = None) -> R:
        """Alias of :meth:`get`."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block like :meth:`get`; return the error instead of raising it (``None`` on success)."""
        try:
            self.get(timeout)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and not self._pending.done:
                raise
            return exc
        return None

    def done(self) -> bool:
        """Whether the outcome is known."""
        return bool(self._pending.done)

    def as_asyncio(self) -> asyncio.Future[R]:
        """An ``asyncio.Future`` on the running loop that completes with this future."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("as_asyncio() requires a running asyncio event loop.") from None
        afut: asyncio.Future[R] = loop.create_future()

        def transfer() -> None:
            if afut.done():
                return
            try:
                afut.set_result(self._outcome())
            except BaseException as exc:
                afut.set_exception(exc)

        def on_done(_: Pending) -> None:
            if loop.is_closed():
                return
            loop.call_soon_threadsafe(transfer)

        if self._pending.done:
            transfer()
        else:
            self._pending.add_done_callback(on_done)
        return afut

    def __await__(self) -> Generator[Any, None, R]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ValueError("a Future can only be awaited inside a running event loop") from None
        return self.as_asyncio().__await__()

    def __repr__(self) -> str:
        state = "done" if self._pending.done else "pending"
        return f"<regency Future {state}>"


class CoroutineFuture(Future[R]):
    """A :class:`Future` that is also a coroutine, for the methods Monarch declares ``async``.

    Monarch's ``ProcMesh.logging_option`` (and its siblings) return a coroutine, so a Monarch
    program passes the result to ``asyncio.run`` or awaits it; a regency program may call
    ``get()`` on it. This object serves all three: the work starts when the method is called
    (as every regency operation does), ``get()`` blocks for it, ``await`` suspends for it and
    ``asyncio.run`` accepts it (it has a coroutine's ``send``/``throw``/``close``). It can be
    driven as a coroutine once, like any coroutine.
    """

    __slots__ = ("_driver",)
    _driver: Generator[Any, None, R] | None

    @classmethod
    def _from_pending(
        cls, pending: Pending, transform: Callable[[Any], Any] | None = None
    ) -> CoroutineFuture[Any]:
        fut = super()._from_pending(pending, transform)
        assert isinstance(fut, CoroutineFuture)
        fut._driver = None
        return fut

    @classmethod
    def _resolved(cls, value: Any) -> CoroutineFuture[Any]:
        fut = super()._resolved(value)
        assert isinstance(fut, CoroutineFuture)
        return fut

    @classmethod
    def _failed(cls, error: BaseException) -> CoroutineFuture[Any]:
        fut = super()._failed(error)
        assert isinstance(fut, CoroutineFuture)
        return fut

    def _drive(self) -> Generator[Any, None, R]:
        if self._driver is None:
            self._driver = self.__await__()
        return self._driver

    def send(self, value: Any) -> Any:
        """Drive the coroutine one step (what an event loop's task does)."""
        return self._drive().send(value)

    def throw(self, *exc: Any) -> Any:
        """Raise ``exc`` where the coroutine waits (a task's cancellation)."""
        return self._drive().throw(*exc)

    def close(self) -> None:
        """Close the coroutine; the work it stands for goes on."""
        if self._driver is not None:
            self._driver.close()
