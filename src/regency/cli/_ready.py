"""The actor ``regency apply`` spawns on a job's hosts (its own module: the CLI starts fast)."""

from __future__ import annotations

import os

from regency.actor import Actor, endpoint


class ReadyCheck(Actor):
    """Answers once its proc runs: that procs start on the job's hosts."""

    @endpoint
    def ready(self) -> int:
        """The pid of the proc it runs in."""
        return os.getpid()
