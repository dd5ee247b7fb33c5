"""How an ibverbs transfer is cut into work requests and how many of them are in flight.

A transfer is a list of contiguous chunks, each one RDMA READ or RDMA WRITE work request no
larger than either port's maximum message size. At most ``depth`` requests are outstanding at a
time (the send queue's depth); each completion frees a slot for the next chunk. A request's
``wr_id`` carries the transfer's *epoch* (a per-queue-pair counter) and the chunk's index, so a
completion that belongs to another transfer is recognised instead of being counted.
"""

from __future__ import annotations

CHUNK_BYTES = 1 << 20
"""Largest chunk of one work request (smaller when a port's maximum message size is smaller)."""
STAGING_BYTES = 1 << 20
"""Transfers up to this size go through a queue pair's pre-registered staging region."""
WINDOW = 16
"""Work requests outstanding at once on one queue pair."""
ACCESS_LOCAL_WRITE = 1  # IBV_ACCESS_LOCAL_WRITE
ACCESS_REMOTE_WRITE = 2  # IBV_ACCESS_REMOTE_WRITE
ACCESS_REMOTE_READ = 4  # IBV_ACCESS_REMOTE_READ
_INDEX_BITS = 32
_INDEX_MASK = (1 << _INDEX_BITS) - 1
_EPOCH_MASK = (1 << (64 - _INDEX_BITS)) - 1
_SPIN_POLLS = 256
_FIRST_PAUSE_S = 20e-6
_MAX_PAUSE_S = 1e-3


def chunk_size(local_max_msg: int, remote_max_msg: int, cap: int = CHUNK_BYTES) -> int:
    """The chunk size two ports can both carry, at most ``cap`` (``ValueError`` if none)."""
    size = min(local_max_msg, remote_max_msg, cap)
    if size < 1:
        raise ValueError(
            f"no usable message size (local {local_max_msg}, remote {remote_max_msg} bytes)"
        )
    return size


def chunks(nbytes: int, chunk: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each chunk of ``[0, nbytes)``, in order."""
    if nbytes < 0 or chunk < 1:
        raise ValueError(f"cannot cut {nbytes} bytes into chunks of {chunk}")
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def use_staging(nbytes: int, staging_bytes: int = STAGING_BYTES) -> bool:
    """Whether a transfer is copied through the staging region instead of registering memory.

    Registering memory pins its pages and costs tens of microseconds plus time per page; a copy
    of up to a megabyte is cheaper, and it leaves the caller's memory unregistered.
    """
    return nbytes <= staging_bytes


def access_flags(*, remote: bool, writable: bool) -> int:
    """The ``ibv_access_flags`` a registration (or a queue pair) needs.

    ``remote``: peers reach it with RDMA READ, and RDMA WRITE too if ``writable``. Remote write
    needs local write, and read-only memory cannot be registered for writing at all, so
    read-only memory gets remote read only. Without ``remote`` it is a local buffer: the NIC
    writes into it (an RDMA READ's destination) if ``writable``, else only reads it.
    """
    if not remote:
        return ACCESS_LOCAL_WRITE if writable else 0
    if writable:
        return ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ
    return ACCESS_REMOTE_READ


def make_wr_id(epoch: int, index: int) -> int:
    """The 64-bit ``wr_id`` of chunk ``index`` of the transfer numbered ``epoch``."""
    if not 0 <= index <= _INDEX_MASK:
        raise ValueError(f"chunk index {index} does not fit a work request id")
    if not 0 <= epoch <= _EPOCH_MASK:
        raise ValueError(f"epoch {epoch} does not fit a work request id")
    return (epoch << _INDEX_BITS) | index


def split_wr_id(wr_id: int) -> tuple[int, int]:
    """``(epoch, index)`` of a ``wr_id`` made by :func:`make_wr_id`."""
    return wr_id >> _INDEX_BITS, wr_id & _INDEX_MASK


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch`` (wrapping at the width a ``wr_id`` holds)."""
    return (epoch + 1) & _EPOCH_MASK


def pause_after(empty_polls: int) -> float:
    """Seconds to sleep after ``empty_polls`` polls in a row found nothing.

    Spin (no sleep) first: completions of a busy link arrive within microseconds. Then back off
    exponentially up to a millisecond, so a slow transfer does not burn a core.
    """
    if empty_polls < _SPIN_POLLS:
        return 0.0
    doublings = min(empty_polls - _SPIN_POLLS, 16)
    return min(_FIRST_PAUSE_S * (1 << doublings), _MAX_PAUSE_S)


class Window:
    """Which chunks of a transfer are outstanding, done, or still to be posted."""

    __slots__ = ("_depth", "_done", "_next", "_outstanding", "_total")

    def __init__(self, total: int, depth: int) -> None:
        if total < 0 or depth < 1:
            raise ValueError(f"a window needs total >= 0 and depth >= 1, got {total}, {depth}")
        self._total = total
        self._depth = depth
        self._next = 0
        self._done = 0
        self._outstanding: set[int] = set()

    def take(self) -> range:
        """The chunks to post now (marked outstanding); empty while the window is full."""
        room = min(self._depth - len(self._outstanding), self._total - self._next)
        batch = range(self._next, self._next + max(room, 0))
        self._outstanding.update(batch)
        self._next += len(batch)
        return batch

    def complete(self, index: int) -> None:
        """Record the completion of chunk ``index`` (``ValueError`` unless it is outstanding)."""
        try:
            self._outstanding.remove(index)
        except KeyError:
            raise ValueError(f"completion for chunk {index}, which is not outstanding") from None
        self._done += 1

    @property
    def outstanding(self) -> int:
        """How many posted chunks have not completed."""
        return len(self._outstanding)

    @property
    def done(self) -> bool:
        """Whether every chunk has completed."""
        return self._done == self._total
