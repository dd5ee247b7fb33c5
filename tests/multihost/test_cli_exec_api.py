"""``regency.job.exec_command``: the Python API under ``regency exec``, on ProcessJob hosts."""

from __future__ import annotations

import threading
from collections.abc import Iterator

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
