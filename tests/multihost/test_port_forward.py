"""A controller outside the cluster: each host reached only through a forwarded port, and nothing
on the hosts can dial the controller back (Monarch's out-of-cluster path, issue 12 §6).

Two network-namespace hosts on a bridge that has no address in the root namespace
(``NetnsCluster(isolated=True)``): the controller (this process, in the root namespace) and the
hosts cannot reach one another. A worker daemon listens on ``0.0.0.0:26600`` in each, as in a
pod. The only way in is ``port_forwarder.py``, a real TCP forwarder that takes ``kubectl
port-forward``'s command line and does what it does: it listens on the controller's loopback and
opens each connection to ``localhost:26600`` inside the host's namespace. The controller attaches
with ``attach_to_workers(forwarded=...)``; every connection the hosts' side needs toward the
controller's machine is a reverse connection the controller opens through the same forward.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import pytest
from _worker_helpers import Failures, start_netns_workers
from netns import NetnsCluster, unavailable_reason

from regency import config
from regency._transport import tls
from regency.actor import Actor, SupervisionError, endpoint, this_host
from regency.job import KubernetesJob, attach_to_workers
from regency.job._errors import JobError
from regency.job._port_forward import PortForward, port_forward_command

pytestmark = pytest.mark.timeout(120)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FORWARDER = str(Path(__file__).with_name("port_forwarder.py"))
PORT = 26600
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")
SECRET = os.urandom(32)
HERE = os.readlink("/proc/self/ns/net")  # the controller's network namespace


class Where(Actor):
    """Says where it runs, and calls other actors (across hosts, or to the controller's)."""

    @endpoint
    def ip(self) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.200.0.254", 9))  # only picks the route: the host's own address
            return str(probe.getsockname()[0])

    @endpoint
    def netns(self) -> str:
        return os.readlink("/proc/self/ns/net")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, data: bytes) -> bytes:
        return data[::-1]

    @endpoint
    def ask(self, other: Where) -> str:
        """The network namespace ``other`` runs in."""
        return str(other.netns.call_one().get(timeout=30))


@dataclass
class Forward:
    """One running forwarder (``kubectl port-forward pod/NAME :26600``) and its local end."""

    proc: subprocess.Popen[str]
    local: str

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def start_forward(pod: str, pods: dict[str, str], record: Path | None = None) -> Forward:
    """``kubectl port-forward --namespace ml pod/POD :26600``, as ``port_forwarder.py``."""
    env = {**os.environ, "REGENCY_TEST_PODS": json.dumps(pods)}
    if record is not None:
        env["REGENCY_TEST_RECORD"] = str(record)
    proc = subprocess.Popen(
        [sys.executable, FORWARDER, "port-forward", "--namespace", "ml", f"pod/{pod}", f":{PORT}"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = FORWARDING.search(line)
    assert found, f"forwarder printed {line!r}"
    return Forward(proc, f"tcp://127.0.0.1:{found.group(1)}")


@dataclass
class OutOfCluster:
    """The isolated hosts, their workers' addresses, and the forwards to them (by address)."""

    cluster: NetnsCluster
    workers: list[str]
    forwards: dict[str, Forward]
    pods: dict[str, str]  # pod name -> its host's network namespace

    def forwarded(self) -> dict[str, str]:
        return {worker: fwd.local for worker, fwd in self.forwards.items()}


@contextlib.contextmanager
def out_of_cluster(record: Path | None = None, forward: bool = True) -> Iterator[OutOfCluster]:
    """The isolated hosts with a worker each as pods ``w-0``, ``w-1``, and (``forward``) a
    forward to each."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with NetnsCluster(2, isolated=True) as cluster:
        workers = start_netns_workers(cluster, SECRET, PORT, bind_all=True)
        pods = {f"w-{host.index}": host.netns for host in cluster.hosts}
        forwards: dict[str, Forward] = {}
        try:
            for worker, pod in zip(workers, pods, strict=True):
                if forward:
                    forwards[worker] = start_forward(pod, pods, record)
            yield OutOfCluster(cluster, workers, forwards, pods)
        finally:
            for forward in forwards.values():
                forward.kill()
                if forward.proc.stdout is not None:
                    forward.proc.stdout.close()


def _unreachable(cluster: NetnsCluster) -> None:
    """Neither side can dial the other: the premise of the out-of-cluster path."""
    with socket.socket() as probe:
        probe.settimeout(2)
        with pytest.raises(OSError):
            probe.connect((cluster.hosts[0].ip, PORT))
    routes = cluster.run(0, ["ip", "-4", "route"]).stdout
    assert "default" not in routes, routes
    addresses = subprocess.run(
        ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True
    ).stdout
    assert "10.200.0." not in addresses, "the root namespace has an address the hosts reach"


def test_everything_runs_through_the_forwards_alone(failures: Failures) -> None:
    with out_of_cluster() as env:
        _unreachable(env.cluster)
        hosts = attach_to_workers(env.workers, secret=SECRET, forwarded=env.forwarded(), timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        actors = procs.spawn("where", Where)
        ips = list(actors.ip.call().get(timeout=60).values())
        assert ips == [h.ip for h in env.cluster.hosts for _ in range(2)]
        # Between hosts: direct, inside the cluster.
        spaces = list(actors.netns.call().get(timeout=60).values())
        assert spaces[0] == spaces[1] != spaces[2] == spaces[3] != HERE
        across = actors.slice(hosts=0, gpus=0).ask.call_one(actors.slice(hosts=1, gpus=1))
        assert across.get(timeout=60) == spaces[3]
        # A proc on the controller's machine: reached from the hosts by reverse connections
        # only (it never dialed them first), and reaching them through the forwards.
        local = this_host().spawn_procs(per_host={"local": 1}).spawn("local", Where)
        assert actors.slice(hosts=1, gpus=0).ask.call_one(local).get(timeout=60) == HERE
        assert local.ask.call_one(actors.slice(hosts=1, gpus=1)).get(timeout=60) == spaces[3]
        payload = os.urandom(1 << 20)
        assert (
            actors.slice(hosts=1, gpus=1).echo.call_one(payload).get(timeout=60) == (payload[::-1])
        )
        procs.stop().get(timeout=30)
        assert failures.seen == []


def test_a_killed_proc_is_reported_through_supervision(failures: Failures) -> None:
    with out_of_cluster() as env:
        hosts = attach_to_workers(env.workers, secret=SECRET, forwarded=env.forwarded(), timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        actors = procs.spawn("where", Where)
        victim = actors.slice(hosts=1).pid.call_one().get(timeout=60)
        os.kill(victim, signal.SIGKILL)  # one PID namespace: the test can reach it
        with pytest.raises(SupervisionError) as info:
            actors.slice(hosts=1).ip.call_one().get(timeout=30)
        assert "SIGKILL" in str(info.value), info.value
        seen = failures.wait_for(1)
        assert any("SIGKILL" in failure for failure in seen), seen
        assert actors.slice(hosts=0).ip.call_one().get(timeout=30) == env.cluster.hosts[0].ip
        procs.stop().get(timeout=30)


def test_a_cut_forward_loses_its_host_and_the_other_serves_on(failures: Failures) -> None:
    with out_of_cluster() as env, config.configured(heartbeat_interval=0.25, heartbeat_timeout=2):
        hosts = attach_to_workers(env.workers, secret=SECRET, forwarded=env.forwarded(), timeout=30)
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        actors = procs.spawn("where", Where)
        assert len(actors.ip.call().get(timeout=60)) == 2
        cut = env.workers[1]
        env.forwards[cut].kill()  # kubectl port-forward ends: every connection through it goes
        with pytest.raises(SupervisionError) as info:
            actors.slice(hosts=1).ip.call_one().get(timeout=30)
        message = str(info.value)
        assert f"its host {cut} was lost" in message, message
        assert any(cut in failure for failure in failures.wait_for(1))
        assert actors.slice(hosts=0).ip.call_one().get(timeout=30) == env.cluster.hosts[0].ip
        procs.stop().get(timeout=30)


@pytest.mark.parametrize("tls_on", [True, False], ids=["tls", "control-without-tls"])
def test_what_crosses_the_forward_is_encrypted(
    tls_on: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not tls_on:
        monkeypatch.setenv(tls.ENABLE_ENV, "0")  # the workers (started after this) and procs
        tls.force_enabled(False)
    record = tmp_path / "wire"
    record.mkdir()
    try:
        with out_of_cluster(record) as env:
            hosts = attach_to_workers(
                env.workers, secret=SECRET, forwarded=env.forwarded(), timeout=30
            )
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            local = this_host().spawn_procs(per_host={"local": 1}).spawn("local", Where)
            marker = b"PLAINTEXT-MARKER-" + os.urandom(8).hex().encode()
            actors = procs.spawn("where", Where)
            assert actors.slice(hosts=0).echo.call_one(marker).get(timeout=60) == marker[::-1]
            assert actors.slice(hosts=1).ask.call_one(local).get(timeout=60) == HERE
            procs.stop().get(timeout=30)
    finally:
        tls.force_enabled(None)
    wire = b"".join(path.read_bytes() for path in record.iterdir())
    assert wire, "the forwarders recorded nothing"
    assert (marker in wire) is not tls_on
    assert (marker[::-1] in wire) is not tls_on
    assert SECRET not in wire
    assert SECRET.hex().encode() not in wire


def test_attach_needs_the_forward_to_name_a_worker() -> None:
    with pytest.raises(ValueError, match="not one of the tcp:// workers"):
        attach_to_workers(
            ["tcp://10.9.9.9:26600"],
            secret=SECRET,
            forwarded={"tcp://10.9.9.8:26600": "tcp://127.0.0.1:1"},
        )
    with pytest.raises(ValueError, match="must be the tcp://HOST:PORT"):
        attach_to_workers(
            ["tcp://10.9.9.9:26600"],
            secret=SECRET,
            forwarded={"tcp://10.9.9.9:26600": "127.0.0.1:1"},
        )


# -- KubernetesJob(port_forward=True) ------------------------------------------------------------


def test_kubernetes_job_forwards_each_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job starts one forward per pod with kubectl's command line (here the forwarder
    stands in for kubectl), attaches through them, and ends them at kill()."""
    pytest.importorskip("kubernetes.client", reason="the kubernetes extra is not installed")
    from _fake_kubernetes import NS, FakeKubernetesApiServer, pod

    with out_of_cluster(forward=False) as env:
        monkeypatch.setenv("REGENCY_TEST_PODS", json.dumps(env.pods))
        server = FakeKubernetesApiServer()
        for host in env.cluster.hosts:
            server.add_pod(NS, pod(f"w-{host.index}", host.index, ip=host.ip))
        job = KubernetesJob(
            NS,
            timeout=30,
            core_api=server.core,
            batch_api=server.batch,
            poll_interval=0.01,
            port_forward=True,
            kubectl=[sys.executable, FORWARDER],
        )
        job.secret = SECRET  # what the pods were started with
        job.add_mesh("workers", 2, label_selector="app=workers", port=PORT)
        state = job.state(cached_path=None)
        forwards = list(job._forwards)
        assert [f.argv[2:] for f in forwards] == [
            ["port-forward", "--namespace", NS, f"pod/w-{i}", f":{PORT}", "--address", "127.0.0.1"]
            for i in range(2)
        ]
        procs = state.workers.spawn_procs(per_host={"gpus": 1})
        actors = procs.spawn("where", Where)
        assert list(actors.ip.call().get(timeout=60).values()) == [h.ip for h in env.cluster.hosts]
        job.kill()
        assert not any(f.alive() for f in forwards)
        assert job._forwards == []


def test_port_forward_command_with_the_real_kubectl(tmp_path: Path) -> None:
    """The argv the job builds, run by the real kubectl against an API server that is not
    there: kubectl accepts every flag and fails to connect, and the job says so."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (apt-get install kubernetes-client)")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(NOWHERE_KUBECONFIG)
    argv = port_forward_command(kubectl, "ml", "w-0", PORT, str(kubeconfig))
    with pytest.raises(JobError) as info:
        PortForward(argv, "w-0", timeout=30)
    message = str(info.value)
    assert "kubectl port-forward to pod w-0 exited with status 1" in message, message
    assert "127.0.0.1:9" in message, message  # it tried the API server in the kubeconfig
    assert "unknown" not in message.lower(), message  # every flag parsed


def test_the_port_is_found_when_another_line_comes_with_it() -> None:
    """kubectl may print a warning and the announcing line in one write: both arrive in one
    read, and the announcement must still be seen (a stand-in kubectl, run by Python)."""
    script = (
        "import sys, time\n"
        "sys.stdout.write('Warning: kubeconfig is group-readable\\n'"
        " 'Forwarding from 127.0.0.1:43210 -> 26600\\n')\n"
        "sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    forward = PortForward([sys.executable, "-c", script], "w-0", timeout=20)
    try:
        assert forward.local == "tcp://127.0.0.1:43210"
        assert forward.alive()
    finally:
        forward.stop()
    assert not forward.alive()


def test_a_forward_that_exits_first_says_so_with_its_output() -> None:
    script = "print('error: pods \"w-0\" not found'); raise SystemExit(1)"
    with pytest.raises(JobError) as info:
        PortForward([sys.executable, "-c", script], "w-0", timeout=20)
    message = str(info.value)
    assert "exited with status 1 before forwarding" in message, message
    assert 'pods "w-0" not found' in message, message


def test_port_forward_without_kubectl_names_it() -> None:
    with pytest.raises(JobError, match="is not on PATH"):
        PortForward(["no-such-kubectl-here", "port-forward"], "w-0")


NOWHERE_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:9"}
users:
- name: me
  user: {token: "not-a-real-token"}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: me}
current-context: nowhere
"""
