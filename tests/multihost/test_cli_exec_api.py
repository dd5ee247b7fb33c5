"""``regency.job.exec_command``: the Python API under ``regency exec``, on ProcessJob hosts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _worker_helpers import kill_and_check

from regency.job import CommandResult, ProcessJob, exec_command

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    job.state(cached_path=None)
    yield job
    kill_and_check(job)


def test_results_per_rank_with_env(job: ProcessJob) -> None:
    hosts = job.state(cached_path=None).hosts
    results = exec_command(
        hosts,
        "echo $GREETING $REGENCY_RANK_HOSTS of $REGENCY_SIZE_HOSTS; echo e >&2; "
        "exit $REGENCY_RANK_HOSTS",
        env={"GREETING": "hi"},
    )
    assert results.sizes == {"hosts": 2}
    assert [r for _, r in results.items()] == [
        CommandResult(0, "hi 0 of 2\n", "e\n"),
        CommandResult(1, "hi 1 of 2\n", "e\n"),
    ]
    code, out, err = results.item(hosts=1)
    assert (code, out, err) == (1, "hi 1 of 2\n", "e\n")


def test_stream_callback_gets_lines_in_order_per_rank(job: ProcessJob) -> None:
    hosts = job.state(cached_path=None).hosts
    seen: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def on_line(rank: int, stream: str, line: str) -> None:
        with lock:
            seen.append((rank, stream, line))

    results = exec_command(
        hosts.slice(hosts=1), ["sh", "-c", "seq 1 30; echo done >&2"], stream=on_line
    )
    assert [r.returncode for r in results.values()] == [0]
    assert [line for _, s, line in seen if s == "stdout"] == [str(i) for i in range(1, 31)]
    assert [(r, line) for r, s, line in seen if s == "stderr"] == [(0, "done")]
    assert next(iter(results.values())).stdout == "".join(f"{i}\n" for i in range(1, 31))


def test_stream_true_prints_with_rank_prefix(
    job: ProcessJob, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = job.state(cached_path=None).hosts
    exec_command(hosts, ["sh", "-c", "echo x$REGENCY_RANK_HOSTS"], stream=True)
    assert sorted(capsys.readouterr().out.splitlines()) == ["[0] x0", "[1] x1"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_timeout_kills_each_command_with_what_it_started(job: ProcessJob, tmp_path: Path) -> None:
    hosts = job.state(cached_path=None).hosts
    pids = tmp_path / "pids-"
    # The shell starts a grandchild that would outlive it, then waits for it.
    script = f"sleep 300 & echo $! > {pids}$REGENCY_RANK_HOSTS; echo started; wait"
    started = threading.Event()
    with pytest.raises(TimeoutError):
        exec_command(
            hosts,
            script,
            stream=lambda rank, stream, line: started.set(),
            timeout=3,
        )
    assert started.is_set()
    sleepers = [int((tmp_path / f"pids-{rank}").read_text()) for rank in range(2)]
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in sleepers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in sleepers), "a command's child outlived the timeout"
    # The hosts still run commands afterwards.
    assert [r.returncode for r in exec_command(hosts, "true").values()] == [0, 0]
