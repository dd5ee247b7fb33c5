"""The debugger's broker: Monarch's ``DebugController``, an actor in the controller's process.

It is spawned (as the singleton ``debug_controller``) by the first ``breakpoint()`` any proc of
the job reaches, and from then on keeps the open sessions
(:class:`~regency.observe.debug_sessions.Sessions`) and serves ``regency debug`` clients
(:class:`~regency.observe.debug_server.DebugServer`). It says where on the controller's stderr,
once, and in this user's controller file (:mod:`regency.observe.rendezvous`).

A client proves a secret the controller holds: the controller's own (its token is in the
controller file, which only this user can read) or a job secret it attached workers with, so
``regency debug --job PATH`` and ``--secret-file`` work from wherever the job's secret is known.
"""

from __future__ import annotations

import sys
from typing import Any

from regency._lowlevel import Actor, Port, endpoint, runtime
from regency.observe import rendezvous
from regency.observe.debug_server import DebugServer
from regency.observe.debug_sessions import Location, SessionInfo, SessionKey, Sessions
from regency.observe.debug_wire import debug_token


def _tokens() -> list[str]:
    rt = runtime()
    return [debug_token(s) for s in [rt.secret, *rt.transport.job_secrets()]]


class DebugController(Actor):
    """Keeps the ranks paused in ``breakpoint()`` and serves debugger clients for them.

    ``list()`` gives the paused ranks as dicts (``actor_name``, ``rank``, ``coords``,
    ``hostname``, ``function``, ``lineno``, ``waiting``); ``server_address()`` where
    ``regency debug`` connects. The ``session_*`` endpoints are the paused ranks' side.
    """

    def __init__(self) -> None:
        self.sessions = Sessions()
        self.server = DebugServer(self.sessions, _tokens)
        rendezvous.publish(
            "debug", {"address": self.server.address, "token": debug_token(runtime().secret)}
        )
        print(
            f"regency: a proc reached breakpoint(); attach with `regency debug` "
            f"(the debugger listens on {self.server.address})",
            file=sys.stderr,
            flush=True,
        )

    @endpoint
    def session_start(self, info: SessionInfo, port: Port[tuple[str, str]]) -> None:
        """A rank paused in ``breakpoint()``; ``port`` takes its commands."""
        self.sessions.start(info, port)

    @endpoint
    def session_write(self, key: SessionKey, text: str, location: Location, waiting: bool) -> None:
        """A paused rank's ``pdb`` output; ``waiting``: it waits for a command."""
        self.sessions.output(key, text, location, waiting)

    @endpoint
    def session_end(self, key: SessionKey, text: str, reason: str) -> None:
        """A rank left ``pdb``."""
        self.sessions.end(key, text, reason)

    @endpoint
    def list(self) -> list[dict[str, Any]]:
        """The paused ranks."""
        return self.sessions.snapshot()

    @endpoint
    def server_address(self) -> str:
        """``HOST:PORT`` of the debugger server."""
        return self.server.address

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.server.close()
        rendezvous.withdraw("debug")
