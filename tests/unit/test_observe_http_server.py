"""The admin API's HTTP server: deadlines, bounds and one log line per refusal."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus

import pytest

from regency.observe import AdminServer, http_server, start_admin

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> Iterator[AdminServer]:
    monkeypatch.setattr(http_server, "HEADER_TIMEOUT", 0.5)
    server = start_admin(secret=b"s" * 32)
    yield server
    server.stop()


def _connect(admin: AdminServer) -> socket.socket:
    port = int(admin.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass  # closed with bytes of ours unread
    return data


def test_silence_and_drips_are_cut_at_the_header_deadline(
    admin: AdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    silent, dripping = _connect(admin), _connect(admin)
    start = time.monotonic()
    with silent, dripping:
        for byte in b"GET /v1/tree HTTP/1.1\r\nX-Filler: " + b"a" * 40:
            try:
                dripping.send(bytes([byte]))
            except OSError:
                break  # cut
            if select.select([dripping], [], [], 0.1)[0]:  # one byte per 0.1 s until cut
                break
        assert _answer(dripping) == b""
        assert _answer(silent) == b""
    assert time.monotonic() - start < 0.5 + 2.0  # the drip alone would last 6 s
    assert "no whole request within 0.5 s" in caplog.text


def test_a_huge_head_gets_431_and_garbage_gets_400(admin: AdminServer) -> None:
    with _connect(admin) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nX: " + b"a" * (http_server.MAX_HEAD + 10) + b"\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 431 ")
    with _connect(admin) as sock:
        sock.sendall(b"HELLO\r\n\r\n")
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"not an HTTP/1 request line: 'HELLO'" in answer


def test_the_owners_pool_pushes_out_its_oldest_idle_connection(admin: AdminServer) -> None:
    idle = [_connect(admin) for _ in range(http_server.OWNER)]
    try:
        with _connect(admin) as newest:
            assert _answer(idle[0]) == b""  # pushed out at once
            newest.sendall(b"GET /dashboard HTTP/1.1\r\n\r\n")
            assert _answer(newest).startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in idle:
            sock.close()


def test_refusals_are_one_line_each_and_rate_limited(
    admin: AdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "regency.admin")
    for _ in range(30):
        with _connect(admin) as sock:
            sock.sendall(b"GET /v1/tree HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n")
            assert _answer(sock).startswith(b"HTTP/1.1 401 ")
    refusals = [r for r in caplog.records if "refused a request" in r.getMessage()]
    assert len(refusals) == 10
    assert refusals[0].getMessage() == (
        "admin API: refused a request from this user: GET '/v1/tree': 401"
    )
    assert all(r.exc_info is None for r in caplog.records)  # no tracebacks


class _Big:
    """An app whose every answer is 64 MiB: more than loopback's buffers hold."""

    def authorized(self, request: http_server.Request) -> bool:
        return True

    def public(self, request: http_server.Request) -> http_server.Response:
        raise AssertionError("every request is authorized here")

    def private(self, request: http_server.Request) -> http_server.Response:
        return http_server.Response(HTTPStatus.OK, b"x" * (64 << 20))


class _Watch(logging.Handler):
    """Sets ``seen`` once a record holding ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_an_answer_the_client_does_not_take_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "IDLE_TIMEOUT", 0.5)
    log = logging.getLogger("regency.test-http")
    watch = _Watch("did not take its answer within 0.5 s")
    log.addHandler(watch)
    server = http_server.HttpServer("127.0.0.1", 0, _Big(), "big", log)
    try:
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert watch.seen.wait(10), "the answer was never cut"
            assert len(_answer(sock)) < 64 << 20
    finally:
        server.stop()
        log.removeHandler(watch)
