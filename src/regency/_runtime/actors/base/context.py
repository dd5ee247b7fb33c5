"""Who is running: the current actor instance and the rank of the message it is handling."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from regency._runtime.kernel import state
from regency.shape import Extent, Point

if TYPE_CHECKING:
    from regency._runtime.actors.base.identity import InstanceBase

_EMPTY_POINT = Point(0, Extent([], []))
_client: InstanceBase | None = None


class Context:
    """The context of the code that is running: an actor instance and the message's rank."""

    __slots__ = ("_instance", "_message_rank")

    def __init__(self, instance: InstanceBase, message_rank: Point = _EMPTY_POINT) -> None:
        self._instance = instance
        self._message_rank = message_rank

    @property
    def actor_instance(self) -> InstanceBase:
        """The running actor (the root client, ``<root>``, in the controller's own code)."""
        return self._instance

    @property
    def message_rank(self) -> Point:
        """This actor's position within the mesh slice the current message was cast to."""
        return self._message_rank

    def __repr__(self) -> str:
        return f"Context({self._instance}, message_rank={self._message_rank})"


CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "regency_context", default=None
)


def current_or_none() -> Context | None:
    """The context set for this thread or task, if any."""
    return CURRENT.get()


def set_current(ctx: Context) -> Any:
    """Make ``ctx`` current; returns a token for ``CURRENT.reset``."""
    return CURRENT.set(ctx)


def empty_point() -> Point:
    """A 0-dimensional point (the rank of a direct, non-cast message)."""
    return _EMPTY_POINT


def install_client(instance: InstanceBase) -> None:
    """Make ``instance`` the sender of code that runs outside any actor (before the runtime
    is installed, so that a started runtime always has its client)."""
    global _client
    _client = instance


def current_client() -> InstanceBase | None:
    """The client instance, if the runtime was started (without starting it)."""
    return _client


def clear_client() -> None:
    """Forget the client instance (after shutdown)."""
    global _client
    _client = None


def current_instance() -> InstanceBase:
    """The instance sending from this thread or task: the running actor, or the client in code
    outside any actor."""
    ctx = CURRENT.get()
    if ctx is not None:
        return ctx._instance
    return _client if _client is not None else client()


def client() -> InstanceBase:
    """The instance that sends on behalf of code running outside any actor."""
    state.runtime()
    assert _client is not None
    return _client
