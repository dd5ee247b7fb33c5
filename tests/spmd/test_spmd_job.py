"""``serve`` / ``SPMDJob.run_spmd``: a torchrun command run on real procs of regency's jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from regency.actor import ActorError
from regency.job import ProcessJob, job_load
from regency.job._process import _alive
from regency.job.spmd import SPMDJob, serve

pytestmark = pytest.mark.timeout(300)

# Each rank records its torchrun environment and arguments in OUT/rank<RANK>.json.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"]
    out, *rest = sys.argv[1:]
    record = {k: os.environ[k] for k in keys} | {"argv": rest}
    if rest == ["fail"] and os.environ["RANK"] == "1":
        sys.exit(3)
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(record, f)
    """
)


def _records(out: Path) -> dict[int, dict[str, object]]:
    return {
        int(path.stem[4:]): json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))
    }


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    return path


def test_serve_local_runs_nproc_ranks_on_this_host(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = serve(["torchrun", "--nproc-per-node=2", "--standalone", str(script), str(out), "--lr"])
    try:
        assert isinstance(job, SPMDJob)
        assert job.active
        assert job.run_spmd() is None
        records = _records(out)
        assert sorted(records) == [0, 1]
        for rank, record in records.items():
            assert record["WORLD_SIZE"] == "2"
            assert record["LOCAL_RANK"] == str(rank)
            assert record["argv"] == ["--lr"]
        assert records[0]["MASTER_PORT"] == records[1]["MASTER_PORT"]
    finally:
        job.kill()


def test_serve_process_spreads_nnodes_hosts_and_kill_ends_them(
    script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    command = ["torchrun", "--nnodes=2", "--nproc-per-node=2", str(script), str(out)]
    job = serve(command, scheduler="process")
    workers = []
    try:
        assert isinstance(job.job, ProcessJob)
        workers = [(w.pid, w.started) for w in job.job._workers["workers"]]
        assert len(workers) == 2
        assert job.state(cached_path=None).workers.sizes == {"hosts": 2}
        job.run_spmd()
        records = _records(out)
        assert sorted(records) == [0, 1, 2, 3]
        assert [records[r]["GROUP_RANK"] for r in range(4)] == ["0", "0", "1", "1"]
        assert [records[r]["LOCAL_RANK"] for r in range(4)] == ["0", "1", "0", "1"]
        assert {records[r]["WORLD_SIZE"] for r in range(4)} == {"4"}
    finally:
        job.kill()
    assert not any(_alive(pid, started) for pid, started in workers)


def test_a_failing_rank_raises_and_the_hosts_serve_another_run(
    script: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    hosts = ProcessJob({"hosts": 1})
    failing = serve(["torchrun", "--nproc-per-node=2", str(script), str(out), "fail"], hosts)
    try:
        with pytest.raises(ActorError, match=r"rank 1 exited with status 3 \(sys.exit\)"):
            failing.run_spmd()
        ok = serve(["torchrun", "--nproc-per-node=2", str(script), str(out), "again"], hosts)
        ok.run_spmd()
        assert [r["argv"] for r in _records(out).values()] == [["again"], ["again"]]
    finally:
        hosts.kill()


def test_an_applied_spmd_job_runs_from_a_later_script(
    script: Path, tmp_path: Path, leftover_processes: Callable[[], list[int]]
) -> None:
    out = tmp_path / "out"
    (tmp_path / "spmdjobs.py").write_text(
        "from regency.job import ProcessJob\n"
        "from regency.job.spmd import SPMDJob\n"
        f"job = SPMDJob(ProcessJob({{'hosts': 2}}), ['torchrun', {str(script)!r}, {str(out)!r}])\n"
    )
    (tmp_path / "run.py").write_text(
        "from regency.job import load_current_job\nload_current_job().run_spmd()\n"
    )

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def workers() -> list[tuple[int, int]]:
        job = job_load(tmp_path / ".regency/default/state.pkl")
        assert isinstance(job, SPMDJob)
        assert isinstance(job.job, ProcessJob)
        return [(w.pid, w.started) for w in job.job._workers["hosts"]]

    started: list[tuple[int, int]] = []
    try:
        applied = run("-m", "regency", "apply", "spmdjobs.job")
        assert applied.returncode == 0, applied.stderr
        started = workers()
        ran = run("run.py")
        assert ran.returncode == 0, ran.stderr
        assert sorted(_records(out)) == [0, 1]
        assert {r["GROUP_RANK"] for r in _records(out).values()} == {"0", "1"}
        assert workers() == started, "the script ran on the applied hosts, it started none"
    finally:
        killed = run("-m", "regency", "kill")
        assert killed.returncode == 0, killed.stderr
    assert not any(_alive(pid, since) for pid, since in started)
    assert leftover_processes() == [], "run.py started no hosts of its own that kill missed"
