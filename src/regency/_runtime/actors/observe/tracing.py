"""The runtime's telemetry seam: the one check on the hot path, and what it records.

Every hook in the runtime reads :data:`probe` once and does nothing else while it is ``None``
(telemetry off, the default). When ``regency.observe.telemetry`` switches telemetry on in this
process it installs a :class:`Probe`, and the hooks record each message: the sender appends
one small tuple per call or cast to ``probe.records`` (:data:`CALL`); the receiver counts each
message in ``probe.counts`` and appends a :data:`HANDLED` tuple for a traced one. Turning those
into spans and metrics, shipping them to the controller and storing them happens off the hot
path, on the telemetry layer's own thread.

Traces: a call made inside a traced handler or span (:data:`CURRENT`) joins that trace; any
other call starts a new trace while the process's budget lasts (``telemetry_traces_per_s``
times the collector's interval, refilled every interval); otherwise it is only counted. A
traced message carries ``(trace id, send span id, send time)`` in its envelope; an untraced one
carries ``None`` there.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import random
import time
from collections import deque
from typing import Any

from regency import _hooks, config
from regency._config_keys import TELEMETRY
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
ROW = 6  # (ROW, table, row): a row of one of the job's tables, made where it happened
RECEIVED = 7  # (RECEIVED, actor, method, sender uid, started, ended, error text)
SENT = 8  # (SENT, sender uid, actor mesh id, view labels, offset, sizes, strides, time)
HOST = 9  # (HOST, host agent address): a host this controller attached keeps rows

ID_MASK = 0x7FFF_FFFF_FFFF_FFFF  # ids in the job's tables are 63-bit (a signed BIGINT)

probe: Probe | None = None
"""This process's probe while telemetry is on (installed by ``regency.observe.telemetry``)."""


class Outgoing:
    """A call whose reply is awaited: what its record needs once the reply is in."""

    __slots__ = ("name", "nbytes", "ndest", "records", "sent", "start", "trace")

    def __init__(
        self,
        records: deque[tuple[Any, ...]],
        name: str,
        start: int,
        trace: Trace | None,
        nbytes: int,
        ndest: int,
    ) -> None:
        self.records = records
        self.name = name
        self.start = start
        self.trace = trace
        self.nbytes = nbytes
        self.ndest = ndest
        self.sent = _now()

    def replied(self, pending: Pending) -> None:
        """The call's outcome is in (on the thread that filled ``pending``)."""
        self._record(pending.failed())

    def gathered(self, pending: Pending) -> None:
        """A gathered call's outcome is in: it failed if any rank's reply is an error."""
        error = pending.failed() or any(
            flags & wire.FLAG_ERROR for _, flags, _ in pending.outcome()
        )
        self._record(error)

    def _record(self, error: bool) -> None:
        end = _now()
        record = (CALL, self.name, self.start, self.sent, end, self.ndest, self.nbytes, error)
        self.records.append((*record, self.trace))


# (trace id, call span id, send span id, parent span id), for a traced call or cast.
Trace = tuple[int, int, int, int]
# What the receiver keeps while an actor handles a message: its trace (trace id, send span id,
# send time, handle span id) or None, the mailbox depth, the start, the span context's token.
Handling = tuple[tuple[int, int, int, int] | None, int, int, Any]


class Probe:
    """What the hooks call while telemetry is on; ``records`` is drained by the collector."""

    def __init__(self, traces_per_s: float, tracing: bool) -> None:
        self.records: deque[tuple[Any, ...]] = deque()
        self.counts: dict[Any, dict[str, list[int]]] = {}
        self.tracing = tracing
        self.traces_per_s = traces_per_s
        # New traces this process may still start in this interval: the collector refills it
        # (a budget, not a clock read per message).
        self.budget = 0.0
        self.refill(1.0)

    # -- sampling ------------------------------------------------------------------------------

    def refill(self, seconds: float) -> None:
        """Allow ``traces_per_s`` new traces per second for the next ``seconds``."""
        self.budget = self.traces_per_s * seconds if self.tracing else 0.0

    def new_trace(self) -> bool:
        """Whether a call or span with no traced parent starts a trace (while budget is left)."""
        if self.budget >= 1.0:
            self.budget -= 1.0
            return True
        return False

    # -- the sender ----------------------------------------------------------------------------

    def begin(self, timed: bool) -> tuple[int, Trace | None]:
        """A call (``timed``: a reply is awaited) or cast is about to be sent: its start time
        (0 for an untraced cast, which is only counted) and its trace (or None)."""
        parent = CURRENT.get()
        if parent is not None:
            trace_id, parent_id = parent
        elif self.budget >= 1.0 and self.new_trace():
            trace_id, parent_id = _bits(128), 0
        else:
            return (_now() if timed else 0), None
        return _now(), (trace_id, _bits(64), _bits(64), parent_id)

    def sent(
        self,
        name: str,
        start: int,
        trace: Trace | None,
        nbytes: int,
        ndest: int,
        pending: Pending | None,
        gather: bool,
    ) -> None:
        """A message to ``name`` (``<actor mesh>.<endpoint>``) went to ``ndest`` actors;
        ``pending`` completes with its reply (None: a cast, nothing comes back)."""
        if pending is not None:
            out = Outgoing(self.records, name, start, trace, nbytes, ndest)
            pending.add_done_callback(out.gathered if gather else out.replied)
        elif trace is None:
            self.records.append((CALL, name, 0, 0, 0, ndest, nbytes, False, None))
        else:
            self.records.append((CALL, name, start, _now(), 0, ndest, nbytes, False, trace))

    # -- the receiver --------------------------------------------------------------------------

    def handling(self, wire_trace: tuple[int, int, int], depth: int) -> Handling:
        """An actor starts handling a traced message (its envelope carried ``wire_trace``)."""
        trace_id, send_id, sent = wire_trace
        handle_id = _bits(64)
        token = CURRENT.set((trace_id, handle_id))
        return (trace_id, send_id, sent, handle_id), depth, _now(), token

    def handled(
        self, mark: Handling, core: Any, method: str, settling: int, error: BaseException | None
    ) -> None:
        """The traced message of ``mark`` was handled; its reply (or failure) began at
        ``settling``."""
        trace, depth, start, token = mark
        if token is not None:
            CURRENT.reset(token)
        self.count(core, method, error is not None)
        text = None if error is None else f"{type(error).__name__}: {error}"
        self.records.append((HANDLED, core, method, trace, start, settling, _now(), depth, text))

    def count(self, core: Any, method: str, failed: bool) -> None:
        """One more message handled by ``core``'s ``method`` (``failed``: it raised).

        Untraced messages are only counted: ``counts[core][method]`` is ``[handled, failed]``,
        written by the actor's own thread only; the collector reads the growth.
        """
        per = self.counts.get(core)
        if per is None:
            per = self.counts.setdefault(core, {})
        entry = per.get(method)
        if entry is None:
            entry = per[method] = [0, 0]
        entry[0] += 1
        if failed:
            entry[1] += 1

    @staticmethod
    def abandon(mark: Handling) -> None:
        """The handler was cancelled (its actor stops): leave its span context."""
        if mark[3] is not None:
            CURRENT.reset(mark[3])

    # -- the rest ------------------------------------------------------------------------------

    def failure(self, actor: str, text: str) -> None:
        """An actor failed, as its owner learned (supervision)."""
        self.records.append((FAILURE, actor, text, _now()))

    def restart(self, mesh: str, ranks: list[int]) -> None:
        """An owner restarted ``ranks`` of its actor mesh ``mesh``."""
        self.records.append((RESTART, mesh, tuple(ranks), _now()))

    def row(self, table: str, row: tuple[Any, ...]) -> None:
        """A row of the job's table ``table`` (a mesh created): its columns but the first
        two, an ``id`` and ``timestamp_us``, which are added here."""
        self.records.append((ROW, table, (_bits(63), _now() // 1000, *row)))

    def actor(self, uid: int, mesh_id: int, rank: int, full_name: str, display: str) -> None:
        """An actor (uid ``uid``) of the mesh ``mesh_id`` was created here."""
        self.records.append(
            (ROW, "actors", (uid & ID_MASK, _now() // 1000, mesh_id & ID_MASK, rank, full_name,
                             display))
        )  # fmt: skip

    def status(self, uid: int, status: str, reason: str | None = None) -> None:
        """The actor ``uid`` changed status (Monarch's names: ``Created``, ``Idle``, ...)."""
        self.row("actor_status_events", (uid & ID_MASK, status, reason))

    def received(
        self, core: Any, method: str, sender: int, started: int, error: BaseException | None
    ) -> None:
        """``core`` handled a message to ``method`` from the actor ``sender`` (its uid; 0:
        not an actor) that it began at ``started``."""
        text = None if error is None else f"{type(error).__name__}: {error}"
        self.records.append((RECEIVED, core, method, sender, started, _now(), text))

    def cast(self, sender: int, mesh_id: int, labels: Any, offset: int, sizes: Any,
             strides: Any) -> None:  # fmt: skip
        """The actor ``sender`` (uid) sent a message to the view of actor mesh ``mesh_id``."""
        self.records.append((SENT, sender, mesh_id, labels, offset, sizes, strides, _now()))


def actor_full_name(proc: str, mesh_name: str, mesh_id: int, rank: int) -> str:
    """An actor's ``full_name`` in the job's tables (and its node in the snapshots): its
    proc's address, its mesh's name and id, and its rank."""
    return f"{proc},{mesh_name}-{mesh_id & ID_MASK:016x}[{rank}]"


def entity_id(key: str) -> int:
    """The id of an actor or mesh in the job's tables: a 63-bit hash of ``key``, the same in
    every process."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ID_MASK


_COMPACT = (",", ":")  # JSON columns are written as Monarch's (serde's) compact text


def region_json(labels: Any, offset: int, sizes: Any, strides: Any) -> str:
    """A mesh view as Monarch's ndslice ``Region`` serializes: labels and the slice."""
    return json.dumps(
        {
            "labels": list(labels),
            "slice": {"offset": offset, "sizes": list(sizes), "strides": list(strides)},
        },
        separators=_COMPACT,
    )


def extent_json(labels: Any, sizes: Any) -> str:
    """A mesh's shape as Monarch's ndslice ``Extent`` serializes."""
    return json.dumps(
        {"inner": {"labels": list(labels), "sizes": list(sizes)}}, separators=_COMPACT
    )


def mesh_created(
    mesh_id: int,
    kind: str,
    name: str,
    labels: Any,
    sizes: Any,
    parent_id: int | None,
    parent_view: str | None,
) -> None:
    """Record a mesh (``kind``: ``Host``, ``Proc`` or ``Python<Class>``) in the job's
    ``meshes`` table while telemetry is on."""
    p = probe
    if p is not None:
        full = f"{name}-{mesh_id & ID_MASK:016x}"
        shape = extent_json(labels, sizes)
        p.records.append(
            (ROW, "meshes", (mesh_id & ID_MASK, _now() // 1000, kind, name, full, shape,
                             parent_id, parent_view))
        )  # fmt: skip


def now() -> int:
    """The wall clock in nanoseconds (what records carry)."""
    return _now()


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
    want = config.value(TELEMETRY)
    if want != (probe is not None):
        _hooks.telemetry.load().follow(want)


def finish() -> None:
    """As the process stops: send what telemetry still holds."""
    if probe is not None:
        _hooks.telemetry.load().follow(False)
