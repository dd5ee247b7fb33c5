"""Worker side of cross-stream ordering: points one stream signals and another waits for.

The tensor workers of one process (one per stream) share these events, as they share the ref
table. An event is made by whichever of the two sides gets to it first, and forgotten once
waited for (each event has exactly one waiter).
"""

from __future__ import annotations

import threading

from regency._tensor.table import IDENTITY, TABLE, Poisoned

_events: dict[int, threading.Event] = {}
_lock = threading.Lock()


def _event(event: int) -> threading.Event:
    with _lock:
        found = _events.get(event)
        if found is None:
            found = _events[event] = threading.Event()
        return found


def alias(src: int, out: int) -> None:
    """``out`` names the value (or poison) of ``src``; a missing ``src`` leaves ``out`` unset."""
    value = TABLE.get(src)
    if value is not None:
        TABLE[out] = value


def handover(src: int, out: int, event: int) -> None:
    """``out`` takes the value (or poison) of ``src``, which is forgotten; then ``event``."""
    value = TABLE.pop(src, None)
    if value is None:
        value = Poisoned(-1, IDENTITY.get("rank", -1), f"ref {src} is not defined on this worker")
    TABLE[out] = value
    signal(event)


def signal(event: int) -> None:
    """This stream reached ``event``."""
    _event(event).set()


def wait(event: int) -> None:
    """Block until another stream signals ``event``."""
    _event(event).wait()
    with _lock:
        _events.pop(event, None)
