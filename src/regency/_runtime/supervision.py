"""Failure reports: an actor that dies tells its mesh's owner."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regency._runtime.instance import ActorInstance

log = logging.getLogger("regency.supervision")


def report_failure(instance: ActorInstance, reason: str) -> None:
    """Record that ``instance`` failed and why (printed on the proc's stderr)."""
    print(
        f"regency: actor {instance} failed: {reason}",
        file=sys.stderr,
        flush=True,
    )
