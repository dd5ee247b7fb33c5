"""``RDMAAction``: several one-sided transfers validated together and run as one unit."""

from __future__ import annotations

from typing import Any

from regency.actor import Future
from regency.rdma import _engine
from regency.rdma._buffer import DEFAULT_TIMEOUT, RDMABuffer


class RDMAAction:
    """A batch of reads and writes submitted together.

    ::

        RDMAAction().read_remote(local_a, buf_a).write_remote(buf_b, local_b).submit().get()

    Every operation is validated when it is added (the same ``ValueError`` / ``TypeError`` as
    :meth:`RDMABuffer.read_into` / :meth:`RDMABuffer.write_from`) and the batch as a whole when it
    is submitted: it may not race with itself, so a local destination may not overlap any other
    local range of the batch, and a remote buffer that is written may not be read or written by
    another operation of the batch. The operations then run in parallel and one ``Future``
    reports the outcome: it fails with the first failure (in the order the operations were
    added) once all of them have ended. An action can be submitted again.
    """

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[_engine.Transfer] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Add a read of all of ``src`` into local memory ``dst``; returns this action."""
        self._ops.append(_engine.prepare(_handle_of(src), dst, write=False))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Add a write of all of local memory ``src`` into ``dst``; returns this action."""
        self._ops.append(_engine.prepare(_handle_of(dst), src, write=True))
        return self

    def submit(self, *, timeout: float = DEFAULT_TIMEOUT) -> Future[None]:
        """Check the batch for internal races, then run every operation; one ``Future``."""
        seconds = _engine.check_timeout(timeout)
        _check_races(self._ops)
        return _engine.submit_all(list(self._ops), seconds)

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"RDMAAction({len(self._ops)} operations)"


def _handle_of(buf: RDMABuffer) -> Any:
    if not isinstance(buf, RDMABuffer):
        raise TypeError(f"expected an RDMABuffer, got {type(buf).__name__}")
    return buf._handle


def _check_races(ops: list[_engine.Transfer]) -> None:
    for i, a in enumerate(ops):
        for b in ops[i + 1 :]:
            if a.write or b.write:
                same = (a.handle.buffer_id, a.handle.token) == (b.handle.buffer_id, b.handle.token)
                if same:
                    raise ValueError(
                        f"RDMAAction races with itself: {a.describe()} and {b.describe()} "
                        "touch the same remote buffer and one of them writes it"
                    )
            if not a.write or not b.write:
                a_lo, b_lo = a.local.address, b.local.address
                overlap = a_lo < b_lo + b.nbytes and b_lo < a_lo + a.nbytes
                if overlap and a.local.device == b.local.device and a.nbytes and b.nbytes:
                    raise ValueError(
                        f"RDMAAction races with itself: the local memory of {a.describe()} "
                        f"overlaps that of {b.describe()}, and one of them is written"
                    )
