"""A small bounded HTTP server: asyncio's, on a thread of its own, one request per connection.

What serves the admin API and the dashboard. Nothing is spent on a connection beyond its socket
and a coroutine until it has sent a whole request head:

- connections that have not authenticated are counted per client (:mod:`regency.observe.
  admission`): at most :data:`OTHERS` from everybody but this user together and
  :data:`PER_CLIENT` from one of them (another local user by uid, another machine by address),
  :data:`OWNER` from this user's own processes; one more pushes out the oldest of its kind;
- the request head must arrive whole within :data:`HEADER_TIMEOUT` seconds and fit in
  :data:`MAX_HEAD` bytes; a response the client has not taken within :data:`IDLE_TIMEOUT`
  seconds is cut;
- only an authorized request runs its handler on a thread, one of :data:`WORKERS`;
- each refused or cut connection is one log line, at most 10 per 10 s
  (:class:`regency._transport.ratelog.RateLimitedLog`);
- ``accept()`` out of descriptors pauses the listener for a second (asyncio's own back-off), one
  rate-limited line each time, no busy loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

from regency._errors import RegencyError
from regency._transport.ratelog import RateLimitedLog
from regency.observe.admission import Admission, client_key, describe

HEADER_TIMEOUT = 5.0
IDLE_TIMEOUT = 10.0
MAX_HEAD = 16 * 1024
OTHERS = 64
PER_CLIENT = 16
OWNER = 64
WORKERS = 4
BACKLOG = 1024  # a burst of connections waits in the kernel rather than retrying its SYN


@dataclass(frozen=True)
class Request:
    """A request head: the method, the target (path and query), headers by lower-case name."""

    method: str
    target: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Response:
    """A status, a body and the headers beyond ``Content-Length`` and ``Connection``."""

    status: HTTPStatus
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class App(Protocol):
    """What the server asks of the application it serves."""

    def authorized(self, request: Request) -> bool:
        """Whether ``request`` proves it may be served by :meth:`private` (quick, no I/O)."""

    def public(self, request: Request) -> Response:
        """The answer to a request that is not authorized (quick, no I/O)."""

    def private(self, request: Request) -> Response:
        """The answer to an authorized request (runs on a worker thread; may block)."""


class _BadRequestError(RegencyError, ValueError):
    pass


class HttpServer:
    """Serves ``app`` at ``(host, port)`` until :meth:`stop`; ``address`` is where it listens."""

    def __init__(self, host: str, port: int, app: App, name: str, log: logging.Logger) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family)
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.address = (str(bound_host), int(bound_port))
        self._app, self._name = app, name
        self._refused = RateLimitedLog(log)
        self._admission: Admission[asyncio.StreamWriter] = Admission(OTHERS, PER_CLIENT, OWNER)
        self._writers: set[asyncio.StreamWriter] = set()
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix=f"regency-{name}-request")
        self._loop = asyncio.SelectorEventLoop()
        self._loop.set_exception_handler(self._loop_error)
        self._server: asyncio.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=f"regency-{name}", daemon=True
        )
        self._thread.start()
        started.wait()

    def stop(self) -> None:
        """Stop serving: close the listener and every connection, then the thread."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped already
            self._loop.call_soon_threadsafe(self._shut)
        self._thread.join(timeout=5)
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, sock=self._sock, limit=MAX_HEAD, backlog=BACKLOG)
            )
        finally:
            started.set()
        try:
            self._loop.run_forever()
            # Let the connections' coroutines see their aborts and end before the loop goes.
            pending = asyncio.all_tasks(self._loop)
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self._loop.close()

    def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._loop.call_soon(self._loop.stop)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        why = f": {exc}" if exc is not None else ""
        self._refused.warning("%s: %s%s", self._name, context.get("message", "error"), why)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        writer.transport.set_write_buffer_limits(high=0)  # drain() waits for the whole answer
        key = client_key(writer.get_extra_info("socket"))
        for old in self._admission.admit(key, writer):
            old.transport.abort()
            self._refused.warning(
                "%s: closed the oldest connection without a token to admit one from %s "
                "(at most %d per client, %d from others, %d from this user)",
                self._name,
                describe(key),
                PER_CLIENT,
                OTHERS,
                OWNER,
            )
        try:
            await self._exchange(reader, writer, key)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client left, or the connection was pushed out
        finally:
            self._admission.release(writer)
            self._writers.discard(writer)
            writer.transport.abort()

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str | None
    ) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT)
            request = _parse(head)
        except asyncio.TimeoutError:
            self._refuse(key, f"no whole request within {HEADER_TIMEOUT:g} s")
            return
        except asyncio.LimitOverrunError:
            self._refuse(key, f"a request head over {MAX_HEAD} bytes")
            await self._send(writer, _error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too big"))
            return
        except _BadRequestError as exc:
            self._refuse(key, str(exc))
            await self._send(writer, _error(HTTPStatus.BAD_REQUEST, str(exc)))
            return
        if self._app.authorized(request):
            self._admission.release(writer)
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(self._workers, self._app.private, request)
        else:
            response = self._app.public(request)
            if response.status >= 400:
                self._refuse(key, f"{request.method} {request.target[:100]!r}: {response.status}")
        await self._send(writer, response)

    async def _send(self, writer: asyncio.StreamWriter, response: Response) -> None:
        status = response.status
        lines = [f"HTTP/1.1 {status.value} {status.phrase}", "Server: regency"]
        lines += [f"{name}: {value}" for name, value in response.headers.items()]
        lines += [f"Content-Length: {len(response.body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + response.body)
        try:
            await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT)
        except asyncio.TimeoutError:
            self._refused.warning(
                "%s: cut a connection that did not take its answer within %g s",
                self._name,
                IDLE_TIMEOUT,
            )

    def _refuse(self, key: str | None, why: str) -> None:
        self._refused.warning("%s: refused a request from %s: %s", self._name, describe(key), why)


def _parse(head: bytes) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise _BadRequestError(f"not an HTTP/1 request line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise _BadRequestError(f"not a header line: {line[:100]!r}")
        headers[name.lower()] = value.strip()
    return Request(parts[0], parts[1], headers)


def _error(status: HTTPStatus, text: str) -> Response:
    return Response(status, f"{status.phrase}: {text}\n".encode(), {"Content-Type": "text/plain"})
