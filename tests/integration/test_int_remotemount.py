"""Remote and gather mounts on this host, on real FUSE mounts (skipped where FUSE is missing)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from regency.actor import Actor, context, endpoint, this_host
from regency.gather_mount import gather_mount
from regency.remotemount import remotemount
from regency.remotemount._fuse import fuse_problem, is_mounted

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(fuse_problem() is not None, reason=f"no FUSE here: {fuse_problem()}"),
]


class Importer(Actor):
    """Imports a package from a directory added to its ``sys.path``."""

    @endpoint
    def import_from(self, directory: str, module: str) -> tuple[int, str, int]:
        sys.path.insert(0, directory)
        try:
            imported = __import__(module)
        finally:
            sys.path.remove(directory)
        return imported.VALUE, imported.__file__, os.getpid()


def _tree(root: Path) -> None:
    (root / "clientonly_pkg").mkdir(parents=True)
    (root / "clientonly_pkg" / "__init__.py").write_text("VALUE = 42\n")
    (root / "data.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    (root / "link").symlink_to("clientonly_pkg")
    (root / ".regency").mkdir()
    (root / ".regency" / "job_state.pkl").write_bytes(b"state")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    _tree(root)
    return root


@pytest.fixture
def mounted(source: Path, tmp_path: Path) -> Iterator[tuple[object, Path]]:
    mnt = tmp_path / "mnt"
    handler = remotemount(this_host(), str(source), str(mnt))
    handler.open()
    try:
        yield handler, mnt
    finally:
        handler.close()
    assert not is_mounted(str(mnt)), "close() left the mount behind"


def test_tree_contents_and_metadata_match_the_source(
    mounted: tuple[object, Path], source: Path
) -> None:
    _, mnt = mounted
    assert sorted(os.listdir(mnt)) == ["clientonly_pkg", "data.bin", "link"], "no .regency"
    assert os.readlink(mnt / "link") == "clientonly_pkg"
    assert (mnt / "data.bin").read_bytes() == (source / "data.bin").read_bytes()
    st, src_st = os.stat(mnt / "data.bin"), os.stat(source / "data.bin")
    assert (st.st_size, int(st.st_mtime)) == (src_st.st_size, int(src_st.st_mtime))
    with pytest.raises(OSError, match="Read-only file system"):
        (mnt / "new.txt").write_text("x")


def test_import_from_the_mount_on_every_proc(mounted: tuple[object, Path]) -> None:
    _, mnt = mounted
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        found = procs.spawn("importer", Importer).import_from.call(str(mnt), "clientonly_pkg")
        results = [value for _, value in found.get(timeout=60).items()]
    finally:
        procs.stop().get(timeout=30)
    assert [r[0] for r in results] == [42, 42]
    assert all(r[1] == str(mnt / "clientonly_pkg" / "__init__.py") for r in results)
    assert len({r[2] for r in results}) == 2


def test_refresh_sends_only_the_changed_file(mounted: tuple[object, Path], source: Path) -> None:
    handler, mnt = mounted
    assert (mnt / "data.bin").read_bytes()  # every block this test reads is now on the host
    before = handler.stats()  # type: ignore[attr-defined]
    handler.refresh()  # type: ignore[attr-defined]
    assert handler.stats() == before, "a refresh with no change sends nothing"  # type: ignore[attr-defined]

    (source / "clientonly_pkg" / "__init__.py").write_text("VALUE = 43  # edited\n")
    (source / "clientonly_pkg" / "extra.py").write_text("Y = 1\n")
    handler.refresh()  # type: ignore[attr-defined]
    assert (mnt / "clientonly_pkg" / "__init__.py").read_text() == "VALUE = 43  # edited\n"
    assert (mnt / "clientonly_pkg" / "extra.py").read_text() == "Y = 1\n"
    assert (mnt / "data.bin").read_bytes() == (source / "data.bin").read_bytes()
    after = handler.stats()  # type: ignore[attr-defined]
    sent = after["block_bytes"] - before["block_bytes"]
    # The edited and the new file travel (in one new block-aligned block); the 3 MiB file does not.
    assert sent == len("VALUE = 43  # edited\n") + len("Y = 1\n")
    assert after["blocks"] - before["blocks"] == 1


def test_a_file_changed_without_refresh_reads_eio(source: Path, tmp_path: Path) -> None:
    only_big = tmp_path / "big"
    only_big.mkdir()
    (only_big / "weights.bin").write_bytes(b"a" * (2 * 1024 * 1024))  # not sent ahead
    mnt = tmp_path / "mnt2"
    handler = remotemount(this_host(), str(only_big), str(mnt))
    handler.open()
    try:
        (only_big / "weights.bin").write_bytes(b"b" * (2 * 1024 * 1024 + 1))
        with pytest.raises(OSError) as caught:
            (mnt / "weights.bin").read_bytes()
        assert caught.value.errno == 5  # EIO: never the new or torn bytes under the old size
    finally:
        handler.close()


def test_open_on_a_missing_source_names_it(tmp_path: Path) -> None:
    before = len(context().actor_instance.children)
    handler = remotemount(this_host(), str(tmp_path / "nope"), str(tmp_path / "mnt"))
    with pytest.raises(Exception, match="is not a directory"):
        handler.open()
    assert len(context().actor_instance.children) == before  # nothing left running


def test_gather_mount_reads_the_host_directory_live(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "ckpt").mkdir(parents=True)
    (out / "train.log").write_text("step 1\n")
    (out / "ckpt" / "w.bin").write_bytes(os.urandom(5_000_000))
    local = tmp_path / "gathered"
    with gather_mount(this_host(), str(out), str(local)):
        # this_host() is a 0-dimensional mesh: its files appear directly.
        assert sorted(os.listdir(local)) == ["ckpt", "train.log"]
        assert (local / "ckpt" / "w.bin").read_bytes() == (out / "ckpt" / "w.bin").read_bytes()
        with (out / "train.log").open("a") as log:
            log.write("step 2\n")
        assert (local / "train.log").read_text() == "step 1\nstep 2\n"
        with pytest.raises(OSError, match="Read-only file system"):
            (local / "x").write_text("x")
        with pytest.raises(RuntimeError, match="already mounted"):
            gather_mount(this_host(), str(out), str(local))
    assert not is_mounted(str(local))


def test_close_stops_every_proc_the_mount_started(source: Path, tmp_path: Path) -> None:
    before = len(context().actor_instance.children)
    handler = remotemount(this_host(), str(source), str(tmp_path / "mnt"))
    handler.open()
    handler.close()
    assert len(context().actor_instance.children) == before
    with pytest.raises(RuntimeError, match="is closed"):
        handler.refresh()
    handler.open()  # a closed handle opens again
    try:
        assert (tmp_path / "mnt" / "clientonly_pkg").is_dir()
    finally:
        handler.close()
    assert len(context().actor_instance.children) == before
