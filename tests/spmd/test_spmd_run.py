"""``regency run``: a plain torchrun script on N procs, rank-prefixed output, exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(180)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def regency_run(*args: str, cwd: Path = SCRIPTS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regency", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def test_runs_a_torchrun_script_with_rank_prefixes() -> None:
    done = regency_run("--nproc-per-node", "2", "allreduce.py")
    assert done.returncode == 0, done.stderr
    out = sorted(done.stdout.splitlines())
    assert out == ["[rank0]: rank 0 of 2: sum 3", "[rank1]: rank 1 of 2: sum 3"]
    assert "[rank0]: local rank 0 on stderr" in done.stderr.splitlines()
    assert "[rank1]: local rank 1 on stderr" in done.stderr.splitlines()


def test_a_failing_rank_sets_the_exit_status() -> None:
    done = regency_run("--nproc-per-node", "2", "allreduce.py", "fail")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "regency run: rank 1 failed with exit status 3" in done.stderr
    assert "[rank0]: rank 0 of 2: sum 3" in done.stdout.splitlines()


def test_module_mode_and_usage_errors(tmp_path: Path) -> None:
    src = tmp_path / "in.json"
    src.write_text('{"b": 1, "a": 2}')
    done = regency_run("--nproc-per-node", "1", "--preload", "", "-m", "json.tool", str(src))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[rank0]: {",
        '[rank0]:     "b": 1,',
        '[rank0]:     "a": 2',
        "[rank0]: }",
    ]
    missing = regency_run("--nproc-per-node", "1", "--preload", "", str(tmp_path / "nope.py"))
    assert missing.returncode == 1
    assert "no script" in missing.stderr
    assert "nope.py" in missing.stderr
    bad = regency_run("--nproc-per-node", "0", "x.py")
    assert bad.returncode == 2
    assert "--nproc-per-node must be at least 1" in bad.stderr


def test_runs_on_the_hosts_of_a_cached_job(tmp_path: Path) -> None:
    """``--job``: one proc on each of a ProcessJob's two worker hosts; their output streams
    back to the launcher; ``GROUP_RANK`` tells the hosts apart."""
    from regency.job import ProcessJob, job_load

    start = "from regency.job import ProcessJob\nProcessJob({'hosts': 2}).state()\n"
    (tmp_path / "start.py").write_text(start)
    subprocess.run([sys.executable, "start.py"], cwd=tmp_path, check=True, timeout=60)
    cache = tmp_path / ".regency" / "job_state.pkl"
    job = job_load(cache)
    assert isinstance(job, ProcessJob)
    try:
        script = tmp_path / "where.py"
        script.write_text(
            "import os\n"
            "print('rank', os.environ['RANK'], 'group', os.environ['GROUP_RANK'], "
            "'of', os.environ['GROUP_WORLD_SIZE'], 'master', os.environ['MASTER_ADDR'])\n"
        )
        done = regency_run(
            "--job", str(cache), "--nproc-per-node", "1", "--preload", "", str(script), cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        lines = sorted(done.stdout.splitlines())
        assert [line.split(" master ")[0] for line in lines] == [
            "[rank0]: rank 0 group 0 of 2",
            "[rank1]: rank 1 group 1 of 2",
        ]
    finally:
        job.kill()
