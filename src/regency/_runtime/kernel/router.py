"""The per-process router: frames in, frames out, local mailboxes, ports and services.

Every regency process (the controller and each spawned proc) has exactly one router, a
:class:`~regency._runtime.kernel.proc_runtime.ProcRuntime` over real sockets (an in-memory
loopback in unit tests).
Frames arrive on the I/O thread and are routed without unpickling user data: actor messages to
mailboxes, port messages to port handlers (which only store the raw parts), control requests to
service threads, and cast frames are delivered locally and forwarded down the casting tree (the
router's :attr:`~FrameRouter.casts`, :mod:`regency._runtime.kernel.cast_path`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

from regency import config
from regency._config_keys import SHM_ARENA_BYTES
from regency._runtime.kernel import bulk, wire
from regency._runtime.kernel.bulk import Bulk
from regency._runtime.kernel.cast_path import CastPath
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.forwards import Forwards
from regency._runtime.kernel.losses import Losses
from regency._runtime.kernel.mailbox import Mailbox
from regency._runtime.kernel.parts import COALESCE_MAX, buffers_size, own_copies, postable
from regency._runtime.kernel.port_handlers import ExitReports, PeerWatch, PortHandler
from regency._runtime.kernel.refs import Part, PortRef
from regency._runtime.kernel.seam import FrameSink, FrameSource, FrameTransport, LossSink, Timers
from regency._runtime.kernel.service import Service
from regency._transport import frames
from regency._transport.transport import PeerUnreachableError

log = logging.getLogger("regency.proc")


# How long a frame that came while its router was being made waits for it.
_MADE_WITHIN_S = 60.0


class FrameRouter:
    """Routing state of one process, over any :class:`~.seam.FrameTransport` (the send seam).

    :class:`ProcRuntime` runs it over the real transport; :mod:`.loopback` over memory.
    """

    def __init__(
        self,
        job_id: str,
        secret: bytes,
        transport: Callable[[FrameSink, LossSink], FrameTransport],
        timers: Timers,
        frame_limit: int,
    ) -> None:
        self.job_id = job_id
        self.secret = secret
        self.frame_limit = frame_limit
        # Frames and losses can come as soon as the transport exists (a proc's zygote hands it a
        # connection the controller already writes on): they wait until this router is whole.
        self._whole = False
        self._made = threading.Event()
        # Made by ``transport``, which is given where received frames and losses go.
        self._link = transport(self._on_frame, self._on_peer_lost)
        self._timers = timers
        self.address = self._link.address
        self._lock = threading.Lock()
        self._mailboxes: dict[int, Mailbox] = {}
        self._ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(16)
        self._services: dict[int, Service] = {}
        self._early_control: dict[int, list[Any]] = {}
        # The largest frame posted without an Encoder (post_actor, send_port).
        self._post_max = min(COALESCE_MAX, frame_limit)
        self.bulk = Bulk(config.value(SHM_ARENA_BYTES), self._bulk_release)
        # Who ended and why, who is stopped on purpose, and the ports waiting to hear of it.
        self.losses = Losses(self._ports, self._forget_peer, timers)
        self._exit_port: PortRef | None = None
        # Sends casts to subtree heads (``casts.send``) and forwards the cast frames that come.
        self.casts = CastPath(
            self,
            self._link,
            self.losses,
            self._deliver_local,
            self._frame_parts,
            frame_limit,
            Forwards(self, self.losses, timers),
        )
        self._whole = True
        self._made.set()

    def port_handler(self, port: int) -> PortHandler | None:
        """The handler of port ``port`` of this process, if it is open."""
        return self._ports.get(port)

    def post_service(self, service_id: int, request: Any) -> None:
        """Queue ``request`` for this process's own service ``service_id`` (which exists)."""
        self._services[service_id].post(request)

    def known_as(self, address: str) -> None:
        """Take ``address`` as this process's address from now on (a worker takes the address
        its controller dials it by: its listener may be bound to a wildcard or another name)."""
        self.address = self._link.address = address

    # -- ports ---------------------------------------------------------------------------------

    def open_port(self, handler: PortHandler, watch: Sequence[str] = ()) -> PortRef:
        """Register a port; ``watch`` lists processes whose loss fails it."""
        port = next(self._port_ids)
        self._ports[port] = handler
        if watch:
            self.losses.watch(port, watch)
        return tuple.__new__(PortRef, (self.address, port))  # without NamedTuple's Python call

    def exit_reports(self, agent: str, procs: Sequence[str]) -> PortRef:
        """The port where host agent ``agent`` reports how ``procs`` (spawned from here) ended.

        Until a report arrives, a lost connection to one of them is not taken as its death: the
        report, which says how the process ended, follows within moments. If the host agent
        itself is lost, so are all of them, at once.
        """
        if self.losses.started_on(agent, procs):
            self.open_port(PeerWatch(agent, self.losses.host_lost), watch=[agent])
        if self._exit_port is None:
            self._exit_port = self.open_port(ExitReports(self.losses.proc_ended))
        return self._exit_port

    def close_port(self, port: int, watch: Sequence[str] = ()) -> None:
        """Forget a port; later messages to it are dropped."""
        self._ports.pop(port, None)
        if watch:
            self.losses.unwatch(port, watch)

    # -- sending -------------------------------------------------------------------------------

    def send_actor(
        self,
        targets: Sequence[tuple[str, int, int]],
        mesh_id: int,
        sender: int,
        encoder: frames.Encoder,
    ) -> None:
        """Send one actor message directly to each ``(addr, seq, rank)`` in ``targets``.

        Every target that can be reached gets it, even when another cannot: each took the
        sender's next sequence number, and a target left without its message would hold back
        every later message from that sender. Then :class:`PeerLostError` names the lost ones.
        """
        lost = self._send_actor(targets, mesh_id, sender, encoder)
        if lost:
            raise PeerLostError("; ".join(lost))

    def post_actor(
        self,
        addr: str,
        mesh_id: int,
        rank: int,
        sender: int,
        seq_of: Callable[[str, int], int],
        envelope: bytes,
        body: bytes,
    ) -> bool:
        """Post a small message of two parts of our own (an envelope and a pickle: the
        commonest call) to the actor of rank ``rank`` of mesh ``mesh_id`` at ``addr``, taking
        its sequence number from ``seq_of(addr, mesh_id)``.

        Returns False, having taken no sequence number, when the message is not one to post
        (too large, or for this process): the caller then sends it with :meth:`send_actor`.
        """
        size = frames.TWO_PARTS_FIXED + len(envelope) + len(body)
        if size > self._post_max or addr == self.address:
            return False
        buffers = frames.two_parts(
            wire.KIND_ACTOR, mesh_id, rank, sender, seq_of(addr, mesh_id), envelope, body
        )
        try:
            self._link.post_one(addr, buffers, size)
        except PeerUnreachableError as exc:
            raise PeerLostError(str(exc)) from exc
        return True

    def _send_actor(
        self,
        targets: Sequence[tuple[str, int, int]],
        mesh_id: int,
        sender: int,
        encoder: frames.Encoder,
    ) -> list[str]:
        """Send to every target that can be reached; return why the others could not be."""
        parts = encoder.parts
        size = encoder.size
        coalesce = postable(len(parts), size)
        big = size >= bulk.BULK_MIN
        frame = encoder.frame
        posts: list[tuple[str, list[Part], int]] = []
        here = self.address
        local: list[tuple[int, int]] = []
        lost: list[str] = []
        # Known-dead targets were refused by the caller; one that dies meanwhile makes the
        # transport raise PeerUnreachableError.
        try:
            for addr, seq, rank in targets:
                if addr == here:
                    local.append((seq, rank))
                    continue
                try:
                    if big:
                        framed, flags = self._frame_parts(addr, parts)
                        buffers = frames.encode(
                            wire.KIND_ACTOR,
                            mesh_id,
                            framed,
                            flags=flags,
                            rank=rank,
                            sender=sender,
                            seq=seq,
                            limit=self.frame_limit,
                        )
                    else:
                        buffers = frame(wire.KIND_ACTOR, mesh_id, rank=rank, sender=sender, seq=seq)
                        if coalesce:
                            posts.append((addr, buffers, size))
                            continue
                    self._link.send(addr, buffers)
                except PeerUnreachableError as exc:
                    lost.append(str(exc))
            if posts:
                try:
                    self._link.post(posts)
                except PeerUnreachableError as exc:
                    lost.append(str(exc))
        finally:
            # Our own actors last: waking one could take this thread's CPU before the rest left.
            for seq, rank in local:
                self._deliver_local(mesh_id, sender, seq, rank, own_copies(parts), None)
        return lost

    def _frame_parts(self, addr: str, parts: Sequence[Part]) -> tuple[list[Part], int]:
        """The parts of a frame to ``addr``: large ones move to shared memory on this host.

        Not when the frame has no room for the part that says where they went: the sender
        checked the message's limits before it took sequence numbers, and must not fail here.
        """
        if (
            len(parts) < frames.MAX_PARTS
            and self._link.is_local(addr)
            and buffers_size(parts) >= bulk.BULK_MIN
        ):
            frames.Encoder(list(parts), self.frame_limit)  # the limit is on the whole message
            exported = self.bulk.export(addr, parts)
            if exported is not None:
                moved, descriptor = exported
                return [*moved, descriptor], wire.FLAG_BULK
        return list(parts), 0

    def _bulk_release(self, peer: str, offset: int) -> None:
        # Runs from a finalizer, on any thread and possibly inside a lock: only enqueue.
        self._timers.call_soon(lambda: self._send_release(peer, offset))

    def _send_release(self, peer: str, offset: int) -> None:
        if peer in self.losses.dead:
            return
        body = pickle.dumps(wire.BulkRelease(offset), protocol=5)
        buffers = frames.encode(
            wire.KIND_CONTROL, wire.SERVICE_BULK, [body], limit=self.frame_limit
        )
        with contextlib.suppress(PeerUnreachableError):
            self._link.send(peer, buffers, wait=False)

    def flush(self) -> None:
        """Send the frames waiting to be coalesced (call before blocking)."""
        try:
            self._link.flush()
        except PeerUnreachableError as exc:
            raise PeerLostError(str(exc)) from exc

    def send_port(
        self,
        ref: PortRef,
        rank: int,
        flags: int,
        parts: Sequence[Part],
        wait: bool = True,
        before_post: Callable[[], None] | None = None,
    ) -> None:
        """Send a value to a port (anywhere).

        ``before_post`` runs just before a message is posted: one that returns at once, never
        waiting for the peer to take its bytes (small, of our own parts: a reply).
        """
        addr = ref.addr
        if addr == self.address:
            handler = self._ports.get(ref.port)
            if handler is not None:
                handler.deliver(rank, flags, own_copies(parts))
            return
        self.losses.check_alive(addr)
        if wait and len(parts) == 1:
            part = parts[0]
            size = part.nbytes if type(part) is memoryview else len(part)
            if frames.ONE_PART_FIXED + size <= self._post_max:
                buffers = frames.one_part(wire.KIND_PORT, ref.port, rank, flags, part, size)
                if before_post is not None:
                    before_post()
                try:
                    self._link.post_one(addr, buffers, frames.ONE_PART_FIXED + size)
                except PeerUnreachableError as exc:
                    raise PeerLostError(str(exc)) from exc
                return
        try:
            encoder = frames.Encoder(parts, self.frame_limit)
            size = encoder.size
            if size >= bulk.BULK_MIN:
                framed, bulk_flags = self._frame_parts(addr, parts)
                encoder = frames.Encoder(framed, self.frame_limit)
                flags |= bulk_flags
            buffers = encoder.frame(wire.KIND_PORT, ref.port, rank=rank, flags=flags)
            if wait and postable(len(parts), size):
                if before_post is not None:
                    before_post()
                self._link.post([(addr, buffers, size)])  # a reply: coalesced in bursts
            else:
                self._link.send(addr, buffers, wait)
        except PeerUnreachableError as exc:
            raise PeerLostError(str(exc)) from exc

    def send_control(self, addr: str, service: int, request: Any, wait: bool = True) -> None:
        """Send a control request to a service of the process at ``addr`` (without ``wait``,
        return before a connection to it exists)."""
        try:
            self._send_control(addr, service, request, wait)
        except PeerUnreachableError as exc:
            raise PeerLostError(str(exc)) from exc

    def _send_control(self, addr: str, service: int, request: Any, wait: bool = True) -> None:
        body = pickle.dumps(request, protocol=5) if addr != self.address else None
        if addr == self.address:
            self._post_control(service, request, addr)
            return
        self.losses.check_alive(addr)
        assert body is not None
        buffers = frames.encode(wire.KIND_CONTROL, service, [body], limit=self.frame_limit)
        self._link.send(addr, buffers, wait)

    # -- services ------------------------------------------------------------------------------

    def add_service(self, service_id: int, service: Service) -> None:
        """Register a service and hand it the requests that arrived before it existed."""
        with self._lock:
            self._services[service_id] = service
            early = self._early_control.pop(service_id, [])
        for request in early:
            service.post(request)

    def _post_control(self, service_id: int, request: Any, peer: str) -> None:
        service = self._services.get(service_id)
        if service is None:
            with self._lock:
                service = self._services.get(service_id)
                if service is None:
                    if service_id not in wire.SERVICES:
                        log.warning(
                            "control request for unknown service %d from %s", service_id, peer
                        )
                        return
                    # A peer may reach a proc that is still starting its services: keep it.
                    self._early_control.setdefault(service_id, []).append(request)
                    return
        service.post(request)

    # -- receiving -----------------------------------------------------------------------------

    def mailbox(self, mesh_id: int) -> Mailbox:
        """The mailbox for the actor of mesh ``mesh_id`` in this process (made on first use)."""
        box = self._mailboxes.get(mesh_id)
        if box is None:
            with self._lock:
                box = self._mailboxes.get(mesh_id)
                if box is None:
                    box = self._mailboxes[mesh_id] = Mailbox()
        return box

    def _deliver_local(
        self,
        mesh_id: int,
        sender: int,
        seq: int,
        rank: int,
        parts: Sequence[Part],
        reply: PortRef | None,
    ) -> None:
        self.mailbox(mesh_id).post(sender, seq, (parts, rank, reply))

    def _wait_until_whole(self) -> None:
        if not self._made.wait(_MADE_WITHIN_S):
            raise RuntimeError(f"a router of job {self.job_id} was not made in {_MADE_WITHIN_S} s")

    def _on_frame(self, conn: FrameSource, frame: frames.Frame) -> None:
        if not self._whole:
            self._wait_until_whole()
        if frame.flags & wire.FLAG_BULK:
            if not frame.parts:
                raise frames.FrameError("bulk frame without its descriptor part")
            frame.parts = self.bulk.import_(conn.peer, frame.parts[:-1], frame.parts[-1])
            frame.flags &= ~wire.FLAG_BULK
        kind = frame.kind
        if kind == wire.KIND_PORT:
            handler = self._ports.get(frame.dest)
            if handler is not None:
                handler.deliver(frame.rank, frame.flags, frame.parts)
            return
        if kind == wire.KIND_ACTOR:
            box = self._mailboxes.get(frame.dest) or self.mailbox(frame.dest)
            box.post(frame.sender, frame.seq, (frame.parts, frame.rank, None))
            return
        if kind == wire.KIND_CAST:
            if not frame.parts:
                raise frames.FrameError("cast frame without a routing part")
            self.casts.received(frame.dest, frame.sender, frame.seq, frame.rank, frame.parts)
            return
        if kind == wire.KIND_CONTROL:
            try:
                request = pickle.loads(frame.parts[0])
            except Exception as exc:
                log.warning("dropping undecodable control request from %s: %s", conn.peer, exc)
                return
            if frame.dest == wire.SERVICE_BULK:
                if type(request) is wire.BulkRelease:
                    self.bulk.released(request.offset)
                return
            self._post_control(frame.dest, request, conn.peer)
            return
        log.warning("closing connection from %s: unknown frame kind %d", conn.peer, kind)
        conn.close(f"unknown frame kind {kind}")

    # -- failures ------------------------------------------------------------------------------

    def expect_new_process(self, addr: str) -> None:
        """A new process is about to be reached at ``addr`` where an earlier one may have
        ended (a worker daemon attached afresh can hold a TCP port the kernel took back from a
        lost one): forget that end, so the new process is dialed rather than reported lost."""
        self.losses.forget_end(addr)
        self._link.forget_lost(addr)

    def _forget_peer(self, addr: str, reason: str) -> None:
        self._link.mark_lost(addr, reason)
        self.bulk.peer_lost(addr)

    def _on_peer_lost(self, addr: str, reason: str) -> None:
        if not self._whole:
            self._wait_until_whole()
        self.losses.connection_lost(addr, reason)

    def close(self) -> None:
        """Stop the services and close every connection."""
        for service in self._services.values():
            service.stop()
        self._link.close()
