"""A second local user who plants files and directories where regency will look.

Creating the user needs root (CI runs as root); without it the tests that need one skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NAME = "regency-attacker"


@dataclass(frozen=True)
class Attacker:
    """Runs shell commands as another local user."""

    name: str
    uid: int

    def sh(self, script: str, stdin: bytes = b"") -> None:
        """Run ``script`` with ``/bin/sh`` as this user; fail the test if it fails."""
        done = subprocess.run(
            ["/bin/sh", "-c", script],
            input=stdin,
            user=self.name,
            capture_output=True,
            timeout=30,
            check=False,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, f"as {self.name}: {script!r} failed: {done.stderr!r}"


def _ensure_user() -> int:
    try:
        return pwd.getpwnam(NAME).pw_uid
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        pytest.skip("no useradd on this machine: a second local user cannot be created")
    subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/bin/sh", NAME],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return pwd.getpwnam(NAME).pw_uid


@pytest.fixture(scope="session")
def attacker() -> Attacker:
    """Another local user (created with ``useradd`` when this runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create and act as a second local user (CI runs as root)")
    return Attacker(NAME, _ensure_user())


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may write to, sticky as ``/tmp`` is (and removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="regency-shared-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
