"""The control plane's messages: what a process asks of another's proc agent
(``SERVICE_PROC``), host agent (``SERVICE_HOST``) or singleton registry, as typed values.

The kernel's one message, :class:`~regency._runtime.kernel.wire.BulkRelease`, lives in the
kernel; the worker daemon's :class:`~regency._runtime.host.worker_daemon.Attach` with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn, TypeAlias

from regency._runtime.actors.base.identity import CreatorInstance
from regency._runtime.actors.control.bootstrap_command import ProcLaunch
from regency._runtime.kernel.refs import PortRef

# -- to a proc agent -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpawnActor:
    """A request to a proc: create one actor of a mesh there."""

    mesh_id: int
    name: str
    rank: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    creator: CreatorInstance
    class_name: str  # module.qualname, so errors name the class even if unpickling it fails
    payload: bytes  # cloudpickled (cls, args, kwargs, proc_mesh)
    status: PortRef  # receives (rank, error-text-or-None) once __init__ has run
    owner: PortRef | None  # supervision reports for this mesh go here


@dataclass(frozen=True, slots=True)
class PingProc:
    """Ask a proc to answer on ``port`` (as ``rank``) once booted: its bootstrap's error or None."""

    port: PortRef
    rank: int


@dataclass(frozen=True, slots=True)
class DumpStacks:
    """Ask a proc for its threads' Python stacks, answered on ``port`` (as ``rank``) with text;
    ``pyspy``: through py-spy where the proc's host has it."""

    port: PortRef
    rank: int
    pyspy: bool


@dataclass(frozen=True, slots=True)
class ProcStats:
    """Ask a proc what its actors are doing, answered on ``port`` (as ``rank``) with
    ``{mesh_id: ActorInstance.stats()}``."""

    port: PortRef
    rank: int


@dataclass(frozen=True, slots=True)
class SetLogLevel:
    """Set the level of a proc's root logger (``ProcMesh.logging_option(level=...)``)."""

    level: int


@dataclass(frozen=True, slots=True)
class SetTelemetry:
    """Switch a proc's telemetry on or off (the controller's ``enable_telemetry()``); ``settings``
    are the controller's ``telemetry*`` configuration values."""

    on: bool
    settings: dict[str, object]


@dataclass(frozen=True, slots=True)
class StopActor:
    """Ask a proc to stop its actor of mesh ``mesh_id``; ``done`` (if any) hears when it has."""

    mesh_id: int
    reason: str
    done: PortRef | None


@dataclass(frozen=True, slots=True)
class StopProc:
    """Ask a proc to stop every actor it hosts, then exit.

    ``exiting``: its controller is exiting, so the proc ends without running its interpreter's
    exit handlers (as Monarch's procs then do): a library thread still blocked, in a collective
    say, cannot hold its exit up.
    """

    reason: str
    exiting: bool = False


@dataclass(frozen=True, slots=True)
class GetSingleton:
    """Ask the root for singleton ``name``, spawning cloudpickled ``(cls, args, kwargs)`` first
    if it has none; the actor mesh (or the error) goes to ``reply``."""

    name: str
    payload: bytes
    reply: PortRef


# -- to a host agent -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One proc: its address, its host agent's address, its rank and its index on the host."""

    addr: str
    agent: str
    rank: int
    local_rank: int


@dataclass(frozen=True, slots=True)
class SpawnProcs:
    """Ask a host agent to start procs at the given addresses."""

    procs: tuple[ProcInfo, ...]
    bootstrap: bytes | None  # cloudpickled callable run in each proc before any actor
    mesh_name: str
    events: PortRef | None  # receives a message when one of these procs exits
    settings: dict[str, object]  # the spawner's regency.config values when it asked
    launches: tuple[ProcLaunch | None, ...] | None = None  # per proc: binding, command
    logs: PortRef | None = None  # forward the procs' stdout/stderr lines here (None: inherit)
    hosts: tuple[str, ...] = ()  # the host agents of the host mesh they are spawned through


@dataclass(frozen=True, slots=True)
class StopProcs:
    """Ask a host agent to stop procs (gracefully, then by force) and report when all are gone."""

    addrs: tuple[str, ...]
    reason: str
    done: PortRef
    index: int = 0  # the rank of the answer to ``done``: which host agent answered


@dataclass(frozen=True, slots=True)
class ShutdownHost:
    """Ask a worker daemon to stop every proc and exit (``HostMesh.shutdown``).

    The worker's connection closing is the answer; it writes ``(worker, error)`` to ``done``
    only to refuse (it serves another controller than ``controller``).
    """

    controller: str
    done: PortRef


@dataclass(frozen=True, slots=True)
class WarmZygote:
    """Ask this process's host agent to start its zygote now, before the first spawn needs it.

    The controller posts it at boot; there is no answer.
    """


ProcAgentRequest: TypeAlias = (
    SpawnActor
    | PingProc
    | DumpStacks
    | ProcStats
    | SetLogLevel
    | SetTelemetry
    | StopActor
    | StopProc
)
"""Every request a proc agent serves (``isinstance`` takes it; ``match`` it exhaustively)."""

HostAgentRequest: TypeAlias = SpawnProcs | StopProcs | WarmZygote
"""Every request a host agent serves."""


def unhandled(request: NoReturn) -> NoReturn:
    """The last case of an exhaustive ``match`` over a request union: mypy proves it unreachable."""
    raise AssertionError(f"unhandled request {request!r}")
