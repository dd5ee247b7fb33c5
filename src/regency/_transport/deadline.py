"""Deadlines of socket exchanges: a ``time.monotonic()`` value, and the error once it passed."""

from __future__ import annotations

import time

from regency._errors import RegencyError


class DeadlineError(RegencyError, TimeoutError):
    """An operation's deadline passed before it finished."""


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value); raise once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineError("deadline passed")
    return left
