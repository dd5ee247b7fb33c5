"""§6: a second controller of a worker is refused at once, saying why, and the first serves on.

A worker serves one controller at a time. ``regency exec`` is a controller: run while the job's
script is attached, it must fail at once (not after the attach timeout) naming the controller
being served, and leave that controller's hosts working.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import Probe

from regency.job import ProcessJob

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def attached(tmp_path: Path) -> Iterator[tuple[ProcessJob, Path]]:
    job = ProcessJob({"hosts": 1})
    cache = tmp_path / "job.pkl"
    job.state(cached_path=cache)  # this process is the attached controller
    try:
        yield job, cache
    finally:
        job.kill()


def test_regency_exec_while_the_script_is_attached_is_refused_at_once(
    attached: tuple[ProcessJob, Path],
) -> None:
    job, cache = attached
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "regency", "exec", "--job", str(cache), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode != 0, done.stdout
    assert "already serves controller" in done.stderr, done.stderr
    assert "a worker serves one controller at a time" in done.stderr, done.stderr
    # At once: the worker answers the attach with the refusal (the attach timeout is 30 s, and
    # most of this is the second interpreter starting).
    assert elapsed < 15, f"refused after {elapsed:.1f} s"
    hosts = job.state(cached_path=cache).hosts
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    try:
        assert procs.spawn("probe", Probe).value.call_one(3).get(timeout=30) == 3
    finally:
        procs.stop().get(timeout=30)
