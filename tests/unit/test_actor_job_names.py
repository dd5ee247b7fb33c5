"""``regency.actor`` offers Monarch's multi-host entry points without importing the job package
up front."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_multi_host_entry_points_are_reachable_from_regency_actor() -> None:
    script = (
        "import sys\n"
        "import regency.actor as actor\n"
        "assert 'regency.job' not in sys.modules, 'imported the job package eagerly'\n"
        "from regency.actor import attach_to_workers, run_worker_loop_forever\n"
        "import regency.job as job\n"
        "assert attach_to_workers is job.attach_to_workers\n"
        "assert run_worker_loop_forever is job.run_worker_loop_forever\n"
        "try:\n"
        "    actor.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "module 'regency.actor' has no attribute 'no_such_name'" in run.stdout
