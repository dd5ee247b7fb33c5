"""A job's admin API: ``enable_admin()`` then ``state()`` serves the tree of the job's hosts."""

from __future__ import annotations

import json
import urllib.request

import pytest
from _worker_helpers import Probe, kill_and_check

from regency.job import ProcessJob
from regency.observe import admin_token

pytestmark = pytest.mark.timeout(120)


def test_a_jobs_admin_api_shows_its_hosts_procs_and_actors() -> None:
    job = ProcessJob({"hosts": 2}).enable_admin()
    try:
        state = job.state(cached_path=None)
        assert state.admin_url is not None
        assert state.admin_url.startswith("http://127.0.0.1:")
        assert state.admin_token == admin_token(job.secret)
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        procs.spawn("probes", Probe).where.call().get(timeout=30)
        request = urllib.request.Request(
            state.admin_url + "/v1/tree", headers={"Authorization": f"Bearer {state.admin_token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            tree = json.loads(response.read())
        hosts = {host["address"]: host for host in tree["hosts"]}
        assert sorted(hosts) == sorted(h.agent for h in state.hosts._hosts)
        for host in hosts.values():
            assert len(host["procs"]) == 2
            for proc in host["procs"]:
                assert proc["state"] == "running"
                assert proc["address"].startswith(host["address"] + "/")
                (actor,) = proc["actors"]
                assert actor["actor_mesh"] == "probes"
                assert actor["state"] == "running"
                assert actor["messages_handled"] == 1
        procs.stop().get(timeout=30)
    finally:
        kill_and_check(job)
    # kill() stopped the admin server with the job.
    with pytest.raises(OSError):
        urllib.request.urlopen(state.admin_url + "/v1/root", timeout=5)
