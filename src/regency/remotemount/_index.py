"""The index of a mounted tree and the fixed-size blocks its file contents are packed into.

The client walks the source directory once into an *index*: a dict from virtual path (``/``,
``/pkg``, ``/pkg/mod.py``) to a node. Every node has ``attr`` (the ``st_*`` fields of its
``lstat``); a directory has ``children``; a symlink has ``link_target``; a regular file has
``file_len``, ``mtime_ns``, ``full_path`` (where the client reads it) and ``global_offset``:
where its bytes start in one long virtual array cut into blocks of :data:`BLOCK_SIZE` bytes.
``index["/"]["total_size"]`` is that array's length.

Offsets are append-only against the previous index: a file whose size and mtime did not change
keeps its offset, so the blocks a host already holds stay valid after a re-mount; new and changed
files are placed past the previous end, starting on a block boundary (small files first).
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

BLOCK_SIZE: int = 64 * 1024 * 1024
"""Bytes per block: a file's byte at layout offset ``o`` is in block ``o // BLOCK_SIZE``."""

BIG_FILE_THRESHOLD: int = 1024 * 1024
"""Files of at least this size are placed after the small ones and are never sent ahead."""

EXCLUDED_DIRS: frozenset[str] = frozenset({".monarch", ".regency"})
"""Directory names never mounted: the runtime's own job-state directories (Monarch's and ours)."""

_ATTR_KEYS: tuple[str, ...] = (
    "st_atime",
    "st_ctime",
    "st_gid",
    "st_mode",
    "st_mtime",
    "st_nlink",
    "st_size",
    "st_uid",
)

Index = dict[str, dict[str, Any]]


def _attr(st: os.stat_result) -> dict[str, Any]:
    # atime is normalised to mtime: reading the source (to send a block) must not change the
    # index, so that an unchanged tree gives an equal index and a re-mount sends nothing.
    attr = {key: getattr(st, key) for key in _ATTR_KEYS}
    attr["st_atime"] = attr["st_mtime"]
    return attr


def build_index(source_path: str, previous: Index) -> Index:
    """Walk ``source_path`` into an index; files unchanged since ``previous`` keep their offsets.

    Pass ``previous={}`` for a fresh layout. The walk stays on the source's file system (a
    directory on another one, such as a mount point inside the tree, is listed but empty) and
    skips :data:`EXCLUDED_DIRS`. An unchanged tree gives an index equal to ``previous``.
    """
    root = os.path.abspath(source_path)
    root_st = os.stat(root)
    index: Index = {}
    appended: list[str] = []
    pending: list[tuple[str, str, os.stat_result]] = [(root, "/", root_st)]
    while pending:
        directory, vdir, dir_st = pending.pop()
        prefix = vdir.rstrip("/")
        names: list[str] = []
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            vpath = f"{prefix}/{entry.name}"
            if entry.is_symlink():
                index[vpath] = {
                    "attr": _attr(entry.stat(follow_symlinks=False)),
                    "link_target": os.readlink(entry.path),
                }
            elif entry.is_dir():
                if entry.name in EXCLUDED_DIRS:
                    continue
                try:
                    st = entry.stat()
                except OSError as error:
                    logger.warning("remotemount: skipping %s: %s", entry.path, error)
                    continue
                if st.st_dev == root_st.st_dev:
                    pending.append((entry.path, vpath, st))
                else:
                    logger.warning(
                        "remotemount: %s is on another file system; mounted empty", entry.path
                    )
                    index[vpath] = {"attr": _attr(st), "children": []}
            else:
                st = entry.stat(follow_symlinks=False)
                node: dict[str, Any] = {
                    "attr": _attr(st),
                    "file_len": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "full_path": entry.path,
                }
                old = previous.get(vpath)
                if (
                    old is not None
                    and "global_offset" in old
                    and old.get("file_len") == st.st_size
                    and old.get("mtime_ns") == st.st_mtime_ns
                ):
                    node["global_offset"] = old["global_offset"]
                else:
                    appended.append(vpath)
                index[vpath] = node
            names.append(entry.name)
        index[vdir] = {"attr": _attr(dir_st), "children": names}

    end = int(previous.get("/", {}).get("total_size", 0))
    if appended and end % BLOCK_SIZE:
        end += BLOCK_SIZE - end % BLOCK_SIZE
    appended.sort(key=lambda v: index[v]["file_len"] >= BIG_FILE_THRESHOLD)  # stable: small first
    for vpath in appended:
        index[vpath]["global_offset"] = end
        end += index[vpath]["file_len"]
    index["/"]["total_size"] = end
    return index


def index_changes(old: Index, new: Index) -> dict[str, dict[str, Any] | None]:
    """The nodes of ``new`` that differ from ``old``'s, and ``None`` for each path ``new`` lacks.

    What a re-mount sends: `apply_changes` turns ``old`` into ``new`` with it.
    """
    changes: dict[str, dict[str, Any] | None] = {
        path: node for path, node in new.items() if old.get(path) != node
    }
    changes.update({path: None for path in old.keys() - new.keys()})
    return changes


def apply_changes(old: Index, changes: dict[str, dict[str, Any] | None]) -> Index:
    """A new index: ``old`` with `index_changes`' result applied (``old`` is left as it was)."""
    new = dict(old)
    for path, node in changes.items():
        if node is None:
            new.pop(path, None)
        else:
            new[path] = node
    return new


def code_blocks(index: Index) -> set[int]:
    """The blocks holding at least one small file: the ones worth sending before any read."""
    blocks: set[int] = set()
    for node in index.values():
        offset = node.get("global_offset")
        size = node.get("file_len", 0)
        if offset is None or size == 0 or size >= BIG_FILE_THRESHOLD:
            continue
        blocks.update(range(offset // BLOCK_SIZE, (offset + size - 1) // BLOCK_SIZE + 1))
    return blocks


def materialise_block(index: Index, block: int, buf: bytearray) -> tuple[bytes, int, list[str]]:
    """Read block ``block`` of the layout from the source files into ``buf`` (``BLOCK_SIZE`` long).

    Returns ``(data, used, diverged)``: the whole block as ``bytes``; ``used``, the length of
    its prefix up to the last byte any file occupies (what a transport needs to send); and the
    virtual paths of the files whose source no longer matches the index (size or mtime changed,
    gone, short read). Their range is filled with random bytes and the caller must make reads
    of them fail. Raises ``ValueError`` for a block past the layout's end.
    """
    used, diverged = fill_block(index, block, buf)
    return bytes(buf), used, diverged


def fill_block(index: Index, block: int, buf: bytearray) -> tuple[int, list[str]]:
    """`materialise_block` without the copy: fills ``buf``, returns ``(used, diverged)``."""
    total = int(index["/"]["total_size"])
    start = block * BLOCK_SIZE
    if block < 0 or start >= total:
        raise ValueError(
            f"block {block} is past the layout end (offset {start} >= total_size {total})"
        )
    stop = start + BLOCK_SIZE
    view = memoryview(buf)
    used = 0
    diverged: list[str] = []
    for vpath, node in index.items():
        offset = node.get("global_offset")
        if offset is None:
            continue
        lo, hi = max(offset, start), min(offset + node["file_len"], stop)
        if lo >= hi:
            continue
        used = max(used, hi - start)
        target = view[lo - start : hi - start]
        if not _read_fenced(node, lo - offset, target):
            diverged.append(vpath)
            target[:] = os.urandom(hi - lo)
    return used, diverged


def _read_fenced(node: dict[str, Any], position: int, target: memoryview) -> bool:
    """Fill ``target`` from the node's file at ``position`` if the file still matches the node."""
    try:
        st = os.stat(node["full_path"], follow_symlinks=False)
        if st.st_size != node["file_len"] or st.st_mtime_ns != node["mtime_ns"]:
            return False
        with open(node["full_path"], "rb", buffering=0) as source:
            source.seek(position)
            return source.readinto(target) == len(target)
    except OSError:
        return False
