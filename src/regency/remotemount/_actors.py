"""The actors of a remote mount: `FUSEActor` on every host, `MountHandlerClient` beside the source.

The client actor holds the index and reads blocks from the source on request; each host's
`FUSEActor` serves the mount and asks the client (``read_block``) for a block the first time a
read needs it. Blocks travel as ordinary actor messages, so over regency's authenticated (and,
across hosts, TLS) channels.
"""

from __future__ import annotations

import contextvars
import logging
import os
import pickle
from typing import Any

from regency.actor import Actor, ProcMesh, current_rank, endpoint
from regency.remotemount._blockfs import BlockFileSystem
from regency.remotemount._fuse import FuseThread, binding, prepare_mount_point, unmount
from regency.remotemount._index import (
    BLOCK_SIZE,
    Index,
    build_index,
    code_blocks,
    fill_block,
    index_changes,
)

logger = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 60.0
"""How long a host waits for one block before the read fails with ``EIO``."""


def point_key(point: dict[str, int]) -> str:
    """A mesh point as a directory name: ``{"hosts": 3}`` -> ``hosts_3``; ``{}`` -> ``""``."""
    return "_".join(f"{label}_{coord}" for label, coord in point.items())


def resolve_path(path: str) -> str:
    """``path`` with ``$SUBDIR`` replaced by the calling actor's mesh point (``hosts_0``)."""
    if "$SUBDIR" not in path:
        return path
    return path.replace("$SUBDIR", point_key(dict(current_rank())))


class FUSEActor(Actor):
    """One host's side of a mount: serves the FUSE file system, fetches blocks from ``client``."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._fs: BlockFileSystem | None = None
        self._thread: FuseThread | None = None

    @endpoint
    def mkdir(self, path: str) -> None:
        """Create the mount point (detaching a dead mount left there)."""
        prepare_mount_point(resolve_path(path))

    @endpoint
    def mount(self, mount_point: str, meta: Index) -> None:
        """Mount ``meta``'s tree read-only at ``mount_point``; no block is held yet."""
        if self._thread is not None:
            raise RuntimeError("this FUSEActor already serves a mount")
        mount_point = resolve_path(mount_point)
        if not os.path.isabs(mount_point):
            raise ValueError(f"mount point must be an absolute path, got {mount_point!r}")
        client = self._client
        ctx = contextvars.copy_context()  # the actor's context, for calls from FUSE threads

        def fetch(block: int) -> tuple[bytes, list[str]]:
            data, stale = ctx.copy().run(
                lambda: client.read_block.call_one(block).get(timeout=FETCH_TIMEOUT_S)
            )
            return bytes(data), list(stale)

        self._fs = BlockFileSystem(meta, fetch, binding().FuseOSError)
        self._thread = FuseThread(self._fs, mount_point, "regency-remotemount")
        self._thread.start()

    @endpoint
    def refresh_mount(self, meta: Index) -> None:
        """Serve the new ``meta`` without unmounting; blocks held stay valid."""
        if self._fs is None:
            raise RuntimeError("no mount to refresh")
        self._fs.swap_index(meta)

    @endpoint
    def patch_mount(self, changes: dict[str, Any]) -> None:
        """Like `refresh_mount`, given only the nodes that changed (``None``: removed)."""
        if self._fs is None:
            raise RuntimeError("no mount to refresh")
        self._fs.patch_index(changes)

    @endpoint
    def receive_block(self, block: int, data: bytes, stale: list[str]) -> None:
        """Keep a block sent ahead of any read."""
        if self._fs is None:
            raise RuntimeError("no mount to receive blocks for")
        self._fs.add_block(block, bytes(data), stale)

    @endpoint
    def fetched_bytes(self) -> int:
        """Bytes this host fetched on demand since it mounted."""
        return 0 if self._fs is None else self._fs.fetched_bytes

    @endpoint
    def unmount(self, mount_point: str) -> tuple[str, str]:
        """Unmount: ``("ok" | "not_mounted" | "busy" | "error", detail)``."""
        if self._thread is not None:
            status = self._thread.stop()
            self._thread = None
            if self._fs is not None:
                self._fs.close()
            self._fs = None
            return status
        return unmount(resolve_path(mount_point))

    def __cleanup__(self, exc: BaseException | None) -> None:
        """Unmount when the actor stops (mesh stop); a killed proc is unmounted by fusermount3."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._fs is not None:
            self._fs.close()
            self._fs = None


class MountHandlerClient(Actor):
    """The source side of a mount: the index, and blocks read from ``sourcepath`` on request."""

    def __init__(self, host_mesh: Any, sourcepath: str, mntpoint: str | None = None) -> None:
        self.sourcepath = os.path.abspath(sourcepath)
        self.mntpoint = os.path.abspath(mntpoint) if mntpoint is not None else self.sourcepath
        self.host_mesh = host_mesh
        self.procs: ProcMesh | None = None
        self.fuse_actors: Any = None
        self.index: Index | None = None
        self._buf = bytearray(BLOCK_SIZE)
        self._stats = {"index_bytes": 0, "block_bytes": 0, "blocks": 0}

    @endpoint
    def open(self, self_handle: Any) -> None:
        """Spawn a `FUSEActor` on every host, mount the tree, and send the small files' blocks."""
        if self.fuse_actors is not None:
            raise RuntimeError(f"{self.sourcepath} is already mounted; close() it first")
        if not os.path.isdir(self.sourcepath):
            raise FileNotFoundError(f"remotemount source {self.sourcepath} is not a directory")
        binding()  # a clear error here, before anything is spawned, where FUSE is missing
        self.index = build_index(self.sourcepath, {})
        self.procs = self.host_mesh.spawn_procs(name="remotemount")
        self.fuse_actors = self.procs.spawn("FUSEActor", FUSEActor, self_handle)
        try:
            self.fuse_actors.mkdir.call(self.mntpoint).get()
            self._count_shipped(self.index)
            self.fuse_actors.mount.call(self.mntpoint, self.index).get()
            for block in sorted(code_blocks(self.index)):
                data, stale = self._materialise(block)
                self.fuse_actors.receive_block.call(block, data, stale).get()
                self._count_blocks(len(data), copies=len(self.procs))
        except BaseException:
            self._teardown()
            raise

    @endpoint
    def read_block(self, block: int) -> tuple[bytes, list[str]]:
        """Block ``block`` read from the source now (its used prefix), and its diverged files."""
        data, stale = self._materialise(int(block))
        self._count_blocks(len(data), copies=1)
        return data, stale

    @endpoint
    def refresh(self) -> None:
        """Re-index the source append-only; send every host the nodes that changed, if any."""
        if self.fuse_actors is None or self.index is None:
            raise RuntimeError("no active mount to refresh; call open() first")
        index = build_index(self.sourcepath, self.index)
        if index == self.index:
            return
        changes = index_changes(self.index, index)
        self.index = index
        self._count_shipped(changes)
        self.fuse_actors.patch_mount.call(changes).get()

    @endpoint
    def close(self) -> None:
        """Unmount every host's mount and stop the procs that served them."""
        self._teardown()

    @endpoint
    def stats(self) -> dict[str, int]:
        """Sent so far, every host's copy counted: index bytes, block bytes and blocks."""
        return dict(self._stats)

    def _count_shipped(self, nodes: dict[str, Any]) -> None:
        assert self.procs is not None
        hosts = max(1, len(self.procs))
        self._stats["index_bytes"] += hosts * len(pickle.dumps(nodes, protocol=5))

    def _materialise(self, block: int) -> tuple[bytes, list[str]]:
        assert self.index is not None
        used, stale = fill_block(self.index, block, self._buf)
        if stale:
            logger.warning("remotemount: block %d: source changed under %s", block, stale)
        return bytes(memoryview(self._buf)[:used]), stale

    def _count_blocks(self, size: int, copies: int) -> None:
        self._stats["block_bytes"] += size * copies
        self._stats["blocks"] += copies

    def _teardown(self) -> None:
        if self.fuse_actors is not None:
            try:
                results = self.fuse_actors.unmount.call(self.mntpoint).get()
                for _point, (status, detail) in results:
                    if status not in ("ok", "not_mounted"):
                        logger.warning(
                            "remotemount: unmount %s: %s %s", self.mntpoint, status, detail
                        )
            finally:
                self.fuse_actors = None
        if self.procs is not None:
            self.procs.stop().get()
            self.procs = None
