"""Endpoint adverbs: ``call``, ``call_one``, ``choose``, ``stream``, ``broadcast`` and ``send``."""

from __future__ import annotations

import inspect
import pickle
import random
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, Protocol, TypeVar, overload

from regency._errors import RegencyError
from regency._runtime.actors import context
from regency._runtime.actors.errors import (
    SupervisionError,
    failed_text,
    process_failed,
    stopped_text,
)
from regency._runtime.actors.future import Future
from regency._runtime.actors.mesh_trait import EmptySliceError
from regency._runtime.actors.ports import GatherReply, OnceReply, Port, StreamReply, fail_handler
from regency._runtime.actors.supervision import UndeliverableMessageEnvelope, is_stop_reason
from regency._runtime.actors.value_mesh import ValueMesh
from regency._runtime.kernel import casting, codec, state, wire
from regency._runtime.kernel.refs import PortRef
from regency._transport import frames
from regency._transport.transport import PeerUnreachableError

if TYPE_CHECKING:
    from regency._runtime.actors.endpoint_def import ArgumentCheck, EndpointSpec
    from regency._runtime.actors.identity import InstanceBase
    from regency._runtime.actors.mesh_supervisor import MeshSupervisor
    from regency.shape import Shape

R = TypeVar("R")
V = TypeVar("V")


class Route(NamedTuple):
    """A mesh view's destinations: base ranks, proc addresses, and the cast extent."""

    bases: list[int]
    addrs: list[str]
    ranks: list[int]
    unique: list[str]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    fanout: int
    envelopes: dict[str, bytes]  # pickled envelopes of messages without a reply port
    generation: int  # the supervisor's generation it was computed for


class MeshTarget(Protocol):
    """What an endpoint reads of the actor mesh it sends to (``ActorMesh`` implements it)."""

    @property
    def _class(self) -> type:
        """The actors' class."""

    @property
    def _name(self) -> str:
        """The mesh's name."""

    @property
    def _shape(self) -> Shape:
        """The shape of this view."""

    @property
    def _mesh_id(self) -> int:
        """The mesh's id, shared by its views."""

    @property
    def _supervisor(self) -> MeshSupervisor | None:
        """Per-rank health and restarts, on the owner's mesh and its views."""

    def _route(self) -> Route:
        """Where this view's messages go."""


def current_instance() -> InstanceBase:
    """The instance sending from this thread or task (the client outside actors)."""
    ctx = context.current_or_none()
    return ctx.actor_instance if ctx is not None else context.client()


class Endpoint(Generic[R]):
    """A method of an actor mesh, reached as ``mesh.method``; pick an adverb to send."""

    __slots__ = ("_checker", "_mesh", "_name", "_spec")

    def __init__(
        self, mesh: MeshTarget, name: str, spec: EndpointSpec, checker: ArgumentCheck
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._spec = spec
        self._checker = checker

    # -- adverbs -------------------------------------------------------------------------------

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Send to every actor of the mesh; the future holds one reply per rank.

        If any rank raised, the future raises that rank's ``ActorError``.
        """
        self._check_arguments(args, kwargs)
        self._nonempty("call")
        route = self._mesh._route()
        handler = GatherReply(len(route.bases), route.unique, self._describe_loss)
        reply = self._open(handler)
        self._cast(args, kwargs, reply, route.addrs, route.ranks, True, route.unique)
        shape = self._mesh._shape

        def build(entries: list[casting.Entry]) -> ValueMesh[R]:
            entries.sort(key=lambda e: e[0])
            for _, flags, parts in entries:
                if flags & wire.FLAG_ERROR:
                    raise codec.loads(parts)
            return ValueMesh._from_raw(shape, [parts for _, _, parts in entries])

        return Future._from_pending(handler.pending, build)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to the single actor of this mesh and return its reply."""
        n = len(self._mesh._shape)
        if n != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {n}")
        return self._one(0, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to one actor picked at random and return its reply."""
        return self._one(random.randrange(self._nonempty("choose")), args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every actor; yield one future per rank, completing in arrival order."""
        self._check_arguments(args, kwargs)
        route = self._mesh._route()
        handler = StreamReply(len(route.bases), route.unique, self._describe_loss)
        reply = self._open(handler)
        self._cast(args, kwargs, reply, route.addrs, route.ranks, False, route.unique)
        return iter([Future._from_pending(p) for p in handler.pendings])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; an exception there kills that actor."""
        self._check_arguments(args, kwargs)
        route = self._mesh._route()
        self._cast(args, kwargs, None, route.addrs, route.ranks, gather=False)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: Literal["all", "choose"],
    ) -> None:
        self._check_arguments(args, kwargs)
        if selection == "choose":
            self._nonempty("send(choose)")
        route = self._mesh._route()
        addrs, ranks = route.addrs, route.ranks
        if selection == "choose":
            pick = random.randrange(len(addrs))
            addrs, ranks = [addrs[pick]], [pick]
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        self._cast(args, kwargs, port.ref if port is not None else None, addrs, ranks, False)

    # -- mechanics -----------------------------------------------------------------------------

    def _nonempty(self, adverb: str) -> int:
        """The mesh's size; :class:`EmptySliceError` when it has no actor to send to."""
        n = len(self._mesh._shape)
        if n == 0:
            raise EmptySliceError(
                f"{self._name}.{adverb}(): the mesh {self._mesh._shape} has no actor to send to"
            )
        return n

    def _one(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        self._check_arguments(args, kwargs)
        addr = self._mesh._route().addrs[index]
        handler = OnceReply((addr,), self._describe_loss)
        reply = self._open(handler)
        self._cast(args, kwargs, reply, (addr,), (index,), False, (addr,))
        return Future._from_pending(handler.pending)

    def _open(self, handler: Any) -> PortRef:
        # The port watches its destinations only once the message is sent (see _cast): a call
        # refused before sending must fail with the owner's account of the rank, not a watch's.
        ref = state.runtime().open_port(handler)
        handler.port = ref.port
        return ref

    def _describe_loss(self, addr: str, reason: str) -> SupervisionError:
        route = self._mesh._route()
        dead = state.runtime().dead
        # Procs lost together (a lost host) share the reason: name all of their ranks.
        ranks = [i for i, a in enumerate(route.addrs) if a == addr or dead.get(a) == reason]
        supervisor = self._mesh._supervisor
        if supervisor is not None:
            # Name the rank in the whole mesh, not its index in this slice.
            ranks = [supervisor.bases.index(route.bases[i]) for i in ranks]
        name = self._mesh._name
        actor = (
            supervisor.actor_name(ranks[0])
            if supervisor is not None and ranks
            else f"<{self._mesh._class.__qualname__} {name}>"
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
            f"Endpoint call {name}.{self._name}() failed, {what}", f"{name}.{self._name}"
        )

    def _refuse(self, reply: PortRef | None, error: SupervisionError) -> None:
        """Fail a call that cannot be delivered: its future, or the sender if there is none."""
        rt = state.runtime()
        if reply is not None and reply.addr == rt.address:
            handler = rt.port_handler(reply.port)
            if isinstance(handler, (OnceReply, GatherReply, StreamReply)):
                rt.close_port(reply.port)
                fail_handler(handler, error)
                return
        # No future of ours to fail (broadcast, or a user's port): the sender hears of it.
        sender = current_instance()
        undeliverable = getattr(sender, "undeliverable", None)
        if undeliverable is not None:
            envelope = UndeliverableMessageEnvelope(
                str(sender), f"{self._mesh._name}.{self._name}", str(error)
            )
            if undeliverable(envelope):
                return
        raise error

    def _check_health(self, reply: PortRef | None, ranks: Sequence[int]) -> bool:
        """Whether the chosen ranks are healthy as far as the owner knows (else refuse)."""
        supervisor = self._mesh._supervisor
        assert supervisor is not None
        route = self._mesh._route()
        for rank in ranks:
            why = supervisor.bad.get(route.bases[rank])
            if why is not None:
                name = self._mesh._name
                self._refuse(
                    reply,
                    SupervisionError(
                        f"Endpoint call {name}.{self._name}() failed, {why}", f"{name}.{self._name}"
                    ),
                )
                return False
        return True

    def _cast(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: PortRef | None,
        addrs: Sequence[str],
        ranks: Sequence[int],
        gather: bool,
        watch: Sequence[str] = (),
    ) -> None:
        rt = state.runtime()
        supervisor = self._mesh._supervisor
        if supervisor is not None and supervisor.bad and not self._check_health(reply, ranks):
            return
        dead = rt.dead
        if dead:
            for addr in addrs:
                reason = dead.get(addr)
                if reason is not None:
                    self._refuse(reply, self._describe_loss(addr, reason))
                    return
        route = self._mesh._route()
        if reply is None:
            envelope = route.envelopes.get(self._name)
            if envelope is None:
                envelope = route.envelopes[self._name] = pickle.dumps(
                    (self._spec.name, None, route.labels, route.sizes), protocol=5
                )
        else:
            # The reply port travels as a plain tuple: pickling a NamedTuple runs Python code.
            envelope = pickle.dumps(
                (self._spec.name, tuple(reply), route.labels, route.sizes), protocol=5
            )
        parts = [envelope, *codec.dumps_call(args, kwargs)]
        # Refuse oversize messages before taking sequence numbers: a gap would stall the
        # receiver's ordering of every later message from this sender.
        encoder = frames.Encoder(parts, rt.frame_limit)
        sender = current_instance()
        mesh_id = self._mesh._mesh_id
        uid = sender.uid
        next_seq = sender.next_seq
        try:
            if len(addrs) <= route.fanout:
                targets = [
                    (addr, next_seq(addr, mesh_id), rank)
                    for addr, rank in zip(addrs, ranks, strict=True)
                ]
                rt.send_actor(targets, mesh_id, uid, encoder)
            else:
                dests = [
                    casting.Dest(addr, next_seq(addr, mesh_id), rank)
                    for addr, rank in zip(addrs, ranks, strict=True)
                ]
                for group in casting.plan(dests, route.fanout):
                    rt.send_cast(group, mesh_id, uid, reply, gather, parts)
        except PeerUnreachableError as exc:
            self._refuse(
                reply,
                SupervisionError(
                    f"Endpoint call {self._mesh._name}.{self._name}() failed: {exc}",
                    f"{self._mesh._name}.{self._name}",
                ),
            )
            return
        if reply is not None:
            rt.watch(reply.port, watch)

    def _check_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._checker.check(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._mesh._name}.{self._name}(): {exc}") from None

    def __repr__(self) -> str:
        return f"<Endpoint {self._mesh._name}.{self._name}>"


class YieldsToEndpoint(Generic[V]):
    """A read-only mesh attribute that an endpoint of the same name shadows.

    A non-data descriptor: a value in the instance's ``__dict__`` (the endpoint) wins.
    """

    def __init__(self, fget: Callable[[Any], V]) -> None:
        self._fget = fget
        self.__doc__ = fget.__doc__

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> YieldsToEndpoint[V]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> V: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self._fget(obj)


class NotAnEndpointError(RegencyError, RuntimeError, AttributeError):
    """A method of an actor mesh that is not an ``@endpoint`` was called or sent to."""


class NotAnEndpoint:
    """``mesh.method`` for a method not marked ``@endpoint``: calling it (or an adverb on it)
    raises; ``as_endpoint(mesh.method)`` makes an endpoint of it."""

    __slots__ = ("_mesh", "_name")

    def __init__(self, mesh: MeshTarget, name: str) -> None:
        self._mesh = mesh
        self._name = name

    def _error(self) -> NotAnEndpointError:
        cls = self._mesh._class
        return NotAnEndpointError(
            f"Actor {cls}.{self._name} is not annotated as an endpoint. To call it as one, add a "
            "@endpoint decorator to it, or directly wrap it in one "
            "as_endpoint(obj.method).call(...)"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise self._error()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise self._error()


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """Treat a method of a spawned actor mesh that is not an ``@endpoint`` as one:
    ``as_endpoint(mesh.method).call(...)``.

    ``explicit_response_port=True`` passes a ``Port`` first, as for ``@endpoint``. On an actor
    whose endpoints are all ``def`` the method must be a ``def`` too (an ``async def`` fails
    with ``TypeError`` on the actor). Anything but such a method raises ``ValueError``.
    """
    from regency._runtime.actors.endpoint_def import ArgumentCheck, as_endpoint_spec

    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected an method of a spawned actor")
    mesh = not_an_endpoint._mesh
    method = getattr(mesh._class, not_an_endpoint._name)
    spec = as_endpoint_spec(method, explicit_response_port, propagate)
    checker = ArgumentCheck(inspect.signature(method), 2 if explicit_response_port else 1)
    return Endpoint(mesh, not_an_endpoint._name, spec, checker)


def send(
    endpoint: Endpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Cast ``endpoint(*args, **kwargs)``; each reply goes to ``port`` (dropped if ``None``).

    ``selection="choose"`` sends to one random actor instead of all of them.
    """
    endpoint._send(args, kwargs, port, selection)
