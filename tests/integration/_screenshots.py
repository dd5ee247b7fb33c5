"""Where the dashboard and TUI tests keep their screenshots.

Each is written to the test's ``tmp_path``; with ``REGENCY_UPDATE_DOC_IMAGES=1`` it is copied to
``docs/images/`` too, where ``docs/introspection.md`` shows it (a plain test run leaves the work
tree as it was).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def keep(path: Path) -> Path:
    """Copy the screenshot at ``path`` into ``docs/images/`` when asked to; return ``path``."""
    assert path.stat().st_size > 0, f"screenshot {path} is empty"
    if os.environ.get("REGENCY_UPDATE_DOC_IMAGES") == "1":
        DOC_IMAGES.mkdir(exist_ok=True)
        shutil.copyfile(path, DOC_IMAGES / path.name)
    return path
