"""Stopping a proc mesh whose host agent is lost before it answers: the stop still ends.

A worker that takes its controller for gone (a missed heartbeat on a loaded machine) drops its
connection without answering the stop it was sent; a worker killed mid-stop never answers
either. Their procs are gone with them, so ``stop()`` counts such a host as done.
"""

from __future__ import annotations

import os
import signal

import pytest
from _worker_helpers import Probe, raw_worker

from regency.job import attach_to_workers

pytestmark = pytest.mark.timeout(120)


def test_stop_ends_when_a_host_is_lost_before_answering() -> None:
    secret = b"q" * 32
    with raw_worker(secret) as healthy, raw_worker(secret) as doomed:
        hosts = attach_to_workers([healthy.address, doomed.address], secret=secret)
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        probes = procs.spawn("probes", Probe)
        assert len(probes.value.call(1).get(timeout=30)) == 4
        os.kill(doomed.proc.pid, signal.SIGSTOP)  # the stop request reaches it, unread
        stopping = procs.stop()
        os.kill(doomed.proc.pid, signal.SIGKILL)
        stopping.get(timeout=30)
        # The healthy host stopped its procs and still serves new ones.
        again = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("again", Probe)
        assert again.value.call_one(2).get(timeout=30) == 2
