"""A snapshot of what this controller runs: hosts → procs → actors, with their states.

The tree is built from what this process owns (the proc meshes it spawned and the actor meshes
spawned on them from here) and from each live proc's own account of its actors (a
:class:`~regency._runtime.actors.control.control.ProcStats` to every proc, answered by its agent's
thread): state (running / failed / stopped), the failure text, messages handled and mailbox
depth. Restart counts and latched failures come from the meshes' supervisors here. Every node
has a ``ref`` (URL-safe, stable for the node's life) for looking it up on its own.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from regency._runtime.actors.base import context
from regency._runtime.actors.control.control import ProcStats
from regency._runtime.actors.meshes.meshes import ProcMesh
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.observe.answers import Answers
from regency._runtime.actors.supervision.supervision import is_stop_reason
from regency._runtime.kernel import state
from regency.shape import Point

_STATS_TIMEOUT = 5.0
Node = dict[str, Any]


def ref_of(kind: str, *key: object) -> str:
    """A node's reference: its kind and a short digest of what identifies it."""
    digest = hashlib.sha256("\0".join(map(str, key)).encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


def owned_proc_meshes() -> list[ProcMesh]:
    """The proc meshes this process's root owns, oldest first."""
    return [m for m in context.client().owned if isinstance(m, ProcMesh)]


def live_proc_addresses() -> list[str]:
    """The addresses of the live procs of the proc meshes this process's root owns."""
    dead = state.runtime().losses.dead
    addrs = {info.addr for mesh in owned_proc_meshes() for info in _all_procs(mesh)}
    return sorted(a for a in addrs if a not in dead)


def mesh_tree(timeout: float = _STATS_TIMEOUT) -> Node:
    """The whole tree as JSON-ready dicts (asks every live proc for its actors' states)."""
    rt = state.runtime()
    meshes = owned_proc_meshes()
    addrs = sorted({info.addr for mesh in meshes for info in _all_procs(mesh)})
    live = [a for a in addrs if a not in rt.losses.dead]
    stats = _proc_stats(live, timeout)
    hosts: dict[str, Node] = {}
    for mesh in meshes:
        for rank, info in _ranked_procs(mesh):
            host = hosts.setdefault(
                info.agent,
                {
                    "ref": ref_of("host", info.agent),
                    "kind": "host",
                    "address": info.agent,
                    "procs": [],
                },
            )
            host["procs"].append(_proc_node(mesh, rank, info.addr, stats.get(info.addr)))
    return {
        "ref": "root",
        "kind": "root",
        "address": rt.address,
        "pid": os.getpid(),
        "job_id": rt.job_id,
        "hosts": list(hosts.values()),
    }


def find(tree: Node, ref: str) -> Node | None:
    """The node of ``tree`` whose ``ref`` is ``ref``."""
    if tree.get("ref") == ref:
        return tree
    for key in ("hosts", "procs", "actors"):
        for child in tree.get(key, ()):
            found = find(child, ref)
            if found is not None:
                return found
    return None


def _all_procs(mesh: ProcMesh) -> list[Any]:
    return [info for _, info in _ranked_procs(mesh)]


def _ranked_procs(mesh: ProcMesh) -> list[tuple[int, Any]]:
    """``(rank, ProcInfo)`` of the mesh's procs, then of procs that restarts put in their
    place (a restarted rank runs in a new process; the one it replaced is listed too)."""
    seen: dict[str, tuple[int, Any]] = {}
    for rank, info in enumerate(mesh._procs):
        seen.setdefault(info.addr, (rank, info))
    for supervisor in mesh._supervisors:
        for rank, info in enumerate(supervisor.procs):
            seen.setdefault(info.addr, (rank, info))
    return list(seen.values())


def _proc_stats(addrs: list[str], timeout: float) -> dict[str, dict[int, Any] | str]:
    """Each proc's ``{mesh_id: stats}``, or why it did not say."""
    gather: Answers[dict[int, Any] | str] = Answers(
        addrs,
        lost=lambda addr, reason: f"gone: {reason}",
        silent=f"no answer within {timeout:g} s",
    )
    pending = gather.ask(ProcStats, timeout)
    if not pending.wait(timeout + 5.0):  # the timeout fills in every silent proc before this
        return {}
    answers: list[dict[int, Any] | str] = pending.outcome()
    return dict(zip(addrs, answers, strict=True))


def _proc_node(mesh: ProcMesh, rank: int, addr: str, stats: dict[int, Any] | str | None) -> Node:
    rt = state.runtime()
    end = rt.losses.dead.get(addr)
    if end is not None:
        proc_state, reason = ("stopped" if is_stop_reason(end) else "failed"), end
    elif mesh._stopped:
        proc_state, reason = "stopped", None
    elif isinstance(stats, str):
        proc_state, reason = "unknown", stats
    else:
        proc_state, reason = "running", None
    extent = mesh._shape.extent
    node: Node = {
        "ref": ref_of("proc", addr),
        "kind": "proc",
        "address": addr,
        "proc_mesh": mesh._name,
        "rank": rank,
        "point": dict(Point(rank, extent)) if rank < extent.nelements else {},
        "state": proc_state,
        "reason": reason,
        "actors": [],
    }
    for supervisor in mesh._supervisors:
        for actor_rank, base in enumerate(supervisor.bases):
            if supervisor.procs[base].addr != addr:
                continue
            live = stats.get(supervisor.mesh_id) if isinstance(stats, dict) else None
            node["actors"].append(_actor_node(supervisor, actor_rank, base, live, proc_state, addr))
    return node


def _actor_node(
    supervisor: Any, rank: int, base: int, live: Any, proc_state: str, addr: str
) -> Node:
    latched = supervisor.bad.get(base)
    if isinstance(live, dict):
        actor_state, failure = live["state"], live["failure"]
        handled, depth = live["messages_handled"], live["mailbox_depth"]
    else:
        actor_state, failure, handled, depth = "stopped", None, None, None
        if proc_state == "unknown":
            actor_state = "unknown"
        elif proc_state == "running":
            actor_state = "starting"  # its proc has not taken the spawn yet
    if supervisor.stopping and actor_state != "failed":
        actor_state = "stopped"  # its owner stopped the mesh (each rank latched "stopped")
    elif latched is not None and actor_state != "failed":
        actor_state = "stopped" if is_stop_reason(latched) else "failed"
        failure = failure or latched
    return {
        "ref": ref_of("actor", supervisor.mesh_id, rank, supervisor.generation),
        "kind": "actor",
        "name": supervisor.actor_name(rank),
        "full_name": tracing.actor_full_name(addr, supervisor.name, supervisor.mesh_id, rank),
        "actor_mesh": supervisor.name,
        "class": supervisor.class_name,
        "rank": rank,
        "point": dict(Point(rank, supervisor.extent)),
        "state": actor_state,
        "failure": failure,
        "restarts": supervisor.restarts,
        "messages_handled": handled,
        "mailbox_depth": depth,
    }
