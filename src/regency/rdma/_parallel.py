"""Run the streams of one transfer side by side, on a pool that transfers never wait on."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

Job = Callable[[threading.Event], None]
"""One stream of a transfer; it gets an event that is set once any other stream failed."""

_MAX_STREAM_THREADS = 32
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _streams() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                _MAX_STREAM_THREADS, thread_name_prefix="regency-rdma-stream"
            )
        return _executor


def default_streams(limit: int) -> int:
    """How many parallel streams a large transfer uses: one per core, at most ``limit``."""
    return max(1, min(limit, len(os.sched_getaffinity(0))))


def split(nbytes: int, parts: int, chunk: int) -> list[tuple[int, int]]:
    """Cut ``[0, nbytes)`` into at most ``parts`` contiguous ranges of whole chunks."""
    chunks = max(1, -(-nbytes // chunk))
    parts = max(1, min(parts, chunks))
    per, extra = divmod(chunks, parts)
    ranges = []
    start = 0
    for i in range(parts):
        end = min(nbytes, start + (per + (i < extra)) * chunk)
        ranges.append((start, end))
        start = end
    return ranges


def run_all(jobs: Sequence[Job]) -> None:
    """Run every job (the first on this thread), wait for all, re-raise the first failure.

    Each job gets an event that is set once any job has failed, so the others stop early; the
    error raised is the one that happened first, not a later "another stream failed".
    """
    failed = threading.Event()
    first: list[BaseException] = []
    guard = threading.Lock()

    def guarded(job: Job) -> None:
        try:
            job(failed)
        except BaseException as exc:
            with guard:
                if not first:
                    first.append(exc)
            failed.set()

    others = [_streams().submit(guarded, job) for job in jobs[1:]]
    guarded(jobs[0])
    for future in others:
        future.result()
    if first:
        raise first[0]


def _after_fork_in_child() -> None:
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
