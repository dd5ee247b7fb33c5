"""Endpoint adverbs: ``call``, ``call_one``, ``choose``, ``stream``, ``broadcast`` and ``send``."""

from __future__ import annotations

import inspect
import pickle
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from regency import config
from regency._runtime import casting, codec, context, state, wire
from regency._runtime.errors import SupervisionError
from regency._runtime.future import Future
from regency._runtime.ports import GatherReply, OnceReply, Port, StreamReply
from regency._runtime.proc import PortRef
from regency._runtime.value_mesh import ValueMesh
from regency._transport.transport import PeerUnreachableError

if TYPE_CHECKING:
    from regency._runtime.endpoint_def import EndpointSpec
    from regency._runtime.identity import InstanceBase
    from regency._runtime.meshes import ActorMesh

R = TypeVar("R")


def current_instance() -> InstanceBase:
    """The instance sending from this thread or task (the client outside actors)."""
    ctx = context.current_or_none()
    return ctx.actor_instance if ctx is not None else state.client()


class Endpoint(Generic[R]):
    """A method of an actor mesh, reached as ``mesh.method``; pick an adverb to send."""

    __slots__ = ("_mesh", "_name", "_signature", "_spec")

    def __init__(
        self, mesh: ActorMesh[Any], name: str, spec: EndpointSpec, signature: inspect.Signature
    ) -> None:
        self._mesh = mesh
        self._name = name
        self._spec = spec
        self._signature = signature

    # -- adverbs -------------------------------------------------------------------------------

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Send to every actor of the mesh; the future holds one reply per rank.

        If any rank raised, the future raises that rank's ``ActorError``.
        """
        shape = self._mesh._shape
        bases = shape.ranks()
        addrs = [self._mesh._procs[b].addr for b in bases]
        handler = GatherReply(len(bases), _unique(addrs), self._describe_loss)
        reply = self._open(handler)
        handler.port = reply.port
        self._cast(args, kwargs, reply, bases, addrs, gather=True)

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
        return self._one(random.randrange(len(self._mesh._shape)), args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every actor; yield one future per rank, completing in arrival order."""
        bases = self._mesh._shape.ranks()
        addrs = [self._mesh._procs[b].addr for b in bases]
        handler = StreamReply(len(bases), _unique(addrs), self._describe_loss)
        reply = self._open(handler)
        handler.port = reply.port
        self._cast(args, kwargs, reply, bases, addrs, gather=False)
        return iter([Future._from_pending(p) for p in handler.pendings])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; an exception there kills that actor."""
        bases = self._mesh._shape.ranks()
        addrs = [self._mesh._procs[b].addr for b in bases]
        self._cast(args, kwargs, None, bases, addrs, gather=False)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port[Any] | None,
        selection: Literal["all", "choose"],
    ) -> None:
        bases = self._mesh._shape.ranks()
        if selection == "choose":
            pick = random.randrange(len(bases))
            bases, ranks = [bases[pick]], [pick]
        elif selection == "all":
            ranks = list(range(len(bases)))
        else:
            raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
        addrs = [self._mesh._procs[b].addr for b in bases]
        self._cast(args, kwargs, port.ref if port is not None else None, bases, addrs, False, ranks)

    # -- mechanics -----------------------------------------------------------------------------

    def _one(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        base = self._mesh._shape.ranks()[index]
        addr = self._mesh._procs[base].addr
        handler = OnceReply((addr,), self._describe_loss)
        reply = self._open(handler)
        handler.port = reply.port
        self._cast(args, kwargs, reply, [base], [addr], False, [index])
        return Future._from_pending(handler.pending)

    def _open(self, handler: Any) -> PortRef:
        return state.runtime().open_port(handler, watch=handler._watch)

    def _describe_loss(self, addr: str, reason: str) -> SupervisionError:
        ranks = [
            i for i, b in enumerate(self._mesh._shape.ranks()) if self._mesh._procs[b].addr == addr
        ]
        return SupervisionError(
            f"Endpoint call {self._mesh._name}.{self._name}() failed, failure on mesh "
            f"{self._mesh._name} at rank {ranks[0] if ranks else '?'} with event: the process "
            f"{addr} hosting it failed: {reason}",
            f"{self._mesh._name}.{self._name}",
        )

    def _cast(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: PortRef | None,
        bases: Sequence[int],
        addrs: Sequence[str],
        gather: bool,
        ranks: Sequence[int] | None = None,
    ) -> None:
        self._check_arguments(args, kwargs)
        rt = state.runtime()
        shape = self._mesh._shape
        if ranks is None:
            ranks = range(len(bases))
        for addr in addrs:
            reason = rt.dead.get(addr)
            if reason is not None:
                error = self._describe_loss(addr, reason)
                if reply is not None:
                    handler = rt.ports.get(reply.port)
                    if handler is not None:
                        handler.peer_lost(addr, reason)
                    return
                raise error
        ext = shape.extent
        if len(bases) == 1 and ranks is not None and len(ranks) == 1 and len(shape) != 1:
            labels, sizes = tuple(ext.labels), tuple(ext.sizes)
        else:
            labels, sizes = tuple(ext.labels), tuple(ext.sizes)
        envelope = pickle.dumps((self._name, reply, labels, sizes), protocol=5)
        parts = [envelope, *codec.dumps(codec.wrap_arguments(args, kwargs))]
        sender = current_instance()
        mesh_id = self._mesh._mesh_id
        uid = sender.uid
        fanout = int(config.get("cast_fanout"))
        try:
            if len(addrs) <= fanout:
                for addr, rank in zip(addrs, ranks, strict=True):
                    rt.send_actor(addr, mesh_id, uid, sender.next_seq(addr, mesh_id), rank, parts)
                return
            dests = [
                casting.Dest(addr, sender.next_seq(addr, mesh_id), rank)
                for addr, rank in zip(addrs, ranks, strict=True)
            ]
            for group in casting.plan(dests, fanout):
                rt.send_cast(group, mesh_id, uid, reply, gather, parts)
        except PeerUnreachableError as exc:
            if reply is None:
                raise SupervisionError(
                    f"Endpoint call {self._mesh._name}.{self._name}() failed: {exc}",
                    f"{self._mesh._name}.{self._name}",
                ) from exc
            # The port's watch on that process fails the future with the reason.

    def _check_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        params = self._signature
        skip = 2 if self._spec.explicit_port else 1
        try:
            params.bind(*((None,) * skip), *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._mesh._name}.{self._name}(): {exc}") from None

    def __repr__(self) -> str:
        return f"<Endpoint {self._mesh._name}.{self._name}>"


def _unique(addrs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(addrs))


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
