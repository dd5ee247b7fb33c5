"""``regency logs``: proc log files, on this machine and on a cached job's hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _worker_helpers import kill_and_check

from regency.job import ProcessJob

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import sys
    from regency.actor import Actor, current_rank, endpoint
    from regency.job import job_load

    class Talker(Actor):
        @endpoint
        def say(self, word: str) -> None:
            print(f"{word} from rank {current_rank().rank}")

    path = sys.argv[1]
    state = job_load(path).state(cached_path=path)
    procs = state.hosts.spawn_procs(per_host={"gpus": 1})
    procs.spawn("talkers", Talker).say.call(sys.argv[2]).get(timeout=60)
    procs.stop().get(timeout=30)
    from regency._lowlevel import runtime
    print("RUN", runtime().job_id)
    """
)


def _regency(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "regency", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_logs_of_a_jobs_hosts_after_its_script_ended(tmp_path: Path) -> None:
    job = ProcessJob({"hosts": 2})
    job.apply()
    path = tmp_path / "job.pkl"
    job.dump(path)
    try:
        script = tmp_path / "talk.py"
        script.write_text(SCRIPT)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        ran = subprocess.run(
            [sys.executable, str(script), str(path), "pineapple"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        # The script's own terminal got the lines, forwarded from the job's hosts...
        assert "pineapple from rank 0" in ran.stdout
        (run,) = [line.split()[1] for line in ran.stdout.splitlines() if line.startswith("RUN ")]
        # ... and each host kept them in its proc's log file (the newest run, by default).
        shown = _regency("logs", "--job", str(path), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        blocks = shown.stdout.split("=== hosts ")[1:]
        assert len(blocks) == 2
        for rank, block in enumerate(blocks):
            assert "==> " in block
            assert f"pineapple from rank {rank}" in block
        # ProcessJob's hosts share this machine's log directory: the run has both hosts' files.
        listed = _regency("logs", "--job", str(path), "--list", cwd=tmp_path)
        assert listed.stdout.count(f"{run}  2 proc logs") == 2
        one = _regency("logs", "--job", str(path), "--run", run, "--tail", "1", cwd=tmp_path)
        assert one.stdout.count("pineapple from rank 1") == 2
    finally:
        kill_and_check(job)


def test_logs_here_without_a_job(tmp_path: Path) -> None:
    listed = _regency("logs", "--list", "--job", str(tmp_path / "none.pkl"), cwd=tmp_path)
    assert listed.returncode == 0
    shown = _regency("logs", "--run", "no-such-run", "--here", cwd=tmp_path)
    assert shown.returncode == 0
    assert "(no run 'no-such-run' here" in shown.stdout
    bad = _regency("logs", "--tail", "0", "--here", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--tail takes a positive number" in bad.stderr
