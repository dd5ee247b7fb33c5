"""A one-shot outcome slot filled from any thread and read from any thread or event loop.

Replies usually arrive as raw message parts on the I/O thread; they are unpickled lazily, on the
thread that first asks for the value, so the I/O thread never runs user code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from regency._runtime.kernel import codec

_UNSET: Any = object()
# Guards callback lists and lazy decoding; held only for a few bytecodes at a time.
_STATE = threading.Lock()


class Pending:
    """The eventual outcome of a remote operation."""

    __slots__ = ("_callbacks", "_decode", "_error", "_raw", "_raw_error", "_value")

    def __init__(self, decode: Callable[[Any], Any] | None = None) -> None:
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._raw: Sequence[Any] | None = None
        self._raw_error = False
        self._decode = decode
        self._callbacks: list[Callable[[Pending], None]] | None = []

    # -- filling (any thread) ------------------------------------------------------------------

    def set_decoder(self, decode: Callable[[Any], Any]) -> None:
        """Transform the decoded raw value with ``decode`` (set before filling)."""
        self._decode = decode

    def _finish(self) -> bool:
        with _STATE:
            callbacks = self._callbacks
            if callbacks is None:
                return False
            self._callbacks = None
        for cb in callbacks:
            cb(self)
        return True

    def set_raw(self, parts: Sequence[Any], is_error: bool = False) -> bool:
        """Fill with undecoded message parts; returns False if already filled."""
        with _STATE:  # _finish, inline: every reply comes this way
            callbacks = self._callbacks
            if callbacks is None:
                return False
            self._raw = parts
            self._raw_error = is_error
            self._callbacks = None
        for cb in callbacks:
            cb(self)
        return True

    def set_result(self, value: Any) -> bool:
        """Fill with a value; returns False if already filled."""
        if self._callbacks is None:
            return False
        self._value = value
        return self._finish()

    def set_exception(self, error: BaseException) -> bool:
        """Fill with an error; returns False if already filled."""
        if self._callbacks is None:
            return False
        self._error = error
        return self._finish()

    # -- reading -------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._callbacks is None

    def is_done(self) -> bool:
        """:attr:`done` as a method: a ready-made condition for a wait to check."""
        return self._callbacks is None

    def wait(self, timeout: float | None) -> bool:
        """Block until done or ``timeout`` seconds pass; return whether it is done."""
        if self._callbacks is None:
            return True
        # A lock per blocking wait, not per pending: most are waited for by reading inline
        # (kernel/waiting.py) or not at all.
        gate = threading.Lock()
        gate.acquire()

        def release(_: Pending) -> None:
            gate.release()

        self.add_done_callback(release)
        if gate.acquire(timeout=-1 if timeout is None else timeout):
            return True
        self.remove_done_callback(release)  # a later wait must not find this one's callback
        return self._callbacks is None

    def failed(self) -> bool:
        """Whether the outcome is an error, known without decoding it. Only valid once done."""
        return self._raw_error if self._raw is not None else self._error is not None

    def add_done_callback(self, fn: Callable[[Pending], None]) -> None:
        """Call ``fn(self)`` once done (at once if already done), on the filling thread."""
        with _STATE:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)

    def remove_done_callback(self, fn: Callable[[Pending], None]) -> None:
        """Forget ``fn`` (added with :meth:`add_done_callback`) if it has not run: a wait that
        timed out takes its wake-up back, or a caller polling ``get(timeout)`` on a long call
        would leave one more every time."""
        with _STATE:
            callbacks = self._callbacks
            if callbacks is not None and fn in callbacks:
                callbacks.remove(fn)

    def outcome(self) -> Any:
        """The value, or raise the error. Only valid once done."""
        if self._raw is not None:
            self._materialize()
        if self._error is not None:
            raise self._error
        return self._value

    def error(self) -> BaseException | None:
        """The error, or ``None`` if it succeeded. Only valid once done."""
        if self._raw is not None:
            self._materialize()
        return self._error

    def _materialize(self) -> None:
        raw = self._raw
        if raw is None:
            return
        value: Any = _UNSET
        error: BaseException | None = None
        try:
            decoded = codec.loads_reply(raw)
            if self._decode is not None:
                decoded = self._decode(decoded)
        except BaseException as exc:  # a reply that cannot be decoded is that call's error
            error = exc
        else:
            if self._raw_error:
                error = decoded
            else:
                value = decoded
        with _STATE:
            if self._raw is raw:  # another reader may have decoded it first
                self._value = value
                self._error = error
                self._raw = None
