"""The error a job backend raises when it cannot start, find or reach its hosts."""

from __future__ import annotations

from regency._errors import RegencyError


class JobError(RegencyError, RuntimeError):
    """A job backend failed: a scheduler or ssh command failed or printed something unexpected.

    Also raised when workers did not start, or a job was used before it had hosts. It is a
    ``RuntimeError``, as these errors were before it existed, so old handlers still catch it.
    """
