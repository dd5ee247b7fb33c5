"""Endpoint adverbs: ``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``, ``send``
and the tensor engine's ``rref``."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from regency import _hooks
from regency._errors import RegencyError
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.base.mesh_trait import EmptySliceError
from regency._runtime.actors.base.ports import Port
from regency._runtime.actors.base.value_mesh import ValueMesh
from regency._runtime.kernel import casting, codec, wire

if TYPE_CHECKING:
    from regency._runtime.actors.base.endpoint_def import ArgumentCheck, EndpointSpec
    from regency._runtime.actors.meshes.send_pipeline import SendPipeline

R = TypeVar("R")
V = TypeVar("V")


class Endpoint(Generic[R]):
    """A method of an actor mesh, reached as ``mesh.method``; pick an adverb to send.

    Each adverb checks its arguments and makes one call to the mesh view's
    :class:`~regency._runtime.actors.meshes.send_pipeline.SendPipeline`, which does the sending.
    """

    __slots__ = ("_checker", "_name", "_pipeline", "_spec")

    def __init__(
        self, pipeline: SendPipeline, name: str, spec: EndpointSpec, checker: ArgumentCheck
    ) -> None:
        self._pipeline = pipeline
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
        handler = self._pipeline.gather(self._name, self._spec.name, args, kwargs)
        shape = self._pipeline.dense_shape

        def build(entries: list[casting.Entry]) -> ValueMesh[R]:
            entries.sort(key=lambda e: e[0])
            for _, flags, parts in entries:
                if flags & wire.FLAG_ERROR:
                    raise codec.loads_reply(parts)
            return ValueMesh._from_raw(shape, [parts for _, _, parts in entries])

        return Future._from_pending(handler.pending, build)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to the single actor of this mesh and return its reply."""
        n = self._pipeline.size
        if n != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {n}")
        return self._one(0, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Send to one actor picked at random and return its reply."""
        return self._one(random.randrange(self._nonempty("choose")), args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every actor; yield one future per rank, completing in arrival order."""
        self._check_arguments(args, kwargs)
        handler = self._pipeline.stream(self._name, self._spec.name, args, kwargs)
        return iter([Future._from_pending(p) for p in handler.pendings])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor without waiting; an exception there kills that actor."""
        self._check_arguments(args, kwargs)
        self._pipeline.post(self._name, self._spec.name, args, kwargs, None)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Tensor engine: run the endpoint on every rank, its mesh tensor arguments arriving as
        that rank's local tensors, and leave its tensor results on the workers.

        Returns at once, without waiting: mesh tensors (on this actor mesh's procs, on the
        active stream) whose shapes come from the endpoint's ``propagate`` callable, usable in
        later ops and fetches; ``None`` for ``propagate="inspect"``. A failure of the endpoint
        poisons them (a fetch raises ``RemoteException``).
        """
        self._check_arguments(args, kwargs)
        self._nonempty("rref")
        return _hooks.tensor.load().actor_rref(self._pipeline, self._name, self._spec, args, kwargs)

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
        reply = port.ref if port is not None else None
        self._pipeline.post(self._name, self._spec.name, args, kwargs, reply, selection)

    # -- checks --------------------------------------------------------------------------------

    def _nonempty(self, adverb: str) -> int:
        """The mesh's size; :class:`EmptySliceError` when it has no actor to send to."""
        shape = self._pipeline.shape
        n = len(shape)
        if n == 0:
            raise EmptySliceError(
                f"{self._name}.{adverb}(): the mesh {shape} has no actor to send to"
            )
        return n

    def _one(self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        self._check_arguments(args, kwargs)
        return Future._from_pending(
            self._pipeline.one(index, self._name, self._spec.name, args, kwargs)
        )

    def _check_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            self._checker.check(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._pipeline.mesh_name}.{self._name}(): {exc}") from None

    def __repr__(self) -> str:
        return f"<Endpoint {self._pipeline.mesh_name}.{self._name}>"


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

    __slots__ = ("_name", "_pipeline")

    def __init__(self, pipeline: SendPipeline, name: str) -> None:
        self._pipeline = pipeline
        self._name = name

    def _error(self) -> NotAnEndpointError:
        cls = self._pipeline.actor_class
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
    from regency._runtime.actors.base.endpoint_def import ArgumentCheck, as_endpoint_spec

    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError("expected an method of a spawned actor")
    pipeline = not_an_endpoint._pipeline
    method = getattr(pipeline.actor_class, not_an_endpoint._name)
    spec = as_endpoint_spec(method, explicit_response_port, propagate)
    checker = ArgumentCheck(inspect.signature(method), 2 if explicit_response_port else 1)
    return Endpoint(pipeline, not_an_endpoint._name, spec, checker)


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
