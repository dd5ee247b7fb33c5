"""Shared helpers for the fault tests: raw wire clients, process probes and controller scripts.

The wire helpers speak the protocol from its documentation (``regency._transport.auth`` and
``regency._transport.frames`` docstrings) with their own code, so a test does not trust the
implementation it checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from regency.actor import ProcMesh, this_host

MAGIC = b"RGCY\x02"
NONCE = 32
MAC = 32
HELLO_LEN = len(MAGIC) + NONCE
REFUSED = b"RGCY refused the proof".ljust(32, b"\0")
# u64 body_len | u8 kind | u8 nparts | u16 flags | u32 rank | u64 dest | u64 sender | u64 seq
HEADER = struct.Struct("<QBBHIQQQ")

KIND_ACTOR = 1
KIND_CAST = 2
KIND_PORT = 3
KIND_CONTROL = 4

REPO = Path(__file__).resolve().parents[2]


# -- waiting ---------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# -- processes -------------------------------------------------------------------------------


def proc_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) regency process.

    PID 1 of the test machine may not reap orphans, so a killed proc can linger as a zombie:
    that counts as gone. A pid reused by an unrelated program also counts as gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    return b"regency" in cmdline


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    pids = list(pids)
    wait_until(lambda: not any(proc_alive(p) for p in pids), timeout)
    return [p for p in pids if proc_alive(p)]


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL whichever of ``pids`` are still regency processes (test cleanup)."""
    for pid in pids:
        if proc_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- raw wire clients ------------------------------------------------------------------------


def connect(address: str, timeout: float = 5.0) -> socket.socket:
    """A plain blocking socket connected to a regency address (no handshake)."""
    if address.startswith("unix:"):
        name = address[len("unix:") :]
        target: object = "\0" + name[1:] if name.startswith("@") else name
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        host, _, port = address[len("tcp://") :].rpartition(":")
        target = (host.strip("[]"), int(port))
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(timeout)
    sock.connect(target)
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, or fewer if the peer closes first."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Send ``data``; False if the peer had already hung up (which the tests accept)."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Read until the peer closes; return (everything read, whether it closed in time)."""
    deadline = time.monotonic() + timeout
    data = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(data), False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return bytes(data), False
        except ConnectionResetError:
            return bytes(data), True
        if not chunk:
            return bytes(data), True
        data += chunk


def mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    """HMAC-SHA256 over role, the channel (none: plain TCP) and both nonces, as the handshake
    defines it."""
    channel = hashlib.sha256(b"").digest()
    return hmac.new(secret, role + channel + first + second, hashlib.sha256).digest()


def handshake(sock: socket.socket, secret: bytes, my_address: str) -> bool:
    """Run the dialer side with ``secret``; True if the listener proved it holds it too.

    Returns False when the listener refuses the proof or hangs up instead of answering.
    """
    hello = recv_exact(sock, HELLO_LEN)
    assert hello[: len(MAGIC)] == MAGIC, f"unexpected greeting {hello!r}"
    nonce_l = hello[len(MAGIC) :]
    nonce_d = os.urandom(NONCE)
    addr = my_address.encode()
    sock.sendall(
        mac(secret, b"dial", nonce_l, nonce_d)
        + nonce_d
        + struct.pack("<H", len(addr))
        + addr
        + mac(secret, b"addr", nonce_l + nonce_d, addr)
    )
    answer = recv_exact(sock, MAC)
    if len(answer) < MAC or answer == REFUSED:
        return False
    assert hmac.compare_digest(answer, mac(secret, b"listen", nonce_d, nonce_l))
    return True


def frame(
    kind: int,
    dest: int,
    parts: list[bytes],
    *,
    flags: int = 0,
    rank: int = 0,
    sender: int = 0,
    seq: int = 0,
) -> bytes:
    """One well-formed frame."""
    table = struct.pack(f"<{len(parts)}Q", *(len(p) for p in parts))
    body_len = HEADER.size - 8 + len(table) + sum(len(p) for p in parts)
    head = HEADER.pack(body_len, kind, len(parts), flags, rank, dest, sender, seq)
    return head + table + b"".join(parts)


# -- controller scripts ----------------------------------------------------------------------

PRELUDE = """
import json, os, sys, time, traceback
def emit(tag, value):
    print(tag + " " + json.dumps(value), flush=True)
"""


def write_script(tmp_path: Path, body: str, name: str = "controller.py") -> Path:
    """Write a controller script (the prelude defines ``emit(tag, value)``)."""
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def script_env() -> dict[str, str]:
    """Environment for controller subprocesses: unbuffered, no inherited REGENCY_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGENCY_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Controller:
    """A controller script running in a subprocess, its output read by background threads."""

    def __init__(self, path: Path, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, str(path), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(path.parent),
            env=script_env(),
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._readers = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, self.stdout, True)),
            threading.Thread(target=self._pump, args=(self.popen.stderr, self.stderr, False)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    def _pump(self, stream: IO[str], sink: list[str], forward: bool) -> None:
        for line in stream:
            sink.append(line)
            if forward:
                self._lines.put(line)
        if forward:
            self._lines.put(None)

    def expect(self, tag: str, timeout: float) -> Any:
        """Wait for a stdout line starting with ``tag``; return its JSON value."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.001))
            except queue.Empty:
                line = None
            if line is not None and line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])
            if line is None:
                raise AssertionError(
                    f"no {tag!r} line from the controller (exit code {self.popen.poll()})\n"
                    f"{self.describe()}"
                )

    def wait(self, timeout: float) -> int:
        """Wait for the controller to exit and its output to be read; return its exit code."""
        code = self.popen.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout)
        return code

    def describe(self) -> str:
        """Captured output, for assertion messages."""
        return "stdout:\n" + "".join(self.stdout) + "stderr:\n" + "".join(self.stderr)

    def close(self) -> None:
        """Kill the controller if it is still running (test cleanup)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        for reader in self._readers:
            reader.join(5)


def tagged(stdout: str, tag: str) -> Any:
    """The JSON value of the first ``tag`` line in captured output."""
    for line in stdout.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag!r} line in {stdout!r}")


def tracked_procs(cleanup: tuple[list[ProcMesh], list[int]], gpus: int = 1) -> ProcMesh:
    """A fresh proc mesh on this host that the ``cleanup`` fixture stops at teardown."""
    procs = this_host().spawn_procs(per_host={"gpus": gpus})
    cleanup[0].append(procs)
    return procs


QUIET = 0.5  # how long a test watches for a notice that must not come


def quiet(get: Callable[[], list[Any]]) -> list[Any]:
    """Whatever ``get`` returns within ``QUIET`` seconds (it should stay empty)."""
    seen: list[Any] = []

    def any_seen() -> bool:
        seen[:] = get()
        return bool(seen)

    wait_until(any_seen, QUIET, interval=0.05)
    return seen
