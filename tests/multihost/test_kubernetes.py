"""KubernetesJob without a cluster: manifests as client models, pod ranking, and the lifecycle
against ``FakeKubernetesApiServer``, an in-memory stand-in for the few API calls the job makes.

No Kubernetes cluster runs here. What is real: the official client's model classes and its
serializer (``ApiClient().sanitize_for_serialization``), and, in the last test, real worker
daemons in network-namespace hosts that the job attaches to through pods the fake server
describes with those hosts' IPs.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import subprocess
import sys
from typing import Any

import cloudpickle
import pytest

k8s = pytest.importorskip("kubernetes.client", reason="the kubernetes extra is not installed")
from _fake_kubernetes import NS, FakeKubernetesApiServer, make_ready, pod  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from regency.actor import Actor, endpoint  # noqa: E402
from regency.job import ImageSpec, KubernetesJob, worker_command, worker_env  # noqa: E402
from regency.job._kubernetes import JOB_LABEL, JOB_RANK_LABEL  # noqa: E402

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def serialize(model: Any) -> Any:
    return k8s.ApiClient().sanitize_for_serialization(model)


@pytest.fixture
def server() -> FakeKubernetesApiServer:
    return FakeKubernetesApiServer()


def new_job(server: FakeKubernetesApiServer, **kwargs: Any) -> KubernetesJob:
    kwargs.setdefault("poll_interval", 0.001)
    return KubernetesJob(NS, core_api=server.core, batch_api=server.batch, **kwargs)


# -- manifests -----------------------------------------------------------------------------------


def test_provisioned_mesh_manifests() -> None:
    job = KubernetesJob(NS)
    job.add_mesh(
        "Trainers_A",
        4,
        image_spec=ImageSpec(
            "registry/app:1.0",
            python_exe="/opt/venv/bin/python",
            resources={"cpu": "4", "nvidia.com/gpu": "8"},
            env={"NCCL_DEBUG": "INFO"},
        ),
        port=7000,
        labels={"team": "ml"},
        annotations={"owner": "me"},
    )
    name = job.resource_name("Trainers_A")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert len(name) <= 63
    manifest = serialize(job.job_manifest("Trainers_A"))
    assert manifest["apiVersion"] == "batch/v1"
    assert manifest["kind"] == "Job"
    assert manifest["metadata"]["name"] == name
    assert manifest["metadata"]["annotations"] == {"owner": "me"}
    spec = manifest["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    template = spec["template"]
    labels = template["metadata"]["labels"]
    assert labels["team"] == "ml"
    assert labels[JOB_LABEL] == job.run_id
    assert labels["app.kubernetes.io/managed-by"] == "regency"
    assert template["metadata"]["annotations"] == {"owner": "me"}
    pod_spec = template["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["subdomain"] == name
    (container,) = pod_spec["containers"]
    assert container["image"] == "registry/app:1.0"
    assert container["command"] == worker_command("tcp://0.0.0.0:7000", "/opt/venv/bin/python")
    assert container["ports"] == [{"containerPort": 7000, "name": "regency"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 7000}
    assert container["resources"]["limits"] == {"cpu": "4", "nvidia.com/gpu": "8"}
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in container["env"]
    assert {
        "name": "REGENCY_JOB_SECRET",
        "valueFrom": {"secretKeyRef": {"name": job.secret_name, "key": "REGENCY_JOB_SECRET"}},
    } in container["env"]

    service = serialize(job.service_manifest("Trainers_A"))
    assert service["kind"] == "Service"
    assert service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"  # headless
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [{"name": "regency", "port": 7000, "targetPort": 7000}]
    assert service["spec"]["selector"].items() <= labels.items()  # selects exactly these pods

    secret = serialize(job.secret_manifest())
    assert secret["kind"] == "Secret"
    assert secret["metadata"]["name"] == job.secret_name
    assert secret["stringData"] == {"REGENCY_JOB_SECRET": job.secret.hex()}
    # The secret is in the Secret only: not in the Job (command, env) or the Service.
    assert job.secret.hex() not in json.dumps(manifest) + json.dumps(service)
    # The pods are ranked by the indexed Job's label, whatever the attach default is.
    assert job.meshes["Trainers_A"].pod_rank_label == JOB_RANK_LABEL


def test_pod_template_keeps_the_users_settings() -> None:
    job = KubernetesJob(NS)
    template = {
        "metadata": {"labels": {"app": "mine"}},
        "spec": {
            "nodeSelector": {"gpu": "h100"},
            "restartPolicy": "OnFailure",
            "containers": [
                {"name": "sidecar", "image": "proxy:1"},
                {
                    "name": "worker",
                    "image": "app:2",
                    "env": [{"name": "X", "value": "1"}],
                    "ports": [{"containerPort": 26600, "name": "own"}],
                },
            ],
        },
    }
    job.add_mesh("hosts", 2, pod_template=template)
    pod_spec = serialize(job.job_manifest("hosts"))["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"gpu": "h100"}
    assert pod_spec["restartPolicy"] == "OnFailure"
    sidecar, worker = pod_spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "proxy:1"}
    assert worker["image"] == "app:2"
    assert worker["command"] == worker_command("tcp://0.0.0.0:26600", "python")
    assert worker["ports"] == [{"containerPort": 26600, "name": "own"}]  # not duplicated
    assert [e["name"] for e in worker["env"]] == ["X", "REGENCY_JOB_SECRET"]
    with pytest.raises(ValueError, match="label_selector"):
        job.add_mesh("bare", 1)
    with pytest.raises(ValueError, match="already"):
        job.add_mesh("hosts", 1, label_selector="a=b")
    with pytest.raises(ValueError, match="positive"):
        job.add_mesh("zero", 0, label_selector="a=b")


# -- attaching: readiness and ranks -------------------------------------------------------------


def attach_job(server: FakeKubernetesApiServer, replicas: int = 3, **kwargs: Any) -> Any:
    job = new_job(server, **kwargs)
    job.add_mesh("workers", replicas, label_selector="app=workers", port=26600)
    return job


def test_attach_orders_pods_by_rank_and_ignores_finished_ones(
    server: FakeKubernetesApiServer,
) -> None:
    for p in [
        pod("w-2", 2, ip="10.0.0.12"),
        pod("w-0", 0, ip="10.0.0.10"),
        pod("w-1", 1, ip="10.0.0.11"),
        pod("old-1", 1, ip="10.0.0.99", phase="Failed"),  # a replaced pod
        pod("gone-0", 0, ip="10.0.0.98", deleting=True),
        pod("other", 0, labels={"app": "else"}),  # not selected
    ]:
        server.add_pod(NS, p)
    job = attach_job(server)
    assert job._worker_addresses() == {
        "workers": ["tcp://10.0.0.10:26600", "tcp://10.0.0.11:26600", "tcp://10.0.0.12:26600"]
    }
    assert job._running()
    assert ("list", "Pod", NS, "app=workers") in server.calls


def test_attach_waits_until_the_pods_are_ready(server: FakeKubernetesApiServer) -> None:
    server.add_pod(NS, pod("w-0", 0, phase="Pending", ip=None))
    server.add_pod(NS, pod("w-1", 1, ready=False))
    lists = 0

    def later(srv: FakeKubernetesApiServer) -> None:
        nonlocal lists
        lists += 1
        if lists == 5:
            make_ready(srv)

    server.before_list = later
    job = attach_job(server, replicas=2, timeout=30)
    assert not job._running()
    assert len(job._worker_addresses()["workers"]) == 2
    assert lists >= 5


def test_attach_timeout_names_the_pods_not_ready(server: FakeKubernetesApiServer) -> None:
    server.add_pod(NS, pod("w-0", 0))
    server.add_pod(NS, pod("w-1", 1, phase="Pending", ip=None))
    server.add_pod(NS, pod("w-2", 2, ready=False))
    job = attach_job(server, replicas=4, timeout=0.2)
    with pytest.raises(TimeoutError) as info:
        job._worker_addresses()
    message = str(info.value)
    assert "'workers'" in message
    assert "timeout=0.2s" in message
    assert "no pod for ranks [3]" in message
    assert "w-1 (rank 1, Pending)" in message
    assert "w-2 (rank 2, Running, not Ready)" in message
    assert "w-0" not in message


@pytest.mark.parametrize(
    ("pods", "error"),
    [
        ([pod("w-0", 0), pod("w-x", None)], r"pod w-x has no valid rank label"),
        ([pod("w-0", 0), pod("w-y", "first")], r"pod w-y has no valid rank label.*'first'"),
        ([pod("w-0", 0), pod("w-0b", 0)], r"pods w-0 and w-0b both have rank 0"),
        ([pod("w-0", 0), pod("w-5", 5)], r"pod w-5 has rank 5, but num_replicas=2"),
    ],
    ids=["missing", "not-a-number", "duplicate", "out-of-range"],
)
def test_bad_ranks_are_clear_errors(
    server: FakeKubernetesApiServer, pods: list[Any], error: str
) -> None:
    for p in pods:
        server.add_pod(NS, p)
    job = attach_job(server, replicas=2, timeout=5)
    with pytest.raises(ValueError, match=error):
        job._worker_addresses()


def test_custom_rank_label(server: FakeKubernetesApiServer) -> None:
    server.add_pod(NS, pod("b", 0, ip="10.0.0.2", rank_label="rank"))
    server.add_pod(NS, pod("a", 1, ip="10.0.0.1", rank_label="rank"))
    job = new_job(server)
    job.add_mesh("hosts", 2, label_selector="app=workers", pod_rank_label="rank", port=5)
    assert job._worker_addresses()["hosts"] == ["tcp://10.0.0.2:5", "tcp://10.0.0.1:5"]


# -- provisioning and kill -----------------------------------------------------------------------


def test_provision_then_kill_deletes_only_what_it_created(server: FakeKubernetesApiServer) -> None:
    server.add_pod(NS, pod("w-0", 0, ip="10.0.0.10"))  # an attach-mode mesh's running pod
    unrelated = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="unrelated"))
    server.create("Secret", NS, unrelated)
    job = new_job(server, timeout=10)
    job.add_mesh("trainers", 2, image_spec="app:1")
    job.add_mesh("servers", 1, label_selector="app=workers")
    job.apply()
    created = {(kind, name) for kind, _, name in server.objects if kind != "Pod"}
    assert created == {
        ("Secret", "unrelated"),
        ("Secret", job.secret_name),
        ("Service", job.resource_name("trainers")),
        ("Job", job.resource_name("trainers")),
    }
    assert job._running()  # the Job exists; its pods may still be pending
    make_ready(server, {job.resource_name("trainers") + "-1": "10.1.0.9"})
    addresses = job._worker_addresses()
    assert addresses["trainers"][1] == "tcp://10.1.0.9:26600"
    assert addresses["servers"] == ["tcp://10.0.0.10:26600"]

    name, secret_name = job.resource_name("trainers"), job.secret_name
    job.kill()
    deletes = [c for c in server.calls if c[0] == "delete"]
    assert [c[1:] for c in deletes] == [
        ("Job", NS, name, "Foreground"),
        ("Service", NS, name, "Foreground"),
        ("Secret", NS, secret_name, "Foreground"),
    ]
    left = {(kind, name) for kind, _, name in server.objects}
    assert left == {("Secret", "unrelated"), ("Pod", "w-0")}  # what it did not create
    assert not job._running()
    job.kill()  # idempotent: nothing more deleted
    assert len([c for c in server.calls if c[0] == "delete"]) == 3


def test_failed_create_removes_what_was_created(server: FakeKubernetesApiServer) -> None:
    server.fail_on = "Job"
    job = new_job(server)
    job.add_mesh("trainers", 2, image_spec="app:1")
    with pytest.raises(ApiException, match="Forbidden"):
        job.apply()
    assert server.objects == {}
    assert job.created == []


def test_pickled_job_reconnects_and_kills(server: FakeKubernetesApiServer) -> None:
    job = new_job(server)
    job.add_mesh("trainers", 2, image_spec="app:1")
    job.apply()
    make_ready(server)
    data = job.dumps()
    assert b"FakeKubernetesApiServer" not in data  # API objects are not pickled
    assert b"_Facade" not in data
    later: KubernetesJob = pickle.loads(data)
    assert later._core is None
    spec = new_job(server)
    spec.add_mesh("trainers", 2, image_spec="app:1")
    assert later.can_run(spec)
    spec._adopt(later)  # what state() does with a cached job it can reuse
    assert spec._core is server.core  # its own API objects survive adoption
    assert spec._running()
    assert spec._worker_addresses() == job._worker_addresses()
    other = new_job(server)
    other.add_mesh("trainers", 3, image_spec="app:1")
    assert not later.can_run(other)
    spec.kill()
    assert server.objects == {}


def test_importable_without_the_kubernetes_package() -> None:
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "from regency.job import KubernetesJob\n"
        "job = KubernetesJob('ns')\n"
        "job.add_mesh('a', 1, label_selector='x=y')\n"
        "try:\n"
        "    job.state(cached_path=None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'regency[kubernetes]'" in done.stdout


# -- attaching for real: pods that are namespace hosts -------------------------------------------


class Here(Actor):
    """Reports the IP its proc's namespace uses toward the controller."""

    @endpoint
    def ip(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.200.0.1", 9))
            return str(probe.getsockname()[0])


def test_attach_to_real_workers_described_as_pods(
    netns_cluster: Any, server: FakeKubernetesApiServer, tmp_path: Any
) -> None:
    """Worker daemons in two namespace hosts on port 26600, 'pods' with those hosts' IPs."""
    job = attach_job(server, replicas=2, timeout=30)
    hosts = netns_cluster.hosts[:2]
    for rank, host in enumerate(reversed(hosts)):  # rank 0 is the second namespace
        proc = netns_cluster.popen(
            host,
            worker_command(f"tcp://{host.ip}:26600"),
            env={**os.environ, **worker_env(job.secret)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert "listening on" in proc.stdout.readline()
        server.add_pod(NS, pod(f"w-{rank}", rank, ip=host.ip))
    state = job.state(cached_path=tmp_path / "job.pkl")
    procs = state.workers.spawn_procs(per_host={"gpus": 1})
    try:
        ips = list(procs.spawn("here", Here).ip.call().get(timeout=60).values())
    finally:
        procs.stop().get(timeout=30)
    assert ips == [hosts[1].ip, hosts[0].ip]
    job.kill()  # attach mode: deletes nothing
    assert not [c for c in server.calls if c[0] == "delete"]
