"""``breakpoint()`` in a proc: ``pdb`` on the rank that paused, driven from the controller.

The runtime's hook (``regency._runtime.actors.observe.breakpoints``) calls :func:`pause` with the
caller's frame. The rank then registers a session with the controller's
:class:`~regency.observe.debugger.DebugController` (spawned there on first use) and runs a real
``pdb.Pdb`` whose output goes to the controller in one message per prompt and whose commands
come back through a port of its own: the actor's thread blocks in ``pdb`` as it would at a
terminal, while the proc keeps serving everything else (its I/O and agent run on other threads).

The session ends when ``pdb`` continues with no breakpoint left, quits (the endpoint then raises
``BdbQuit``), or when the endpoint that paused finishes; if that endpoint raises, ``pdb`` first
stops where it raised (post-mortem), as Monarch's debugger does. Frames of regency's runtime and
of asyncio are skipped, so stepping never stops inside the machinery around an endpoint.
"""

from __future__ import annotations

import bdb
import pdb
import socket
import sys
import threading
from types import FrameType
from typing import Any

from regency._lowlevel import (
    Channel,
    current_context,
    get_or_spawn_controller,
    when_endpoint_finishes,
)
from regency.observe.debug_sessions import Location, SessionInfo, SessionKey

CONTROLLER_NAME = "debug_controller"
_SKIP = ["regency.*", "asyncio", "asyncio.*", "concurrent.*", "threading", "contextvars", "bdb"]
_controller: Any = None
_controller_lock = threading.Lock()
_active: dict[int, _RemotePdb] = {}


def debug_controller() -> Any:
    """The job's debugger broker (an actor mesh of one), spawned in the controller on first use."""
    global _controller
    with _controller_lock:
        if _controller is None:
            from regency.observe.debugger import DebugController

            _controller = get_or_spawn_controller(CONTROLLER_NAME, DebugController).get()
        return _controller


def _location(frame: FrameType | None) -> Location:
    if frame is None:
        return Location("<none>", 0)
    module = frame.f_globals.get("__name__", "?")
    return Location(f"{module}.{frame.f_code.co_name}", frame.f_lineno, frame.f_code.co_filename)


class _Output:
    """``pdb``'s stdout: text kept until the next prompt, then sent in one message."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text = "".join(self._parts)
        self._parts.clear()
        return text


class _Input:
    """``pdb``'s stdin: each ``readline`` sends the output so far and waits for a command."""

    def __init__(self, debugger: _RemotePdb) -> None:
        self._debugger = debugger

    def readline(self) -> str:
        return self._debugger.next_command()


class _RemotePdb(pdb.Pdb):
    """A ``pdb.Pdb`` whose terminal is a debugger client on the controller."""

    def __init__(self, key: SessionKey, info: SessionInfo) -> None:
        self._out = _Output()
        super().__init__(
            stdin=_Input(self),  # type: ignore[arg-type]  # pdb needs readline() only
            stdout=self._out,  # type: ignore[arg-type]  # and write()/flush()
            skip=_SKIP,
            nosigint=True,
            readrc=False,
        )
        self.prompt = "(Pdb) "
        self._key = key
        self._port, self._inbox = Channel[tuple[str, str]].open()
        self._controller = debug_controller()
        self._info = info
        self._open = False
        self.reopen()

    def reopen(self, frame: FrameType | None = None) -> None:
        """(Re)register the session with the controller: the rank paused (again)."""
        if not self._open:
            self._open = True
            info = self._info
            if frame is not None:
                info = SessionInfo(
                    info.actor_name, info.rank, info.coords, info.hostname, _location(frame)
                )
            self._controller.session_start.broadcast(info, self._port)

    def next_command(self) -> str:
        """Send what ``pdb`` wrote and wait for the client's next command."""
        frame = getattr(self, "curframe", None)
        self._controller.session_write.broadcast(
            self._key, self._out.take(), _location(frame), True
        )
        kind, line = self._inbox.recv().get()
        if kind == "continue":  # the debugger's `continue`: every rank runs on, no breakpoints
            self.clear_all_breaks()
            return "continue\n"
        return line + "\n"

    def end(self, reason: str) -> None:
        """Leave the session: tell the controller (with what ``pdb`` wrote last)."""
        if self._open:
            self._open = False
            self._controller.session_end.broadcast(self._key, self._out.take(), reason)

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self.end("continued")

    def set_quit(self) -> None:
        super().set_quit()
        self.end("quit")

    def endpoint_finished(self, error: BaseException | None) -> None:
        """The endpoint that paused has finished: stop tracing, post-mortem first if it raised.

        As in Monarch, an endpoint that reached ``breakpoint()`` and then raises pauses once more
        where it raised, even when the session had been continued.
        """
        _active.pop(threading.get_ident(), None)
        self.clear_all_breaks()
        sys.settrace(None)
        if isinstance(error, Exception) and not isinstance(error, bdb.BdbQuit):
            traceback = error.__traceback__
            innermost = traceback
            while innermost is not None and innermost.tb_next is not None:
                innermost = innermost.tb_next
            self.reopen(innermost.tb_frame if innermost is not None else None)
            self.message(f"{type(error).__name__}: {error}  (post-mortem: the endpoint raised)")
            self.reset()
            self.interaction(None, traceback)
        self.end("the endpoint finished")


def _session_info(frame: FrameType) -> SessionInfo:
    ctx = current_context()
    instance = ctx.actor_instance
    name = str(getattr(instance, "name", "") or "<proc>")
    point = getattr(instance, "rank", None) or ctx.message_rank
    coords = {label: point[label] for label in point}
    return SessionInfo(name, point.rank, coords, socket.gethostname(), _location(frame))


def pause(frame: FrameType, *args: Any, **kwargs: Any) -> None:
    """``breakpoint()`` at ``frame`` in a proc: pause here.

    Opens (or reuses) this thread's session with the controller's debugger.
    """
    ident = threading.get_ident()
    debugger = _active.get(ident)
    if debugger is None:
        info = _session_info(frame)
        debugger = _RemotePdb(info.key, info)
        _active[ident] = debugger
        when_endpoint_finishes(debugger.endpoint_finished)
    else:
        debugger.reopen(frame)
    debugger.set_trace(frame)
