"""The worker daemon: serves its machine as a host to one controller at a time.

A worker listens on one TCP port and holds its job's secret. A controller that proves the secret
sends :class:`Attach`: it tells the worker the address the controller knows it by, where the
controller's machine is reached (its gateway; or nowhere, when the controller reaches the worker
through a forwarded port and cannot be dialed: then the controller opens every connection the
worker's side needs, see :mod:`regency._transport.reverse`), the controller's own secret
(wrapped with the job's, never in the clear) and its settings. From then on the worker's host
agent starts procs for that controller; the procs hold the controller's secret and are reached
through the worker's port. When the controller goes (its connection closes or falls silent), the
worker stops every proc it started and its zygote (a fresh one starts for the next controller),
and waits for the next one (or, started with ``exit_with_controller``, exits); when the
controller shuts the host down (``HostMesh.shutdown``), the worker stops them and exits. A
second controller that attaches while one is served is refused with an error naming the one
being served.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import threading
from dataclasses import dataclass
from typing import Any

from regency import _hooks, config
from regency._config_keys import STOP_TIMEOUT
from regency._runtime.actors.control.control import ShutdownHost
from regency._runtime.host.host_agent import HostAgent, HostSession
from regency._runtime.kernel import wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.port_handlers import PeerWatch
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.refs import PortRef
from regency._runtime.kernel.service import Service
from regency._transport import address
from regency._transport.auth import AuthenticationError, unwrap_secret

log = logging.getLogger("regency.worker")

_WILDCARDS = ("0.0.0.0", "::", "")  # compared, never bound
_ORPHAN_STOP_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class Attach:
    """A controller asks a worker to serve it (sent to the worker's host service)."""

    controller: str  # the root controller's address
    job_id: str
    address: str  # the worker's address as the controller dials it
    gateway: str | None  # the controller's TCP address the worker can reach (None: same machine)
    wrapped_secret: bytes  # the controller's secret, wrapped with the job's
    settings: dict[str, object]  # the controller's regency.config values
    reply: PortRef
    reverse: bool = False  # the controller cannot be dialed: it opens reverse connections


class WorkerAgent:
    """The worker's host service: attaches controllers, then serves their spawn requests."""

    def __init__(
        self,
        runtime: ProcRuntime,
        agent: HostAgent,
        job_secret: bytes,
        idle_timeout: float | None = None,
        exit_with_controller: bool = False,
    ) -> None:
        self.runtime = runtime
        self.agent = agent
        self.job_secret = job_secret
        self.service = Service("regency-worker", self.handle)
        self.finished = threading.Event()  # set once a controller shut this host down
        # With an idle timeout, the worker exits once no controller attached for that long.
        self.idle_timeout = idle_timeout
        # Exit once the served controller goes (a worker that nobody will attach to again).
        self.exit_with_controller = exit_with_controller
        self._idle_round = 0
        self._start_idle_clock()

    def _start_idle_clock(self) -> None:
        """No controller is attached (from now): exit after the idle timeout unless one does."""
        if self.idle_timeout is None:
            return
        self._idle_round += 1
        round_ = self._idle_round
        self.runtime.loop.call_later(
            self.idle_timeout, lambda: self.service.post(_IdleCheck(round_))
        )

    def _idle_check(self, check: _IdleCheck) -> None:
        if check.round != self._idle_round or self.agent.session is not None:
            return  # a controller attached meanwhile (it may have left again: a later round)
        log.info("no controller attached for %g s (idle timeout); exiting", self.idle_timeout)
        self.agent.shutdown(config.value(STOP_TIMEOUT))
        self.finished.set()

    def handle(self, request: object) -> None:
        """Service entry point (runs on the worker service's thread, one request at a time)."""
        if isinstance(request, Attach):
            self._attach(request)
        elif isinstance(request, _Detach):
            self._detach(request)
        elif isinstance(request, ShutdownHost):
            self._shutdown(request)
        elif isinstance(request, _IdleCheck):
            self._idle_check(request)
        else:
            self.agent.handle(request)

    def _shutdown(self, request: ShutdownHost) -> None:
        session = self.agent.session
        if session is None or session.root != request.controller:
            served = "no controller" if session is None else f"controller {session.root}"
            with contextlib.suppress(PeerLostError):
                self.runtime.send_port(
                    request.done,
                    0,
                    0,
                    [pickle.dumps((self.runtime.address, f"it serves {served}"), protocol=5)],
                )
            return
        log.info("controller %s shut this host down; exiting", request.controller)
        self.agent.shutdown(config.value(STOP_TIMEOUT))
        self.finished.set()

    def _attach(self, request: Attach) -> None:
        current = self.agent.session
        if current is not None:
            if current.root == request.controller:
                self._reply(request.reply, self._description())
                return
            log.warning(
                "refused controller %s: serving controller %s", request.controller, current.root
            )
            self._reply(
                request.reply,
                {
                    "error": f"worker {self.runtime.address} already serves controller "
                    f"{current.root} (job {current.job_id}); a worker serves one controller "
                    "at a time"
                },
            )
            return
        try:
            secret = unwrap_secret(self.job_secret, request.wrapped_secret)
        except AuthenticationError as exc:
            self._reply(request.reply, {"error": f"the controller's secret did not unwrap: {exc}"})
            return
        config.clear_runtime_config()
        config.configure(**request.settings)
        self.runtime.known_as(request.address)
        transport = self.runtime.transport
        transport.secret = secret
        transport.accepted = (self.job_secret,)
        transport.gateway = request.gateway
        transport.use_reverse(request.reverse, request.controller)
        self.agent.session = HostSession(
            request.job_id,
            request.address,
            request.controller,
            secret,
            request.gateway,
            request.reverse,
        )
        self.runtime.open_port(
            PeerWatch(request.controller, self._controller_gone), watch=[request.controller]
        )
        self.agent.launcher.start_zygote()  # stopped when the previous controller went
        # The controller's own address is a unix one, reached from here through its gateway.
        log.info(
            "serving controller %s through %s (job %s)",
            request.controller,
            "reverse connections" if request.reverse else request.gateway,
            request.job_id,
        )
        self._reply(request.reply, self._description())

    def _detach(self, request: _Detach) -> None:
        session = self.agent.session
        if session is None or session.root != request.controller:
            return
        log.info(
            "controller %s is gone (%s); stopping its procs", request.controller, request.reason
        )
        self.agent.session = None
        self.agent.stop_all(f"the controller is gone: {request.reason}", _ORPHAN_STOP_TIMEOUT)
        # Nothing of this controller's stays: the next controller gets a fresh zygote.
        self.agent.launcher.stop_zygote()
        if self.exit_with_controller:
            log.info("exiting with the controller (no other controller will attach)")
            self.agent.shutdown(config.value(STOP_TIMEOUT))
            self.finished.set()
            return
        transport = self.runtime.transport
        transport.secret = self.job_secret
        transport.accepted = ()
        transport.gateway = None
        transport.use_reverse(False)
        config.clear_runtime_config()
        log.info("waiting for the next controller")
        self._start_idle_clock()

    def _description(self) -> dict[str, Any]:
        return {"hostname": socket.gethostname(), "pid": os.getpid()}

    def _reply(self, port: PortRef, value: dict[str, Any]) -> None:
        with contextlib.suppress(PeerLostError):
            self.runtime.send_port(port, 0, 0, [pickle.dumps(value, protocol=5)])

    def _controller_gone(self, controller: str, reason: str) -> None:
        # Runs on the I/O thread: the service thread does the stopping, after pending requests.
        self.service.post(_Detach(controller, reason))


@dataclass(frozen=True, slots=True)
class _IdleCheck:
    round: int  # which idle period this timer belongs to


@dataclass(frozen=True, slots=True)
class _Detach:
    controller: str
    reason: str


def advertised(bound: str) -> str:
    """The address to announce for a listener bound at ``bound``: a wildcard host becomes this
    machine's primary IP."""
    host = address.tcp_host(bound)
    if host not in _WILDCARDS:
        return bound
    port = int(bound.rpartition(":")[2])
    return address.tcp_address(address.primary_ip(), port)


def start(
    listen: str,
    job_secret: bytes,
    advertise: str | None = None,
    idle_timeout: float | None = None,
    exit_with_controller: bool = False,
) -> tuple[ProcRuntime, WorkerAgent]:
    """Start serving this machine as a host at ``listen``; return once listening with the
    runtime and the worker agent (whose ``finished`` is set when a controller shuts it down,
    when no controller was attached for ``idle_timeout`` seconds, if given, or with
    ``exit_with_controller`` when the first controller served goes).

    ``listen`` is ``tcp://HOST:PORT``, or ``unix:PATH`` for a worker that only controllers on
    this machine attach to. ``advertise`` is the address to announce instead of the bound one.
    """
    local = listen.startswith("unix:")
    if not local and (not address.is_tcp(listen) or address.route_key(listen)):
        raise address.AddressError(f"a worker listens on tcp://HOST:PORT, not {listen!r}")
    runtime = ProcRuntime(listen, job_secret, "worker")
    runtime.known_as(advertise or (runtime.address if local else advertised(runtime.address)))
    agent = HostAgent(runtime, None)
    worker = WorkerAgent(runtime, agent, job_secret, idle_timeout, exit_with_controller)
    runtime.add_service(wire.SERVICE_HOST, worker.service)
    # This host keeps its procs' rows of the job's telemetry tables (they outlive the procs).
    _hooks.telemetry.load().serve_rows(runtime)
    agent.launcher.start_zygote()
    print(f"regency worker listening on {advertise or runtime.address}", flush=True)
    return runtime, worker


def serve_until_shutdown(
    listen: str,
    job_secret: bytes,
    advertise: str | None = None,
    idle_timeout: float | None = None,
    exit_with_controller: bool = False,
) -> None:
    """Serve this machine as a host at ``listen`` until a controller shuts it down (or, with
    ``idle_timeout``, none is attached for that long; with ``exit_with_controller``, until
    the controller served goes); then close the runtime and return."""
    runtime, worker = start(listen, job_secret, advertise, idle_timeout, exit_with_controller)
    worker.finished.wait()
    runtime.close()


def serve(
    listen: str,
    job_secret: bytes,
    advertise: str | None = None,
    idle_timeout: float | None = None,
    exit_with_controller: bool = False,
) -> None:
    """Serve this machine as a host at ``listen`` (``tcp://HOST:PORT``) until a controller shuts
    it down (or as :func:`serve_until_shutdown` says); then raise ``SystemExit(0)``."""
    serve_until_shutdown(listen, job_secret, advertise, idle_timeout, exit_with_controller)
    raise SystemExit(0)
