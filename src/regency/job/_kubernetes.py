"""``KubernetesJob``: host meshes made of Kubernetes pods, found by label or created by the job.

Each mesh is ``num_replicas`` pods, one worker daemon per pod, ranked by a pod label.

- **Attach** (no ``image_spec``/``pod_template``): the pods already run a worker daemon on
  ``port`` (a StatefulSet, say, whose pods carry ``apps.kubernetes.io/pod-index``). The job
  lists the pods matching ``label_selector``, waits until ``num_replicas`` of them are Running
  and Ready, orders them by ``pod_rank_label`` and attaches to ``tcp://{pod_ip}:{port}``. The
  pods must hold the job secret: set ``REGENCY_JOB_SECRET`` in them to ``job.secret.hex()``.
  ``kill()`` leaves them alone.
- **Provision** (``image_spec`` or ``pod_template``): ``apply()`` creates, per mesh, an indexed
  ``batch/v1`` Job (``completionMode: Indexed``, ``parallelism = completions = num_replicas``)
  whose container runs ``python -m regency worker --listen tcp://0.0.0.0:PORT`` with a TCP
  readiness probe on the port, and a headless Service over its pods; and, once per job, a
  ``Secret`` holding the job secret, which reaches each container as ``REGENCY_JOB_SECRET``
  through ``secretKeyRef`` (on no command line, in no image). Pods are ranked by the Job's
  ``batch.kubernetes.io/job-completion-index`` label. ``kill()`` deletes exactly what the job
  created (the Jobs with foreground propagation, so their pods go first; the Services; the
  Secret) and waits until the pods are gone. The manifests are built by
  :mod:`regency.job._kubernetes_manifests`.

API objects: ``core_api``/``batch_api``, else the in-cluster service account in a pod, else
``kubeconfig`` (default ``~/.kube/config``); the client is imported only when needed
(``pip install 'regency[kubernetes]'``). The controller dials pod IPs and the pods dial it back,
unless ``port_forward=True`` (out of the cluster): then each pod is reached only through a
``kubectl port-forward`` of its own, and reaches the controller back over reverse connections
through it (:mod:`regency.job._port_forward`).
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from regency.job import _kubernetes_manifests as manifests
from regency.job._errors import JobError
from regency.job._kubernetes_client import api_client, client, model
from regency.job._kubernetes_manifests import (
    JOB_LABEL,
    JOB_RANK_LABEL,
    MESH_LABEL,
    STATEFULSET_RANK_LABEL,
    ImageSpec,
)
from regency.job._kubernetes_pods import job_finished, rank_pods
from regency.job._port_forward import PortForward, port_forward_command
from regency.job._trait import JobTrait

__all__ = ["ImageSpec", "KubernetesJob"]

_DELETE_TIMEOUT = 120.0


def _not_found(exc: BaseException) -> bool:
    return getattr(exc, "status", None) == 404


@dataclass
class _Mesh:
    """One ``add_mesh`` call."""

    name: str
    num_replicas: int
    label_selector: str | None
    pod_rank_label: str
    image_spec: ImageSpec | None
    port: int
    pod_template: Any  # V1PodTemplateSpec | None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def provisioned(self) -> bool:
        return self.image_spec is not None or self.pod_template is not None


class KubernetesJob(JobTrait):
    """Host meshes of Kubernetes pods, one worker daemon per pod (see the module docstring).

    ::

        job = KubernetesJob(namespace="training", timeout=600)
        job.add_mesh("trainers", 4, image_spec=ImageSpec("registry/app:1.0",
                                                         resources={"nvidia.com/gpu": "8"}))
        job.add_mesh("servers", 2, label_selector="app=servers")   # pods already running
        trainers = job.state().trainers.spawn_procs(per_host={"gpus": 8})
        ...
        job.kill()   # deletes the trainers' Job, Service and the Secret; servers untouched

    Args:
        namespace: the namespace the pods (and anything created) live in.
        timeout: seconds ``state()`` waits for each mesh's pods to be Running and Ready;
            ``TimeoutError`` names the pods (and ranks) not ready. ``None`` waits indefinitely.
        kubeconfig: a kubeconfig file for out-of-cluster use (default: in-cluster config when
            running in a pod, else ``~/.kube/config``).
        core_api: a ``kubernetes.client.CoreV1Api`` to use (default: built from the config).
        batch_api: a ``kubernetes.client.BatchV1Api`` to use (default: built from the config).
        poll_interval: seconds between pod listings while waiting.
        port_forward: reach every pod through a ``kubectl port-forward`` of its own (started
            by ``state()``, ended by ``kill()`` or when this process exits), for a controller
            outside the cluster that cannot dial pod IPs and that the pods cannot dial.
        kubectl: the kubectl command (a path, or an argv prefix such as ``["kubectl",
            "--context", "prod"]``); ``kubeconfig`` is passed on to it.

    """

    def __init__(
        self,
        namespace: str,
        timeout: float | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        core_api: Any = None,
        batch_api: Any = None,
        poll_interval: float = 1.0,
        port_forward: bool = False,
        kubectl: str | Sequence[str] = "kubectl",
    ) -> None:
        super().__init__()
        self.port_forward = port_forward
        self.kubectl = kubectl if isinstance(kubectl, str) else list(kubectl)
        self._pod_names: dict[str, str] = {}  # worker address -> its pod's name
        self._forwards: list[PortForward] = []
        self.namespace = namespace
        self.timeout = timeout
        self.kubeconfig = None if kubeconfig is None else os.fspath(kubeconfig)
        self.poll_interval = poll_interval
        self.meshes: dict[str, _Mesh] = {}
        self.run_id = uuid.uuid4().hex[:10]
        self.created: list[tuple[str, str]] = []  # (kind, name) of what _create made
        self._core = core_api
        self._batch = batch_api

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = STATEFULSET_RANK_LABEL,
        image_spec: ImageSpec | str | None = None,
        port: int = 26600,
        pod_template: Any = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Declare mesh ``name`` of ``num_replicas`` pods.

        With ``image_spec`` (an :class:`ImageSpec` or an image name) or ``pod_template`` (a
        ``V1PodTemplateSpec`` or its dict; its container named ``worker``, else its first, gets
        the worker command unless it has one, the port and the secret) the job creates the
        pods; otherwise it attaches to the pods matching ``label_selector``, ranked by
        ``pod_rank_label``. ``labels`` and ``annotations`` go on everything created.
        """
        if not name.isidentifier():
            raise ValueError(f"mesh name {name!r} is not a Python identifier")
        if name in self.meshes:
            raise ValueError(f"mesh {name!r} was already added")
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"mesh {name!r} needs a positive num_replicas, not {num_replicas!r}")
        if not 0 < port < 65536:
            raise ValueError(f"port must be 1..65535, not {port}")
        if isinstance(image_spec, str):
            image_spec = ImageSpec(image_spec)
        if pod_template is not None and isinstance(pod_template, Mapping):
            pod_template = model(dict(pod_template), "V1PodTemplateSpec")
        mesh = _Mesh(
            name,
            num_replicas,
            label_selector,
            pod_rank_label,
            image_spec,
            port,
            copy.deepcopy(pod_template),
            dict(labels or {}),
            dict(annotations or {}),
        )
        if not mesh.provisioned and not label_selector:
            raise ValueError(
                f"mesh {name!r}: give label_selector (attach to running pods) or "
                "image_spec/pod_template (create them)"
            )
        if mesh.provisioned:
            mesh.pod_rank_label = JOB_RANK_LABEL  # what an indexed Job labels its pods with
        self.meshes[name] = mesh

    # -- names and manifests (see regency.job._kubernetes_manifests) ---------------------------

    def resource_name(self, mesh: str) -> str:
        """The name of the Job and Service created for ``mesh`` (a DNS label)."""
        return manifests.resource_name(self.run_id, mesh)

    @property
    def secret_name(self) -> str:
        """The name of the Secret holding the job secret."""
        return manifests.secret_name(self.run_id)

    def selector(self, mesh: str) -> str:
        """The label selector of a mesh's pods."""
        spec = self.meshes[mesh]
        if not spec.provisioned:
            assert spec.label_selector is not None
            return spec.label_selector
        labels = manifests.labels(self.run_id, spec)
        return f"{JOB_LABEL}={labels[JOB_LABEL]},{MESH_LABEL}={labels[MESH_LABEL]}"

    def secret_manifest(self) -> Any:
        """The ``V1Secret`` holding the job secret (hex) under ``REGENCY_JOB_SECRET``."""
        return manifests.secret_manifest(self.run_id, self.secret)

    def service_manifest(self, mesh: str) -> Any:
        """The headless ``V1Service`` over a provisioned mesh's pods."""
        return manifests.service_manifest(self.run_id, self.meshes[mesh])

    def job_manifest(self, mesh: str) -> Any:
        """The indexed ``V1Job`` running a provisioned mesh's worker daemons."""
        return manifests.job_manifest(self.run_id, self.meshes[mesh])

    # -- the API --------------------------------------------------------------------------------

    def _apis(self) -> tuple[Any, Any]:
        if self._core is None or self._batch is None:
            k8s = client()
            api = api_client(self.kubeconfig)
            self._core = self._core or k8s.CoreV1Api(api)
            self._batch = self._batch or k8s.BatchV1Api(api)
        return self._core, self._batch

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_core"] = state["_batch"] = None  # API clients belong to this process
        state["_forwards"] = []  # so do the kubectl processes
        return state

    def _adopt(self, running: JobTrait) -> None:
        # How this controller reaches the cluster is its own, not the cached job's.
        mine = self._core, self._batch, self.port_forward, self.kubectl, self.kubeconfig
        super()._adopt(running)
        self._core, self._batch, self.port_forward, self.kubectl, self.kubeconfig = mine

    def _forwarded(self, addresses: list[str]) -> dict[str, str]:
        if not self.port_forward:
            return {}
        started: list[PortForward] = []
        try:
            for worker in addresses:
                pod = self._pod_names[worker]
                port = int(worker.rpartition(":")[2])
                argv = port_forward_command(
                    self.kubectl, self.namespace, pod, port, self.kubeconfig
                )
                started.append(PortForward(argv, pod))
        except BaseException:
            for forward in started:
                forward.stop()
            raise
        self._forwards += started
        return {worker: forward.local for worker, forward in zip(addresses, started, strict=True)}

    def stop_port_forwards(self) -> None:
        """End the ``kubectl port-forward`` processes ``state()`` started (``kill()`` does)."""
        forwards, self._forwards = self._forwards, []
        for forward in forwards:
            forward.stop()

    # -- JobTrait hooks -------------------------------------------------------------------------

    def _spec(self) -> Any:
        return (self.namespace, tuple(sorted(self.meshes.items())))

    def _create(self) -> None:
        if not self.meshes:
            raise ValueError("KubernetesJob has no meshes: call add_mesh() first")
        provisioned = [m for m in self.meshes.values() if m.provisioned]
        if not provisioned:
            return  # attach only: nothing to create
        core, batch = self._apis()
        try:
            core.create_namespaced_secret(self.namespace, self.secret_manifest())
            self.created.append(("Secret", self.secret_name))
            for mesh in provisioned:
                core.create_namespaced_service(self.namespace, self.service_manifest(mesh.name))
                self.created.append(("Service", self.resource_name(mesh.name)))
                batch.create_namespaced_job(self.namespace, self.job_manifest(mesh.name))
                self.created.append(("Job", self.resource_name(mesh.name)))
        except BaseException:
            self._kill()
            raise

    def _running(self) -> bool:
        if not self.meshes:
            return False
        core, batch = self._apis()
        for mesh in self.meshes.values():
            if mesh.provisioned:
                if ("Job", self.resource_name(mesh.name)) not in self.created:
                    return False
                try:
                    job = batch.read_namespaced_job(self.resource_name(mesh.name), self.namespace)
                except Exception as exc:
                    if _not_found(exc):
                        return False
                    raise
                if job_finished(job):
                    return False
            elif isinstance(rank_pods(self._pods(core, mesh), mesh), str):
                return False  # attach mode: running means its pods are ready now
        return True

    def _worker_addresses(self) -> dict[str, list[str]]:
        core, _ = self._apis()
        return {name: self._wait_for_pods(core, mesh) for name, mesh in self.meshes.items()}

    def _kill(self) -> None:
        self.stop_port_forwards()
        if not self.created:
            return
        core, batch = self._apis()
        deleters = {
            "Job": batch.delete_namespaced_job,
            "Service": core.delete_namespaced_service,
            "Secret": core.delete_namespaced_secret,
        }
        k8s = client()
        for kind, name in reversed(self.created):
            try:
                deleters[kind](
                    name,
                    self.namespace,
                    body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
                )
            except Exception as exc:
                if not _not_found(exc):
                    raise
        # Wait until the pods of what was deleted are gone, so nothing of this job is left.
        meshes = [
            m for m in self.meshes.values() if ("Job", self.resource_name(m.name)) in self.created
        ]
        deadline = time.monotonic() + _DELETE_TIMEOUT
        for mesh in meshes:
            while self._pods(core, mesh):
                if time.monotonic() > deadline:
                    raise JobError(
                        f"the pods of Job {self.resource_name(mesh.name)} are still there "
                        f"{_DELETE_TIMEOUT:.0f}s after deleting it; kill() again to retry"
                    )
                time.sleep(self.poll_interval)  # the API offers no cheaper wait than a watch
        self.created = []
        self.run_id = uuid.uuid4().hex[:10]  # a new apply creates new objects

    # -- finding the pods -----------------------------------------------------------------------

    def _pods(self, core: Any, mesh: _Mesh) -> list[Any]:
        listing = core.list_namespaced_pod(self.namespace, label_selector=self.selector(mesh.name))
        return list(listing.items or [])

    def _wait_for_pods(self, core: Any, mesh: _Mesh) -> list[str]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            ranked = rank_pods(self._pods(core, mesh), mesh)
            if not isinstance(ranked, str):
                addresses = [f"tcp://{pod.status.pod_ip}:{mesh.port}" for pod in ranked]
                self._pod_names.update(
                    zip(addresses, (pod.metadata.name for pod in ranked), strict=True)
                )
                return addresses
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"KubernetesJob mesh {mesh.name!r} (namespace {self.namespace!r}, selector "
                    f"{self.selector(mesh.name)!r}): not ready within timeout={self.timeout:g}s: "
                    f"{ranked}"
                )
            time.sleep(self.poll_interval)  # polling the API server, at poll_interval
