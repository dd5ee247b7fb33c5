"""Gather mounts: Monarch's ``monarch.gather_mount`` (the hosts' directories, read on the client).

::

    from regency.gather_mount import gather_mount

    with gather_mount(host_mesh, "/tmp/run/logs", "/mnt/logs"):
        print(open("/mnt/logs/hosts_0/train.log").read())
"""

from regency import _public
from regency.gather_mount._gather import GatherMount, gather_mount

__all__ = ["GatherMount", "gather_mount"]

_public.publish(__name__, globals())
