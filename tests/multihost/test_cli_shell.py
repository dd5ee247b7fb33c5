"""``regency shell`` on a host of a ProcessJob that a controller script cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_exec import _start_job

pytestmark = pytest.mark.timeout(120)


def _shell(cwd: Path, script: bytes, *args: str) -> tuple[int, str, str]:
    """Run ``regency shell ARGS`` with ``script`` as input; stdin stays open until it exits."""
    read_end, write_end = os.pipe()
    with subprocess.Popen(
        [sys.executable, "-m", "regency", "shell", *args],
        cwd=cwd,
        stdin=read_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as child:
        os.close(read_end)
        os.write(write_end, script)
        try:
            out, err = child.communicate(timeout=90)
        finally:
            os.close(write_end)
    return child.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def test_shell_opens_on_the_host_picked_with_its_rank(tmp_path: Path) -> None:
    job = _start_job(tmp_path)
    try:
        script = b'echo "at=$REGENCY_RANK_HOSTS/$REGENCY_SIZE_HOSTS pid=$$"; exit 4\n'
        status, out, err = _shell(tmp_path, script, "--point", "hosts=1", "-e", "SHELL=/bin/sh")
        assert status == 4, err
        assert "at=1/2" in out
        status, out, err = _shell(tmp_path, script, "-e", "SHELL=/bin/sh")
        assert status == 4, err
        assert "at=0/2" in out  # the first host by default
    finally:
        job.kill()


def test_shell_without_a_cached_job_says_so(tmp_path: Path) -> None:
    status, _, err = _shell(tmp_path, b"")
    assert status == 2
    assert "regency shell: no job cached at .regency/job_state.pkl" in err
