"""``Accumulator``: fold the replies of a ``stream`` into one value."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from regency._runtime.actors.base.future import Future
from regency._runtime.actors.meshes.endpoint import Endpoint
from regency._runtime.kernel.pending import Pending

A = TypeVar("A")
R = TypeVar("R")


class Accumulator(Generic[R, A]):
    """Left-fold ``combine(acc, reply)`` over an endpoint's replies, starting at ``identity``.

    Replies are folded in arrival order; a mesh of no actors gives ``identity``.
    """

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Send to every actor and fold the replies as they come."""
        futures = list(self._endpoint.stream(*args, **kwargs))
        pending = Pending()
        identity, combine = self._identity, self._combine

        def fold(_: Any) -> A:
            acc = identity
            for fut in futures:
                acc = combine(acc, fut.get())
            return acc

        if not futures:
            pending.set_result(None)
            return Future._from_pending(pending, lambda _: identity)
        remaining = [len(futures)]
        lock = threading.Lock()

        def one_done(_: Pending) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                pending.set_result(None)

        for fut in futures:
            fut._pending.add_done_callback(one_done)
        return Future._from_pending(pending, fold)
