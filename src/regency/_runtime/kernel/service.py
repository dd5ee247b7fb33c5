"""A service: requests handled one at a time on a thread of their own, off the I/O thread."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("regency.service")

_STOP: Any = object()


class Service:
    """Runs ``handler(request)`` for each posted request, in order, on a daemon thread."""

    def __init__(self, name: str, handler: Callable[[Any], None]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handler = handler
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, request: Any) -> None:
        """Queue a request (any thread)."""
        self._queue.put(request)

    def stop(self) -> None:
        """Finish queued requests, then end the thread."""
        self._queue.put(_STOP)

    def _run(self) -> None:
        while True:
            request = self._queue.get()
            if request is _STOP:
                return
            try:
                self._handler(request)
            except Exception:
                log.exception("service %s failed to handle a request", self._thread.name)
