"""An in-memory fake of the few Kubernetes API calls ``KubernetesJob`` makes (tests only), and
``V1Pod`` objects as the API server describes them.

Needs the ``kubernetes`` client (its models and ``ApiException``): import it after
``pytest.importorskip("kubernetes.client")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s
from kubernetes.client.rest import ApiException

from regency.job._kubernetes import JOB_RANK_LABEL
from regency.job._kubernetes_pods import pod_ready

NS = "ml"


class FakeKubernetesApiServer:
    """An in-memory fake of the Kubernetes API server: ONLY for tests.

    Implements the calls KubernetesJob makes, on ``.core`` (``CoreV1Api``) and ``.batch``
    (``BatchV1Api``): create/delete of Secrets, Services and Jobs, ``read_namespaced_job`` and
    ``list_namespaced_pod`` with equality label selectors. Creating a Job creates its indexed
    pods (Pending, labelled with the completion index) the way the Job controller would;
    deleting it deletes them. Missing objects raise the client's ``ApiException(404)``,
    duplicates ``ApiException(409)``. ``calls`` records every call.
    """

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Any] = {}  # (kind, namespace, name) -> model
        self.calls: list[tuple[str, ...]] = []
        self.before_list: Callable[[FakeKubernetesApiServer], None] | None = None
        self.fail_on: str | None = None
        self.core = _Facade(self)
        self.batch = self.core

    # object store
    def create(self, kind: str, namespace: str, body: Any) -> Any:
        self.calls.append(("create", kind, namespace, body.metadata.name))
        if self.fail_on == kind:
            raise ApiException(status=403, reason=f"Forbidden: cannot create {kind}")
        key = (kind, namespace, body.metadata.name)
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = body
        if kind == "Job":
            self._start_job(namespace, body)
        return body

    def delete(self, kind: str, name: str, namespace: str, body: Any = None) -> None:
        policy = body.propagation_policy if body is not None else None
        self.calls.append(("delete", kind, namespace, name, str(policy)))
        if self.objects.pop((kind, namespace, name), None) is None:
            raise ApiException(status=404, reason="NotFound")
        if kind == "Job":
            for key, pod in list(self.objects.items()):
                owner = (pod.metadata.labels or {}).get("batch.kubernetes.io/job-name")
                if key[0] == "Pod" and key[1] == namespace and owner == name:
                    del self.objects[key]

    def read(self, kind: str, name: str, namespace: str) -> Any:
        try:
            return self.objects[(kind, namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="NotFound") from None

    def pods(self, namespace: str, selector: str | None = None) -> list[Any]:
        wanted = dict(term.split("=", 1) for term in selector.split(",")) if selector else {}
        return [
            pod
            for (kind, ns, _), pod in sorted(self.objects.items())
            if kind == "Pod"
            and ns == namespace
            and all((pod.metadata.labels or {}).get(k) == v for k, v in wanted.items())
        ]

    def add_pod(self, namespace: str, pod: Any) -> Any:
        self.objects[("Pod", namespace, pod.metadata.name)] = pod
        return pod

    def _start_job(self, namespace: str, job: Any) -> None:
        template = job.spec.template
        for index in range(job.spec.completions):
            labels = {
                **(template.metadata.labels or {}),
                JOB_RANK_LABEL: str(index),
                "batch.kubernetes.io/job-name": job.metadata.name,
            }
            self.add_pod(
                namespace,
                k8s.V1Pod(
                    metadata=k8s.V1ObjectMeta(name=f"{job.metadata.name}-{index}", labels=labels),
                    spec=template.spec,
                    status=k8s.V1PodStatus(phase="Pending"),
                ),
            )


class _Facade:
    """The ``CoreV1Api``/``BatchV1Api`` method names over the fake server."""

    def __init__(self, server: FakeKubernetesApiServer) -> None:
        self.server = server

    def create_namespaced_secret(self, namespace: str, body: Any) -> Any:
        return self.server.create("Secret", namespace, body)

    def create_namespaced_service(self, namespace: str, body: Any) -> Any:
        return self.server.create("Service", namespace, body)

    def create_namespaced_job(self, namespace: str, body: Any) -> Any:
        return self.server.create("Job", namespace, body)

    def delete_namespaced_secret(self, name: str, namespace: str, body: Any = None) -> None:
        self.server.delete("Secret", name, namespace, body)

    def delete_namespaced_service(self, name: str, namespace: str, body: Any = None) -> None:
        self.server.delete("Service", name, namespace, body)

    def delete_namespaced_job(self, name: str, namespace: str, body: Any = None) -> None:
        self.server.delete("Job", name, namespace, body)

    def read_namespaced_job(self, name: str, namespace: str) -> Any:
        return self.server.read("Job", name, namespace)

    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None) -> Any:
        self.server.calls.append(("list", "Pod", namespace, str(label_selector)))
        if self.server.before_list is not None:
            self.server.before_list(self.server)
        return k8s.V1PodList(items=self.server.pods(namespace, label_selector))


def pod(
    name: str,
    rank: int | str | None,
    *,
    ip: str | None = "10.0.0.1",
    phase: str = "Running",
    ready: bool = True,
    labels: dict[str, str] | None = None,
    rank_label: str = "apps.kubernetes.io/pod-index",
    deleting: bool = False,
) -> Any:
    """A ``V1Pod`` as the API server would describe it."""
    all_labels = {"app": "workers", **(labels or {})}
    if rank is not None:
        all_labels[rank_label] = str(rank)
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=name,
            labels=all_labels,
            deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None,
        ),
        status=k8s.V1PodStatus(
            phase=phase,
            pod_ip=ip,
            conditions=[k8s.V1PodCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def make_ready(server: FakeKubernetesApiServer, ips: dict[str, str] | None = None) -> None:
    """Every pod not yet ready becomes Running and Ready (given IPs, else 10.1.0.<n>)."""
    for n, found in enumerate(server.pods(NS)):
        if pod_ready(found):
            continue
        found.status = k8s.V1PodStatus(
            phase="Running",
            pod_ip=(ips or {}).get(found.metadata.name, f"10.1.0.{n + 1}"),
            conditions=[k8s.V1PodCondition(type="Ready", status="True")],
        )
