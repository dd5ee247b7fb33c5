"""What a ``KubernetesJob`` creates for its provisioned meshes, as Kubernetes API objects.

Per mesh, an indexed ``batch/v1`` Job running one worker daemon per pod and a headless Service
over its pods; per job, a Secret holding the job secret, which reaches each container as
``REGENCY_JOB_SECRET`` through ``secretKeyRef``. Their names carry the job's run id, and their
labels say who manages them and which job and mesh they belong to.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from regency._transport.auth import SECRET_ENV
from regency.actor._worker import worker_command
from regency.job._kubernetes_client import client

STATEFULSET_RANK_LABEL = "apps.kubernetes.io/pod-index"
JOB_RANK_LABEL = "batch.kubernetes.io/job-completion-index"
MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_LABEL = "regency.dev/job"
MESH_LABEL = "regency.dev/mesh"
_CONTAINER = "worker"


@dataclass(frozen=True)
class ImageSpec:
    """The container a provisioned mesh runs: an image with regency installed.

    ``python_exe`` is the interpreter inside the image; ``resources`` becomes the container's
    requests and limits (e.g. ``{"cpu": "4", "nvidia.com/gpu": "8"}``); ``env`` adds
    environment variables (not secrets: they are in the Job's manifest).
    """

    image: str
    python_exe: str = "python"
    resources: Mapping[str, str] | None = None
    env: Mapping[str, str] | None = None


class MeshSpec(Protocol):
    """What the manifests need of a mesh (one ``KubernetesJob.add_mesh`` call)."""

    @property
    def name(self) -> str: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def image_spec(self) -> ImageSpec | None: ...
    @property
    def port(self) -> int: ...
    @property
    def pod_template(self) -> Any: ...  # V1PodTemplateSpec | None
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def provisioned(self) -> bool: ...


def resource_name(run_id: str, mesh: str) -> str:
    """The name of the Job and Service created for ``mesh`` in run ``run_id`` (a DNS label)."""
    base = re.sub(r"[^a-z0-9-]", "-", mesh.lower()).strip("-")[:40] or "mesh"
    return f"regency-{base}-{run_id}"


def secret_name(run_id: str) -> str:
    """The name of the Secret holding the job secret in run ``run_id``."""
    return f"regency-secret-{run_id}"


def labels(run_id: str, mesh: MeshSpec | None) -> dict[str, str]:
    """The labels of what run ``run_id`` creates for ``mesh`` (``None``: for the whole job)."""
    found = {} if mesh is None else dict(mesh.labels)
    found.update({MANAGED_BY: "regency", JOB_LABEL: run_id})
    if mesh is not None:
        found[MESH_LABEL] = resource_name(run_id, mesh.name).removeprefix("regency-")
    return found


def secret_manifest(run_id: str, secret: bytes) -> Any:
    """The ``V1Secret`` holding ``secret`` (hex) under ``REGENCY_JOB_SECRET``."""
    k8s = client()
    return k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=k8s.V1ObjectMeta(name=secret_name(run_id), labels=labels(run_id, None)),
        type="Opaque",
        string_data={SECRET_ENV: secret.hex()},
    )


def service_manifest(run_id: str, spec: MeshSpec) -> Any:
    """The headless ``V1Service`` over a provisioned mesh's pods."""
    k8s = client()
    found = labels(run_id, spec)
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(
            name=resource_name(run_id, spec.name),
            labels=found,
            annotations=spec.annotations or None,
        ),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            selector={JOB_LABEL: found[JOB_LABEL], MESH_LABEL: found[MESH_LABEL]},
            publish_not_ready_addresses=True,
            ports=[k8s.V1ServicePort(name="regency", port=spec.port, target_port=spec.port)],
        ),
    )


def job_manifest(run_id: str, spec: MeshSpec) -> Any:
    """The indexed ``V1Job`` running a provisioned mesh's worker daemons."""
    k8s = client()
    if not spec.provisioned:
        raise ValueError(f"mesh {spec.name!r} attaches to running pods; it has no Job")
    found = labels(run_id, spec)
    name = resource_name(run_id, spec.name)
    template = (
        copy.deepcopy(spec.pod_template)
        if spec.pod_template is not None
        else k8s.V1PodTemplateSpec(spec=k8s.V1PodSpec(containers=[]))
    )
    if template.metadata is None:
        template.metadata = k8s.V1ObjectMeta()
    template.metadata.labels = {**(template.metadata.labels or {}), **found}
    if spec.annotations:
        template.metadata.annotations = {
            **(template.metadata.annotations or {}),
            **spec.annotations,
        }
    pod = template.spec
    if pod is None:
        pod = template.spec = k8s.V1PodSpec(containers=[])
    pod.restart_policy = pod.restart_policy or "Never"
    pod.subdomain = name  # DNS names under the headless Service
    containers = list(pod.containers or [])
    chosen = next((c for c in containers if c.name == _CONTAINER), None)
    if chosen is None and containers:
        chosen = containers[0]
    if chosen is None:
        chosen = k8s.V1Container(name=_CONTAINER)
        containers.append(chosen)
    pod.containers = containers
    _fill_container(k8s, chosen, spec, secret_name(run_id))
    return k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=k8s.V1ObjectMeta(name=name, labels=found, annotations=spec.annotations or None),
        spec=k8s.V1JobSpec(
            completion_mode="Indexed",
            completions=spec.num_replicas,
            parallelism=spec.num_replicas,
            backoff_limit=0,
            template=template,
        ),
    )


def _fill_container(k8s: Any, container: Any, spec: MeshSpec, secret: str) -> None:
    """Give the worker container its image, command, port, probe, resources and secret."""
    image = spec.image_spec
    if image is not None:
        container.image = image.image
    if container.image is None:
        raise ValueError(f"mesh {spec.name!r}: the pod template's container has no image")
    if not container.command and not container.args:
        python = image.python_exe if image is not None else "python"
        container.command = worker_command(f"tcp://0.0.0.0:{spec.port}", python=python)
    env = [e for e in (container.env or []) if e.name != SECRET_ENV]
    if image is not None and image.env:
        env += [k8s.V1EnvVar(name=k, value=v) for k, v in sorted(image.env.items())]
    env.append(
        k8s.V1EnvVar(
            name=SECRET_ENV,
            value_from=k8s.V1EnvVarSource(
                secret_key_ref=k8s.V1SecretKeySelector(name=secret, key=SECRET_ENV)
            ),
        )
    )
    container.env = env
    ports = list(container.ports or [])
    if all(p.container_port != spec.port for p in ports):
        ports.append(k8s.V1ContainerPort(name="regency", container_port=spec.port))
    container.ports = ports
    if container.readiness_probe is None:
        container.readiness_probe = k8s.V1Probe(
            tcp_socket=k8s.V1TCPSocketAction(port=spec.port), period_seconds=1
        )
    if image is not None and image.resources:
        container.resources = k8s.V1ResourceRequirements(
            requests=dict(image.resources), limits=dict(image.resources)
        )
