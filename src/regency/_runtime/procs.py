"""Requests to host agents about procs, and what a proc mesh records about each proc."""

from __future__ import annotations

from dataclasses import dataclass

from regency._runtime.proc import PortRef


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


@dataclass(frozen=True, slots=True)
class StopProcs:
    """Ask a host agent to stop procs (gracefully, then by force) and report when all are gone."""

    addrs: tuple[str, ...]
    reason: str
    done: PortRef
