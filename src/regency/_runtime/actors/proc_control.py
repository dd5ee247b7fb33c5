"""Requests to host agents about procs, and what a proc mesh records about each proc."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from regency._runtime.actors.bootstrap_command import ProcLaunch
from regency._runtime.kernel.refs import PortRef
from regency._transport import address

_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def new_proc_address(agent: str, job_id: str, mesh_name: str, tag: str = "") -> str:
    """A fresh address for a proc of mesh ``mesh_name`` that host agent ``agent`` will start:
    on this machine a unix address, on a worker host one behind the worker's TCP port."""
    mesh = _NAME_SAFE.sub("_", mesh_name)[:64]
    return address.behind(agent, f"regency-{job_id}-{mesh}-{tag}{os.urandom(6).hex()}")


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


@dataclass(frozen=True, slots=True)
class StopProcs:
    """Ask a host agent to stop procs (gracefully, then by force) and report when all are gone."""

    addrs: tuple[str, ...]
    reason: str
    done: PortRef


@dataclass(frozen=True, slots=True)
class ShutdownHost:
    """Ask a worker daemon to stop every proc and exit (``HostMesh.shutdown``).

    The worker's connection closing is the answer; it writes ``(worker, error)`` to ``done``
    only to refuse (it serves another controller than ``controller``).
    """

    controller: str
    done: PortRef
