"""The observation layer's listeners against another local user: floods, drips, wrong proofs.

The admin API (and the dashboard it serves) and the debugger accept connections before any
secret is proved. Another local user (created with ``useradd`` when the tests run as root,
skipped otherwise) floods each from 127.0.0.1, as the owner does: the owner must still be served
at once, the listener's process must keep its descriptors, and the attacker's failures must
not lock the owner out. (Telemetry export only dials out: it has no listener.)
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _attacker import Attacker, attacker
from _local_flood import start_flood, wrong_proofs

from regency._transport.peer_identity import tcp_peer_uid
from regency.observe import debug_server, debug_wire, http_server
from regency.observe.admission import client_key
from regency.observe.debug_server import DebugServer
from regency.observe.debug_sessions import Sessions
from regency.observe.debug_wire import proof

__all__ = ["attacker"]  # fixture

pytestmark = pytest.mark.timeout(120)

# How long a legitimate request or handshake may take while the flood is on.
PROMPT = 2.0

# A controller with the common soft limit of 1024 descriptors, serving the admin API; on
# "spawn" it starts a proc, calls it and stops it (what failed with EMFILE before); on "fill"
# it opens files until it has no descriptor left, on "free" it closes them.
_CONTROLLER = r"""
import json, os, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
from regency.actor import Actor, endpoint, this_host
from regency.observe import start_admin

class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

admin = start_admin()
print(json.dumps({"url": admin.url, "token": admin.token}), flush=True)
held = []
for line in sys.stdin:
    if line == "fill\n":  # use up every descriptor
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            print("filled", exc.errno, flush=True)
    elif line == "free\n":
        for fd in held:
            os.close(fd)
        held.clear()
        print("freed", flush=True)
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        pid = procs.spawn("pid", Pid).pid.call_one().get(timeout=60)
        procs.stop().get(timeout=60)
        print("spawned", pid, flush=True)
"""


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class _Controller:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CONTROLLER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()
        line = self.process.stdout.readline()
        assert line, f"the controller did not start: {self.stderr}"
        info = json.loads(line)
        self.url: str = info["url"]
        self.token: str = info["token"]

    def _drain(self, pipe: Any) -> None:
        for line in pipe:
            self.stderr.append(line.rstrip("\n"))

    def get(self, path: str) -> tuple[int, float]:
        """Status of an authorized GET and the seconds it took."""
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        start = time.monotonic()
        with urllib.request.urlopen(request, timeout=10) as response:
            json.loads(response.read())
            return response.status, time.monotonic() - start

    def command(self, line: str) -> str:
        """Send ``line`` ("spawn", "fill", "free"); the controller's answer."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)


@pytest.fixture
def controller() -> Iterator[_Controller]:
    ctl = _Controller()
    try:
        yield ctl
    finally:
        ctl.close()


def test_admin_api_flood_from_another_user_leaves_the_owner_served(
    attacker: Attacker, controller: _Controller
) -> None:
    """1100 connections (100 dripping a byte a second) from another uid, held 12 s: the
    controller (1024 descriptors) keeps answering its owner at once, keeps its descriptors and
    can still start a proc."""
    pid = controller.process.pid
    before = _fd_count(pid)
    flood = start_flood(attacker, _port(controller.url), 1100, drips=100, hold=12.0)
    try:
        peak, served = before, 0
        while flood.running_after(0.5):
            status, took = controller.get("/v1/root")
            assert status == 200
            assert took < PROMPT, f"the owner waited {took:.1f} s under the flood"
            peak, served = max(peak, _fd_count(pid)), served + 1
        assert served >= 5
        seen = flood.result(timeout=60)
    finally:
        flood.kill()
    # At most OTHERS connections of others are kept, each for HEADER_TIMEOUT at most.
    assert peak < before + http_server.OTHERS + 32, (before, peak)
    assert seen["cut"] == seen["opened"] > 1000, seen
    assert seen["longest_drip"] < http_server.HEADER_TIMEOUT + 3.0, seen  # never cut: 12 s and more
    assert controller.command("spawn").startswith("spawned"), controller.stderr[-5:]
    assert controller.process.poll() is None
    assert not any("Traceback" in line for line in controller.stderr), controller.stderr[:20]
    refusals = [line for line in controller.stderr if "admin API" in line]
    assert 0 < len(refusals) <= 30, refusals  # rate-limited: 10 lines per 10 s and a summary


def test_admin_api_out_of_descriptors_backs_off_and_recovers(controller: _Controller) -> None:
    """With every descriptor in use, connections wait in the backlog: the listener pauses
    instead of spinning on EMFILE, says so in a bounded number of lines, and serves again once
    descriptors are free."""
    pid = controller.process.pid
    assert controller.command("fill").split() == ["filled", str(errno.EMFILE)]
    port = _port(controller.url)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    try:
        cpu = _cpu_seconds(pid)
        assert not _readable(clients[0], 3.0)  # nothing answers, nothing spins
        spent = _cpu_seconds(pid) - cpu
        assert spent < 0.5, f"the controller spent {spent:.2f} s of CPU in 3 s out of descriptors"
        assert controller.command("free") == "freed\n"
        status, took = controller.get("/v1/root")
        assert status == 200
        assert took < 1.5 + PROMPT  # asyncio retries accept() after a second
    finally:
        for client in clients:
            client.close()
    lines = [line for line in controller.stderr if "out of system resource" in line]
    assert 0 < len(lines) <= 10, controller.stderr[-20:]


def _readable(sock: socket.socket, wait: float) -> bool:
    """Whether ``sock`` has something to read (or was closed) within ``wait`` seconds."""
    return bool(select.select([sock], [], [], wait)[0])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_the_kernel_names_another_users_loopback_connection(attacker: Attacker) -> None:
    """Both dial from 127.0.0.1; the kernel tells the other user's connection apart."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        flood = start_flood(attacker, listener.getsockname()[1], 1, hold=30.0)
        try:
            sock, (host, _) = listener.accept()
            with sock:
                assert host == "127.0.0.1"
                assert tcp_peer_uid(sock) == attacker.uid
                assert client_key(sock) == f"uid:{attacker.uid}"
        finally:
            flood.kill()


TOKEN = "a" * 64


@pytest.fixture
def debugger() -> Iterator[DebugServer]:
    server = DebugServer(Sessions(), lambda: [TOKEN], ("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.close()


def _attach(server: DebugServer) -> tuple[dict[str, Any], float]:
    """The owner's handshake: the server's verdict and the seconds it took."""
    host, port = server.address.rsplit(":", 1)
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        first = reader.readline()
        assert first, "the debugger closed the owner's connection before its challenge"
        challenge = json.loads(first)["challenge"]
        sock.sendall(json.dumps({"proof": proof(TOKEN, challenge)}).encode() + b"\n")
        verdict: dict[str, Any] = json.loads(reader.readline())
        return verdict, time.monotonic() - start


def test_debugger_wrong_proofs_of_another_user_do_not_lock_the_owner_out(
    attacker: Attacker, debugger: DebugServer
) -> None:
    """12 wrong proofs from 127.0.0.1 lock out the user who sent them, not the owner."""
    seen = wrong_proofs(attacker, int(debugger.address.rsplit(":", 1)[1]), 12)
    assert seen[0] == "authentication failed: wrong or missing secret"
    assert seen[-1] == "closed", seen  # the attacker's own uid is now refused outright
    verdict, took = _attach(debugger)
    assert verdict == {"ok": True}
    assert took < PROMPT


def test_debugger_drips_of_another_user_hold_no_slot_the_owner_needs(
    attacker: Attacker, debugger: DebugServer
) -> None:
    """1100 connections, 40 of them dripping one byte every 3 s, held 12 s: each owner attach
    is answered at once, every drip is cut at the handshake deadline and the server's process
    keeps its descriptors."""
    before = _fd_count(os.getpid())
    port = int(debugger.address.rsplit(":", 1)[1])
    flood = start_flood(attacker, port, 1100, drips=40, drip_every=3.0, hold=12.0)
    try:
        peak, served = before, 0
        while flood.running_after(0.5):
            verdict, took = _attach(debugger)
            assert verdict == {"ok": True}
            assert took < PROMPT, f"the owner waited {took:.1f} s under the flood"
            peak, served = max(peak, _fd_count(os.getpid())), served + 1
        assert served >= 5
        seen = flood.result(timeout=60)
    finally:
        flood.kill()
    assert peak < before + debug_server.MAX_HANDSHAKES + 16, (before, peak)
    assert seen["cut"] == seen["opened"] > 1000, seen
    assert seen["longest_drip"] < debug_server.HANDSHAKE_TIMEOUT + 3.0, (
        seen
    )  # never cut: 12 s and more


def test_debugger_handshake_deadline_holds_however_the_bytes_trickle(
    debugger: DebugServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handshake that sends a byte every 0.2 s (each read succeeds) is cut at the deadline
    counted from its accept; so is one that sends nothing."""
    monkeypatch.setattr(debug_server, "HANDSHAKE_TIMEOUT", 1.0)
    host, port = debugger.address.rsplit(":", 1)
    start = time.monotonic()
    with (
        socket.create_connection((host, int(port)), timeout=10) as drip,
        socket.create_connection((host, int(port)), timeout=10) as silent,
    ):
        drip.makefile("rb").readline()  # the challenge
        cut = False
        while not cut and time.monotonic() - start < 10:
            try:
                drip.send(b"{")
                cut = bool(select.select([drip], [], [], 0.2)[0]) and _closed(drip)
            except OSError:
                cut = True
        took = time.monotonic() - start
        assert silent.makefile("rb").readline()  # the challenge, then
        assert _closed(silent)
    assert cut
    assert 1.0 <= took < 1.0 + 2.0, took  # the drip alone would last 10 s


def _closed(sock: socket.socket) -> bool:
    """Read until the server closes ``sock``; whether it did within the socket's timeout."""
    try:
        while sock.recv(65536):
            pass  # the refusal's text
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_debugger_refuses_a_long_handshake_line_at_once(debugger: DebugServer) -> None:
    """A peer that has proved nothing may not make the server buffer a long line."""
    host, port = debugger.address.rsplit(":", 1)
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        reader.readline()  # the challenge
        sock.sendall(b"x" * (debug_wire.HANDSHAKE_LINE + 10))  # and no end of line
        refusal = json.loads(reader.readline())
    assert refusal == {"error": "authentication failed: wrong or missing secret"}
    assert time.monotonic() - start < debug_server.HANDSHAKE_TIMEOUT - 2
