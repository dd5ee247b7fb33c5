"""``logging`` inside a proc whose output is forwarded: each record says which actor logged it.

:func:`install_actor_log_handler` gives the proc's root logger (if nothing configured it) a
handler writing to stderr as ``[actor=<qualified name>] LEVEL logger: message``; records logged
outside any actor's message (the proc's own threads) say ``[actor=<proc>]``.
"""

from __future__ import annotations

import logging
import sys

from regency._runtime.actors import context

_FORMAT = "[actor=%(regency_actor)s] %(levelname)s %(name)s: %(message)s"


class _ActorFilter(logging.Filter):
    """Adds ``regency_actor``: the actor handling the current message."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = context.current_or_none()
        record.regency_actor = str(ctx.actor_instance) if ctx is not None else "<proc>"
        return True


def install_actor_log_handler() -> None:
    """Write the root logger's records to stderr with their actor, unless a handler is set."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ActorFilter())
    handler.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(handler)
