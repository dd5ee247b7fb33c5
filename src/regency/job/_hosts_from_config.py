"""``hosts_from_config``: Monarch's getting-started stand-in for a configured host mesh."""

from __future__ import annotations

import atexit

from regency.actor import HostMesh
from regency.job._process import ProcessJob

_HOSTS = 2


def hosts_from_config(name: str) -> HostMesh:
    """The host mesh ``name`` of the project's configuration.

    For now, as in Monarch, two local worker daemons attached as a ``{"hosts": 2}`` mesh.
    Unlike Monarch's, whose worker processes outlive the controller, the workers are killed
    when the controller exits.
    """
    job = ProcessJob({name: _HOSTS})
    hosts = getattr(job.state(cached_path=None), name)
    atexit.register(job.kill)
    return hosts  # type: ignore[no-any-return]
