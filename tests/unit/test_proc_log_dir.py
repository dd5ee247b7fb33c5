"""Where a host keeps proc logs: private directories per run, the oldest pruned."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from regency._runtime.host import output


def test_runs_are_private_and_the_oldest_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(output, "KEEP_RUNS", 3)
    made = []
    for i in range(5):
        path = output.proc_log_dir(f"run{i}")
        os.utime(path, (1000 + i, 1000 + i))  # oldest first, whatever the clock's resolution
        made.append(path)
    root = output.proc_log_root()
    assert sorted(p.name for p in root.iterdir()) == ["run2", "run3", "run4"]
    for level in (root.parent, root, made[-1]):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    # Asking again for a run that exists prunes nothing.
    output.proc_log_dir("run2")
    assert sorted(p.name for p in root.iterdir()) == ["run2", "run3", "run4"]
