"""An idle attached cluster costs the controller one ping per host and interval, nothing per
proc: procs take no part in heartbeats (their host agents answer for them)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from _worker_helpers import Failures, kill_and_check

from regency import config
from regency._runtime.kernel import state
from regency.actor import Actor, endpoint
from regency.job import ProcessJob

pytestmark = pytest.mark.timeout(120)

HOSTS = 3


class Beats(Actor):
    """Reports its process's heartbeat statistics and TCP connections."""

    @endpoint
    def statistics(self) -> dict[str, int]:
        transport = state.runtime().transport
        return {
            **transport.heartbeat.statistics(),
            "tcp": len(transport._tcp_connections()),
        }


@pytest.fixture
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": HOSTS})
    yield job
    kill_and_check(job)


def test_idle_cluster_pings_each_host_once_per_sweep_and_no_proc(
    job: ProcessJob, failures: Failures
) -> None:
    with config.configured(heartbeat_interval=0.1, heartbeat_timeout=2.0):
        hosts = job.state(cached_path=None).hosts
        beats = hosts.spawn_procs(per_host={"gpus": 2}).spawn("beats", Beats)
        # Every proc talks with the controller (and so has a TCP connection to it).
        procs = beats.statistics.call().get(timeout=60)
        assert len(procs) == 2 * HOSTS
        heartbeat = state.runtime().transport.heartbeat
        first = heartbeat.statistics()
        deadline = time.monotonic() + 60
        while heartbeat.statistics()["sweeps"] < first["sweeps"] + 20:  # ~2 s, 20 sweeps
            assert time.monotonic() < deadline, "the controller's sweeps stopped"
            time.sleep(0.05)
        last = heartbeat.statistics()
        sweeps = last["sweeps"] - first["sweeps"]
        pings = last["pings"] - first["pings"]
        # One watched connection per host: the one to its agent (the 6 procs' are not).
        assert last["watched"] == HOSTS, last
        assert sweeps * HOSTS - HOSTS <= pings <= sweeps * HOSTS, (sweeps, pings)
        assert last["answers"] == first["answers"] == 0, "the workers ping nobody"
        for _, seen in procs.items():
            assert seen["tcp"] >= 1, seen  # a TCP connection that carries no heartbeat
            assert (seen["sweeps"], seen["pings"], seen["answers"]) == (0, 0, 0), seen
        assert len(beats.statistics.call().get(timeout=30)) == 2 * HOSTS  # all still answer
        assert failures.seen == [], "no host or proc was declared lost"
