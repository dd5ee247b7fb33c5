"""The runtime's telemetry seam: the one check on the hot path, and what it records.

Every hook in the runtime reads :data:`probe` once and does nothing else while it is ``None``
(telemetry off, the default). When ``regency.observe.telemetry`` switches telemetry on in this
process it installs a :class:`Probe`, and the hooks append one small tuple per message to
``probe.records``: the sender one per call or cast (:data:`CALL`), the receiver one per handled
message (:data:`HANDLED`). Turning those into spans and metrics, shipping them to the
controller and storing them happens off the hot path, on the telemetry layer's own thread.

Traces: a call made inside a traced handler or span (:data:`CURRENT`) joins that trace; any
other call starts a new trace if the process's budget of new traces per second allows
(a token bucket), otherwise it is only counted. A traced message carries ``(trace id, send
span id, send time)`` in its envelope; an untraced one carries ``None`` there.
"""

from __future__ import annotations

import contextvars
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from regency import _plugins, config
from regency._runtime.kernel import wire
from regency._runtime.kernel.pending import Pending

_now = time.time_ns
_bits = random.getrandbits

# The span that calls and user spans started here belong to: (trace id, span id).
CURRENT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "regency_span", default=None
)

# Record kinds (the first field of every record).
CALL = 0  # (CALL, name, start, sent, end, ndest, nbytes, error, trace); end 0: no reply
HANDLED = 1  # (HANDLED, actor, method, trace, start, settle, end, depth, error text)
SPAN = 2  # (SPAN, name, actor, trace id, span id, parent id, start, end, error text)
FAILURE = 3  # (FAILURE, actor, text, time)
RESTART = 4  # (RESTART, actor mesh, ranks, time)
MEASURE = 5  # (MEASURE, instrument, kind, value, attributes, time)

probe: Probe | None = None
"""This process's probe while telemetry is on (installed by ``regency.observe.telemetry``)."""


class Outgoing:
    """One call or cast being sent: its endpoint, start, trace, and what its envelope carries.

    ``trace`` is ``(trace id, call span id, send span id, parent span id)`` when traced.
    """

    __slots__ = ("name", "nbytes", "ndest", "records", "sent", "start", "trace", "wire")

    def __init__(
        self,
        records: deque[tuple[Any, ...]],
        name: str,
        start: int,
        trace: tuple[int, int, int, int] | None,
    ) -> None:
        self.records = records
        self.name = name
        self.start = start
        self.trace = trace
        self.wire = None if trace is None else (trace[0], trace[2], start)
        self.sent = self.ndest = self.nbytes = 0

    def replied(self, pending: Pending, gather: bool = False) -> None:
        """The call's outcome is in (on the thread that filled ``pending``)."""
        end = _now()
        error = pending.failed()
        if gather and not error:
            error = any(flags & wire.FLAG_ERROR for _, flags, _ in pending.outcome())
        self.records.append(
            (
                CALL,
                self.name,
                self.start,
                self.sent,
                end,
                self.ndest,
                self.nbytes,
                error,
                self.trace,
            )
        )


class Handling:
    """One message an actor is handling: its trace (with the handle span's id) and start."""

    __slots__ = ("depth", "start", "token", "trace")

    def __init__(self, trace: tuple[int, int, int, int] | None, depth: int) -> None:
        self.trace = trace
        self.depth = depth
        self.token = None if trace is None else CURRENT.set((trace[0], trace[3]))
        self.start = _now()


class Probe:
    """What the hooks call while telemetry is on; ``records`` is drained by the collector."""

    def __init__(self, traces_per_s: float, tracing: bool) -> None:
        self.records: deque[tuple[Any, ...]] = deque()
        self.tracing = tracing
        self._rate = traces_per_s / 1e9  # tokens per nanosecond
        self._burst = max(1.0, traces_per_s)
        self._tokens = self._burst
        self._last = _now()

    # -- sampling ------------------------------------------------------------------------------

    def new_trace(self, now: int) -> bool:
        """Whether a call or span with no traced parent starts a trace (the token bucket)."""
        if not self.tracing:
            return False
        tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    # -- the sender ----------------------------------------------------------------------------

    def begin(self, name: str) -> Outgoing:
        """A call or cast to ``name`` (``<actor mesh>.<endpoint>``) is about to be sent."""
        now = _now()
        parent = CURRENT.get()
        if parent is not None:
            trace_id, parent_id = parent
        elif self.new_trace(now):
            trace_id, parent_id = _bits(128), 0
        else:
            return Outgoing(self.records, name, now, None)
        return Outgoing(self.records, name, now, (trace_id, _bits(64), _bits(64), parent_id))

    def sent(
        self, out: Outgoing, nbytes: int, ndest: int, pending: Pending | None, gather: bool
    ) -> None:
        """``out`` went to ``ndest`` actors; ``pending`` completes with its reply (or None)."""
        out.sent = _now()
        out.nbytes = nbytes
        out.ndest = ndest
        if pending is None:
            self.records.append(
                (CALL, out.name, out.start, out.sent, 0, ndest, nbytes, False, out.trace)
            )
        elif gather:
            pending.add_done_callback(lambda p: out.replied(p, True))
        else:
            pending.add_done_callback(out.replied)

    # -- the receiver --------------------------------------------------------------------------

    def handling(self, wire_trace: tuple[int, int, int] | None, depth: int) -> Handling:
        """An actor starts handling a message whose envelope carried ``wire_trace``."""
        if wire_trace is None:
            return Handling(None, depth)
        trace_id, send_id, sent = wire_trace
        return Handling((trace_id, send_id, sent, _bits(64)), depth)

    def settle(
        self,
        mark: Handling,
        core: Any,
        method: str,
        settle: Callable[[], None],
        error: BaseException | None,
    ) -> None:
        """Run ``settle`` (the reply, or the failure) and record the message as handled."""
        settling = _now()
        try:
            settle()
        finally:
            if mark.token is not None:
                CURRENT.reset(mark.token)
            text = None if error is None else f"{type(error).__name__}: {error}"
            self.records.append(
                (HANDLED, core, method, mark.trace, mark.start, settling, _now(), mark.depth, text)
            )

    # -- the rest ------------------------------------------------------------------------------

    def failure(self, actor: str, text: str) -> None:
        """An actor failed, as its owner learned (supervision)."""
        self.records.append((FAILURE, actor, text, _now()))

    def restart(self, mesh: str, ranks: list[int]) -> None:
        """An owner restarted ``ranks`` of its actor mesh ``mesh``."""
        self.records.append((RESTART, mesh, tuple(ranks), _now()))


def new_trace_id() -> int:
    """A fresh random trace id."""
    return _bits(128)


def new_span_id() -> int:
    """A fresh random span id."""
    return _bits(64)


def install(new: Probe | None) -> None:
    """Make ``new`` this process's probe (``None``: telemetry off)."""
    global probe
    probe = new


def follow_config() -> None:
    """Start or stop telemetry here to match the ``telemetry`` setting: as a process starts,
    and before the controller spawns procs (which take its settings)."""
    want = bool(config.get("telemetry"))
    if want != (probe is not None):
        _plugins.load("telemetry").follow(want)


def finish() -> None:
    """As the process stops: send what telemetry still holds."""
    if probe is not None:
        _plugins.load("telemetry").follow(False)
