"""The proc agent: every process's service that creates and stops the actors it hosts."""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

from regency import _hooks, config
from regency._config_keys import STOP_TIMEOUT
from regency._runtime.actors.control.control import (
    DumpStacks,
    PingProc,
    ProcAgentRequest,
    ProcStats,
    SetLogLevel,
    SetTelemetry,
    SpawnActor,
    StopActor,
    StopProc,
    unhandled,
)
from regency._runtime.actors.execution.instance import ActorInstance
from regency._runtime.actors.execution.unbooted import UnbootedInstance
from regency._runtime.actors.observe.stacks import local_stacks
from regency._runtime.actors.supervision import supervision
from regency._runtime.kernel import wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.port_handlers import PeerWatch
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.refs import PortRef

log = logging.getLogger("regency.proc")


class ProcAgent:
    """Handles spawn/stop requests for one process."""

    def __init__(
        self,
        runtime: ProcRuntime,
        on_stop_proc: Callable[[StopProc], None] | None = None,
        booting: bool = False,
    ) -> None:
        self.runtime = runtime
        self.instances: dict[int, ActorInstance] = {}
        self._on_stop_proc = on_stop_proc
        self.bootstrap_error: str | None = None
        # While the proc's bootstrap runs, requests from other processes wait here (their actors
        # start after it); the bootstrap's own spawns on this proc go ahead.
        self._held: list[ProcAgentRequest] | None = [] if booting else None
        self._lock = threading.Lock()
        self._by_owner: dict[str, set[int]] = {}

    def booted(self, error: str | None) -> None:
        """The bootstrap returned (``error``: the traceback of what it raised); runs the held
        requests. Call from any thread: it is queued behind the requests already received."""
        self.runtime.post_service(wire.SERVICE_PROC, _Booted(error))

    def handle(self, request: object) -> None:
        """Service entry point (runs on the proc agent's own thread)."""
        if isinstance(request, ProcAgentRequest):
            self._serve(request)
        elif isinstance(request, _Booted) and self._held is not None:
            held, self._held = self._held, None
            self.bootstrap_error = request.error
            for early in held:
                self._serve(early)
        else:
            log.warning("proc agent got an unknown request %r", type(request).__name__)

    def _serve(self, request: ProcAgentRequest) -> None:
        match request:
            case DumpStacks():  # answered even while the bootstrap runs
                threading.Thread(
                    target=lambda: self._answer(
                        request.port, request.rank, local_stacks(request.pyspy)
                    ),
                    name="regency-stacks",
                    daemon=True,
                ).start()
            case SetLogLevel():
                logging.getLogger().setLevel(request.level)
            case SetTelemetry():
                config.configure(**request.settings)
                _hooks.telemetry.load().follow(request.on)
            case ProcStats():
                with self._lock:
                    stats = {mesh_id: i.stats() for mesh_id, i in self.instances.items()}
                self._answer(request.port, request.rank, stats)
            case _ if self._held is not None and not (
                isinstance(request, SpawnActor) and request.status.addr == self.runtime.address
            ):
                self._held.append(request)
            case SpawnActor():
                self._spawn(request)
            case PingProc():
                self._answer(request.port, request.rank, self.bootstrap_error)
            case StopActor():
                port = request.done
                self._stop_actor(
                    request.mesh_id,
                    request.reason,
                    lambda: self._answer(port, 0, None) if port is not None else None,
                )
            case StopProc():
                if request.exiting:
                    supervision.shutting_down()
                # Not on this thread: an actor that stops here stops the meshes it owns, and
                # those on this same proc are stopped by requests to this very thread.
                threading.Thread(
                    target=self._stop_proc,
                    args=(request,),
                    name="regency-proc-stop",
                    daemon=True,
                ).start()
            case _:
                unhandled(request)

    def _spawn(self, request: SpawnActor) -> None:
        if self.bootstrap_error is not None:
            instance: ActorInstance = UnbootedInstance(self.runtime, request, self.bootstrap_error)
        else:
            instance = ActorInstance(self.runtime, request)
        with self._lock:
            self.instances[request.mesh_id] = instance
        if request.owner is not None and request.owner.addr != self.runtime.address:
            self._watch_owner(request.owner.addr, request.mesh_id)
        instance.start()

    def _stop_proc(self, request: StopProc) -> None:
        self.stop_all(config.value(STOP_TIMEOUT))
        if self._on_stop_proc is not None:
            self._on_stop_proc(request)

    def _watch_owner(self, owner: str, mesh_id: int) -> None:
        """Stop this actor if the process of its mesh's owner dies (meshes die with owners)."""
        with self._lock:
            meshes = self._by_owner.get(owner)
            first = meshes is None
            if meshes is None:
                meshes = self._by_owner[owner] = set()
            meshes.add(mesh_id)
        if first:
            self.runtime.open_port(PeerWatch(owner, self.owner_gone), watch=[owner])

    def owner_gone(self, owner: str, reason: str) -> None:
        """Stop the actors whose owner's process is gone."""
        with self._lock:
            meshes = self._by_owner.pop(owner, set())
        for mesh_id in meshes:
            self._stop_actor(mesh_id, f"its owner {owner} is gone: {reason}", lambda: None)

    def _answer(self, port: PortRef, rank: int, value: Any) -> None:
        with contextlib.suppress(PeerLostError):
            self.runtime.send_port(port, rank, 0, [pickle.dumps(value, protocol=5)])

    def _stop_actor(self, mesh_id: int, reason: str, done: Callable[[], None]) -> None:
        with self._lock:
            instance = self.instances.pop(mesh_id, None)
        if instance is None:
            done()
            return
        instance.request_stop(done, reason)

    def stop_all(self, timeout: float) -> None:
        """Stop every hosted actor, waiting up to ``timeout`` seconds in all."""
        with self._lock:
            instances = list(self.instances.values())
            self.instances.clear()
        events = []
        for instance in instances:
            event = threading.Event()
            instance.request_stop(event.set, "proc stopping")
            events.append(event)
        deadline = time.monotonic() + timeout
        for event in events:
            event.wait(max(0.0, deadline - time.monotonic()))


class _Booted:
    """The proc's bootstrap returned (posted by the proc itself, never sent)."""

    __slots__ = ("error",)

    def __init__(self, error: str | None) -> None:
        self.error = error
