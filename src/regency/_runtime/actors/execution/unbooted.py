"""Actors spawned on a proc whose ``bootstrap`` raised: they never run.

As in Monarch, the spawn's ``initialized`` and every call to such an actor raise ``ActorError``
carrying the bootstrap's traceback; the failure is not a supervision event (the controller goes
on, and stopping the mesh works).
"""

from __future__ import annotations

from typing import Any

from regency._runtime.actors.base.errors import ActorError
from regency._runtime.actors.control.control import SpawnActor
from regency._runtime.actors.execution.instance import ActorInstance
from regency._runtime.kernel.proc_runtime import ProcRuntime


class UnbootedInstance(ActorInstance):
    """Stands for an actor of a proc whose bootstrap raised ``bootstrap_error`` (a traceback)."""

    def __init__(self, runtime: ProcRuntime, request: SpawnActor, bootstrap_error: str) -> None:
        super().__init__(runtime, request)
        self._bootstrap_error = bootstrap_error

    def start(self) -> None:
        """Report the spawn as failed and answer every message with the bootstrap's error."""
        self._send_status(f"the bootstrap of its proc raised:\n{self._bootstrap_error}")
        self.runtime.mailbox(self.mesh_id).attach(self._reject)

    def _reject(self, item: Any, release: bool = False) -> None:
        # The mailbox's sink: nothing was published on a proc whose bootstrap failed.
        if not isinstance(item, tuple):  # a stop request (or a wake-up): nothing runs here
            super()._reject(item, release)
            return
        method, reply, point, _, _, _ = self._open(item)
        if reply is None:
            return
        error = ActorError(
            None,
            f"Endpoint call {self.name}.{method}() failed: the bootstrap of its proc raised",
            self._bootstrap_error,
        )
        self._reply_error(reply, point.rank, error)
