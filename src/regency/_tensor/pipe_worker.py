"""The worker side of pipes: a data source (``fn(pipe, *args, **kwargs)``, a function that
calls ``pipe.send(value)`` or a generator that yields values) running on a thread of each worker
process, whose values the stream takes in order with ``PipeRecv``.

At most ``max_messages`` values wait in each direction, so a source runs ahead of its consumer
by that much and no more. A source that raises, or returns, fails every later ``PipeRecv`` of
its pipe: the outputs are poisoned with the traceback (or with the end), as a failing remote
function's are.
"""

from __future__ import annotations

import queue
import threading
import traceback
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

from regency._errors import RegencyError
from regency._tensor import commands as c
from regency._tensor.table import (
    TABLE,
    Poisoned,
    PoisonedInputError,
    Resident,
    poison,
    resolve,
    tensor_leaves,
)

_POLL_S = 0.2
"""How often a source blocked on a full or empty queue checks whether its pipe was dropped."""


class PipeClosedError(RegencyError, RuntimeError):
    """The pipe was dropped on the controller (raised in the source, which should end)."""


class _End:
    """What the source's thread puts last: why no more values will come."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class PipeEnd:
    """What the source function gets as its first argument: ``send(value)`` (blocks while
    ``max_messages`` values wait), ``recv()`` (a value the controller sent with
    ``pipe.send``), ``ranks`` (this worker's coordinates) and ``sizes`` (the mesh's)."""

    def __init__(self, max_messages: int, ranks: dict[str, int], sizes: dict[str, int]) -> None:
        self.ranks = ranks
        self.sizes = sizes
        self.outbox: queue.Queue[Any] = queue.Queue(max_messages)
        self.inbox: queue.Queue[Any] = queue.Queue(max_messages)
        self.closed = threading.Event()

    def send(self, value: Any) -> None:
        """Hand ``value`` (tensors in any lists, tuples, dicts) to the controller's next
        ``recv()``."""
        self._put(self.outbox, value)

    def recv(self) -> Any:
        """The next value the controller sent with ``pipe.send`` (waiting for it)."""
        while True:
            try:
                return self.inbox.get(timeout=_POLL_S)
            except queue.Empty:
                if self.closed.is_set():
                    raise PipeClosedError("the pipe was dropped on the controller") from None

    def _put(self, box: queue.Queue[Any], value: Any) -> None:
        while True:
            if self.closed.is_set():
                raise PipeClosedError("the pipe was dropped on the controller")
            try:
                box.put(value, timeout=_POLL_S)
                return
            except queue.Full:
                continue


class WorkerPipe(Resident):
    """A pipe in the ref table: its source's thread and the queues between the two. Dropping
    it (its ref deleted) closes the pipe, which ends a source waiting on it."""

    __slots__ = ("end", "failure")

    def __init__(self, cmd: c.CreatePipe, rank: int) -> None:
        self.end = PipeEnd(cmd.max_messages, cmd.coords.get(rank, {}), cmd.sizes)
        self.failure: Poisoned | None = None
        weakref.finalize(self, self.end.closed.set)
        threading.Thread(
            target=_serve,
            args=(self.end, cmd, rank),
            name=f"regency-pipe-{cmd.out}",
            daemon=True,
        ).start()

    def take(self, site: int, rank: int) -> Any:
        """The source's next value (waiting for it); raises ``PoisonedInputError`` once the
        source failed or ended."""
        if self.failure is None:
            got = self.end.outbox.get()
            if not isinstance(got, _End):
                return got
            self.failure = Poisoned(site, rank, got.text)
        raise PoisonedInputError(self.failure)


def _serve(end: PipeEnd, cmd: c.CreatePipe, rank: int) -> None:
    """The source's thread: run it, then say why no more values come."""
    try:
        produced = cmd.fn.resolve()(end, *cmd.args, **cmd.kwargs)
        if produced is not None and hasattr(produced, "__next__"):
            for value in produced:
                end.send(value)
        why = f"the source {cmd.fn.name()} of this pipe ended: it has no more values"
    except PipeClosedError:
        return
    except BaseException:
        why = f"the source {cmd.fn.name()} of this pipe failed on rank {rank}:\n"
        why += traceback.format_exc()
    try:
        end.send(_End(why))
    except PipeClosedError:
        return


def create(cmd: c.CreatePipe, rank: int) -> None:
    """``CreatePipe``: start the source."""
    TABLE[cmd.out] = WorkerPipe(cmd, rank)


def recv(cmd: c.PipeRecv, rank: int) -> Poisoned | None:
    """``PipeRecv``: define ``outs`` from the source's next value; the failure to report when
    it failed (a failure that started elsewhere is only passed on)."""
    pipe = TABLE[cmd.pipe]
    assert isinstance(pipe, WorkerPipe)
    earlier = pipe.failure
    try:
        value = pipe.take(cmd.site, rank)
    except PoisonedInputError as bad:
        poison(cmd.outs, bad.poison)
        return bad.poison if earlier is None else None  # reported once, where it started
    tensors = tensor_leaves(value)
    if len(tensors) != len(cmd.outs):
        failure = Poisoned(
            cmd.site,
            rank,
            f"the pipe's source gave {len(tensors)} tensors where its propagation gave "
            f"{len(cmd.outs)}: {_shape_of(value)}",
        )
        poison(cmd.outs, failure)
        return failure
    for ref, tensor in zip(cmd.outs, tensors, strict=True):
        TABLE[ref] = tensor
    return None


def send(cmd: c.PipeSend) -> None:
    """``PipeSend``: a copy of the value for the source; a failed value fails the pipe."""
    pipe = TABLE[cmd.pipe]
    assert isinstance(pipe, WorkerPipe)
    try:
        value = resolve(cmd.value)
    except PoisonedInputError as bad:
        pipe.failure = pipe.failure or bad.poison
        return
    copied = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), value)
    pipe.end.inbox.put(copied)


def _shape_of(value: Any) -> str:
    return repr(pytree.tree_map_only(torch.Tensor, lambda t: f"Tensor{tuple(t.shape)}", value))
