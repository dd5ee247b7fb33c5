"""The host side of a remote mount: a read-only file system over an index and fetched blocks.

Metadata (``getattr``, ``readdir``, ``readlink``) is answered from the index alone. A ``read``
maps the file's range onto blocks; a block not yet on this host is fetched once (concurrent
readers of the same block wait for that one fetch) and kept for the mount's life in an unlinked
temporary file of the host (``TMPDIR``): the page cache holds what is read often, the kernel may
evict the rest, and the files vanish with the process however it ends.
A fetch that fails (the client is gone, or did not answer in time) fails the read with ``EIO``;
so does a read of a file whose source changed after the index was built.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import IO, Any

from regency.remotemount._index import BLOCK_SIZE, Index, apply_changes

BlockFetch = Callable[[int], tuple[bytes, list[str]]]
"""Fetches block ``n`` from the client: its bytes (the used prefix) and the files that diverged."""


class BlockFileSystem:
    """mfusepy operations serving ``index``; blocks come from ``fetch`` on first read."""

    use_ns = True

    def __init__(self, index: Index, fetch: BlockFetch, os_error: type[OSError]) -> None:
        self.ready = threading.Event()
        self._index = index
        self._fetch = fetch
        self._os_error = os_error  # the binding's FuseOSError: its errno is what the reader sees
        self._blocks: dict[int, IO[bytes]] = {}
        self._stale: set[str] = set()
        self._fetching: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self.fetched_bytes = 0

    # ---- what the owner calls
    def swap_index(self, index: Index) -> None:
        """Serve ``index`` from now on; the blocks held stay valid (offsets are append-only)."""
        with self._lock:
            self._index = index
            self._stale.clear()

    def patch_index(self, changes: dict[str, dict[str, Any] | None]) -> None:
        """Serve the index with ``changes`` (from `index_changes`) applied."""
        self.swap_index(apply_changes(self._index, changes))

    def add_block(self, block: int, data: bytes, stale: Iterable[str]) -> None:
        """Keep ``block`` (sent ahead of any read), marking the files that diverged in it."""
        stored = _store(data)
        with self._lock:
            self._stale.update(stale)
            old = self._blocks.pop(block, None)
            self._blocks[block] = stored
        if old is not None:
            old.close()

    def close(self) -> None:
        """Drop the blocks held (their files go with them)."""
        with self._lock:
            held, self._blocks = self._blocks, {}
        for stored in held.values():
            stored.close()

    def held_blocks(self) -> int:
        """How many blocks this host holds."""
        return len(self._blocks)

    # ---- FUSE operations
    def init(self, path: str) -> None:
        """The kernel accepted the mount."""
        self.ready.set()

    def _node(self, path: str) -> dict[str, Any]:
        node = self._index.get(path)
        if node is None:
            raise self._os_error(errno.ENOENT)
        return node

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        """A node's attributes, read-only, times in nanoseconds."""
        attr = dict(self._node(path)["attr"])
        attr["st_mode"] &= ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        for key in ("st_atime", "st_mtime", "st_ctime"):
            attr[key] = int(attr[key] * 1e9)
        return attr

    def readdir(self, path: str, fh: int) -> list[str]:
        """A directory's entries."""
        node = self._node(path)
        if "children" not in node:
            raise self._os_error(errno.ENOTDIR)
        return [".", "..", *node["children"]]

    def readlink(self, path: str) -> str:
        """A symlink's target."""
        target = self._node(path).get("link_target")
        if target is None:
            raise self._os_error(errno.EINVAL)
        return str(target)

    def open(self, path: str, flags: int) -> int:
        """Open a regular file for reading."""
        if "file_len" not in self._node(path):
            raise self._os_error(errno.EISDIR)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of a file, fetching the blocks it needs."""
        node = self._node(path)
        length = int(node.get("file_len", 0))
        if path in self._stale:
            raise self._os_error(errno.EIO)
        end = min(offset + size, length)
        if offset >= end:
            return b""
        base = int(node["global_offset"])
        parts: list[bytes] = []
        position = base + offset
        while position < base + end:
            block, within = divmod(position, BLOCK_SIZE)
            stored = self._block(block)
            if path in self._stale:
                raise self._os_error(errno.EIO)
            take = min(BLOCK_SIZE - within, base + end - position)
            parts.append(os.pread(stored.fileno(), take, within))
            position += take
        return b"".join(parts)

    def statfs(self, path: str) -> dict[str, int]:
        """Sizes for ``df``: the layout's size in 4 KiB units, nothing free."""
        total = int(self._index["/"].get("total_size", 0))
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": total // 4096 + 1, "f_namemax": 255}

    def _block(self, block: int) -> IO[bytes]:
        stored = self._blocks.get(block)
        if stored is not None:
            return stored
        with self._lock:
            gate = self._fetching.setdefault(block, threading.Lock())
        with gate:
            stored = self._blocks.get(block)
            if stored is not None:
                return stored
            try:
                data, stale = self._fetch(block)
            except Exception as error:
                raise self._os_error(errno.EIO) from error
            stored = _store(data)
            with self._lock:
                self._stale.update(stale)
                self._blocks[block] = stored
                self.fetched_bytes += len(data)
                self._fetching.pop(block, None)
            return stored


def _store(data: bytes) -> IO[bytes]:
    """``data`` in an unlinked temporary file (freed when closed or when the process ends)."""
    stored = tempfile.TemporaryFile(prefix="regency-block-")  # noqa: SIM115 (kept open on purpose)
    stored.write(data)
    stored.flush()
    return stored
