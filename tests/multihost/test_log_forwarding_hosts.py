"""Log forwarding from procs on other hosts, on by default: lines reach the controller prefixed."""

from __future__ import annotations

import re
import sys

import cloudpickle
import pytest
from _worker_helpers import kill_and_check
from netns import NetnsCluster

from regency.actor import Actor, endpoint
from regency.job import ProcessJob, attach_to_workers

pytestmark = pytest.mark.timeout(120)

# Workers start fresh interpreters that cannot import this module: ship its actors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Speaker(Actor):
    """Prints one line naming its rank, to stdout and to stderr."""

    @endpoint
    def speak(self, tag: str) -> None:
        from regency.actor import current_rank

        rank = current_rank().rank
        print(f"{tag} from rank {rank}")
        print(f"{tag} on stderr from rank {rank}", file=sys.stderr)


def _lines(text: str) -> list[tuple[str, str, str]]:
    """``(point, host, line)`` of each forwarded line."""
    return re.findall(r"^\[anon (\S+) (\S+)\] (.*)$", text, re.M)


def test_process_job_hosts_forward_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    job = ProcessJob({"hosts": 2})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
        procs.spawn("speakers", Speaker).speak.call("hello").get(timeout=60)
        procs.stop().get(timeout=30)
        captured = capsys.readouterr()
    finally:
        kill_and_check(job)
    out = sorted(_lines(captured.out))
    assert [(point, line) for point, _, line in out] == [
        (f"hosts={h},gpus={g}", f"hello from rank {2 * h + g}") for h in range(2) for g in range(2)
    ]
    assert {host for _, host, _ in out} == {"127.0.0.1"}
    assert len(_lines(captured.err)) == 4


def test_eight_procs_on_two_namespace_hosts(
    hosts_and_workers: tuple[NetnsCluster, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, addresses = hosts_and_workers
    hosts = attach_to_workers(addresses[:2], timeout=30)
    procs = hosts.spawn_procs(per_host={"gpus": 4})
    try:
        procs.spawn("speakers", Speaker).speak.call("netns").get(timeout=60)
    finally:
        procs.stop().get(timeout=30)
    found = sorted(_lines(capsys.readouterr().out))
    expected = sorted(
        (f"hosts={h},gpus={g}", cluster.hosts[h].ip, f"netns from rank {4 * h + g}")
        for h in range(2)
        for g in range(4)
    )
    assert found == expected
