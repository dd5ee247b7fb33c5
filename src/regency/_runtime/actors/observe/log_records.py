"""``logging`` records say which actor logged them, as in Monarch.

:func:`prefix_records_with_actor` (run once the process's runtime is up: the controller's boot,
a proc's bootstrap) gives every ``logging`` handler a filter that puts ``[actor=<qualified
name>] `` in front of the message of a record logged inside an actor (``[actor=<root>] `` on the
controller's main thread; other threads outside actors get none, as in Monarch): the root
logger's handlers at that moment, and every handler added to any logger afterwards (as Monarch
does, by wrapping ``Logger.addHandler``). Monarch's ``prefix_python_logs_with_actor`` switch
(``regency.actor.config``) is read for each record; empty messages (torch's structured trace
records) are left alone.

:func:`install_actor_log_handler` gives the root logger of a proc whose output is forwarded (if
nothing configured it) a handler writing to stderr as ``[actor=<qualified name>] LEVEL logger:
message``.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from regency._runtime.actors.base import context

_switch: Callable[[], bool] = lambda: True  # noqa: E731


def set_prefix_switch(switch: Callable[[], bool]) -> None:
    """Read whether to prefix from ``switch`` (``regency.actor.config`` registers its flag)."""
    global _switch
    _switch = switch


def _actor_name() -> str | None:
    """The actor whose code is running: the current one, ``<root>`` on the controller's main
    thread, else ``None`` (other threads, as Monarch's context is not set there either)."""
    ctx = context.current_or_none()
    if ctx is not None:
        return str(ctx.actor_instance)
    client = context.current_client()
    if (
        client is not None
        and getattr(client, "is_root", False)
        and threading.current_thread() is threading.main_thread()
    ):
        return str(client)
    return None


class ActorPrefixFilter(logging.Filter):
    """Puts ``[actor=<name>] `` before a record's message (once, however many handlers it
    passes) and keeps it as ``record.actor_prefix``."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Prefix ``record`` when the switch is on and an actor is running; never drop it."""
        if hasattr(record, "actor_prefix") or not record.msg:
            return True
        try:
            if not _switch():
                return True
            name = _actor_name()
            if name is not None:
                prefix = f"[actor={name}] "
                record.actor_prefix = prefix  # Monarch sets this extra attribute too
                record.msg = f"{prefix}{record.msg}"
        except Exception as exc:  # a log call must never fail because of the prefix
            warnings.warn(f"could not add the actor to a log record: {exc}", stacklevel=2)
        return True


_PREFIX = ActorPrefixFilter()


@functools.cache
def prefix_records_with_actor() -> None:
    """Give the root logger's handlers, and every handler added from now on, the prefix."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_PREFIX)
    add_handler = logging.Logger.addHandler

    @functools.wraps(add_handler)
    def adding_the_prefix(self: logging.Logger, hdlr: logging.Handler) -> None:
        add_handler(self, hdlr)
        if _PREFIX not in hdlr.filters:
            hdlr.addFilter(_PREFIX)

    logging.Logger.addHandler = adding_the_prefix  # type: ignore[method-assign]


class _ProcFormatter(logging.Formatter):
    """``[actor=...] LEVEL logger: message``: the prefix first, before the level."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        prefix: Any = getattr(record, "actor_prefix", "")
        message = record.message.removeprefix(prefix)
        return f"{prefix}{record.levelname} {record.name}: {message}"


def install_actor_log_handler() -> None:
    """Write the root logger's records to stderr with their actor, unless a handler is set."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ProcFormatter())
    handler.addFilter(_PREFIX)
    root.addHandler(handler)
