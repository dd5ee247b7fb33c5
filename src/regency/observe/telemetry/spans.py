"""Monarch's ``span(name)`` and ``@traced``: user spans in the traces of calls.

A span started inside an endpoint is a child of that message's ``handle`` span, and calls made
inside a span are its children, so a step of a training loop wrapped in ``span("step")`` is
one trace holding every call it made. With telemetry off (or outside any traced call, once the
process's budget of new traces is spent) a span costs one check and records nothing.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

from regency._lowlevel import tracing

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Span:
    """One span: use it as a context manager (``with span("load"):``)."""

    __slots__ = ("_ids", "_probe", "_start", "_token", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"span() takes a str name, got {type(name).__name__}")
        self.name = name
        self._probe: tracing.Probe | None = None
        self._token: contextvars.Token[tuple[int, int] | None] | None = None
        self._ids = (0, 0, 0)
        self._start = 0

    def __enter__(self) -> Span:
        probe = tracing.probe
        if probe is None:
            return self
        now = time.time_ns()
        parent = tracing.CURRENT.get()
        if parent is not None:
            trace_id, parent_id = parent
        elif probe.new_trace():
            trace_id, parent_id = tracing.new_trace_id(), 0
        else:
            return self
        span_id = tracing.new_span_id()
        self._probe = probe
        self._ids = (trace_id, span_id, parent_id)
        self._token = tracing.CURRENT.set((trace_id, span_id))
        self._start = now
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        probe, token = self._probe, self._token
        if probe is None or token is None:
            return
        self._probe = self._token = None
        tracing.CURRENT.reset(token)
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        trace_id, span_id, parent_id = self._ids
        probe.records.append(
            (tracing.SPAN, self.name, None, trace_id, span_id, parent_id, self._start,
             time.time_ns(), error)
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"span({self.name!r})"


def span(name: str) -> Span:
    """A span named ``name`` for a ``with`` block (Monarch's ``span``)."""
    return Span(name)


@overload
def traced(fn: Callable[_P, _R]) -> Callable[_P, _R]: ...
@overload
def traced(*, name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...
def traced(
    fn: Callable[_P, _R] | None = None, *, name: str | None = None
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Wrap each call of a function (sync or async) in a span (Monarch's ``traced``).

    ``@traced`` names the span after the function, ``@traced(name="...")`` as given.
    """

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        if not callable(fn):
            raise TypeError(f"traced() wraps a function, got {type(fn).__name__}")
        label = name if name is not None else fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                with Span(label):
                    return await fn(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with Span(label):
                return fn(*args, **kwargs)

        return run

    if fn is not None:
        return decorate(fn)
    return decorate
