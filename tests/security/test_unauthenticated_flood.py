"""§2: connections that never authenticate do not starve a worker, a listener or the RDMA service.

The worker runs with the common soft limit of 1024 descriptors; the attacker opens 1100
connections that never authenticate (half send a route preamble naming a process that does not
exist, half send nothing) from other loopback addresses, and keeps them open.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _worker_helpers import LISTENING, kill_group

from regency._transport import address, inbound, routing
from regency.job import attach_to_workers, worker_command, worker_env

pytestmark = pytest.mark.timeout(120)

FLOOD = 1100
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 6)]


def _raise_own_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


# Runs the command after it with a soft limit of 1024 descriptors (the common default).
_WITH_1024_FDS = (
    "import os, resource, sys; _, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard)); os.execv(sys.argv[1], sys.argv[1:])"
)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class _Log:
    """A subprocess's stderr, read on a thread so the pipe never fills."""

    def __init__(self, pipe: object) -> None:
        self.data = bytearray()
        self._pipe = pipe
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._pipe:  # type: ignore[attr-defined]
            self.data += line

    def lines(self) -> list[str]:
        return self.data.decode(errors="replace").splitlines()


def _flood(host: str, port: int, count: int, key: str | None) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.socket()
        sock.bind((ATTACKERS[i % len(ATTACKERS)], 0))
        sock.settimeout(10)
        try:
            sock.connect((host, port))
            if key is not None:
                sock.sendall(routing.preamble(key))
        except OSError:
            sock.close()
            continue
        socks.append(sock)
    return socks


@pytest.fixture
def limited_worker() -> Iterator[tuple[subprocess.Popen[bytes], str, _Log, bytes]]:
    secret = os.urandom(32)
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_1024_FDS, *worker_command("tcp://127.0.0.1:0")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **worker_env(secret)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        found = LISTENING.search(proc.stdout.readline().decode())
        assert found
        yield proc, found.group(1), _Log(proc.stderr), secret
    finally:
        kill_group(proc.pid)
        proc.wait(10)


def test_a_flood_of_idle_connections_leaves_the_worker_serving(
    limited_worker: tuple[subprocess.Popen[bytes], str, _Log, bytes],
) -> None:
    proc, worker, log, secret = limited_worker
    _raise_own_limit(2 * FLOOD + 256)
    host, port = address.tcp_host(worker), address.tcp_port(worker)
    held = _flood(host, port, FLOOD // 2, f"{worker}/no-such-proc")
    held += _flood(host, port, FLOOD - len(held), None)
    try:
        assert len(held) >= FLOOD * 0.9, f"only {len(held)} connections got through"
        start = time.monotonic()
        hosts = attach_to_workers([worker], secret=secret, timeout=10)
        took = time.monotonic() - start
        assert took < 2.0, f"the attach took {took:.2f} s behind the flood"
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        procs.stop().get(timeout=30)
        # Near idle while the attacker holds its connections.
        before = _cpu_seconds(proc.pid)
        window = time.monotonic()
        deadline = window + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.1)
        used = (_cpu_seconds(proc.pid) - before) / (time.monotonic() - window)
        assert used < 0.25, f"the worker used {used:.0%} of a CPU under the flood"
        assert _fd_count(proc.pid) < 600
    finally:
        for sock in held:
            sock.close()
    rejected = [line for line in log.lines() if "rejected" in line or "refused" in line]
    assert len(log.lines()) < 150, "\n".join(log.lines()[-20:])
    assert rejected, "the worker said nothing about the flood"


_LISTENER = """
import resource, sys, time
from regency._transport.transport import Transport
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
import logging
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
t = Transport("tcp://127.0.0.1:0", bytes.fromhex(sys.argv[1]), lambda c, f: None,
              lambda p, r: None, frame_limit=1 << 20, connect_timeout=5)
print(t.address, flush=True)
time.sleep(600)
"""


def test_out_of_descriptors_backs_off_instead_of_spinning() -> None:
    secret = os.urandom(32)
    proc = subprocess.Popen(
        [sys.executable, "-c", _LISTENER, secret.hex()],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        listening = proc.stdout.readline().decode().strip()
        log = _Log(proc.stderr)
        _raise_own_limit(600)
        host, port = address.tcp_host(listening), address.tcp_port(listening)
        held = _flood(host, port, 300, None)  # far more than its 64 descriptors
        try:
            before = _cpu_seconds(proc.pid)
            window = time.monotonic()
            deadline = window + 2.0
            while time.monotonic() < deadline:
                time.sleep(0.1)
            used = (_cpu_seconds(proc.pid) - before) / (time.monotonic() - window)
            assert used < 0.25, f"the listener used {used:.0%} of a CPU out of descriptors"
        finally:
            for sock in held:
                sock.close()
        failures = [line for line in log.lines() if "accept failed" in line]
        assert failures, "\n".join(log.lines()[-20:])
        assert "pausing this listener" in failures[0]
        assert len(failures) <= 4, "\n".join(failures)
    finally:
        proc.kill()
        proc.wait(10)


def test_the_rdma_service_cuts_a_slow_loris_at_the_deadline_without_a_thread_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from regency.rdma import RDMABuffer

    monkeypatch.setattr(inbound, "DEADLINE", 1.0)
    buf = RDMABuffer(np.zeros(4096, dtype=np.uint8))
    served = buf._handle.tcp_address
    # Loopback (a single-host job), plus the controller's gateway interfaces once it has any:
    # never every interface.
    from regency.rdma import _service

    service = _service._service
    assert service is not None
    bound = [s.getsockname() for s in service._listeners if s.family != socket.AF_UNIX]
    assert bound[0][0] == "127.0.0.1", bound
    assert all(ip not in ("0.0.0.0", "::") for ip, *_ in bound), bound
    host, port = "127.0.0.1", address.tcp_port(served)
    threads = threading.active_count()
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(50)]
    loris = socket.create_connection((host, port), timeout=5)
    try:
        start = time.monotonic()
        closed_after = None
        while time.monotonic() - start < 8:
            try:
                loris.sendall(b"\x16")  # one byte of a TLS record, every 0.2 s
            except OSError:
                closed_after = time.monotonic() - start
                break
            loris.settimeout(0.2)
            with contextlib.suppress(TimeoutError):
                if loris.recv(4096) == b"":
                    closed_after = time.monotonic() - start
                    break
        assert closed_after is not None, "the slow peer was never cut off"
        assert 0.8 <= closed_after < 4.0, closed_after
        assert threading.active_count() <= threads + 3, "a thread per unauthenticated peer"
    finally:
        loris.close()
        for sock in idle:
            sock.close()
        buf.drop()


# A controller with 1024 descriptors that attached a worker (so it listens on a TCP gateway),
# then spawns and calls once the flood is on its gateway.
_CONTROLLER = """
import os, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
from regency.actor import Actor, endpoint
from regency.job import ProcessJob
from regency._runtime.kernel import gateways

class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

job = ProcessJob({"hosts": 1})
hosts = job.state(cached_path=None).hosts
print(*gateways._gateways.values(), flush=True)
sys.stdin.readline()  # the flood is on
try:
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    print("ANSWERS", len(procs.spawn("echo", Echo).pid.call().get(timeout=30)), flush=True)
    print("FDS", len(os.listdir("/proc/self/fd")), flush=True)
    procs.stop().get(timeout=30)
finally:
    job.kill()
"""


def test_a_flood_on_the_controllers_gateway_leaves_it_spawning(tmp_path: Path) -> None:
    _raise_own_limit(2 * FLOOD + 256)
    errors = tmp_path / "stderr"
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors.open("w"),
        text=True,
        start_new_session=True,
    )
    held: list[socket.socket] = []
    try:
        assert controller.stdin is not None
        assert controller.stdout is not None
        gateway = controller.stdout.readline().strip()
        assert address.is_tcp(gateway), gateway
        host, port = address.tcp_host(gateway), address.tcp_port(gateway)
        held = _flood(host, port, FLOOD // 2, "unix:@no-such-proc")
        held += _flood(host, port, FLOOD - len(held), None)
        assert len(held) >= FLOOD * 0.9, f"only {len(held)} connections got through"
        controller.stdin.write("go\n")
        controller.stdin.flush()
        answers = controller.stdout.readline()
        assert answers.split() == ["ANSWERS", "2"], answers + errors.read_text()
        fds = int(controller.stdout.readline().split()[1])
        assert fds < 600, f"the controller holds {fds} descriptors under the flood"
        assert controller.wait(60) == 0
    finally:
        for sock in held:
            sock.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(controller.pid, 9)
        controller.wait(10)
