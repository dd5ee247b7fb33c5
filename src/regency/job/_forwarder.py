"""``PortForwarder``: TCP port forwarding between two proc meshes (Monarch's ``PortForwarder``).

A ``PortForwarder`` actor (spawn it on ``this_proc()``) starts forwards: for each point of the
source proc mesh, a source actor listens on ``address:port`` and carries every connection it
accepts to ``127.0.0.1:dst_port`` on the destination proc at the same point. The bytes travel as
actor messages over regency's channels (authenticated, TLS across hosts); the local listener is
the only new socket that accepts unauthenticated peers. It holds at most ``max_connections``
connections from its own uid and as many from everyone else (other local users, known by uid
through the kernel's socket diagnostics, and other hosts); more are reset as they arrive, so
others filling a forward never lock its owner out, and the owner can always stop it.

Each direction of a connection is flow-controlled by credit: a side sends at most
:data:`WINDOW` bytes that the other side has not yet written into its socket, and waits for
credit before reading more from its own socket. A slow reader therefore stalls the writer at
the far end through TCP itself, with nothing dropped and nothing buffered without bound.
An abrupt close (a reset) on either side aborts the other side's socket; stopping the
``PortForwarder`` stops every forward it started and closes their listeners and connections,
also those stalled by a reader that does not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from regency._transport.peer_identity import tcp_peer_uid
from regency.actor import Actor, Channel, Port, PortReceiver, ProcMesh, current_rank, endpoint
from regency.job._flow import Credit, collect
from regency.shape import Point

log = logging.getLogger("regency.job")

DESTINATION_HOST = "127.0.0.1"
READ_SIZE = 64 * 1024  # bytes read from a socket per message
WINDOW = 2 * 1024 * 1024  # bytes one direction may have sent and not yet had written
MAX_CONNECTIONS = 1024  # default cap of concurrent connections per source listener
_CLOSE_TIMEOUT = 1.0

PortSpec = int | Callable[[Point], int]
AddressSpec = str | Callable[[Point], str]


class _Data(NamedTuple):
    data: bytes


class _Eof(NamedTuple):
    pass


class _Abort(NamedTuple):
    pass


_Message = _Data | _Eof | _Abort


class _Link(NamedTuple):
    """Where the other side of a connection sends its bytes and returns its credit."""

    data: Port[_Message]
    credit: Port[int]


class _Ends(NamedTuple):
    """One side's receivers of a connection, and the link the other side sends to."""

    link: _Link
    data: PortReceiver[_Message]
    credit: PortReceiver[int]


def _open_ends() -> _Ends:
    data_port, data_receiver = Channel[_Message].open()
    credit_port, credit_receiver = Channel[int].open()
    return _Ends(_Link(data_port, credit_port), data_receiver, credit_receiver)


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout=_CLOSE_TIMEOUT)
    except (OSError, asyncio.TimeoutError):
        writer.transport.abort()


async def _socket_to_peer(reader: asyncio.StreamReader, peer: _Link, credit: Credit) -> None:
    while data := await reader.read(READ_SIZE):
        await credit.take(len(data))
        peer.data.send(_Data(data))
    peer.data.send(_Eof())


async def _peer_to_socket(
    receiver: PortReceiver[_Message], writer: asyncio.StreamWriter, peer: _Link, eof: asyncio.Event
) -> None:
    """Write what the other side sends; after its end of data, still listen for an abort."""
    while True:
        message = await receiver.recv()
        if isinstance(message, _Data):
            writer.write(message.data)
            await writer.drain()
            peer.credit.send(len(message.data))
        elif isinstance(message, _Eof):
            if writer.can_write_eof():
                writer.write_eof()
                await writer.drain()
            eof.set()
        elif isinstance(message, _Abort):
            _reset(writer)
            raise ConnectionAbortedError("the other side of the forward was reset")
        else:
            raise RuntimeError(f"unexpected port-forward message {type(message).__name__}")


async def _relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: _Ends, peer: _Link
) -> None:
    """Carry one connection both ways until both directions ended or either side broke."""
    credit = Credit(WINDOW)
    eof = asyncio.Event()
    sending = asyncio.create_task(_socket_to_peer(reader, peer, credit))
    tasks: list[asyncio.Task[Any]] = [
        sending,
        asyncio.create_task(_peer_to_socket(ends.data, writer, peer, eof)),
        asyncio.create_task(collect(ends.credit, credit)),
        asyncio.create_task(eof.wait()),
    ]
    try:
        # Done when both directions ended; any failure (a reset socket, an abort from the
        # other side) ends the connection at once.
        while not (sending.done() and eof.is_set()):
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            tasks = [task for task in tasks if not task.done()]
    except asyncio.CancelledError:
        _abort(peer, writer)
        raise
    except Exception as error:  # a reset socket, an aborted or lost peer
        log.debug("port forward connection ended: %s: %s", type(error).__name__, error)
        _abort(peer, writer)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close_writer(writer)


def _abort(peer: _Link, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        peer.data.send(_Abort())
    _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the connection with a reset (RST), as an abrupt close must look to the peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None and not writer.transport.is_closing():
        # (an event loop's socket wrapper of a connection already closed raises ValueError)
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connections:
    """The relays of one actor's connections; closing cancels them all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def add(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: _Ends, peer: _Link
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(_relay(reader, writer, ends, peer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _DestinationActor(Actor):
    """Opens a connection to the destination port for each connection a source accepted."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._connections = _Connections()

    @endpoint
    async def configure(self, dst_port: PortSpec) -> None:
        self._port = _resolve_port(dst_port, current_rank())

    @endpoint
    async def open(self, peer: _Link) -> _Link:
        if self._port is None:
            raise RuntimeError("port forward destination is not configured")
        reader, writer = await asyncio.open_connection(DESTINATION_HOST, self._port)
        ends = _open_ends()
        self._connections.add(reader, writer, ends, peer)
        return ends.link

    async def __cleanup__(self, exc: Exception | None) -> None:
        await self._connections.close()


class _SourceActor(Actor):
    """Listens on the source address and relays each connection to its destination."""

    def __init__(self) -> None:
        self._destination: Any = None
        self._server: asyncio.AbstractServer | None = None
        self._connections = _Connections()
        self._max_connections = MAX_CONNECTIONS
        self._open = {True: 0, False: 0}  # connections held, by "from this actor's own uid"

    @endpoint
    async def start(self, destination: Any, src_address: AddressSpec, max_connections: int) -> None:
        point = current_rank()
        self._destination = destination.slice(**dict(point))
        self._max_connections = max_connections
        host, port = _resolve_address(src_address, point)
        self._server = await asyncio.start_server(self._accept, host, port, reuse_port=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Connections from this process's own uid and from anyone else (other local users,
        # other hosts) are capped separately, so that others filling the forward never lock
        # its owner out.
        sock = writer.get_extra_info("socket")
        mine = sock is not None and tcp_peer_uid(sock) == os.getuid()
        if self._destination is None or self._open[mine] >= self._max_connections:
            _reset(writer)
            return
        self._open[mine] += 1
        try:
            ends = _open_ends()
            peer = await self._destination.open.call_one(ends.link)
        except asyncio.CancelledError:  # the forward stops
            self._open[mine] -= 1
            _reset(writer)
            raise
        except Exception as error:
            self._open[mine] -= 1
            log.warning("port forward could not reach its destination: %s", error)
            _reset(writer)
            return
        task = self._connections.add(reader, writer, ends, peer)
        task.add_done_callback(lambda _: self._release(mine))

    def _release(self, mine: bool) -> None:
        self._open[mine] -= 1

    async def __cleanup__(self, exc: Exception | None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._connections.close()
        if server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), timeout=_CLOSE_TIMEOUT)


class PortForwarder(Actor):
    """An actor that owns TCP port forwards between proc meshes.

    Spawn one on the local proc, call :meth:`forward` for each forward, and stop the actor to
    close every forward it started::

        forwarder = this_proc().spawn("forwarder", PortForwarder)
        forwarder.forward.call_one(procs, 8080, this_proc(), "127.0.0.1:8080").get()
        ...  # connections to 127.0.0.1:8080 here reach port 8080 on procs' host
        forwarder.stop().get()
    """

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: PortSpec,
        src_proc_mesh: ProcMesh,
        src_address: AddressSpec,
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """Forward ``src_address`` on each source proc to ``dst_port`` on its destination proc.

        The two meshes must have the same shape. Each source proc listens on the
        ``"address:port"`` that ``src_address`` gives (a string, or a function of the point;
        use ``127.0.0.1`` unless others must reach it) and carries each connection to
        ``127.0.0.1:dst_port`` on the destination proc at the same point (``dst_port`` may also
        be a function of the point). Several points may share one source address: the
        listeners share the port and each connection goes to one of them. Each listener holds
        at most ``max_connections`` connections from this process's uid and as many from
        anyone else; more are reset as they arrive.

        Every destination is configured before any source listens; if any part fails, every
        actor this call started is stopped (no listener is left open) and the call raises.

        Raises:
            ValueError: (as the call's ``ActorError``) when the shapes differ or a port or
                address is invalid.

        """
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "destination and source process meshes must have the same shape: "
                f"{dst_proc_mesh.extent} != {src_proc_mesh.extent}"
            )
        if not callable(dst_port):
            _validate_port("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ValueError("max_connections must be a positive integer")
        if max_connections < 1:
            raise ValueError("max_connections must be a positive integer")
        suffix = uuid.uuid4().hex
        started: list[Any] = []
        try:
            source = src_proc_mesh.spawn(f"port_forward_source_{suffix}", _SourceActor)
            started.append(source)
            destination = dst_proc_mesh.spawn(
                f"port_forward_destination_{suffix}", _DestinationActor
            )
            started.append(destination)
            await destination.configure.call(dst_port)
            await source.start.call(destination, src_address, max_connections)
        except Exception:
            results = await asyncio.gather(
                *(mesh.stop().as_asyncio() for mesh in started), return_exceptions=True
            )
            for result in results:
                if isinstance(result, Exception):
                    log.warning("port-forward setup cleanup failed: %r", result)
            raise


def _validate_port(name: str, port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{name} must be an integer from 1 through 65535, not {port!r}")
    return port


def _resolve_port(port: PortSpec, point: Point) -> int:
    return _validate_port("dst_port", port(point) if callable(port) else port)


def _parse_address(address: object) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ValueError("src_address must resolve to a string in 'address:port' form")
    host, separator, port_text = address.rpartition(":")
    if not separator or not host:
        raise ValueError(f"src_address must use 'address:port' form, not {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError as error:
        raise ValueError(f"src_address port must be an integer, not {port_text!r}") from error
    return host, _validate_port("src_address port", port)


def _resolve_address(address: AddressSpec, point: Point) -> tuple[str, int]:
    return _parse_address(address(point) if callable(address) else address)
