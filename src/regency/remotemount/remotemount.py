"""Mount a client directory read-only on every host of a mesh, served from the client in blocks.

Monarch's ``monarch.remotemount.remotemount``::

    from regency.remotemount import remotemount

    handler = remotemount(host_mesh, "/home/me/project", "/mnt/project")
    handler.open()      # every host of host_mesh now has /mnt/project, read-only
    ...                 # procs there can `import` from it; file contents arrive on first read
    handler.refresh()   # after edits: only the changed files' new blocks will travel
    handler.close()     # unmount everywhere

The client walks the directory into an index (`build_index`); the hosts mount that tree at once
and fetch each block of :data:`BLOCK_SIZE` bytes (`materialise_block`) the first time a read
needs it, keeping it on the host. See ``docs/remotemount.md``.
"""

from __future__ import annotations

from typing import Any

from regency.actor import this_host
from regency.remotemount._actors import FUSEActor, MountHandlerClient
from regency.remotemount._fuse import FuseUnavailableError, prepare_mount_point
from regency.remotemount._index import (
    BIG_FILE_THRESHOLD,
    BLOCK_SIZE,
    build_index,
    code_blocks,
    materialise_block,
)

__all__ = [
    "BIG_FILE_THRESHOLD",
    "BLOCK_SIZE",
    "FUSEActor",
    "FuseUnavailableError",
    "MountHandler",
    "MountHandlerClient",
    "build_index",
    "code_blocks",
    "materialise_block",
    "prepare_mount_point",
    "remotemount",
]


class MountHandler:
    """The owner's handle on one mount: `open`, `refresh`, `close` (as Monarch's)."""

    def __init__(self, host_mesh: Any, sourcepath: str, mntpoint: str | None = None) -> None:
        self.sourcepath = sourcepath
        self.mntpoint = mntpoint
        self._host_mesh = host_mesh
        self._procs: Any = None
        self._client: Any = None
        self._start_client()

    def _start_client(self) -> None:
        self._procs = this_host().spawn_procs(name="remotemount_client")
        self._client = self._procs.spawn(
            "MountHandlerClient",
            MountHandlerClient,
            self._host_mesh,
            self.sourcepath,
            self.mntpoint,
        )

    def _live_client(self) -> Any:
        if self._client is None:
            raise RuntimeError(f"the mount of {self.sourcepath} at {self.mntpoint} is closed")
        return self._client

    def open(self, via_gateway: bool = False) -> None:
        """Mount the directory on every host (the tree at once, small files' blocks sent ahead).

        ``via_gateway`` is accepted as in Monarch and changes nothing: blocks travel as actor
        messages, which reach the hosts however the job's channels do. A closed handle opens
        again; one that fails to open is closed.
        """
        if self._client is None:
            self._start_client()
        try:
            self._client.open.call_one(self._client).get()
        except BaseException:
            self.close()  # a mount that failed to open leaves nothing running
            raise

    def close(self) -> None:
        """Unmount on every host and stop the procs that served the mount.

        The client's own proc stops too (Monarch leaves it running); a closed handle opens again.
        """
        if self._client is None:
            return
        try:
            self._client.close.call_one().get()
        finally:
            procs, self._procs, self._client = self._procs, None, None
            procs.stop().get()

    def refresh(self, sourcepath: str | None = None) -> None:
        """Bring a live mount up to date with the source; unchanged files keep their blocks.

        ``sourcepath`` is accepted as in Monarch and unused: the mount's source is fixed.
        """
        self._live_client().refresh.call_one().get()

    def stats(self) -> dict[str, int]:
        """Bytes sent so far (regency's addition): ``index_bytes``, ``block_bytes``, ``blocks``."""
        stats: dict[str, int] = self._live_client().stats.call_one().get()
        return stats


def remotemount(host_mesh: Any, sourcepath: str, mntpoint: str | None = None) -> MountHandler:
    """A handle that mounts ``sourcepath`` at ``mntpoint`` (default: the same path) on every host.

    Nothing happens until `MountHandler.open`. ``$SUBDIR`` in ``mntpoint`` becomes each host's
    mesh point (``hosts_3``), for several hosts on one machine.
    """
    return MountHandler(host_mesh, sourcepath, mntpoint)
