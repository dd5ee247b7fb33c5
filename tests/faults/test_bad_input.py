"""Bad bytes against a live proc: real processes, real sockets, the proc's own address.

DESIGN.md §1.4: anything that unpickles bytes from a socket first authenticates the peer, frames
have a size limit, and bad input is rejected with a clear error and never kills a healthy process.

Each test spawns its own one-proc mesh (this test process is the controller), attacks the proc's
listening address with a raw socket, then checks the proc still answers real calls.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _fault_helpers import (
    HEADER,
    HELLO_LEN,
    KIND_ACTOR,
    KIND_CAST,
    KIND_CONTROL,
    KIND_PORT,
    MAGIC,
    REFUSED,
    connect,
    frame,
    handshake,
    kill_all,
    mac,
    proc_alive,
    read_until_closed,
    recv_exact,
    send_quietly,
    wait_gone,
    wait_until,
)

from regency._runtime.kernel import codec, state, wire
from regency.actor import Actor, ActorError, ActorMesh, ProcMesh, endpoint, this_host

pytestmark = pytest.mark.timeout(60)

# How long a rejected connection may stay open. Far below the 10 s handshake timeout, so a test
# cannot pass by waiting for the timeout to clean up.
PROMPT = 3.0


class Echo(Actor):
    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@dataclass
class LiveProc:
    procs: ProcMesh
    mesh: ActorMesh[Echo]
    addr: str
    pid: int
    secret: bytes
    stderr: Path

    def healthy(self, timeout: float = 10.0) -> None:
        """The proc is alive and the original actor still answers a real call."""
        token = os.urandom(8).hex()
        try:
            answer = self.mesh.echo.call_one(token).get(timeout=timeout)
        except Exception as exc:
            raise AssertionError(
                f"the proc stopped answering ({exc!r}); its stderr:\n{self.log()}"
            ) from exc
        assert answer == token
        assert proc_alive(self.pid), f"the proc died; its stderr:\n{self.log()}"

    def log(self) -> str:
        """What the proc wrote to its stderr so far."""
        return self.stderr.read_text(errors="replace")

    def client(self) -> socket.socket:
        """A raw socket authenticated with the job's secret, posing as a made-up peer."""
        sock = connect(self.addr)
        assert handshake(sock, self.secret, f"unix:@regency-test-peer-{os.urandom(6).hex()}")
        return sock


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point this process's fd 2 at ``path`` (children spawned meanwhile inherit it)."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@pytest.fixture
def live_proc(tmp_path: Path) -> Iterator[LiveProc]:
    """A fresh one-proc mesh with an Echo actor; the proc's stderr goes to a file."""
    stderr = tmp_path / "proc-stderr.log"
    with _stderr_to(stderr):
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        mesh = procs.spawn("echo", Echo)
        pid = mesh.pid.call_one().get(timeout=30)
    proc = LiveProc(procs, mesh, procs._procs[0].addr, pid, state.runtime().secret, stderr)
    try:
        yield proc
    finally:
        stopped = procs.stop()
        try:
            stopped.get(timeout=5)
        except TimeoutError:
            # A stuck actor (a failing test) delays a graceful stop by stop_timeout; skip that.
            kill_all([pid])
            stopped.get(timeout=10)
        left = wait_gone([pid], 10)
        kill_all(left)
        assert not left, f"proc {pid} outlived its mesh's stop()"


def canary_pickle(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when unpickled: proof that bytes were unpickled."""

    class Canary:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    return pickle.dumps(Canary(), protocol=5)


# -- before authentication -------------------------------------------------------------------


def test_garbage_before_handshake_is_closed_and_never_unpickled(
    live_proc: LiveProc, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    body = canary_pickle(marker)
    # Frames that would be valid after a handshake, repeated past any handshake's length.
    garbage = b"".join(frame(kind, 1, [body]) for kind in (1, 2, 3, 4)) * 400
    assert len(garbage) > 70_000
    sock = connect(live_proc.addr)
    try:
        send_quietly(sock, garbage)
        data, closed = read_until_closed(sock, PROMPT)
    finally:
        sock.close()
    assert closed, "the proc kept a connection open after garbage"
    assert data.startswith(MAGIC)
    # The greeting, then the refusal of the "proof" the garbage starts with: nothing else.
    assert data[HELLO_LEN:] == REFUSED, f"the proc said more to a stranger: {data!r}"
    live_proc.healthy()
    assert not marker.exists(), "the proc unpickled bytes from an unauthenticated peer"


def test_short_garbage_is_rejected_without_waiting_for_the_handshake_timeout(
    live_proc: LiveProc,
) -> None:
    # What a port scanner or a stray HTTP client sends: longer than the dialer's proof and nonce
    # (66 bytes), so the listener has enough bytes to see the proof is wrong.
    probe = b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n"
    assert len(probe) > 66
    sock = connect(live_proc.addr)
    try:
        sock.sendall(probe)
        start = time.monotonic()
        data, closed = read_until_closed(sock, PROMPT)
        waited = time.monotonic() - start
    finally:
        sock.close()
    assert len(data) <= HELLO_LEN + len(REFUSED), f"the proc said more than its greeting: {data!r}"
    assert closed, (
        f"a peer that sent {len(probe)} bytes of garbage was still connected after {waited:.1f} s; "
        "the listener should reject a wrong proof as soon as it has the proof, not wait for the "
        "handshake timeout"
    )
    live_proc.healthy()


def _wrong_proof(sock: socket.socket, secret: bytes) -> bytes:
    """Read the greeting; return a complete dialer reply keyed with a secret that is not
    ``secret``."""
    hello = recv_exact(sock, HELLO_LEN)
    assert hello.startswith(MAGIC)
    nonce_l, nonce_d = hello[len(MAGIC) :], os.urandom(32)
    wrong = bytes(b ^ 0x5A for b in secret)
    addr = b"unix:@regency-test-intruder"
    return mac(wrong, b"dial", nonce_l, nonce_d) + nonce_d + struct.pack("<H", len(addr)) + addr


def test_wrong_secret_is_rejected_and_logged(live_proc: LiveProc) -> None:
    sock = connect(live_proc.addr)
    try:
        send_quietly(sock, _wrong_proof(sock, live_proc.secret))
        data, closed = read_until_closed(sock, PROMPT)
    finally:
        sock.close()
    assert closed, "the proc kept a connection with the wrong secret open"
    assert data == REFUSED, f"the proc answered a wrong proof with {data!r}"
    assert wait_until(lambda: "rejected a connection" in live_proc.log(), 5), (
        f"no 'rejected a connection' warning; the proc's stderr:\n{live_proc.log()}"
    )
    assert "wrong secret" in live_proc.log()
    live_proc.healthy()


def test_frames_behind_a_wrong_secret_are_never_unpickled(
    live_proc: LiveProc, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    sock = connect(live_proc.addr)
    try:
        # The intruder does not wait for the answer: its frames ride in the same write.
        payload = b"".join(frame(k, 1, [canary_pickle(marker)]) for k in (1, 2, 3, 4))
        send_quietly(sock, _wrong_proof(sock, live_proc.secret) + payload)
        data, closed = read_until_closed(sock, PROMPT)
    finally:
        sock.close()
    assert closed
    assert data == REFUSED
    live_proc.healthy()
    assert not marker.exists(), "the proc unpickled bytes from a peer with the wrong secret"


def test_silent_clients_do_not_block_real_calls(live_proc: LiveProc) -> None:
    # The handshake timeout (10 s) is not configurable, so check the next best thing: clients
    # that connect and say nothing, or stop mid-handshake, do not hold anyone else up.
    silent = [connect(live_proc.addr) for _ in range(16)]
    halfway = []
    for _ in range(16):
        sock = connect(live_proc.addr)
        recv_exact(sock, HELLO_LEN)
        sock.sendall(os.urandom(40))  # part of a proof, never finished
        halfway.append(sock)
    try:
        start = time.monotonic()
        for _ in range(5):
            live_proc.healthy(timeout=5)
        assert time.monotonic() - start < 5
    finally:
        for sock in silent + halfway:
            sock.close()
    live_proc.healthy()


# -- after authentication: malformed frames close the connection -----------------------------


def _oversize(proc: LiveProc) -> bytes:
    return HEADER.pack(2**62, KIND_ACTOR, 1, 0, 0, proc.mesh._mesh_id, 7, 0)


def _below_header(proc: LiveProc) -> bytes:
    return struct.pack("<Q", 3) + b"\0" * 60


def _bad_part_table(proc: LiveProc) -> bytes:
    # The part table claims 100 bytes, but the frame carries 5.
    head = HEADER.pack(HEADER.size - 8 + 8 + 5, KIND_ACTOR, 1, 0, 0, proc.mesh._mesh_id, 7, 0)
    return head + struct.pack("<Q", 100) + b"hello"


def _table_longer_than_frame(proc: LiveProc) -> bytes:
    # 200 parts announced in a frame with room for none of their lengths.
    return HEADER.pack(HEADER.size - 8, KIND_CONTROL, 200, 0, 0, 1, 7, 0)


def _unknown_kind(proc: LiveProc) -> bytes:
    return frame(99, proc.mesh._mesh_id, [b"whatever"])


MALFORMED: dict[str, Callable[[LiveProc], bytes]] = {
    "length-over-limit": _oversize,
    "length-below-header": _below_header,
    "part-table-mismatch": _bad_part_table,
    "part-table-past-end": _table_longer_than_frame,
    "unknown-kind": _unknown_kind,
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_frame_closes_the_connection(live_proc: LiveProc, case: str) -> None:
    sock = live_proc.client()
    try:
        send_quietly(sock, MALFORMED[case](live_proc))
        data, closed = read_until_closed(sock, PROMPT)
    finally:
        sock.close()
    assert closed, f"{case}: the proc kept the connection open"
    assert data == b""
    live_proc.healthy()


def test_truncated_frame_then_hang_up(live_proc: LiveProc) -> None:
    for announced in (200, 10 * 1024 * 1024):  # fits the receive buffer / needs its own buffer
        sock = live_proc.client()
        whole = frame(KIND_ACTOR, live_proc.mesh._mesh_id, [b"x" * announced])
        sock.sendall(whole[: len(whole) // 2 if announced < 1000 else 100_000])
        sock.close()
    live_proc.healthy()


# -- after authentication: well-formed frames with bad contents ------------------------------


class _Inbox:
    """A port in this (controller) process that records what arrives."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue[tuple[int, list[bytes]]] = queue.SimpleQueue()

    def deliver(self, rank: int, flags: int, parts: Sequence[Any]) -> None:
        self.items.put((flags, [bytes(p) for p in parts]))

    def peer_lost(self, addr: str, reason: str) -> None:
        self.items.put((-1, [reason.encode()]))


@contextlib.contextmanager
def inbox_port() -> Iterator[tuple[_Inbox, Any]]:
    rt = state.runtime()
    inbox = _Inbox()
    ref = rt.open_port(inbox)
    try:
        yield inbox, ref
    finally:
        rt.close_port(ref.port)


def _envelope(method: str, reply: Any) -> bytes:
    # The reply port's number, then the envelope's pickle (no trace context, no sender: telemetry
    # off): wire.ENVELOPE_PORT.
    return wire.ENVELOPE_PORT.pack(reply.port) + pickle.dumps(
        (method, reply.addr, ("gpus",), (1,), None, 0), protocol=5
    )


def _call_frame(proc: LiveProc, reply: Any, method: str, *args: Any) -> bytes:
    """A real, well-formed call of ``method(*args)`` on the proc's Echo actor."""
    parts = [_envelope(method, reply), *(bytes(p) for p in codec.dumps((args, {})))]
    return frame(KIND_ACTOR, proc.mesh._mesh_id, parts, sender=99)


def _closed_now(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def _send_then_probe(proc: LiveProc, bad: bytes) -> str:
    """Send ``bad`` and, in the same write, a real call; say what became of the call.

    ``"answered"``: the bad frame was dropped or answered and the connection kept working.
    ``"closed"``: the proc closed the connection (an acceptable answer to a protocol error).
    ``"lost"``: neither within the deadline: the good frame after the bad one vanished.
    """
    token = os.urandom(8).hex()
    sock = proc.client()
    with inbox_port() as (inbox, ref):
        try:
            sock.sendall(bad + _call_frame(proc, ref, "echo", token))
            outcome: list[str] = []

            def settled() -> bool:
                with contextlib.suppress(queue.Empty):
                    flags, parts = inbox.items.get_nowait()
                    assert flags == 0, f"probe failed: {parts!r}"
                    assert codec.loads(parts) == token
                    outcome.append("answered")
                    return True
                if _closed_now(sock):
                    outcome.append("closed")
                    return True
                return False

            if not wait_until(settled, 5):
                return "lost"
            return outcome[0]
        finally:
            sock.close()


def _mesh(proc: LiveProc) -> int:
    return proc.mesh._mesh_id


BAD_CONTENTS: dict[str, Callable[[LiveProc], bytes]] = {
    "actor-envelope-not-a-pickle": lambda p: frame(KIND_ACTOR, _mesh(p), [b"\x80\x05junk"]),
    "actor-envelope-wrong-shape": lambda p: frame(KIND_ACTOR, _mesh(p), [pickle.dumps(42)]),
    "actor-envelope-sender-not-an-id": lambda p: frame(
        KIND_ACTOR,
        _mesh(p),
        [wire.ENVELOPE_PORT.pack(0) + pickle.dumps(("echo", None, ("gpus",), (1,), None, "x"))],
    ),
    "actor-no-parts": lambda p: frame(KIND_ACTOR, _mesh(p), []),
    "actor-unknown-mesh": lambda p: frame(KIND_ACTOR, 424242, [b"\x80\x05junk"]),
    "cast-routing-not-a-pickle": lambda p: frame(KIND_CAST, _mesh(p), [b"\x80\x05junk", b"x"]),
    "cast-no-parts": lambda p: frame(KIND_CAST, _mesh(p), []),
    "control-not-a-pickle": lambda p: frame(KIND_CONTROL, 1, [b"\x80\x05junk"]),
    "control-no-parts": lambda p: frame(KIND_CONTROL, 1, []),
    "control-unknown-service": lambda p: frame(KIND_CONTROL, 12345, [pickle.dumps("hi")]),
    "control-unknown-verb": lambda p: frame(KIND_CONTROL, 1, [pickle.dumps(("no-such-verb",))]),
    "control-wrong-type": lambda p: frame(KIND_CONTROL, 1, [pickle.dumps(42)]),
    "port-unknown": lambda p: frame(KIND_PORT, 987654, [b"no such port"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONTENTS))
def test_bad_frame_contents_leave_the_proc_serving(live_proc: LiveProc, case: str) -> None:
    outcome = _send_then_probe(live_proc, BAD_CONTENTS[case](live_proc))
    assert outcome != "lost", (
        f"{case}: after the bad frame the connection stayed open but the well-formed call "
        "sent right behind it was never answered"
    )
    live_proc.healthy(timeout=5)


def test_garbage_arguments_are_answered_with_an_error(live_proc: LiveProc) -> None:
    sock = live_proc.client()
    with inbox_port() as (inbox, ref):
        try:
            parts = [_envelope("echo", ref), b"\x80\x05garbage arguments"]
            sock.sendall(frame(KIND_ACTOR, live_proc.mesh._mesh_id, parts, sender=99))
            flags, reply = inbox.items.get(timeout=10)
        finally:
            sock.close()
    assert flags == 1, f"expected an error reply (FLAG_ERROR), got flags={flags}"
    error = codec.loads(reply)
    assert isinstance(error, ActorError)
    assert "echo" in str(error)
    live_proc.healthy()
