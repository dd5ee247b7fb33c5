"""SSHJob against real sshd servers, each running inside a network-namespace host.

Every test key is generated here, in the test's temporary directory: an ed25519 host key, a
client key, an ``authorized_keys`` holding the client's public key and a ``known_hosts`` holding
the host key. Each sshd runs with a generated ``sshd_config`` that listens only on its
namespace's address and admits root by that key only. Skipped when not root, when namespaces
do not work, or when the OpenSSH server or client is missing (``scripts/ci_services.sh``
installs them).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from _worker_helpers import all_cmdlines, wait_gone
from netns import BRIDGE_IP, Host, NetnsCluster

from regency.actor import Actor, endpoint, this_host
from regency.job import SSHJob

pytestmark = pytest.mark.timeout(90)

# The workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path


class Here(Actor):
    """Reports the address of its proc's namespace and the host it believes it is on."""

    @endpoint
    def where(self) -> tuple[str, str]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((BRIDGE_IP, 9))  # sends nothing: only picks the route
            ip = str(probe.getsockname()[0])
        return ip, next(iter(this_host()._agents()))


@dataclass
class SshHosts:
    """Namespace hosts with sshd running on hosts 0 and 1, and the client's settings."""

    cluster: NetnsCluster
    served: list[Host]
    unserved: Host  # a namespace host with no sshd
    key: Path
    ssh_args: tuple[str, ...]

    def job(self, hosts: Any, **kwargs: Any) -> SSHJob:
        kwargs.setdefault("python_exe", sys.executable)
        kwargs.setdefault("user", "root")
        kwargs.setdefault("identity_file", self.key)
        kwargs.setdefault("ssh_args", self.ssh_args)
        return SSHJob(hosts, **kwargs)


def _missing_tools() -> str | None:
    if not os.path.exists(SSHD):
        return f"no OpenSSH server ({SSHD}); scripts/ci_services.sh installs openssh-server"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"no `{tool}`; scripts/ci_services.sh installs openssh-client"
    return None


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "regency-test", "-f", str(path)],
        check=True,
        timeout=30,
        capture_output=True,
    )


def _start_sshd(cluster: NetnsCluster, host: Host, tmp: Path) -> subprocess.Popen[str]:
    config = tmp / f"sshd_config_{host.index}"
    config.write_text(
        f"ListenAddress {host.ip}:22\n"
        f"HostKey {tmp / 'host_key'}\n"
        f"AuthorizedKeysFile {tmp / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        f"PidFile {tmp / f'sshd_{host.index}.pid'}\n"
        "LogLevel INFO\n"
    )
    check = subprocess.run(
        [SSHD, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30, check=False
    )
    assert check.returncode == 0, f"sshd rejects the test config: {check.stderr}"
    proc = cluster.popen(
        host,
        [SSHD, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # sshd -e logs "Server listening on IP port 22." once bound
        seen.append(line)
        if "Server listening on" in line:
            break
    else:
        raise AssertionError(f"sshd on {host.netns} did not start: {''.join(seen)}")
    return proc


@pytest.fixture
def ssh_hosts(netns_cluster: NetnsCluster, tmp_path: Path) -> SshHosts:
    """sshd on hosts 0 and 1 (stopped with the namespaces); host 2 runs none."""
    missing = _missing_tools()
    if missing is not None:
        pytest.skip(missing)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    _keygen(tmp_path / "host_key")
    _keygen(tmp_path / "client_key")
    shutil.copy(tmp_path / "client_key.pub", tmp_path / "authorized_keys")
    host_pub = (tmp_path / "host_key.pub").read_text().split()
    served = netns_cluster.hosts[:2]
    (tmp_path / "known_hosts").write_text(
        "".join(f"{h.ip} {host_pub[0]} {host_pub[1]}\n" for h in served)
    )
    for host in served:
        _start_sshd(netns_cluster, host, tmp_path)
    ssh_args = (
        "-F",
        "/dev/null",  # not the machine's or the user's ssh configuration
        "-o",
        f"UserKnownHostsFile={tmp_path / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "LogLevel=ERROR",
    )
    return SshHosts(
        netns_cluster, served, netns_cluster.hosts[2], tmp_path / "client_key", ssh_args
    )


def _netns_processes(cluster: NetnsCluster, host: Host) -> dict[int, str]:
    """pid -> command line of every process in a host's namespace."""
    listing = subprocess.run(
        ["ip", "netns", "pids", host.netns],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    found = {}
    for pid in map(int, listing):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def _regency_processes(cluster: NetnsCluster, hosts: list[Host]) -> dict[int, str]:
    found = {}
    for host in hosts:
        for pid, cmdline in _netns_processes(cluster, host).items():
            if "regency" in cmdline or sys.executable in cmdline:
                found[pid] = cmdline
    return found


def _files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_actors_run_on_the_ssh_hosts_and_kill_leaves_nothing(
    ssh_hosts: SshHosts, tmp_path: Path
) -> None:
    served = ssh_hosts.served
    job = ssh_hosts.job([h.ip for h in served])
    start = time.monotonic()
    state = job.state(cached_path=tmp_path / "job.pkl")
    procs = state.hosts.spawn_procs(per_host={"gpus": 2})
    where = list(procs.spawn("here", Here).where.call().get(timeout=60).values())
    print(f"\nSSHJob: ssh to first reply from both hosts {time.monotonic() - start:.2f}s")
    assert [ip for ip, _ in where] == [h.ip for h in served for _ in range(2)]
    assert [agent for _, agent in where] == [f"tcp://{h.ip}:22222" for h in served for _ in "ab"]

    # The secret is on no command line (the machines' processes and ssh's), in no file.
    secret = job.secret.hex()
    assert secret not in all_cmdlines()
    assert secret not in job.remote_command()
    assert all(secret not in " ".join(job.ssh_command(h.ip)) for h in served)
    assert job.job_dir is not None
    assert all(secret.encode() not in p.read_bytes() for p in _files_under(Path(job.job_dir)))

    remote = _regency_processes(ssh_hosts.cluster, served)
    assert len(remote) >= 2 * (2 + 2)  # per host at least: keeper, worker, 2 procs
    procs.stop().get(timeout=30)
    job_dir = job.job_dir
    job.kill()
    left = _regency_processes(ssh_hosts.cluster, served)
    assert not left, f"left after kill(): {left}"
    assert not Path(job_dir).exists()
    job.kill()  # idempotent


def test_closing_the_ssh_session_kills_the_worker(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = ssh_hosts.served[0]
    job = ssh_hosts.job({"solo": [host.ip]}, port=0)
    job.state(cached_path=None)
    (session,) = job._sessions["solo"]
    workers = _regency_processes(ssh_hosts.cluster, [host])
    assert workers
    os.kill(session.pid, signal.SIGKILL)  # the local ssh client dies: the session closes
    for pid in workers:
        wait_gone(pid, timeout=15)
    assert not job._running()
    job.kill()


def test_a_later_controller_reconnects_and_kills(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    cache = tmp_path / "job.pkl"
    served = ssh_hosts.served
    job = ssh_hosts.job({"a": [served[0].ip], "b": [served[1].ip]}, port=0)
    job.state(cached_path=cache)
    sessions = [s.pid for group in job._sessions.values() for s in group]

    later: SSHJob = pickle.loads(cache.read_bytes())  # what a re-run finds in the cache
    assert later._running()
    assert later.can_run(ssh_hosts.job({"a": [served[0].ip], "b": [served[1].ip]}, port=0))
    assert not later.can_run(ssh_hosts.job({"a": [served[0].ip]}, port=0))
    assert [s.pid for group in later._sessions.values() for s in group] == sessions
    assert later._worker_addresses() == job._worker_addresses()
    later.kill()  # stops the sessions it did not start, through their stdin
    assert not _regency_processes(ssh_hosts.cluster, served)
    assert not job._running()
    job.kill()


WrongHost = Callable[[SshHosts], str]


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(lambda hosts: hosts.unserved.ip, id="no-sshd"),
        pytest.param(lambda hosts: "10.200.0.99", id="no-such-machine"),
    ],
)
def test_a_wrong_host_fails_naming_it(
    ssh_hosts: SshHosts, tmp_path: Path, wrong: WrongHost
) -> None:
    good = ssh_hosts.served[0]
    bad = wrong(ssh_hosts)
    job = ssh_hosts.job([good.ip, bad], connect_timeout=3, start_timeout=20)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        job.state(cached_path=tmp_path / "job.pkl")
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert re.search(rf"host '{re.escape(bad)}': the ssh session ended", message), message
    assert f"host '{good.ip}'" not in message  # the good host started; only the bad one failed
    assert elapsed < 15, f"took {elapsed:.1f}s"
    assert not (tmp_path / "job.pkl").exists()
    assert not _regency_processes(ssh_hosts.cluster, [good])  # the good host was cleaned up
    assert not job._running()
