"""Reading a Kubernetes job's pods: which are ready, in which rank order, and why not.

The Kubernetes API objects (``V1Pod``, ``V1Job``) are read by attribute only, so this module
does not import the ``kubernetes`` package.
"""

from __future__ import annotations

from typing import Any, Protocol


class RankedMesh(Protocol):
    """What ranking needs of a mesh: its name, size, and the pod label carrying the rank."""

    @property
    def name(self) -> str: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def pod_rank_label(self) -> str: ...


def job_finished(job: Any) -> bool:
    """Whether a Kubernetes Job has a true ``Complete`` or ``Failed`` condition."""
    for condition in (job.status.conditions if job.status else None) or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return True
    return False


def pod_ready(pod: Any) -> bool:
    """Whether a pod is running, has an IP and reports ``Ready``."""
    status = pod.status
    if status is None or status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def rank_pods(pods: list[Any], mesh: RankedMesh) -> list[Any] | str:
    """The mesh's pods in rank order when all are ready, else why not (a description).

    Pods being deleted or finished are ignored. A live pod without a valid rank label, two live
    pods with one rank, or a rank outside ``0..num_replicas-1`` raise ``ValueError``.
    """
    by_rank: dict[int, Any] = {}
    for pod in pods:
        meta = pod.metadata
        phase = pod.status.phase if pod.status else None
        if meta.deletion_timestamp is not None or phase in ("Succeeded", "Failed"):
            continue
        value = (meta.labels or {}).get(mesh.pod_rank_label)
        if value is None or not str(value).isdigit():
            raise ValueError(
                f"mesh {mesh.name!r}: pod {meta.name} has no valid rank label "
                f"{mesh.pod_rank_label!r} (value {value!r})"
            )
        rank = int(value)
        if rank >= mesh.num_replicas:
            raise ValueError(
                f"mesh {mesh.name!r}: pod {meta.name} has rank {rank}, but num_replicas="
                f"{mesh.num_replicas} (does the selector match more pods than the mesh?)"
            )
        if rank in by_rank:
            raise ValueError(
                f"mesh {mesh.name!r}: pods {by_rank[rank].metadata.name} and {meta.name} "
                f"both have rank {rank} ({mesh.pod_rank_label})"
            )
        by_rank[rank] = pod
    problems = []
    missing = [r for r in range(mesh.num_replicas) if r not in by_rank]
    if missing:
        problems.append(f"no pod for ranks {missing}")
    not_ready = [
        f"{pod.metadata.name} (rank {rank}, {describe_pod(pod)})"
        for rank, pod in sorted(by_rank.items())
        if not pod_ready(pod)
    ]
    if not_ready:
        problems.append("pods not ready: " + ", ".join(not_ready))
    if problems:
        return "; ".join(problems)
    return [by_rank[rank] for rank in range(mesh.num_replicas)]


def describe_pod(pod: Any) -> str:
    """A pod's phase and what it waits for, for messages (``Pending, ImagePullBackOff``)."""
    status = pod.status
    if status is None:
        return "no status"
    parts = [status.phase or "Unknown"]
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            parts.append(waiting.reason)
    if status.phase == "Running" and not status.pod_ip:
        parts.append("no pod IP")
    elif status.phase == "Running":
        parts.append("not Ready")
    return ", ".join(parts)
