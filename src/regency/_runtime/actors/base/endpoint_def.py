"""The ``Actor`` base class and the ``@endpoint`` / ``@concurrent_endpoint`` decorators."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """How an endpoint is called: sync or async, with an explicit response port, concurrently."""

    name: str
    is_async: bool
    explicit_port: bool
    concurrent: bool
    propagate: Any
    instrument: bool


# Suffix of the wire name of a plain method called through ``as_endpoint`` (never a valid
# identifier, so it cannot clash with an endpoint).
AS_ENDPOINT = "@as_endpoint"
AS_ENDPOINT_PORT = "@as_endpoint_port"


def as_endpoint_spec(
    method: Callable[..., Any], explicit_port: bool, propagate: Any
) -> EndpointSpec:
    """The spec a plain method called through ``as_endpoint`` is sent with."""
    name = method.__name__ + (AS_ENDPOINT_PORT if explicit_port else AS_ENDPOINT)
    return EndpointSpec(
        name, inspect.iscoroutinefunction(method), explicit_port, False, propagate, True
    )


def plain_method(
    cls: type, wire_name: str, actor_is_async: bool
) -> tuple[Callable[..., Any], EndpointSpec] | None:
    """The method and spec for a wire name made by :func:`as_endpoint_spec`, else ``None``.

    Raises ``TypeError`` for an ``async def`` method of an actor without an event loop.
    """
    explicit = wire_name.endswith(AS_ENDPOINT_PORT)
    suffix = AS_ENDPOINT_PORT if explicit else AS_ENDPOINT
    if not wire_name.endswith(suffix):
        return None
    name = wire_name[: -len(suffix)]
    fn = getattr(cls, name, None)
    if name.startswith("_") or not callable(fn):
        return None
    spec = as_endpoint_spec(fn, explicit, None)
    if spec.is_async and not actor_is_async:
        raise TypeError(
            f"{cls.__qualname__}.{name} is async, but {cls.__qualname__}'s endpoints are all "
            "def: the actor has no event loop to run it on"
        )
    if actor_is_async and not spec.is_async:
        sync_fn = fn

        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            return sync_fn(self, *args, **kwargs)

        fn = run
    return fn, spec


class ArgumentCheck:
    """Validates call arguments against an endpoint's signature, cheaply in the common case."""

    __slots__ = ("_max_positional", "_min_positional", "_signature", "_skip")

    def __init__(self, signature: inspect.Signature, skip: int) -> None:
        self._signature = signature
        self._skip = skip
        params = list(signature.parameters.values())[skip:]
        positional = [
            p
            for p in params
            if p.kind
            in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        required_kw_only = any(
            p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
            for p in params
        )
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        self._min_positional = (
            -1
            if required_kw_only
            else sum(1 for p in positional if p.default is inspect.Parameter.empty)
        )
        self._max_positional = 1 << 30 if varargs else len(positional)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` if ``args``/``kwargs`` do not fit the signature."""
        if not kwargs and 0 <= self._min_positional <= len(args) <= self._max_positional:
            return
        self._signature.bind(*((None,) * self._skip), *args, **kwargs)


class EndpointProperty(Generic[R]):
    """Descriptor produced by ``@endpoint``; on an actor instance it is the plain method."""

    def __init__(self, method: Callable[..., Any], spec: EndpointSpec) -> None:
        self._method = method
        self.spec = spec
        self.signature = inspect.signature(method)
        self.__doc__ = method.__doc__
        self.__name__ = method.__name__
        self.__wrapped__ = method

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.spec.name:
            object.__setattr__(self, "spec", _respec(self.spec, name))

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> EndpointProperty[R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[..., Any]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self._method.__get__(obj, objtype)

    @property
    def method(self) -> Callable[..., Any]:
        """The undecorated function."""
        return self._method


def _respec(spec: EndpointSpec, name: str) -> EndpointSpec:
    return EndpointSpec(
        name, spec.is_async, spec.explicit_port, spec.concurrent, spec.propagate, spec.instrument
    )


def _make(
    method: Callable[..., Any],
    *,
    propagate: Any,
    explicit_response_port: bool,
    instrument: bool,
    concurrent: bool,
) -> EndpointProperty[Any]:
    if isinstance(method, EndpointProperty):
        if concurrent:  # Monarch's words first, then which method
            raise ValueError(
                "concurrent_endpoint does not wrap @endpoint; pass endpoint options to "
                f"@concurrent_endpoint ({method.__name__} is already an endpoint)"
            )
        raise ValueError(f"{method.__name__} is already an endpoint: @endpoint cannot be stacked")
    is_async = inspect.iscoroutinefunction(method)
    if concurrent and not is_async:
        raise ValueError(
            f"concurrent_endpoint can only wrap async endpoints ({method.__name__} is sync)"
        )
    spec = EndpointSpec(
        method.__name__, is_async, explicit_response_port, concurrent, propagate, instrument
    )
    return EndpointProperty(method, spec)


def _decorate(
    method: Callable[..., Any] | None,
    propagate: Any,
    explicit_response_port: bool,
    instrument: bool,
    *,
    concurrent: bool,
) -> Any:
    """Apply the decorator directly (``@endpoint``) or return it (``@endpoint(...)``)."""

    def wrap(fn: Callable[..., Any]) -> EndpointProperty[Any]:
        return _make(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=concurrent,
        )

    return wrap(method) if method is not None else wrap


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as remotely callable.

    Use bare (``@endpoint``) or with options (``@endpoint(explicit_response_port=True)``). With
    ``explicit_response_port`` the method receives a :class:`Port` right after ``self`` and
    replies through it (later, several times, or from another thread); its return value is
    ignored.
    """

    return _decorate(method, propagate, explicit_response_port, instrument, concurrent=False)


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an ``async`` actor method as an endpoint that runs concurrently with later messages.

    The body runs as an asyncio task and the actor takes its next message at once. Without an
    explicit port the return value (or exception, as ``ActorError``) goes back to the caller; an
    explicit-port body that lets an exception escape kills the actor.
    """

    return _decorate(method, propagate, explicit_response_port, instrument, concurrent=True)


class Actor:
    """Base class of every actor.

    Subclass it, take your constructor arguments in ``__init__`` (they come from
    ``ProcMesh.spawn``) and decorate remotely callable methods with ``@endpoint``::

        class Counter(Actor):
            def __init__(self, start: int) -> None:
                self.value = start

            @endpoint
            def incr(self) -> None:
                self.value += 1

            @endpoint
            def get(self) -> int:
                return self.value

        counters = this_host().spawn_procs(per_host={"gpus": 4}).spawn("c", Counter, 0)
        counters.incr.broadcast()
        print(counters.get.call().get())     # ValueMesh of 1s

    An actor handles one message at a time, in order per sender, on a thread of its own (async
    endpoints on that thread's event loop). Its endpoints are either all sync or all async.
    Optional hooks: ``__supervise__(failure)`` for failures of meshes it owns, and
    ``__cleanup__(exc)`` when it stops.
    """

    def _handle_undeliverable_message(self, message: Any) -> bool:
        """A message this actor sent could not be delivered; return True if handled.

        The default returns False: the actor fails and its owner is told (supervision).
        """
        return False

    @property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class."""
        logger = logging.getLogger(type(self).__qualname__)
        logger.setLevel(logging.DEBUG)
        return logger


def actor_is_async(cls: type) -> bool:
    """Whether ``cls`` runs on an event loop; ``ValueError`` if its endpoints and hooks disagree.

    An actor is async when one of its endpoints is, or when it has none and an async hook. A sync
    actor's hooks must all be sync; an async actor's ``__cleanup__`` must be async, while its
    ``__supervise__`` and ``_handle_undeliverable_message`` may be either (as in Monarch).
    """
    kinds: dict[bool, list[str]] = {True: [], False: []}
    for name, prop in sorted(endpoints_of(cls).items()):
        kinds[prop.spec.is_async].append(name)
    sync, async_ = kinds[False], kinds[True]
    if sync and async_:
        raise ValueError(
            f"{cls} mixes both async and sync endpoints. Synchronous endpoints cannot be mixed "
            f"with async endpoints because they can cause the asyncio loop to deadlock if they "
            f"wait. sync: {sync} async: {async_}"
        )
    hooks = {
        name: inspect.iscoroutinefunction(getattr(cls, name))
        for name in ("__cleanup__", "__supervise__", "_handle_undeliverable_message")
        if getattr(cls, name, None) is not None
    }
    if sync:
        for name, hook_async in hooks.items():
            if hook_async:
                raise ValueError(
                    f"{cls} has sync endpoints, but an async {name}. Make sure {name} is also "
                    f"synchronous. sync: {sync}"
                )
        return False
    if async_ and hooks.get("__cleanup__") is False:
        raise ValueError(
            f"{cls} has async endpoints, but a synchronous __cleanup__. Make sure __cleanup__ "
            f"is also async. async: {async_}"
        )
    return bool(async_) or any(hooks.values())


def endpoints_of(cls: type) -> dict[str, EndpointProperty[Any]]:
    """Every endpoint of an actor class, by name (including inherited ones)."""
    found: dict[str, EndpointProperty[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
    return found
