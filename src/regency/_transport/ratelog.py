"""Log lines that an attacker can trigger at will, at a bounded rate."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Logs at most ``burst`` lines per ``period`` seconds; then one line saying how many were
    left out, once the period is over."""

    __slots__ = ("_burst", "_count", "_log", "_period", "_start", "_suppressed")

    def __init__(self, log: logging.Logger, burst: int = 10, period: float = 10.0) -> None:
        self._log = log
        self._burst = burst
        self._period = period
        self._start = 0.0
        self._count = 0
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        """Log ``message % args`` as a warning unless over the rate."""
        now = time.monotonic()
        if now - self._start >= self._period:
            if self._suppressed:
                self._log.warning(
                    "%d similar messages left out in the last %.0f s",
                    self._suppressed,
                    now - self._start,
                )
            self._start, self._count, self._suppressed = now, 0, 0
        if self._count < self._burst:
            self._count += 1
            self._log.warning(message, *args)
        else:
            self._suppressed += 1
