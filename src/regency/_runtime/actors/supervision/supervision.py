"""What supervision is made of: failure events on the wire, the ``MeshFailure`` an owner's
``__supervise__`` receives, restart notices and restart policies, and the root's fault hook.

Events travel from a failed actor (or from the process watching a dead proc) to the process of
the mesh's owner, where a
:class:`~regency._runtime.actors.supervision.mesh_supervisor.MeshSupervisor` keeps per-rank
health and hands notices to the owner.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import textwrap
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Literal

from regency import _hooks
from regency._runtime.actors.base.errors import failed_text

STOP_REASON_PREFIX = "stopped ("


def stop_reason(why: str) -> str:
    """How the end of a proc that was stopped on purpose (because ``why``) reads."""
    return f"{STOP_REASON_PREFIX}{why})"


def is_stop_reason(reason: str) -> bool:
    """Whether a proc's end was asked for (a stop), as opposed to a crash."""
    return reason.startswith(STOP_REASON_PREFIX)


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """One rank of a mesh failed (or stopped on its own): the wire form of a failure.

    ``actor`` is the failed actor's qualified name; ``cause`` is the event that made it fail
    when its own supervision gave up on a failure below it; ``proc`` tells a restarted rank's
    reports from those of its previous incarnation.
    """

    mesh_id: int
    rank: int
    actor: str
    reason: str
    cause: FailureEvent | None = None
    kind: Literal["failed", "stopped"] = "failed"
    proc: str = ""  # address of the failed actor's proc, when the actor reports itself

    def root_cause(self) -> FailureEvent:
        """The deepest event of the chain: where it all started."""
        event = self
        while event.cause is not None:
            event = event.cause
        return event

    def chain_text(self) -> str:
        """Every event of the chain, one per line, outermost first."""
        lines = []
        event: FailureEvent | None = self
        depth = 0
        while event is not None:
            prefix = "" if depth == 0 else "  " * depth + "caused by: "
            lines.append(f"{prefix}{event.actor}: {event.reason}")
            event = event.cause
            depth += 1
        return "\n".join(lines)


class MeshFailure:
    """A failure of a mesh this actor owns, as given to ``__supervise__`` and to
    ``unhandled_fault_hook``.

    ``mesh_name`` names the failed mesh (compare it to tell owned meshes apart), ``mesh`` is the
    owner's own mesh object, ``crashed_ranks`` the failed ranks and ``report()`` a readable
    account including the root cause. ``restarting`` is true when the mesh's restart policy is
    about to restart those ranks (the notice is informational then). Not picklable.
    """

    def __init__(
        self,
        mesh_name: str,
        mesh: Any,
        event: FailureEvent,
        restarting: bool = False,
    ) -> None:
        self.mesh_name = mesh_name
        self.mesh = mesh
        self.event = event
        self.crashed_ranks = [event.rank]
        self.restarting = restarting

    @property
    def root_cause(self) -> str:
        """The qualified name and reason of the actor where the failure started."""
        root = self.event.root_cause()
        return f"{root.actor}: {root.reason}"

    def report(self) -> str:
        """A human-readable account: Monarch's "The actor ... and all its descendants have
        failed:" naming the actor where the failure started (as Monarch does for a failure
        several owners down) with its reason, then which ranks, and the chain from this mesh's
        actor down to that root cause."""
        head = f"mesh {self.mesh_name!r} failed at ranks {self.crashed_ranks}"
        if self.restarting:
            head += " (restarting under its restart policy)"
        root = self.event.root_cause()
        text = f"{failed_text(root.actor, root.reason)}\n{head}"
        if self.event.cause is not None:
            text += f":\n{self.event.chain_text()}"
        return text

    def __str__(self) -> str:
        reason = textwrap.indent(self.event.reason, "  ", lambda line: True)
        text = (
            f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.crashed_ranks}, "
            f"event=Supervision event: actor {self.event.actor} failed:\n{reason}"
        )
        if self.event.cause is not None:
            text += f", root_cause={self.root_cause!r}"
        if self.restarting:
            text += ", restarting=True"
        return text + ")"

    __repr__ = __str__

    def __reduce__(self) -> Any:
        raise TypeError("MeshFailure is not picklable: it refers to the owner's live mesh")


@dataclass(frozen=True)
class MeshRestarted:
    """Notice to ``__supervise__`` that a restart policy brought ranks of a mesh back.

    ``ranks`` were restarted (fresh process, fresh ``__init__``); ``restarts`` counts the mesh's
    restarts so far. The return value of ``__supervise__`` is ignored for this notice.
    """

    mesh_name: str
    mesh: Any
    ranks: list[int]
    restarts: int

    def __str__(self) -> str:
        return (
            f"MeshRestarted(mesh_name={self.mesh_name}, ranks={self.ranks}, "
            f"restarts={self.restarts})"
        )


@dataclass(frozen=True)
class RestartPolicy:
    """Declarative recovery for an actor mesh, after Erlang/OTP supervisors.

    ``strategy`` is ``"one_for_one"`` (restart only the failed ranks, each in a new proc) or
    ``"one_for_all"`` (restart every rank). More than ``max_restarts`` restarts within
    ``within_s`` seconds (OTP's intensity and period) stops restarting and escalates the failure
    to the owner as an ordinary ``MeshFailure``. Before the n-th restart in a row the policy
    waits ``backoff_s * 2**(n-1)`` seconds (at most ``max_backoff_s``).
    """

    strategy: Literal["one_for_one", "one_for_all"] = "one_for_one"
    max_restarts: int = 3
    within_s: float = 60.0
    backoff_s: float = 0.0
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.strategy not in ("one_for_one", "one_for_all"):
            raise ValueError(
                f"RestartPolicy.strategy must be 'one_for_one' or 'one_for_all', "
                f"got {self.strategy!r}"
            )
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(
                f"RestartPolicy.max_restarts must be an int >= 0, got {self.max_restarts!r}"
            )
        for name in ("within_s", "backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
                raise ValueError(f"RestartPolicy.{name} must be a number >= 0, got {value!r}")


class RestartBudget:
    """A policy's restart history for one mesh: may it restart again, and after what delay?"""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: list[float] = []

    def admit(self, now: float) -> float | None:
        """Record a restart at ``now``; its backoff delay, or ``None`` if intensity is exceeded."""
        window = self.policy.within_s
        self._times = [t for t in self._times if now - t < window]
        if len(self._times) >= self.policy.max_restarts:
            return None
        self._times.append(now)
        streak = len(self._times)
        return float(min(self.policy.backoff_s * 2 ** (streak - 1), self.policy.max_backoff_s))

    def exceeded_text(self) -> str:
        """Why no more restarts are allowed."""
        return (
            f"restart intensity exceeded: {self.policy.max_restarts} restarts within "
            f"{self.policy.within_s:g} s"
        )


class UndeliverableMessageEnvelope:
    """A message an actor sent that could not be delivered, as given to
    ``Actor._handle_undeliverable_message``."""

    def __init__(self, sender: str, dest: str, error: str) -> None:
        self._sender = sender
        self._dest = dest
        self._error = error

    def sender(self) -> str:
        """The qualified name of the actor that sent the message."""
        return self._sender

    def dest(self) -> str:
        """Where the message was going: ``mesh.endpoint`` and rank."""
        return self._dest

    def error_msg(self) -> str:
        """Why it could not be delivered."""
        return self._error

    def __repr__(self) -> str:
        return (
            f"UndeliverableMessageEnvelope(sender={self._sender}, dest={self._dest}, "
            f"error={self._error!r})"
        )


# -- the root of the tree --------------------------------------------------------------------

_fatal = threading.Event()
_delivered = threading.Event()  # the main thread got SystemExit(1): the exit code is set
_shutting_down = threading.Event()


def shutting_down() -> None:
    """This process stops everything and ends with its controller: a failure from now on (an
    actor whose collective broke as its peers stopped, say) is of an actor being stopped: it is
    neither reported nor fatal."""
    _shutting_down.set()


def is_shutting_down() -> bool:
    """Whether :func:`shutting_down` was called in this process."""
    return _shutting_down.is_set()


def run_fault_hook(failure: MeshFailure) -> None:
    """Give an unhandled failure to ``regency.actor.unhandled_fault_hook`` (root only).

    A normal return ignores the failure. If the hook raises (its default raises ``SystemExit``),
    a report goes to stderr and the controller exits with code 1, running its atexit handlers.
    Once the controller shuts down (:func:`shutting_down`), failures are ignored.
    """
    if _shutting_down.is_set():
        return
    hook = _hooks.fault_hook.load()
    try:
        hook(failure)
    except BaseException as exc:
        text = "".join(traceback.format_exception_only(exc)).strip()
        print(
            f"regency: unhandled supervision failure ({text}); exiting with code 1\n"
            f"{failure.report()}",
            file=sys.stderr,
            flush=True,
        )
        _exit_controller()


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Monarch's default: an unhandled failure ends the controller (exit code 1)."""
    sys.exit(1)


def _exit_controller() -> None:
    """Make the main thread leave with ``SystemExit(1)`` (atexit handlers run)."""
    _fatal.set()
    main = threading.main_thread()
    if not main.is_alive() or main.ident is None:
        os._exit(1)
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        # A real signal interrupts whatever the main thread is blocked in.
        signal.pthread_kill(main.ident, signal.SIGINT)
        return
    import _thread

    _thread.interrupt_main()


_ctrl_c_ignored = False
"""SIGINT was ignored when the controller started (a background job of a shell, ``nohup``)."""


def _on_sigint(signum: int, frame: Any) -> None:
    if _fatal.is_set():
        _delivered.set()
        raise SystemExit(1)
    if not _ctrl_c_ignored:
        raise KeyboardInterrupt


def install_exit_path() -> None:
    """Let a fatal failure stop the main thread (called at controller start-up).

    Only when running on the main thread with Python's default SIGINT handler, or with SIGINT
    ignored: then a fatal failure raises ``SystemExit(1)`` in the main thread, whatever it is
    blocked in, and Ctrl-C still raises ``KeyboardInterrupt`` (or is still ignored). Otherwise
    (the program installed its own handler) the main thread gets ``KeyboardInterrupt`` and the
    exit code is forced at exit.
    """
    global _ctrl_c_ignored
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler or current == signal.SIG_IGN:
        # An ignored SIGINT cannot carry the fatal exit (Python drops it, and interrupt_main()
        # does nothing then): a controller run in the background hung on a fatal failure.
        _ctrl_c_ignored = current == signal.SIG_IGN
        signal.signal(signal.SIGINT, _on_sigint)


def fatal_exit_code() -> int | None:
    """1 if a fatal failure happened and the main thread could not be made to exit with 1."""
    return 1 if _fatal.is_set() and not _delivered.is_set() else None
