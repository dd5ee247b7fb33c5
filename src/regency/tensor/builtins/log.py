"""Logging on the workers from the controller (Monarch's ``monarch.builtins.log``).

Call these inside ``with procs.activate():``; each runs on every worker of the mesh, in order
with the ops around it. The records go to the workers' logger of this module's name; with no
handler configured there, Python's last-resort handler writes them to the worker's stderr,
which reaches the controller's console as any worker output does (docs/observability.md).
"""

from __future__ import annotations

import logging

from regency._tensor.remote import remote

logger = logging.getLogger(__name__)
"""The workers' logger these functions write to and set the level of."""


@remote(propagate="inspect")
def log_remote(*args: object, level: int = logging.WARNING, **kwargs: object) -> None:
    """``logger.log(level, *args, **kwargs)`` on every worker (``args[0]`` the %-format)."""
    logger.log(level, *args, **kwargs)  # type: ignore[arg-type]  # logging's own checks


@remote(propagate="inspect")
def set_logging_level_remote(level: int) -> None:
    """Set the workers' logger level: `log_remote` calls below it are dropped there."""
    logger.setLevel(level)
