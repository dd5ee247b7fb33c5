"""The owner's side of one actor mesh: per-rank health, failure notices, restarts.

A :class:`MeshSupervisor` lives in the process of the mesh's owner. It learns of failures two
ways, both pushed: actors report their own failures to its port, and the runtime tells it the
moment a watched proc is gone (the host agent reports exits as they happen). It latches the
first event of each rank, makes calls to failed ranks fail fast, tells the owner (a
``MeshFailure`` for its ``__supervise__``) and, under a :class:`RestartPolicy`, restarts ranks.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from regency._runtime.actors.base.errors import failed_text, process_failed, stopped_text
from regency._runtime.actors.base.identity import segment
from regency._runtime.actors.control.control import ProcInfo
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.supervision.supervision import (
    FailureEvent,
    MeshFailure,
    MeshRestarted,
    RestartBudget,
    RestartPolicy,
    is_stop_reason,
)
from regency._runtime.kernel import state
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef
from regency.shape import Extent, Point

if TYPE_CHECKING:
    from regency._runtime.actors.base.identity import InstanceBase

log = logging.getLogger("regency.supervision")

Respawn = Callable[["MeshSupervisor", list[int]], None]


class MeshSupervisor:
    """Health and supervision of one owned actor mesh, in its owner's process."""

    def __init__(
        self,
        owner: InstanceBase,
        mesh_id: int,
        name: str,
        class_name: str,
        extent: Extent,
        bases: Sequence[int],
        procs: list[ProcInfo],
        policy: RestartPolicy | None,
        respawn: Respawn,
    ) -> None:
        self.owner = owner
        self.mesh_id = mesh_id
        self.name = name
        self.class_name = class_name
        self.creator = str(owner)
        self.extent = extent
        self.bases = list(bases)
        self.procs = procs  # shared with the mesh and its views; restarts replace entries
        self.mesh: Any = None
        self.policy = policy
        # Base rank -> why calls to it fail fast. Empty while all is well (checked per call).
        self.bad: dict[int, str] = {}
        self.generation = 0
        self.restarts = 0
        self.stopping = False
        self.replacements: list[ProcInfo] = []
        self._respawn = respawn
        self._budget = RestartBudget(policy) if policy is not None else None
        self._lock = threading.Lock()
        self._waiters: list[tuple[int, Pending]] = []
        self._cancel = threading.Event()
        rt = state.runtime()
        self.port: PortRef = rt.open_port(self)

    def start_watching(self) -> None:
        """Watch the mesh's procs (once ``mesh`` is set: a proc may already be dead)."""
        state.runtime().losses.watch(self.port.port, self.addresses())

    # -- identity ------------------------------------------------------------------------------

    def addresses(self) -> list[str]:
        """The current proc address of every rank (deduplicated)."""
        return list(dict.fromkeys(self.procs[b].addr for b in self.bases))

    def actor_name(self, rank: int) -> str:
        """The qualified name of the actor at ``rank``, as it would print itself."""
        return f"{self.creator}.{segment(self.class_name, self.name, Point(rank, self.extent))}"

    # -- events in (I/O thread, actor threads) ------------------------------------------------

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """An actor of this mesh reports its own failure or self-stop."""
        try:
            event = pickle.loads(parts[0])
        except Exception as exc:
            log.warning("dropping an undecodable supervision report for %s: %s", self.name, exc)
            return
        if isinstance(event, FailureEvent):
            self.on_event(event, proc=event.proc or None)

    def peer_lost(self, addr: str, reason: str) -> None:
        """A proc hosting ranks of this mesh is gone."""
        for rank, base in enumerate(self.bases):
            if self.procs[base].addr != addr:
                continue
            if is_stop_reason(reason):
                event = FailureEvent(
                    self.mesh_id, rank, self.actor_name(rank), reason, None, "stopped"
                )
            else:
                event = FailureEvent(
                    self.mesh_id,
                    rank,
                    self.actor_name(rank),
                    f"the process this actor was running on {process_failed(reason)} "
                    f"(process {addr}: {reason})",
                )
            self.on_event(event, proc=addr)

    def on_event(self, event: FailureEvent, proc: str | None) -> None:
        """Latch the first event of a rank, then tell the owner or restart."""
        if not 0 <= event.rank < len(self.bases):
            return
        base = self.bases[event.rank]
        with self._lock:
            if self.stopping or base in self.bad:
                return
            if proc is not None and self.procs[base].addr != proc:
                return  # news from a rank's previous incarnation
            if event.kind == "stopped":
                self.bad[base] = stopped_text(
                    event.actor, event.reason, f"actor mesh {self.name} is stopped"
                )
                return
            self.bad[base] = failed_text(
                event.actor,
                event.reason,
                f"failure on mesh {self.name} at rank {event.rank} with event: actor failed",
            )
            probe = tracing.probe
            if probe is not None:
                probe.failure(event.actor, event.reason)
            delay = self._budget.admit(time.monotonic()) if self._budget is not None else None
            exceeded = self._budget is not None and delay is None
            if delay is not None:
                ranks = self._restart_set(event.rank)
                for rank in ranks:
                    self.bad.setdefault(
                        self.bases[rank], f"actor mesh {self.name} is restarting rank {rank}"
                    )
        if delay is not None:
            self._notify(MeshFailure(self.name, self.mesh, event, restarting=True))
            threading.Thread(
                target=self._restart,
                args=(ranks, delay),
                name=f"regency-restart-{self.name}",
                daemon=True,
            ).start()
            return
        if exceeded:
            assert self._budget is not None
            event = FailureEvent(
                event.mesh_id,
                event.rank,
                event.actor,
                f"{self._budget.exceeded_text()}; last failure: {event.reason}",
                event.cause,
            )
        self._notify(MeshFailure(self.name, self.mesh, event))

    def _restart_set(self, rank: int) -> list[int]:
        assert self.policy is not None
        if self.policy.strategy == "one_for_all":
            return list(range(len(self.bases)))
        return [rank]

    # -- restarts ------------------------------------------------------------------------------

    def _restart(self, ranks: list[int], delay: float) -> None:
        if delay > 0 and self._cancel.wait(delay):
            return
        if self.stopping:
            return
        try:
            self._respawn(self, ranks)
        except Exception as exc:
            log.exception("restarting ranks %s of %s failed", ranks, self.name)
            event = FailureEvent(
                self.mesh_id, ranks[0], self.actor_name(ranks[0]), f"restart failed: {exc}"
            )
            self._notify(MeshFailure(self.name, self.mesh, event))

    def replaced(self, rank: int, info: ProcInfo) -> None:
        """A restart moved ``rank`` to a new proc: route calls there from now on."""
        base = self.bases[rank]
        with self._lock:
            self.procs[base] = info
            self.replacements.append(info)
            self.generation += 1
            self.bad.pop(base, None)
        state.runtime().losses.watch(self.port.port, [info.addr])

    def restarted(self, ranks: list[int]) -> None:
        """The restarted ranks' constructors all ran: count it and tell the owner."""
        with self._lock:
            self.restarts += 1
            count = self.restarts
            ready = [p for c, p in self._waiters if c <= count]
            self._waiters = [(c, p) for c, p in self._waiters if c > count]
        for pending in ready:
            pending.set_result(count)
        probe = tracing.probe
        if probe is not None:
            probe.restart(self.name, ranks)
        self._notify(MeshRestarted(self.name, self.mesh, ranks, count))

    def when_restarted(self, count: int) -> Pending:
        """Completes (with the count) once the mesh has completed ``count`` restarts."""
        pending = Pending()
        with self._lock:
            if self.restarts < count:
                self._waiters.append((count, pending))
                return pending
        pending.set_result(self.restarts)
        return pending

    # -- stopping ------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """The owner stops the mesh: no more notices or restarts; calls fail with "stopped"."""
        with self._lock:
            self.stopping = True
            for rank, base in enumerate(self.bases):
                self.bad[base] = stopped_text(
                    self.actor_name(rank), reason, f"actor mesh {self.name} is stopped"
                )
        self._cancel.set()
        state.runtime().close_port(self.port.port, self.addresses())
        self.owner.disown(self.mesh)

    def _notify(self, notice: MeshFailure | MeshRestarted) -> None:
        if self.stopping:
            return
        self.owner.supervise(notice)
