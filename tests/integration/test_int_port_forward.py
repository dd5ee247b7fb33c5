"""``PortForwarder`` over real procs and real sockets: data, back-pressure, resets, stop, limits."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from regency.actor import ActorError, ProcMesh, this_proc
from regency.job import PortForwarder

HOST = "127.0.0.1"
CALL_TIMEOUT = 60.0
SPAWN_TIMEOUT = 60.0


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class Server:
    """A TCP server on a thread; ``handle(conn)`` serves each connection on its own thread."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self._handle = handle
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self._handle(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._accepting.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


@pytest.fixture
def servers() -> Iterator[Callable[[Callable[[socket.socket], None]], Server]]:
    made: list[Server] = []

    def start(handle: Callable[[socket.socket], None]) -> Server:
        made.append(Server(handle))
        return made[-1]

    yield start
    for server in made:
        server.close()


@pytest.fixture
def procs(make_procs: Callable[..., ProcMesh]) -> ProcMesh:
    mesh = make_procs(2)
    assert mesh.initialized.get(timeout=SPAWN_TIMEOUT) is True
    return mesh


@pytest.fixture
def forwarder() -> Iterator[PortForwarder]:
    actor = this_proc().spawn("port_forwarder", PortForwarder)
    yield actor
    actor.stop().get(timeout=CALL_TIMEOUT)


def _forward(forwarder: PortForwarder, procs: ProcMesh, dst_port: int, **kwargs: object) -> int:
    """Forward a free local port on proc 1 to ``dst_port`` on proc 0; return the local port."""
    (source_port,) = _free_ports(1)
    forwarder.forward.call_one(
        procs.slice(gpus=0), dst_port, procs.slice(gpus=1), f"{HOST}:{source_port}", **kwargs
    ).get(timeout=CALL_TIMEOUT)
    return source_port


def _read_to_end(conn: socket.socket) -> None:
    while conn.recv(65536):
        pass


def _round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection((HOST, port), timeout=30) as conn:
        sender = threading.Thread(target=lambda: (conn.sendall(payload), conn.shutdown(1)))
        sender.start()
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
        sender.join()
    return b"".join(chunks)


@pytest.mark.timeout(120)
def test_many_concurrent_connections_carry_their_bytes_intact(procs, forwarder, servers):
    port = _forward(forwarder, procs, servers(_echo).port)
    payloads = [bytes([i]) * 200_000 + bytes(range(256)) * i for i in range(16)]
    results: dict[int, bytes] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, _round_trip(port, payloads[i])))
        for i in range(len(payloads))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [results.get(i) == payloads[i] for i in range(len(payloads))] == [True] * 16


@pytest.mark.timeout(120)
def test_a_slow_reader_stalls_the_writer_and_loses_nothing(procs, forwarder, servers):
    """The destination reads nothing until released: the client's writes stall well before the
    payload is all sent (the forward buffers a bounded window, not the whole stream); once the
    reader reads, every byte arrives in order."""
    release = threading.Event()
    digest: list[str] = []

    def slow_sink(conn: socket.socket) -> None:
        release.wait(60)
        hasher, total = hashlib.sha256(), 0
        while data := conn.recv(1 << 20):
            hasher.update(data)
            total += len(data)
        digest.append(f"{total}:{hasher.hexdigest()}")
        conn.sendall(b"done")

    port = _forward(forwarder, procs, servers(slow_sink).port)
    payload = hashlib.sha256(b"seed").digest() * (96 * 1024 * 1024 // 32)  # 96 MiB
    with socket.create_connection((HOST, port), timeout=30) as conn:
        conn.setblocking(False)
        sent, idle_since = 0, time.monotonic()
        while time.monotonic() - idle_since < 1.5 and sent < len(payload):
            try:
                sent += conn.send(payload[sent : sent + (1 << 20)])
                idle_since = time.monotonic()
            except BlockingIOError:
                time.sleep(0.01)
        assert sent < len(payload) // 2, f"the writer never stalled: {sent} bytes accepted"
        release.set()
        conn.setblocking(True)
        conn.sendall(payload[sent:])
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(16) == b"done"
    assert digest == [f"{len(payload)}:{hashlib.sha256(payload).hexdigest()}"]


@pytest.mark.timeout(120)
def test_a_reset_at_the_destination_resets_the_client(procs, forwarder, servers):
    def reset(conn: socket.socket) -> None:
        conn.recv(1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    port = _forward(forwarder, procs, servers(reset).port)
    with socket.create_connection((HOST, port), timeout=10) as conn:
        conn.sendall(b"x")
        conn.settimeout(10)
        with pytest.raises(ConnectionResetError):
            _read_to_end(conn)


@pytest.mark.timeout(120)
def test_a_reset_at_the_client_closes_the_destination(procs, forwarder, servers):
    ended = threading.Event()

    def stream(conn: socket.socket) -> None:
        try:
            while True:
                conn.sendall(b"y" * 65536)
        finally:
            ended.set()

    port = _forward(forwarder, procs, servers(stream).port)
    conn = socket.create_connection((HOST, port), timeout=10)
    assert conn.recv(1) == b"y"
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()
    assert ended.wait(10)


@pytest.mark.timeout(120)
def test_stop_closes_listener_and_stalled_connections(procs, servers):
    release = threading.Event()
    server = servers(lambda conn: release.wait(60))
    forwarder = this_proc().spawn("port_forwarder", PortForwarder)
    try:
        port = _forward(forwarder, procs, server.port)
        conn = socket.create_connection((HOST, port), timeout=10)
        conn.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                conn.send(b"z" * 65536)
        started = time.monotonic()
        forwarder.stop().get(timeout=CALL_TIMEOUT)
        assert time.monotonic() - started < 20
        conn.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(1) == b""
        conn.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, port), timeout=10)
    finally:
        release.set()


@pytest.mark.timeout(120)
def test_connections_past_the_cap_are_closed_and_the_cap_frees_up(procs, forwarder, servers):
    port = _forward(forwarder, procs, servers(_echo).port, max_connections=2)
    first = socket.create_connection((HOST, port), timeout=10)
    second = socket.create_connection((HOST, port), timeout=10)
    for conn in (first, second):
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"
    # The forwarder resets a connection past the cap; on a busy machine the reset can reach
    # the dialer before its connect() returns.
    with contextlib.suppress(ConnectionResetError):
        with socket.create_connection((HOST, port), timeout=10) as third:
            assert third.recv(1) == b""
    first.close()
    deadline = time.monotonic() + 10
    while True:  # the first connection's slot frees once its close went through
        assert time.monotonic() < deadline, "a closed connection never freed its slot"
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            with socket.create_connection((HOST, port), timeout=10) as again:
                again.sendall(b"pong")
                if again.recv(4) == b"pong":
                    break
        time.sleep(0.05)
    second.close()


@pytest.mark.timeout(120)
def test_setup_failure_leaves_no_listener_open(procs, forwarder, servers):
    server = servers(_echo)
    ports = _free_ports(2)
    with socket.create_server((HOST, ports[1])):
        with pytest.raises(ActorError, match=r"(?i)address already in use"):
            forwarder.forward.call_one(
                procs, server.port, procs, lambda point: f"{HOST}:{ports[point['gpus']]}"
            ).get(timeout=CALL_TIMEOUT)
    for port in ports:
        with socket.socket() as probe:
            probe.bind((HOST, port))
    # the forwarder still works after a failed forward
    assert _round_trip(_forward(forwarder, procs, server.port), b"after") == b"after"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1234, "slice", f"{HOST}:5678"), "must have the same shape"),
        ((0, "same", f"{HOST}:5678"), "dst_port must be an integer from 1 through 65535"),
        ((1234, "same", "5678"), "src_address must use 'address:port' form"),
        ((1234, "same", f"{HOST}:http"), "src_address port must be an integer"),
    ],
)
def test_bad_arguments_are_refused_with_the_problem_named(procs, forwarder, args, message):
    dst_port, which, address = args
    src = procs.slice(gpus=0) if which == "slice" else procs
    with pytest.raises(ActorError, match=message):
        forwarder.forward.call_one(procs, dst_port, src, address).get(timeout=CALL_TIMEOUT)
