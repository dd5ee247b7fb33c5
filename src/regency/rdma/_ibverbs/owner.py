"""The owner's side of the ibverbs backend, run by its transfer service.

A reader that wants ibverbs opens an ordinary (authenticated) service connection and asks, with
``IBV_CONNECT``, for a queue pair connected to its own; the owner makes one and keeps it for as
long as that connection stays open. For each buffer the reader then asks for the key with
``IBV_KEY``: the owner registers the buffer's memory with the NIC the first time anyone asks
(remote read, plus remote and local write when the memory is writable) and keeps the
registration attached to the buffer, so dropping the buffer deregisters it and its key stops
working at once. After that the owner takes no part: the reader's NIC reads and writes the
memory directly.
"""

from __future__ import annotations

from regency._transport.tls import Stream
from regency.rdma._ibverbs.load import IbvUnavailableError, verbs_errors
from regency.rdma._ibverbs.port import agree_depth
from regency.rdma._ibverbs.verbs import Endpoint, Registered, device
from regency.rdma._ibverbs.wire import QpInfo, RemoteKey
from regency.rdma._protocol import REPLY, Status, recv_exact, send_reply
from regency.rdma._registry import Registration, registry

ATTACHMENT = "ibverbs"
"""The name of a buffer's NIC registration among its registry attachments."""
MAX_CONNECT_BYTES = 4096


def _send_ok(conn: Stream, body: bytes) -> None:
    conn.sendall(REPLY.pack(Status.OK, len(body)) + body)


def _registration(entry: Registration) -> Registered:
    """The buffer's registration with the NIC, made on first use (``None`` if it was dropped)."""
    attached = entry.attachments.get(ATTACHMENT)
    if isinstance(attached, Registered):
        return attached
    region = entry.region
    with verbs_errors(
        f"registering the buffer's {region.nbytes} bytes with the RDMA NIC failed (the memlock "
        "limit, `ulimit -l`, caps how much memory a process may register)",
        lasting=False,
    ):
        mine = device().register(
            region.address, region.nbytes, remote=True, writable=region.writable
        )
    got = registry().attach(entry.buffer_id, entry.token, ATTACHMENT, mine)
    if got is not mine:
        mine.close()
    if got is None:
        raise LookupError("dropped while it was being registered")
    assert isinstance(got, Registered)
    return got


class OwnerSide:
    """The ibverbs state of one service connection: the queue pair connected to its reader."""

    def __init__(self, conn: Stream) -> None:
        self.conn = conn
        self._endpoint: Endpoint | None = None

    def connect(self, length: int) -> bool:
        """Serve ``IBV_CONNECT``; ``False`` if the connection must end (a malformed request)."""
        if length > MAX_CONNECT_BYTES:
            send_reply(self.conn, Status.BAD_REQUEST, f"IBV_CONNECT of {length} bytes")
            return False
        try:
            theirs = QpInfo.unpack(recv_exact(self.conn, length))
        except ValueError as exc:
            send_reply(self.conn, Status.BAD_REQUEST, f"bad queue pair info: {exc}")
            return True
        try:
            endpoint, mine = self._accept(theirs)
        except IbvUnavailableError as exc:
            send_reply(self.conn, Status.UNSUPPORTED, str(exc))
            return True
        if self._endpoint is not None:
            self._endpoint.close()
        self._endpoint = endpoint
        _send_ok(self.conn, mine.pack())
        return True

    @staticmethod
    def _accept(theirs: QpInfo) -> tuple[Endpoint, QpInfo]:
        with verbs_errors("accepting the reader's queue pair failed", lasting=True):
            dev = device()
            endpoint = dev.endpoint(remote_access=True)
            try:
                depth = agree_depth(theirs.depth, dev.responder_limit)
                endpoint.connect(theirs, initiator_depth=1, responder_depth=depth)
                return endpoint, endpoint.info(depth)
            except BaseException:
                endpoint.close()
                raise

    def key(self, buffer_id: int, token: int) -> None:
        """Serve ``IBV_KEY``: the buffer's remote key, registering it on first use."""
        entry = registry().lookup(buffer_id, token)
        if entry is None:
            send_reply(self.conn, Status.DROPPED, "the buffer was dropped")
            return
        if entry.region.is_cuda:
            send_reply(
                self.conn,
                Status.UNSUPPORTED,
                "GPU memory is not registered with the NIC here (no GPUDirect RDMA)",
            )
            return
        try:
            reg = _registration(entry)
        except IbvUnavailableError as exc:
            send_reply(self.conn, Status.UNSUPPORTED, str(exc))
            return
        except LookupError as exc:
            send_reply(self.conn, Status.DROPPED, f"the buffer was {exc}")
            return
        _send_ok(self.conn, RemoteKey(reg.rkey, reg.address, reg.nbytes).pack())

    def close(self) -> None:
        """Destroy the queue pair (the reader's requests on it fail from now on)."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
