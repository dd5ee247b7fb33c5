"""The remote mount's index and blocks: exclusions, append-only offsets, the freshness fence."""

from __future__ import annotations

from pathlib import Path

import pytest

from regency.remotemount._index import apply_changes, index_changes
from regency.remotemount.remotemount import (
    BLOCK_SIZE,
    FuseUnavailableError,
    build_index,
    code_blocks,
    materialise_block,
)


def _tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "big.bin").write_bytes(b"x" * (2 * 1024 * 1024))
    (root / ".regency").mkdir()
    (root / ".regency" / "job_state.pkl").write_bytes(b"s")
    (root / ".monarch").mkdir()


def test_runtime_state_dirs_are_not_mounted(tmp_path: Path) -> None:
    _tree(tmp_path)
    index = build_index(str(tmp_path), {})
    assert sorted(index["/"]["children"]) == ["big.bin", "pkg"]
    assert not any(".regency" in path or ".monarch" in path for path in index)
    (tmp_path / ".regency" / "job_state.pkl").write_bytes(b"changed state")
    assert build_index(str(tmp_path), index) == index, "state churn must not change the index"


def test_small_files_first_and_only_their_blocks_sent_ahead(tmp_path: Path) -> None:
    _tree(tmp_path)
    index = build_index(str(tmp_path), {})
    assert index["/pkg/a.py"]["global_offset"] < index["/big.bin"]["global_offset"]
    assert code_blocks(index) == {0}
    only_big = tmp_path / "pkg"
    (only_big / "a.py").unlink()
    (only_big / "w.bin").write_bytes(b"w" * (1024 * 1024))
    assert code_blocks(build_index(str(only_big), {})) == set()


def test_an_edit_appends_block_aligned_and_keeps_other_offsets(tmp_path: Path) -> None:
    _tree(tmp_path)
    old = build_index(str(tmp_path), {})
    (tmp_path / "pkg" / "a.py").write_text("A = 2  # edited\n")
    new = build_index(str(tmp_path), old)
    assert new["/big.bin"]["global_offset"] == old["/big.bin"]["global_offset"]
    assert new["/pkg/a.py"]["global_offset"] == BLOCK_SIZE  # past the old end, on a boundary
    assert new["/"]["total_size"] == BLOCK_SIZE + len("A = 2  # edited\n")
    data, used, stale = materialise_block(new, 1, bytearray(BLOCK_SIZE))
    assert (data[:used], stale) == (b"A = 2  # edited\n", [])


def test_changes_carry_only_what_differs_and_rebuild_the_new_index(tmp_path: Path) -> None:
    _tree(tmp_path)
    old = build_index(str(tmp_path), {})
    (tmp_path / "pkg" / "a.py").unlink()
    (tmp_path / "pkg" / "b.py").write_text("B = 1\n")
    new = build_index(str(tmp_path), old)
    changes = index_changes(old, new)
    assert "/big.bin" not in changes
    assert changes["/pkg/a.py"] is None
    assert set(changes) == {"/", "/pkg", "/pkg/a.py", "/pkg/b.py"}
    assert apply_changes(old, changes) == new


def test_a_file_changed_after_indexing_is_reported_not_served(tmp_path: Path) -> None:
    _tree(tmp_path)
    index = build_index(str(tmp_path), {})
    (tmp_path / "pkg" / "a.py").write_text("A = 3  # longer now\n")
    data, used, stale = materialise_block(index, 0, bytearray(BLOCK_SIZE))
    assert stale == ["/pkg/a.py"]
    offset = index["/big.bin"]["global_offset"]
    assert data[offset : offset + 4] == b"xxxx"  # the unchanged file beside it is served
    assert used == index["/"]["total_size"]


def test_a_block_past_the_end_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path)
    index = build_index(str(tmp_path), {})
    with pytest.raises(ValueError, match="past the layout end"):
        materialise_block(index, 1, bytearray(BLOCK_SIZE))


def test_a_symlink_is_kept_as_a_link_never_followed(tmp_path: Path) -> None:
    (tmp_path / "outside").symlink_to("/etc")
    index = build_index(str(tmp_path), {})
    assert index["/outside"]["link_target"] == "/etc"
    assert "/outside/passwd" not in index


def test_missing_fuse_pieces_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from regency.remotemount import _fuse

    def no_binding(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_fuse.os.path, "exists", lambda path: True)
    monkeypatch.setattr(_fuse.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(_fuse.importlib, "import_module", no_binding)
    with pytest.raises(FuseUnavailableError, match=r"mfusepy .*regency\[remotemount\]"):
        _fuse.binding()
    monkeypatch.setattr(_fuse.shutil, "which", lambda name: None)
    assert "apt-get install fuse3" in str(_fuse.fuse_problem())
    monkeypatch.setattr(_fuse.os.path, "exists", lambda path: False)
    assert "/dev/fuse does not exist" in str(_fuse.fuse_problem())
