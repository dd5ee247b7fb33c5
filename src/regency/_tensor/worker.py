"""The tensor-worker actor: one per proc (per stream), executing command batches in order."""

from __future__ import annotations

import functools
import gc
import os
import traceback
from collections.abc import Callable
from typing import Any

import torch

from regency._lowlevel import PortRef
from regency._tensor import commands as c
from regency._tensor import events, handoff, pipe_worker
from regency._tensor.devices import assign_device
from regency._tensor.move_worker import run_move
from regency._tensor.reduce_worker import init_world, run_reduce
from regency._tensor.streams import DEFAULT_NAME
from regency._tensor.table import (
    IDENTITY,
    TABLE,
    Poisoned,
    PoisonedInputError,
    poison,
    resolve,
    tensor_leaves,
)
from regency._tensor.trees import same_kind
from regency.actor import Actor, Port, current_rank, endpoint

_ops: dict[str, Any] = {}
_frozen: list[bool] = []


def resolve_op(name: str) -> Any:
    """``aten::add.Tensor`` -> ``torch.ops.aten.add.Tensor`` (cached)."""
    op = _ops.get(name)
    if op is None:
        namespace, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")
        _ops[name] = op
    return op


def _freeze_startup_objects() -> None:
    """Move the objects alive now (torch's modules, a few million) out of the collector's view,
    once per process: the first full collection over them otherwise stalls the first large
    batch by a few hundred milliseconds (issue 15's fetch-after-1000-ops figure)."""
    if not _frozen:
        _frozen.append(True)
        gc.collect()
        gc.freeze()


class TensorWorker(Actor):
    """Holds this process's shards; runs what the controller sends, never replies per op.

    ``handoffs`` hears this process's handoff port (``handoff.HandoffPort``, opened by the
    process's first worker) as ``(rank, port)``.
    """

    def __init__(
        self,
        envs: dict[int, dict[str, str]],
        errors: Port[Poisoned],
        handoffs: Port[tuple[int, PortRef]],
        stream: str = "",
    ) -> None:
        self._rank = current_rank().rank
        self._stream = stream  # the process-group tag of this stream's reductions
        self._key = stream or DEFAULT_NAME  # the controller's name for this stream
        self._errors = errors
        try:
            os.environ.update(envs[self._rank])
            assign_device(os.environ)
            IDENTITY["rank"] = self._rank
            _freeze_startup_objects()
            port = handoff.handoff_port()
            if port is not None:
                handoffs.send((self._rank, port))
        except BaseException as exc:
            handoff.stream_down(self._key, f"failed to start: {exc!r}")
            raise

    def __cleanup__(self, exc: Exception | None) -> None:
        """Actors waiting for this stream's shards give up (it failed or stopped)."""
        handoff.stream_down(self._key, "stopped" if exc is None else f"failed: {exc}")

    @endpoint
    def execute(self, batch: list[c.Command]) -> None:
        """Run ``batch`` in order; a failing command poisons its outputs and nothing else."""
        try:
            self._execute(batch)
        except BaseException as exc:
            # The actor dies of this (nobody to report to): nothing after it will run.
            handoff.stream_down(self._key, f"failed: {exc!r}")
            raise

    def _execute(self, batch: list[c.Command]) -> None:
        for cmd in batch:
            if isinstance(cmd, c.CallOp):
                self._call(
                    cmd.site, cmd.outs, cmd.mutates, functools.partial(resolve_op, cmd.op), cmd
                )
            elif isinstance(cmd, c.CallFunction):
                self._call(cmd.site, cmd.outs, cmd.mutates, cmd.fn.resolve, cmd)
            elif isinstance(cmd, c.Delete):
                for ref in cmd.refs:
                    TABLE.pop(ref, None)
            elif isinstance(cmd, c.RankTensor):
                TABLE[cmd.out] = torch.tensor(cmd.ranks[self._rank])
            elif isinstance(cmd, c.InitWorld):
                init_world(cmd, self._rank)
            elif isinstance(cmd, c.Alias):
                events.alias(cmd.src, cmd.out)
            elif isinstance(cmd, c.Signal):
                events.signal(cmd.event)
            elif isinstance(cmd, c.Wait):
                events.wait(cmd.event)
            elif isinstance(cmd, c.Move):
                run_move(cmd, self._rank, self._stream)
            elif isinstance(cmd, c.Handover):
                events.handover(cmd.src, cmd.out, cmd.event)
            elif isinstance(cmd, c.Publish):
                handoff.publish(cmd, self._rank)
            elif isinstance(cmd, c.Collect):
                failure = handoff.collect(cmd, self._rank)
                if failure is not None:
                    self._errors.send(failure)
            elif isinstance(cmd, c.PipeRecv):
                failure = pipe_worker.recv(cmd, self._rank)
                if failure is not None:
                    self._errors.send(failure)
            elif isinstance(cmd, c.CreatePipe):
                pipe_worker.create(cmd, self._rank)
            elif isinstance(cmd, c.PipeSend):
                pipe_worker.send(cmd)
            else:
                run_reduce(cmd, self._rank, self._stream)

    def _call(
        self,
        site: int,
        outs: tuple[int, ...],
        mutates: tuple[int, ...],
        lookup: Callable[[], Any],
        cmd: c.CallOp | c.CallFunction,
    ) -> None:
        try:
            args, kwargs = resolve((cmd.args, cmd.kwargs))
        except PoisonedInputError as bad:
            poison(outs + mutates, bad.poison)
            return
        try:
            result = lookup()(*args, **kwargs)
        except Exception:
            failure = Poisoned(site, self._rank, traceback.format_exc())
            self._errors.send(failure)
            poison(outs + mutates, failure)
            return
        for ref, tensor in zip(outs, tensor_leaves(result), strict=False):
            TABLE[ref] = tensor

    @endpoint
    def fetch(self, tree: Any, rank: int) -> tuple[bool, Any]:
        """One proc's part of a fetch of ``rank``'s shard, sent to every proc of the tensors'
        mesh: ``(True, tree with local copies)`` on ``rank``, ``(True, None)`` on the others
        when their shards are fine, and ``(False, Poisoned)`` where a value failed."""
        ok, value = self._local(tree)
        if ok and self._rank != rank:
            return True, None
        return ok, value

    def _local(self, tree: Any) -> tuple[bool, Any]:
        """``(True, tree with local copies)``, or ``(False, Poisoned)`` for a failed value."""
        try:
            value = resolve(tree)
        except PoisonedInputError as bad:
            return False, bad.poison
        except KeyError as gone:
            return False, Poisoned(-1, self._rank, f"ref {gone} is not defined on this worker")
        return True, _copies(value)

    @endpoint
    def probe(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Run a remote function once here and describe its results (for propagation)."""
        from regency._tensor.meta import TensorMeta

        ok, value = self._local((args, kwargs))
        if not ok:
            return ok, value
        try:
            result = fn.resolve()(*value[0], **value[1])
        except Exception:
            return False, Poisoned(-1, self._rank, traceback.format_exc())
        return True, _describe(result, TensorMeta.of)

    @endpoint
    def run(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a remote function here and return its result (``Remote.call``)."""
        ok, value = self._local((args, kwargs))
        if not ok:
            raise ValueError(f"an argument failed to compute:\n{value.text}")
        return _copies(fn.resolve()(*value[0], **value[1]))

    @endpoint
    def open_store(self) -> tuple[str, int]:
        """Start the world's rendezvous store here (world rank 0)."""
        from regency._tensor.collectives import WorldGroups

        store: tuple[str, int] = WorldGroups.open_store()
        return store

    @endpoint
    def ref_count(self) -> int:
        """How many refs this process holds (tests check that deletes arrive)."""
        return len(TABLE)


def _copies(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (tuple, list)):
        return same_kind(obj, [_copies(x) for x in obj])
    if isinstance(obj, dict):
        return {k: _copies(v) for k, v in obj.items()}
    return obj


def _describe(obj: Any, meta: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return meta(obj)
    if isinstance(obj, (tuple, list)):
        return same_kind(obj, [_describe(x, meta) for x in obj])
    if isinstance(obj, dict):
        return {k: _describe(v, meta) for k, v in obj.items()}
    return obj
