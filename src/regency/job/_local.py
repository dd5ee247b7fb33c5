"""``LocalJob``: every mesh is this machine, served by the controller itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from regency._lowlevel import this_host_mesh
from regency.job._trait import JobState, JobTrait


class LocalJob(JobTrait):
    """A job whose every named mesh is ``this_host()``, served by the controller itself.

    It runs a multi-host program on one machine unchanged, with no worker daemons. It never
    reuses a cached job.
    """

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self.hosts = tuple(hosts)

    def can_run(self, spec: JobTrait) -> bool:
        """Always false: a local job is recreated from its spec on every run."""
        return False

    def _spec(self) -> Any:
        return self.hosts

    def _connect(self) -> JobState:
        return JobState({name: this_host_mesh() for name in self.hosts})

    def _create(self) -> None:
        """Nothing to start: the controller serves this machine."""

    def _running(self) -> bool:
        return self.apply_id is not None

    def _worker_addresses(self) -> dict[str, list[str]]:
        return {}

    def _kill(self) -> None:
        self.apply_id = None
