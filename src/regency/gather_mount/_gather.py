"""Gather mount: the hosts' directories, read-only, under one local directory of the client.

A `GatherSourceActor` on every host answers ``stat``, ``listdir`` and ``read_bytes`` for its
directory; the client serves a FUSE file system in its own process whose first path component
names the host (``hosts_0``, ``hosts_1``...; none for a 0-dimensional mesh) and whose every
operation is one call to that host's actor. Nothing is cached, so reads see the hosts' files as
they are now. A host that cannot be reached fails the operation with ``EIO``.
"""

from __future__ import annotations

import atexit
import contextvars
import errno
import itertools
import os
import stat
import time
from typing import Any

from regency.actor import Actor, HostMesh, endpoint
from regency.remotemount._actors import point_key, resolve_path
from regency.remotemount._fuse import FuseThread, binding, is_mounted, prepare_mount_point

CALL_TIMEOUT_S = 30.0
"""How long one file-system operation waits for its host before failing with ``EIO``."""

READ_CHUNK = 32 * 1024 * 1024
"""The most bytes one ``read_bytes`` message carries."""


class GatherSourceActor(Actor):
    """One host's directory, answered to the client (paths may not leave it)."""

    def __init__(self, remote_path: str) -> None:
        self._root = os.path.abspath(resolve_path(remote_path))

    def _full(self, rel_path: str) -> str:
        full = os.path.normpath(os.path.join(self._root, rel_path.lstrip("/")))
        if full != self._root and not full.startswith(self._root + os.sep):
            raise PermissionError(f"{rel_path!r} is outside the gathered directory")
        return full

    @endpoint
    def stat(self, rel_path: str) -> tuple[int, int, int] | None:
        """``(st_mode, st_size, st_mtime_ns)`` of a path, or ``None`` when it does not exist."""
        try:
            st = os.stat(self._full(rel_path))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return None
        return st.st_mode, st.st_size, st.st_mtime_ns

    @endpoint
    def listdir(self, rel_path: str) -> list[str]:
        """A directory's entries."""
        return sorted(os.listdir(self._full(rel_path)))

    @endpoint
    def read_bytes(self, rel_path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of a file from ``offset``."""
        with open(self._full(rel_path), "rb") as source:
            source.seek(offset)
            return source.read(min(length, READ_CHUNK))


class _GatherFileSystem:
    """mfusepy operations over the hosts' `GatherSourceActor` s."""

    use_ns = True

    def __init__(self, shards: dict[str, Any], os_error: type[OSError]) -> None:
        import threading

        self.ready = threading.Event()
        self._shards = shards
        self._os_error = os_error
        self._ctx = contextvars.copy_context()
        self._mounted_at = time.time_ns()

    def init(self, path: str) -> None:
        """The kernel accepted the mount."""
        self.ready.set()

    def _route(self, path: str) -> tuple[Any, str] | None:
        """The host's actor and its relative path; ``None`` for the synthetic top directory."""
        if "" in self._shards:
            return self._shards[""], path
        parts = path.strip("/").split("/", 1)
        if parts == [""]:
            return None
        actor = self._shards.get(parts[0])
        if actor is None:
            raise self._os_error(errno.ENOENT)
        return actor, parts[1] if len(parts) > 1 else ""

    def _call(self, endpoint_name: str, actor: Any, *args: Any) -> Any:
        def call() -> Any:
            return getattr(actor, endpoint_name).call_one(*args).get(timeout=CALL_TIMEOUT_S)

        try:
            return self._ctx.copy().run(call)  # one context may not be entered twice at once
        except Exception as error:
            raise self._os_error(errno.EIO) from error

    def _dir_attr(self) -> dict[str, Any]:
        t = self._mounted_at
        return {
            "st_mode": stat.S_IFDIR | 0o555,
            "st_nlink": 2,
            "st_size": 0,
            "st_atime": t,
            "st_mtime": t,
            "st_ctime": t,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
        }

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        """Attributes: the host's file's, read-only."""
        route = self._route(path)
        if route is None or (route[1] == "" and "" not in self._shards):
            return self._dir_attr()
        found = self._call("stat", *route)
        if found is None:
            raise self._os_error(errno.ENOENT)
        mode, size, mtime_ns = found
        return {
            "st_mode": mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH),
            "st_nlink": 1,
            "st_size": size,
            "st_atime": mtime_ns,
            "st_mtime": mtime_ns,
            "st_ctime": mtime_ns,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        """The top directory lists the hosts; below it, the host's directory."""
        route = self._route(path)
        if route is None:
            return [".", "..", *sorted(self._shards)]
        return [".", "..", *self._call("listdir", *route)]

    def open(self, path: str, flags: int) -> int:
        """Open for reading (the mount is read-only)."""
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """Bytes of the host's file, read from the host now."""
        route = self._route(path)
        if route is None:
            raise self._os_error(errno.EISDIR)
        data: bytes = self._call("read_bytes", route[0], route[1], offset, size)
        return data


class GatherMount:
    """A live gather mount; `close` it (or use ``with``) to unmount."""

    def __init__(self, host_mesh: HostMesh, remote_mount_point: str, local_mount_point: str):
        self._local = os.path.abspath(local_mount_point)
        self._mounted = False
        os_error = binding().FuseOSError
        if is_mounted(self._local):
            raise RuntimeError(
                f"gather_mount target {self._local!r} is already mounted; "
                "unmount it before creating a new GatherMount"
            )
        self._procs = host_mesh.spawn_procs(name="gather_mount")
        actors: Any = self._procs.spawn("GatherSourceActor", GatherSourceActor, remote_mount_point)
        extent = self._procs.extent
        shards: dict[str, Any] = {}
        for coords in itertools.product(*(range(n) for n in extent.sizes)):
            point = dict(zip(extent.labels, coords, strict=True))
            shards[point_key(point)] = actors.slice(**point) if point else actors
        try:
            prepare_mount_point(self._local)
            self._fuse = FuseThread(
                _GatherFileSystem(shards, os_error),
                self._local,
                "regency-gather",
                # No kernel caching: every stat and read asks the host, so output is live.
                attr_timeout=0,
                entry_timeout=0,
                negative_timeout=0,
                direct_io=True,
            )
            self._fuse.start()
        except BaseException:
            self._procs.stop().get()
            raise
        self._mounted = True
        atexit.register(self.close)

    def close(self) -> None:
        """Unmount and stop the hosts' source actors (does nothing the second time)."""
        if not self._mounted:
            return
        self._mounted = False
        atexit.unregister(self.close)
        status, detail = self._fuse.stop()
        self._procs.stop().get()
        if status not in ("ok", "not_mounted", "busy"):
            raise OSError(f"unmount of {self._local} failed: {detail}")

    def __enter__(self) -> GatherMount:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def gather_mount(
    host_mesh: HostMesh, remote_mount_point: str, local_mount_point: str
) -> GatherMount:
    """Mount every host's ``remote_mount_point`` read-only under ``local_mount_point``.

    Each host appears as a sub-directory named after its mesh point (``hosts_0``); a
    0-dimensional mesh's files appear directly. ``$SUBDIR`` in ``remote_mount_point`` becomes
    each host's own sub-directory name there. The mount is live on return.
    """
    return GatherMount(host_mesh, remote_mount_point, local_mount_point)
