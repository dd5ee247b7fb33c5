"""Worker side of actors and tensors: shards handed to actor endpoints, results taken back.

A mesh tensor in an actor call travels as a placeholder (:func:`arrival`). Before the call is
sent, the controller queues a ``Publish`` on the tensor's stream, which puts a copy of this
proc's shard (or its poison) in a slot here at that point of the stream; the receiving actor
waits for the slot when the endpoint is about to run, never while its message is unpickled
(that may hold the process's import lock, which the stream's worker needs to decode the very
batch that publishes). ``endpoint.rref`` runs the other way: the endpoint's tensor results are
deposited here and a ``Collect`` on the stream defines them as refs.

Who waits for whom, and why neither wait can hang:

- the actor waits for the stream's ``Publish``: queued and sent before the actor's message, so
  only the stream's earlier work stands before it. If that stream's worker on this proc
  fails or stops, the wait ends with an error (:func:`stream_down`);
- the stream waits in ``Collect`` for the actor's result: the actor deposits it when the
  endpoint returns, and every way the call can fail instead (the endpoint raised, the actor
  had failed or stopped, its arguments did not decode) is an error reply, which the controller
  forwards here to this process's handoff port (:class:`HandoffPort`). ``Publish`` precedes
  ``Collect`` on the stream, so the actor never waits for what waits for it.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from regency._lowlevel import Part, PortRef, carry, runtime
from regency._tensor.errors import RemoteException, remote_text
from regency._tensor.table import TABLE, Poisoned, poison, tensor_leaves

if TYPE_CHECKING:
    from regency._tensor import commands as c

RREF_KEY = "__regency_rref_slot__"
"""The keyword an ``rref`` call's result slot travels under (removed before the endpoint
runs)."""

_cond = threading.Condition()
_slots: dict[int, torch.Tensor | Poisoned] = {}
"""Shards published for actor calls, by slot, until the actor takes them."""
_results: dict[int, list[torch.Tensor] | Poisoned | _Failed] = {}
"""``rref`` results deposited by actors (or their failures), by slot, until collected."""
_discarded: dict[int, str] = {}
"""Slots of calls that will never run, whose shards are not published yet: the stream's
``Publish`` drops them when it comes (a stream that goes down takes its own back)."""
_down: dict[str, str] = {}
"""Streams whose worker on this proc failed or stopped: why."""
_site_texts: dict[int, str] = {}
"""Controller call sites, as the controller described them in ``Publish`` commands."""
_port: list[PortRef] = []


class Arrival:
    """A mesh tensor argument of an actor call, unpickled: ``tensor`` (an empty placeholder of
    the right dtype and device, handed to the endpoint) takes the shard of ``slot`` once the
    stream ``stream`` published it."""

    __slots__ = ("slot", "stream", "tensor")

    def __init__(self, slot: int, stream: str, tensor: torch.Tensor) -> None:
        self.slot = slot
        self.stream = stream
        self.tensor = tensor


class ResultSlot:
    """Where an ``rref`` call's endpoint deposits its tensor results."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __reduce__(self) -> tuple[Any, ...]:
        return (result_slot, (self.slot,))


def arrival(slot: int, stream: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Unpickle a mesh tensor in an actor call: a placeholder that becomes the local shard."""
    placeholder = torch.empty(0, dtype=dtype, device=device)
    if not carry(Arrival(slot, stream, placeholder)):
        raise TypeError("a mesh tensor can only be unpickled as an argument of an actor call")
    return placeholder


def result_slot(slot: int) -> ResultSlot:
    """Unpickle an ``rref`` call's result slot."""
    found = ResultSlot(slot)
    if not carry(found):
        raise TypeError("an rref result slot can only be unpickled in an actor call")
    return found


def bind_arrivals(fn: Callable[..., Any], is_async: bool, carried: Sequence[Any]) -> Any:
    """``fn`` (an endpoint's function) made to wait for its mesh tensor arguments first and,
    for an ``rref`` call, to deposit its tensor results instead of replying with them."""
    arrivals = [x for x in carried if isinstance(x, Arrival)]
    results = [x.slot for x in carried if isinstance(x, ResultSlot)]
    slot = results[0] if results else None

    def finish(result: Any) -> Any:
        if slot is None:
            return result
        deposit(slot, tensor_leaves(result))
        return None

    if is_async:

        async def bound_async(actor: Any, *args: Any, **kwargs: Any) -> Any:
            kwargs.pop(RREF_KEY, None)
            if arrivals:
                # Off the event loop: its other tasks (an earlier rref's endpoint, which the
                # stream may be waiting for) must go on meanwhile.
                await asyncio.to_thread(_settle, arrivals)
            return finish(await fn(actor, *args, **kwargs))

        return bound_async

    def bound(actor: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop(RREF_KEY, None)
        _settle(arrivals)
        return finish(fn(actor, *args, **kwargs))

    return bound


def _settle(arrivals: Sequence[Arrival]) -> None:
    # Every slot is taken even when one cannot be (a poisoned shard): the endpoint will not
    # run, and a shard left in its slot would stay in this proc's memory.
    failure: Exception | None = None
    for found in arrivals:
        try:
            found.tensor.set_(take(found.slot, found.stream))  # type: ignore[call-overload]
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def settle_arrivals(carried: Sequence[Any]) -> None:
    """Put this rank's shard of each mesh tensor an actor's constructor arguments carried
    (``spawn``) in its placeholder, waiting for them; a poisoned one raises."""
    _settle([x for x in carried if isinstance(x, Arrival)])


def discard_arrivals(carried: Sequence[Any]) -> None:
    """Free the shards published (or still to be) for a call that will never run, given what
    its message carried (an actor that had failed or stopped, an endpoint that does not exist,
    arguments that did not decode)."""
    with _cond:
        for found in carried:
            if not isinstance(found, Arrival) or _slots.pop(found.slot, None) is not None:
                continue
            if found.stream not in _down:  # else no Publish will come
                _discarded[found.slot] = found.stream


def take(slot: int, stream: str) -> torch.Tensor:
    """The shard published for ``slot`` by ``stream`` (waiting for it); raises
    ``RemoteException`` for a poisoned one, ``RuntimeError`` if the stream's worker here is
    gone."""
    with _cond:
        while True:
            value = _slots.pop(slot, None)
            if value is not None:
                break
            why = _down.get(stream)
            if why is not None:
                raise RuntimeError(
                    f"the tensor engine's worker of stream {stream!r} on this proc {why}, so "
                    "the mesh tensor passed to this endpoint never arrived"
                )
            _cond.wait()
    if isinstance(value, Poisoned):
        raise remote_exception(value)
    return value


def remote_exception(failure: Poisoned) -> RemoteException:
    """The ``RemoteException`` for ``failure``, with the call site the controller sent."""
    site = _site_texts.get(failure.site, "(no controller call site)")
    return RemoteException(remote_text(failure, site), failure.rank, site)


def publish(cmd: c.Publish, rank: int) -> None:
    """Put a copy of each shard of ``cmd`` (or its poison) in its slot for the actor."""
    _site_texts.update(cmd.sites)
    values: dict[int, torch.Tensor | Poisoned] = {}
    for ref, slot in cmd.pairs:
        value = TABLE.get(ref)
        if value is None:
            value = Poisoned(cmd.site, rank, f"ref {ref} is not defined on this worker")
        elif isinstance(value, torch.Tensor):
            # A copy: the stream goes on (and may write the tensor) while the endpoint runs.
            value = value.detach().clone()
        elif not isinstance(value, Poisoned):
            value = Poisoned(cmd.site, rank, f"ref {ref} names a {type(value).__name__}")
        values[slot] = value
    with _cond:
        for slot, value in values.items():
            if _discarded.pop(slot, None) is None:
                _slots[slot] = value
        _cond.notify_all()


def deposit(slot: int, value: list[torch.Tensor] | Poisoned | _Failed) -> None:
    """An ``rref`` endpoint's tensor results (or its failure) for the stream's ``Collect``."""
    with _cond:
        _results[slot] = value
        _cond.notify_all()


def collect(cmd: c.Collect, rank: int) -> Poisoned | None:
    """Wait for the ``rref`` results of ``cmd.slot`` and define ``cmd.outs`` with them; a
    failure poisons them and is returned (for the controller's error report)."""
    with _cond:
        while cmd.slot not in _results:
            _cond.wait()
        value = _results.pop(cmd.slot)
    if isinstance(value, _Failed):
        value = value.poisoned()
    if cmd.metas is None:  # propagate="inspect": the results are not kept
        return value if isinstance(value, Poisoned) else None
    if not isinstance(value, Poisoned):
        value = _checked(value, cmd, rank)
    if isinstance(value, Poisoned):
        poison(cmd.outs, value)
        return value
    for ref, tensor in zip(cmd.outs, value, strict=True):
        TABLE[ref] = tensor
    return None


def _checked(tensors: list[torch.Tensor], cmd: c.Collect, rank: int) -> Any:
    """``tensors`` if there are as many as ``propagate`` said, else a ``Poisoned`` saying how
    not. Their shapes and dtypes are trusted, as Monarch trusts ``propagate``: the controller's
    metadata is what ``propagate`` said."""
    expected = list(cmd.metas or ())
    if len(tensors) == len(expected):
        return tensors
    got = [(tuple(t.shape), t.dtype) for t in tensors]
    return Poisoned(
        cmd.site,
        rank,
        f"the rref endpoint returned tensors {_listing(got)} but its propagate function "
        f"said {_listing(expected)}",
    )


def _listing(metas: list[tuple[tuple[int, ...], torch.dtype]]) -> str:
    return "[" + ", ".join(f"{dtype}{list(shape)}" for shape, dtype in metas) + "]"


def stream_down(stream: str, why: str) -> None:
    """The worker of ``stream`` here failed or stopped: actors waiting for it give up."""
    with _cond:
        _down[stream] = why
        for slot in [slot for slot, owner in _discarded.items() if owner == stream]:
            del _discarded[slot]
        _cond.notify_all()


class _Failed:
    """An ``rref`` call's error reply, not decoded yet: unpickling a user's exception may import
    the user's modules, which the I/O thread must never wait for."""

    def __init__(self, site: int, rank: int, parts: list[bytes]) -> None:
        self.site, self.rank, self.parts = site, rank, parts

    def poisoned(self) -> Poisoned:
        """The failure, decoded (on the stream's thread)."""
        try:
            text = str(pickle.loads(self.parts[0], buffers=self.parts[1:]))
        except Exception as exc:
            text = f"the endpoint failed (its error could not be read here: {exc!r})"
        return Poisoned(self.site, self.rank, text)


class HandoffPort:
    """This process's port for ``rref`` failures the controller forwards: ``(slot, site, rank)``
    and the error reply's parts as they came, deposited for the stream's ``Collect`` (on the
    I/O thread; nothing blocks, and the error is decoded by the stream, see :class:`_Failed`)."""

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """Deposit one forwarded failure."""
        try:
            slot, site, failed_rank = pickle.loads(parts[0])
        except Exception:
            traceback.print_exc()
            return
        deposit(slot, _Failed(site, failed_rank, [bytes(p) for p in parts[1:]]))

    def peer_lost(self, addr: str, reason: str) -> None:
        """Nothing to do: the port watches no process."""


def handoff_port() -> PortRef | None:
    """Open this process's :class:`HandoffPort` on the first call; ``None`` after that."""
    with _cond:
        if _port:
            return None
        _port.append(runtime().open_port(HandoffPort()))
        return _port[0]
