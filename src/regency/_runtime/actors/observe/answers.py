"""One answer from each of several procs' agents, in rank order, whatever becomes of them.

Diagnostic requests (stacks, actor statistics) must not fail as a whole because one proc is
gone or cannot run Python: :class:`Answers` sends one request per proc and collects the
answers by rank; a proc that is lost gets ``lost(addr, reason)`` in its place, and one still
silent after the timeout gets ``silent``.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from regency._runtime.kernel import state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef

T = TypeVar("T")


class Answers(Generic[T]):
    """Port handler collecting one answer per rank of ``addrs`` (a proc agent's, pickled)."""

    def __init__(self, addrs: Sequence[str], lost: Callable[[str, str], T], silent: T) -> None:
        self.pending = Pending()
        self.port = -1
        self._addrs = list(addrs)
        self._lost = lost
        self._silent = silent
        self._answers: list[T | None] = [None] * len(addrs)
        self._given = [False] * len(addrs)
        self._left = len(addrs)
        self._lock = threading.Lock()

    def ask(self, request: Callable[[PortRef, int], Any], timeout: float) -> Pending:
        """Send ``request(port, rank)`` to every proc's agent; the pending completes with the
        answers in rank order once all are in (or lost, or silent for ``timeout`` seconds)."""
        rt = state.runtime()
        ref = rt.open_port(self, watch=sorted(set(self._addrs)))
        self.port = ref.port
        if not self._addrs:
            self._complete()
        for rank, addr in enumerate(self._addrs):
            with contextlib.suppress(PeerLostError):  # the watch fills in the reason
                rt.send_control(addr, wire.SERVICE_PROC, request(ref, rank))
        rt.loop.call_later(timeout, self._expire)
        return self.pending

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        """One rank's answer (our own pickle, from a proc agent)."""
        self._fill([rank], pickle.loads(parts[0]))

    def peer_lost(self, addr: str, reason: str) -> None:
        """A proc is gone: its ranks get ``lost(addr, reason)``."""
        ranks = [r for r, a in enumerate(self._addrs) if a == addr]
        self._fill(ranks, self._lost(addr, reason))

    def _expire(self) -> None:
        self._fill([r for r, given in enumerate(self._given) if not given], self._silent)

    def _fill(self, ranks: Sequence[int], answer: T) -> None:
        with self._lock:
            before = self._left
            for rank in ranks:
                if 0 <= rank < len(self._answers) and not self._given[rank]:
                    self._given[rank] = True
                    self._answers[rank] = answer
                    self._left -= 1
            finished = before > 0 and self._left == 0  # this call gave the last answer
        if finished:
            self._complete()

    def _complete(self) -> None:
        state.runtime().close_port(self.port, self._addrs)
        self.pending.set_result(list(self._answers))
