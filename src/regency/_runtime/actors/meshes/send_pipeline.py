"""The send pipeline: how an endpoint's message reaches the ranks of an actor mesh view.

Each adverb of an :class:`~regency._runtime.actors.meshes.endpoint.Endpoint` makes one call here (as
Ray's actor handle makes one ``submit_actor_task`` call): :meth:`SendPipeline.gather`,
:meth:`~SendPipeline.stream`, :meth:`~SendPipeline.one` or :meth:`~SendPipeline.post`. The
pipeline opens the reply port, refuses what supervision knows cannot be delivered, pickles the
envelope, takes the sender's sequence numbers and sends directly or down the casting tree.
:class:`~regency._runtime.actors.meshes.actor_mesh.ActorMesh` owns one per view.
"""

from __future__ import annotations

import functools
import pickle
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from regency import _hooks, config
from regency._config_keys import CAST_FANOUT
from regency._runtime.actors.base import context
from regency._runtime.actors.base.errors import (
    SupervisionError,
    failed_text,
    process_failed,
    stopped_text,
)
from regency._runtime.actors.base.ports import (
    GatherReply,
    LostDescriber,
    OnceReply,
    StreamReply,
    fail_handler,
)
from regency._runtime.actors.meshes.proc_control import unique
from regency._runtime.actors.observe import tracing
from regency._runtime.actors.supervision.supervision import (
    UndeliverableMessageEnvelope,
    is_stop_reason,
)
from regency._runtime.kernel import casting, codec, state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef
from regency._transport import frames
from regency.shape import Shape

_PORT = wire.ENVELOPE_PORT

if TYPE_CHECKING:
    from regency._runtime.actors.base.identity import InstanceBase
    from regency._runtime.actors.base.mesh_trait import ProcMeshBase
    from regency._runtime.actors.control.control import ProcInfo
    from regency._runtime.actors.supervision.mesh_supervisor import MeshSupervisor
    from regency._runtime.kernel.proc_runtime import ProcRuntime


class Route(NamedTuple):
    """A mesh view's destinations: base ranks, proc addresses, and the cast extent."""

    bases: list[int]
    addrs: list[str]
    ranks: list[int]
    unique: list[str]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    fanout: int
    routing: int  # most bytes a cast frame's routing part to ``addrs`` takes (0: no cast)
    # The pickles of envelopes without a trace context (what follows the reply port's number,
    # wire.ENVELOPE_PORT), by ``(endpoint, reply port's address or None, sender's uid or 0)``.
    envelopes: dict[tuple[str, str | None, int], bytes]
    generation: int  # the supervisor's generation it was computed for


class SendPipeline:
    """One actor mesh view's destinations and the steps that send an endpoint's message there.

    ``endpoint`` in the methods below is the endpoint's name on the mesh (errors name it),
    ``method`` the name its message carries (``EndpointSpec.name``).
    """

    __slots__ = (
        "_dense",
        "_procs",
        "_route",
        "actor_class",
        "mesh_id",
        "mesh_name",
        "proc_mesh",
        "shape",
        "size",
        "supervisor",
    )

    def __init__(
        self,
        actor_class: type,
        mesh_name: str,
        shape: Shape,
        procs: list[ProcInfo],
        mesh_id: int,
        proc_mesh: ProcMeshBase | None = None,
    ) -> None:
        self.actor_class = actor_class
        self.mesh_name = mesh_name
        self.shape = shape
        self.size = len(shape)  # how many actors the view has (every call_one checks it)
        self.mesh_id = mesh_id
        # Per-rank health and restarts: set on the owner's mesh and its views.
        self.supervisor: MeshSupervisor | None = None
        self._procs = procs  # shared with the mesh's views and its supervisor
        self._route: Route | None = None
        self.proc_mesh = proc_mesh
        """The proc mesh the actors were spawned on (the tensor engine checks that mesh tensors
        sent here live on it)."""
        self._dense: Shape | None = None

    @property
    def dense_shape(self) -> Shape:
        """The shape of a reply's ``ValueMesh``: this view's extent, ranks numbered from 0
        (made once: every ``call`` on the view returns one)."""
        dense = self._dense
        if dense is None:
            dense = self._dense = Shape.from_extent(self.shape.extent)
        return dense

    def route(self) -> Route:
        """Where this view's messages go (computed once per view, again after a restart)."""
        route = self._route
        supervisor = self.supervisor
        generation = supervisor.generation if supervisor is not None else 0
        if route is None or route.generation != generation:
            bases = self.shape.ranks()
            addrs = [self._procs[b].addr for b in bases]
            extent = self.shape.extent
            fanout = config.value(CAST_FANOUT)
            route = Route(
                bases,
                addrs,
                list(range(len(addrs))),
                unique(addrs),
                tuple(extent.labels),
                tuple(extent.sizes),
                fanout,
                casting.routing_bound(addrs, state.runtime().address) if len(addrs) > fanout else 0,
                {},
                generation,
            )
            self._route = route
        return route

    # -- the adverbs' entries: one per kind of reply --------------------------------------------

    def gather(
        self, endpoint: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> GatherReply:
        """Send to every rank; the handler gathers one reply per rank (``call``)."""
        route = self.route()
        handler = GatherReply(len(route.bases), route.unique, self._describer(endpoint))
        reply = self._open(handler)
        self._send(
            route, endpoint, method, args, kwargs, reply, route.addrs, route.ranks, True, handler
        )
        return handler

    def stream(
        self, endpoint: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> StreamReply:
        """Send to every rank; the handler holds one pending reply per rank (``stream``)."""
        route = self.route()
        handler = StreamReply(len(route.bases), route.unique, self._describer(endpoint))
        reply = self._open(handler)
        self._send(
            route, endpoint, method, args, kwargs, reply, route.addrs, route.ranks, False, handler
        )
        return handler

    def one(
        self,
        index: int,
        endpoint: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> OnceReply:
        """Send to rank ``index`` of this view; the handler takes its reply (``call_one``)."""
        route = self.route()
        addr = route.addrs[index]
        rt = state.runtime()
        handler = OnceReply((addr,), functools.partial(self.describe_loss, endpoint), rt.close_port)
        reply = rt.open_port(handler)
        handler.port = reply.port
        self._send(route, endpoint, method, args, kwargs, reply, (addr,), (index,), False, handler)
        return handler

    def post(
        self,
        endpoint: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: PortRef | None,
        selection: Literal["all", "choose"] = "all",
    ) -> None:
        """Send without a reply of ours: each reply to ``reply`` (dropped if ``None``).

        ``selection="choose"`` sends to one rank picked at random (``broadcast``, ``send``).
        """
        route = self.route()
        addrs, ranks = route.addrs, route.ranks
        if selection != "all":  # one comparison on the broadcast path
            if selection != "choose":
                raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
            pick = random.randrange(len(addrs))
            addrs, ranks = [addrs[pick]], [pick]
        self._send(route, endpoint, method, args, kwargs, reply, addrs, ranks, False)

    # -- mechanics -------------------------------------------------------------------------------

    def _describer(self, endpoint: str) -> LostDescriber:
        return functools.partial(self.describe_loss, endpoint)

    @staticmethod
    def _open(handler: GatherReply | StreamReply) -> PortRef:
        # Open before _send looks for recorded losses: a loss after that look finds the port
        # (see Losses._notify); one before it refuses the call with the owner's account.
        ref = state.runtime().open_port(handler)
        handler.port = ref.port
        return ref

    def describe_loss(self, endpoint: str, addr: str, reason: str) -> SupervisionError:
        """The error of a call to ``endpoint`` whose process at ``addr`` was lost for ``reason``."""
        route = self.route()
        dead = state.runtime().losses.dead
        # Procs lost together (a lost host) share the reason: name all of their ranks.
        ranks = [i for i, a in enumerate(route.addrs) if a == addr or dead.get(a) == reason]
        supervisor = self.supervisor
        if supervisor is not None:
            # Name the rank in the whole mesh, not its index in this slice.
            ranks = [supervisor.bases.index(route.bases[i]) for i in ranks]
        name = self.mesh_name
        actor = (
            supervisor.actor_name(ranks[0])
            if supervisor is not None and ranks
            else f"<{self.actor_class.__qualname__} {name}>"
        )
        if is_stop_reason(reason):
            what = stopped_text(
                actor, reason, f"actor mesh {name} is stopped due to proc mesh shutdown"
            )
        else:
            at = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks or '?'}"
            what = failed_text(
                actor,
                f"the process this actor was running on {process_failed(reason)}",
                f"failure on mesh {name} at {at} with event: "
                f"the process {addr} hosting it failed: {reason}",
            )
        return SupervisionError(
            f"Endpoint call {name}.{endpoint}() failed, {what}", f"{name}.{endpoint}"
        )

    def _refuse(self, endpoint: str, reply: PortRef | None, error: SupervisionError) -> None:
        """Fail a call that cannot be delivered: its future, or the sender if there is none."""
        rt = state.runtime()
        probe = tracing.probe
        if probe is not None and rt.address == state.root_address():
            sender = context.current_instance()
            if sender is context.current_client():  # the root client takes the supervision
                probe.status(sender.uid, "Processing")  # event, as Monarch's client records
        if reply is not None and reply.addr == rt.address:
            handler = rt.port_handler(reply.port)
            if isinstance(handler, (OnceReply, GatherReply, StreamReply)):
                rt.close_port(reply.port)
                fail_handler(handler, error)
                return
        # No future of ours to fail (broadcast, or a user's port): the sender hears of it.
        sender = context.current_instance()
        undeliverable = getattr(sender, "undeliverable", None)
        if undeliverable is not None:
            envelope = UndeliverableMessageEnvelope(
                str(sender), f"{self.mesh_name}.{endpoint}", str(error)
            )
            if undeliverable(envelope):
                return
        raise error

    def _healthy(
        self,
        supervisor: MeshSupervisor,
        endpoint: str,
        reply: PortRef | None,
        ranks: Sequence[int],
    ) -> bool:
        """Whether the chosen ranks are healthy as far as the owner knows (else refuse)."""
        route = self.route()
        for rank in ranks:
            why = supervisor.bad.get(route.bases[rank])
            if why is not None:
                name = self.mesh_name
                self._refuse(
                    endpoint,
                    reply,
                    SupervisionError(
                        f"Endpoint call {name}.{endpoint}() failed, {why}", f"{name}.{endpoint}"
                    ),
                )
                return False
        return True

    def _send(
        self,
        route: Route,
        endpoint: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: PortRef | None,
        addrs: Sequence[str],
        ranks: Sequence[int],
        gather: bool,
        handler: OnceReply | GatherReply | StreamReply | None = None,
    ) -> None:
        """Send to ``addrs`` (ranks ``ranks`` of the view); ``handler`` takes the replies when
        ``reply`` is a port of ours (it names the processes it waits on: ``watching``)."""
        rt = state.runtime()
        probe = tracing.probe
        if probe is not None:  # the sent_messages table: every send, refused ones too
            uid = context.current_instance().uid
            if len(ranks) < self.size:  # some ranks of the view (choose()): each a point
                for rank in ranks:
                    probe.cast(uid, self.mesh_id, (), route.bases[rank], (), ())
            else:
                view = self.shape.ndslice
                labels = self.shape.labels
                probe.cast(uid, self.mesh_id, labels, view.offset, view.sizes, view.strides)
        supervisor = self.supervisor
        if (
            supervisor is not None
            and supervisor.bad
            and not self._healthy(supervisor, endpoint, reply, ranks)
        ):
            return
        dead = rt.losses.dead
        if dead:
            for addr in addrs:
                reason = dead.get(addr)
                if reason is not None:
                    self._refuse(endpoint, reply, self.describe_loss(endpoint, addr, reason))
                    return
        if probe is None:
            start, traced, trace = 0, None, None
        else:
            start, traced = probe.begin(reply is not None)
            trace = None if traced is None else (traced[0], traced[2], start)
        port, reply_addr = (reply.port, reply.addr) if reply is not None else (0, None)
        sender = context.current_instance()
        # With telemetry on the receiver records who sent it (the messages table).
        sender_uid = 0 if probe is None else sender.uid
        key = (endpoint, reply_addr, sender_uid)
        pickled = route.envelopes.get(key) if trace is None else None
        if pickled is None:
            envelope_fields = (method, reply_addr, route.labels, route.sizes, trace, sender_uid)
            pickled = pickle.dumps(envelope_fields, protocol=5)
            if trace is None:  # the same for every untraced call: made once
                route.envelopes[key] = pickled
        envelope = _PORT.pack(port) + pickled
        body, carried = codec.dumps_call_carrying(args, kwargs)
        try:
            # The commonest call (one actor elsewhere, small plain arguments) is posted as is.
            first = body[0]
            if not (
                len(addrs) == 1
                and len(body) == 1
                and type(first) is bytes
                and not carried
                and rt.post_actor(
                    addrs[0], self.mesh_id, ranks[0], sender.uid, sender.next_seq, envelope, first
                )
            ):
                self._send_framed(
                    rt, route, reply, addrs, ranks, gather, [envelope, *body], carried, sender
                )
        except PeerLostError as exc:
            # The router sent to every destination it could reach before it raised: each took
            # a sequence number of ours. The call itself fails.
            if handler is not None and rt.losses.will_account_for(addrs):
                # Our procs, one of whose connections dropped a moment ago: its end and why (its
                # exit status, its host's loss) are recorded within EXIT_REPORT_GRACE, and the
                # reply handler, which waits on them, fails the call with that account, as if
                # the loss came after the send, rather than with the bare connection error.
                return
            name = self.mesh_name
            self._refuse(
                endpoint,
                reply,
                SupervisionError(
                    f"Endpoint call {name}.{endpoint}() failed: {exc}", f"{name}.{endpoint}"
                ),
            )
            return
        if probe is not None:
            size = frames.Encoder([envelope, *body], rt.frame_limit).size
            if isinstance(handler, StreamReply):
                pending: Pending | None = handler.pendings[-1] if handler.pendings else None
            elif isinstance(handler, GatherReply):
                pending = handler.pending
            else:
                pending = handler
            name = f"{self.mesh_name}.{endpoint}"
            probe.sent(name, start, traced, size, len(addrs), pending, gather)

    def _send_framed(
        self,
        rt: ProcRuntime,
        route: Route,
        reply: PortRef | None,
        addrs: Sequence[str],
        ranks: Sequence[int],
        gather: bool,
        parts: list[Part],
        carried: list[Any],
        sender: InstanceBase,
    ) -> None:
        """Send a message of any size to any number of ranks, directly or down the casting
        tree (what :meth:`FrameRouter.post_actor` does not take)."""
        # Refuse oversize messages before taking sequence numbers: a gap would stall the
        # receiver's ordering of every later message from this sender.
        encoder = frames.Encoder(parts, rt.frame_limit)
        if len(addrs) > route.fanout:
            # Down the casting tree, a frame also carries its subtree's routing.
            replies = len(reply.addr.encode()) if reply is not None else 0
            encoder.check_room(1, route.routing + replies, rt.frame_limit)
        if carried:
            # Mesh tensors among the arguments: the tensor engine hands their shards to these
            # ranks (or refuses, raising) before the message that names them goes out.
            bases = [route.bases[r] for r in ranks]
            _hooks.tensor.load().before_actor_send(carried, self, bases)
        mesh_id = self.mesh_id
        uid = sender.uid
        next_seq = sender.next_seq
        if len(addrs) <= route.fanout:
            targets = [
                (addr, next_seq(addr, mesh_id), rank)
                for addr, rank in zip(addrs, ranks, strict=True)
            ]
            rt.send_actor(targets, mesh_id, uid, encoder)
        else:
            # Numbered per subtree, not per destination (the same route's lists every time).
            groups = sender.seqs.cast(mesh_id, addrs, ranks, route.fanout)
            rt.casts.send(groups, mesh_id, uid, reply, gather, parts)  # one headed here last

    def __reduce__(self) -> tuple[Any, ...]:
        # As a mesh received in a message: a reference that sends, without the owner's supervisor.
        return (
            SendPipeline,
            (
                self.actor_class,
                self.mesh_name,
                self.shape,
                self._procs,
                self.mesh_id,
                self.proc_mesh,
            ),
        )
