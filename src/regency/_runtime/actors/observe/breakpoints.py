"""``breakpoint()`` in a proc: the runtime's side of the debugger into actors.

A proc has no terminal to run ``pdb`` on, so :func:`install` points ``sys.breakpointhook`` at a
hook that hands the caller's frame to the debugger layer (``regency.observe``, found through
:mod:`regency._hooks`, so the runtime names nothing above it). That layer runs ``pdb`` over
messages to the controller, and asks (:func:`when_endpoint_finishes`) to hear when the endpoint
that paused has finished, so that a session never outlives its endpoint. The executors call
:func:`endpoint_finished` before they reply; when no session is open that is one dict check.

``PYTHONBREAKPOINT`` keeps its meaning: ``0`` turns ``breakpoint()`` off, any other value names
the hook Python's own would call.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from regency import _hooks

Finisher = Callable[[BaseException | None], None]
_finishers: dict[int, Finisher] = {}


def install() -> None:
    """Make ``breakpoint()`` in this proc open a debugger session with the controller."""
    sys.breakpointhook = _breakpoint


def _breakpoint(*args: Any, **kwargs: Any) -> Any:
    setting = os.environ.get("PYTHONBREAKPOINT")
    if setting == "0":
        return None
    if setting:
        return sys.__breakpointhook__(*args, **kwargs)
    return _hooks.debugger.load().pause(sys._getframe(1), *args, **kwargs)


def when_endpoint_finishes(callback: Finisher) -> None:
    """Call ``callback(error)`` once the endpoint running on this thread has finished (``error``:
    what it raised, or ``None``), before its reply is sent."""
    _finishers[threading.get_ident()] = callback


def endpoint_finished(error: BaseException | None) -> None:
    """The endpoint running on this thread has finished: tell whoever asked."""
    if _finishers:
        callback = _finishers.pop(threading.get_ident(), None)
        if callback is not None:
            callback(error)
